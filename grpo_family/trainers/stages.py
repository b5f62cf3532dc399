"""The named stages of a generation batch, and how the base class keeps only the rows a method trains on.

Every grpo_family method is a set of stages that :class:`~grpo_family.trainers.base.GRPOFamilyTrainer` calls in
this order; a method overrides stages, never TRL's private helpers:

1. **advantages** -- ``_compute_advantages(rewards, batch)``: the gathered ``(P, G)`` rewards -> advantages per row
   ``(P, G)`` or per token ``(P, G, T)`` (a method that changes the rewards themselves stores them in
   ``batch["rewards"]``).
2. **row selection** -- ``_select_rows(advantages, batch)``: the global flat indices of the rows to train on, or
   None for all. A method that selects rows is scored *before* TRL's no-grad forwards (old and reference
   log-probs), so those forwards run over the kept rows only (see :class:`GenerationStage`).
3. **batch finish** -- ``_finish_generation_batch(output, stage)``: per-row extras the loss needs, from the batch
   of this process's trained rows (CW-GRPO's weights, GPG's row weights, D3S's rollout index).
4. **loss inputs** -- ``_loss_inputs_stage(inputs)``: per-loss-call values (a normaliser, per-token weights made
   ahead of the forward).
5. **loss forward** -- ``_loss_forward_stage(inputs, logps, entropies)``: the log-probs and entropies of the
   loss's own policy forward, before TRL's loss reads them or the advantages (D3S's token filter, CW-GRPO's
   weights from the loss's log-probs).

The stage results are global (computed from tensors gathered from every process), so every process takes the same
decisions and stays in step with the others' collectives.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import torch
from accelerate.utils import gather, pad_across_processes


@dataclasses.dataclass
class GenerationStage:
    """What the advantage and row-selection stages decided for one generation batch (global, every process alike).

    ``rewards`` ``(P, G)`` are the weighted sum of the gathered ``rewards_per_func`` ``(P * G, F)`` (NaN = unscorable),
    ``trained_rewards`` what the advantages were computed from (a method may change them, e.g. SGPO's judge).
    ``advantages`` are flat: ``(P * G,)`` or ``(P * G, T)``, NaN already 0. ``keep`` holds the sorted global flat
    indices (``b * G + i``) of the rows trained on, None for every row. ``early`` says the stages ran before TRL's
    no-grad forwards (a method that selects rows), so those forwards covered the kept rows only.
    """

    rewards: torch.Tensor
    rewards_per_func: torch.Tensor
    trained_rewards: torch.Tensor
    advantages: torch.Tensor
    num_generations: int
    mode: str
    keep: torch.Tensor | None = None
    early: bool = False
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)


def stage_generator(*key: Any) -> torch.Generator:
    """The one seeding helper for sampled draws of a stage: a CPU generator seeded from a hash of ``key`` (e.g.
    ``("ms_grpo", seed, global_step, slot)``), so every process draws alike, any key gives an independent stream,
    no state has to survive a checkpoint, and no mix of large integers can collide or overflow the 64-bit seed."""
    digest = hashlib.blake2b(":".join(str(part) for part in key).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)  # < 2**63


def estimator_options(value: Any, field: str) -> dict[str, Any]:
    """A config's estimator options as a dict: None -> {}, a mapping as is, a JSON object string (the command
    line's form, e.g. ``'{"num_scales": 4, "subgroups_per_scale": 8}'``) parsed."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as error:
            raise ValueError(f"{field} must be a JSON object of estimator options, got {value!r} ({error}).") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a mapping of estimator options, got {type(value).__name__}.")
    return dict(value)


def gather_padded(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s rows from every process, rank-major; a 2-D tensor's columns are zero-padded on the right to the
    widest process's first (processes' completion widths differ)."""
    tensor = tensor.contiguous()
    return gather(pad_across_processes(tensor, dim=1, pad_index=0) if tensor.dim() == 2 else tensor)


def local_rows(keep: torch.Tensor, num_local: int, process_index: int) -> torch.Tensor:
    """This process's kept rows (local indices, ascending) from the global ``keep`` indices."""
    start = process_index * num_local
    mine = keep[(keep >= start) & (keep < start + num_local)]
    return (mine - start).sort().values


def padded_local_rows(
    keep: torch.Tensor, num_local: int, num_processes: int, process_index: int, multiple: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row index of this process's trained batch and which of its rows are real.

    Every process gets the same row count -- the largest kept count over processes, rounded up to ``multiple`` (TRL
    splits the batch into that many equal micro-steps) -- padded with copies of a kept row (row 0 when it keeps
    none), which the caller makes inert. Every process knows the whole selection, so no communication is needed.
    """
    flags = torch.zeros(num_local * num_processes, dtype=torch.bool, device=keep.device)
    flags[keep] = True
    rows = max(int(flags.view(num_processes, num_local).sum(1).max()), 1)
    rows = -(-rows // multiple) * multiple
    local = flags[process_index * num_local : (process_index + 1) * num_local].nonzero().squeeze(1)
    filler = local[:1] if local.numel() else torch.zeros(1, dtype=torch.long, device=keep.device)
    index = torch.cat([local, filler.repeat(rows - local.numel())])
    real = torch.arange(rows, device=keep.device) < local.numel()
    return index, real


__all__ = [
    "GenerationStage",
    "estimator_options",
    "gather_padded",
    "local_rows",
    "padded_local_rows",
    "stage_generator",
]
