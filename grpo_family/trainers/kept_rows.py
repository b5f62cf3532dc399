"""The rows a row-selecting method keeps (D3S): this process's selected rows of TRL's generation output, every
process padded to the same row count with inert rows, and the completion columns left empty trimmed. A mixin of
:class:`~grpo_family.trainers.base.GRPOFamilyTrainer`.
"""

from __future__ import annotations

from typing import Any

import torch

from .batch_keys import FORWARD_KEYS
from .stages import GenerationBatch, padded_local_rows

__all__ = ["KeptRowsMixin"]


class KeptRowsMixin:
    """Row selection applied to TRL's generation output (needs ``GRPOTrainer``'s state)."""

    def _keep_rows(self, batch: GenerationBatch) -> None:
        """Keep this process's selected rows of the output (every row-aligned tensor and list).

        TRL's collectives need equal local batches split into ``steps_per_generation`` equal chunks, so every process
        is padded to the same row count with inert rows (a copy of a local row whose completion mask is zeroed: no
        gradient, no count, no metric). ``batch.kept_rows`` holds each row's global flat index (-1 for padding);
        completion columns that only held dropped rows' padding are trimmed. ``batch.generated_tokens`` is this
        process's valid completion tokens before selection.
        """
        output = batch.output
        if any(output.get(k) is not None for k in FORWARD_KEYS if k not in ("token_type_ids", "mm_token_type_ids")):
            raise NotImplementedError(
                f"{self._name} drops rollouts from the batch; multimodal batches are not supported."
            )
        device = output["completion_ids"].device
        num_local = output["completion_ids"].size(0)
        batch.generated_tokens = output["completion_mask"].sum()  # this process's, before selection
        chunks = self.args.steps_per_generation if batch.mode == "train" else 1
        process = self.accelerator.process_index
        index, real = padded_local_rows(
            batch.keep.to(device), num_local, self.accelerator.num_processes, process, chunks
        )
        for key, value in output.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == num_local:
                output[key] = value[index]
            elif isinstance(value, list) and len(value) == num_local:
                output[key] = [value[i] for i in index.tolist()]
        output["completion_mask"] = output["completion_mask"] * real[:, None].to(output["completion_mask"].dtype)
        if batch.early:  # the kept-rows forwards left NaN on inert rows and past the kept rows' longest completion
            for key in ("old_per_token_logps", "ref_per_token_logps"):
                if output.get(key) is not None:  # masked positions: a finite value keeps TRL's masked sums finite
                    output[key] = torch.nan_to_num(output[key], nan=0.0)
        batch.padding_rows = int((~real).sum())
        batch.kept_rows = torch.where(real, process * num_local + index, -1)
        adv = output["advantages"]
        output["advantages"] = adv * real.view(-1, *([1] * (adv.dim() - 1))).to(adv.dtype)
        self._trim_completion_columns(output)

    def _trim_completion_columns(self, output: dict[str, Any]) -> None:
        """Drop trailing completion columns that only held dropped rollouts' tokens (right padding: the positions of
        the remaining tokens, hence their log-probs, do not change).

        At least two columns stay: TRL 1.16's loss reads a one-column tensor as one value per sequence and then
        ignores the mask (``global_masked_mean``), so a process whose rows are all inert padding would log their KL
        and entropy as if they were real tokens."""
        mask = output["completion_mask"]
        width = mask.size(1)
        used = mask.any(0).nonzero()
        new = max(int(used.max()) + 1 if used.numel() else 1, 2)
        if self.pad_to_multiple_of:
            new = min(width, -(-new // self.pad_to_multiple_of) * self.pad_to_multiple_of)
        if new >= width:
            return
        for key, value in output.items():
            if key.startswith("prompt") or not isinstance(value, torch.Tensor) or value.dim() < 2:
                continue
            if value.size(1) == width:
                output[key] = value[:, :new]
