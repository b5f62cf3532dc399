"""Several generation rounds of one batch (GPG's resampling): the batch trained on assembled from the rounds as
:meth:`~grpo_family.trainers.base.GRPOFamilyTrainer.assemble_generation_rounds` plans it, its rows merged from the
rounds' outputs and its reward metrics logged once. A mixin of :class:`~grpo_family.trainers.base.GRPOFamilyTrainer`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from trl.trainer.utils import nanstd

from ..algorithms.grpo import zero_std_mask
from .batch_keys import LEFT_PADDED, PER_ROW, RIGHT_PADDED
from .stages import GenerationBatch, RoundAssembly

__all__ = ["GenerationRoundsMixin"]


class GenerationRoundsMixin:
    """The assembly of a batch from several generation rounds (needs ``GRPOTrainer``'s state)."""

    def _assemble_rounds(self, rounds: list[GenerationBatch]) -> tuple[GenerationBatch, RoundAssembly]:
        """The batch trained on, assembled as :meth:`assemble_generation_rounds` plans it: this process's rows,
        the global rewards, and the advantages of the assembled rewards."""
        assembly = self.assemble_generation_rounds(rounds)
        G = assembly.rewards.size(1)
        per_func = torch.cat([rounds[k].rewards_per_func[g * G : (g + 1) * G] for k, g in assembly.plan])
        batch = self.generation_batch(assembly.rewards, rewards_per_func=per_func)
        batch.output = self._merge_round_outputs([b.output for b in rounds], assembly.plan)
        batch.advantages = torch.nan_to_num(self.compute_advantages(batch), nan=0.0).reshape(-1)
        return batch, assembly

    def _merge_round_outputs(self, outputs: list[dict[str, Any]], plan: list[tuple[int, int]]) -> dict[str, Any]:
        """This process's rows of the assembled batch, taken from the rounds' local outputs (padded alike)."""
        G, rank = self.num_generations, self.accelerator.process_index
        per_process = len(plan) // self.accelerator.num_processes
        first = outputs[0]
        # TRL's sequence-level vLLM importance-sampling ratio is (n, 1) whatever the completion width: never padded.
        sequence_level_is = self.vllm_importance_sampling_mode in ("sequence_mask", "sequence_truncate")
        per_sequence = {"importance_sampling_ratio"} if sequence_level_is else set()
        unknown = set(first) - LEFT_PADDED - RIGHT_PADDED - PER_ROW - {"num_items_in_batch"}
        if unknown:
            raise NotImplementedError(
                f"{self._name} cannot merge generation rounds of batches with {sorted(unknown)} (multimodal or tool "
                "inputs); use one generation round per batch."
            )
        rows = []  # (round, local row) of every local slot, in slot order
        for k, g in plan[rank * per_process : (rank + 1) * per_process]:
            local_group = g - rank * per_process
            rows.extend((k, local_group * G + i) for i in range(G))
        merged: dict[str, Any] = {}
        pad_id = self._tokenizer.pad_token_id
        for key, value in first.items():
            if key == "num_items_in_batch" or value is None:
                continue
            values = [out[key] for out in outputs]
            if key in PER_ROW or key in per_sequence or values[0].dim() < 2 or len({v.size(1) for v in values}) == 1:
                stacked = values  # nothing to pad (any round's width, e.g. a 1-token one, may be the narrowest)
            else:
                width = max(v.size(1) for v in values)
                fill = pad_id if key in ("prompt_ids", "completion_ids") else (1 if key == "tool_mask" else 0)
                side = (1, 0) if key in LEFT_PADDED else (0, 1)
                stacked = [F.pad(v, tuple(s * (width - v.size(1)) for s in side), value=fill) for v in values]
            merged[key] = torch.stack([stacked[k][i] for k, i in rows])
        if self.pad_to_multiple_of is None:  # drop columns that are padding on every kept row (as TRL pads)
            keep = merged["prompt_mask"].bool().any(dim=0)
            start = int(keep.float().argmax()) if keep.any() else keep.numel()
            for key in LEFT_PADDED:
                merged[key] = merged[key][:, start:]
            used = merged["completion_mask"].bool().any(dim=0)
            width = merged["completion_ids"].size(1)
            # An all-masked batch (e.g. mask_truncated_completions with every completion truncated) keeps its width,
            # as TRL's own batch does: width 0 would make the forward pass logits_to_keep=0, "keep every position".
            end = int(used.nonzero().max()) + 1 if used.any() else width
            for key in (RIGHT_PADDED & set(merged)) - per_sequence:
                if merged[key].dim() == 2 and merged[key].size(1) == width:
                    merged[key] = merged[key][:, :end]
        mask = merged["completion_mask"]
        loss_mask = mask if merged.get("tool_mask") is None else mask * merged["tool_mask"]
        merged["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return merged

    def _log_merged_rewards(self, batch: GenerationBatch, logged: dict[str, int], share: float | None) -> None:
        """Make the step's reward metrics describe the batch assembled from several rounds (written once), in place
        of the entries TRL and :meth:`_fix_logged_batch` wrote for each round (``logged``: the entry counts after
        the first round)."""
        metrics = self._metrics[batch.mode]
        keys = ["reward", "reward_std", "frac_reward_zero_std"]
        keys += [f"rewards/{name}/{stat}" for name in self.reward_func_names for stat in ("mean", "std")]
        for key in keys:  # drop this step's entries, the first round's included (``logged`` counts them)
            del metrics[key][max(0, logged.get(key, 0) - 1) :]
        flat = batch.rewards.reshape(-1)
        if share is None:
            share = zero_std_mask(batch.rewards, scale=self.scale_rewards).float().mean().item()
        metrics["reward"].append(torch.nanmean(flat).item())
        metrics["reward_std"].append(nanstd(flat).item())
        metrics["frac_reward_zero_std"].append(share)
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(batch.rewards_per_func[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(batch.rewards_per_func[:, i]).item())
