"""The surrogate stage: a registered surrogate (:mod:`grpo_family.algorithms.surrogates`) in place of TRL's per-token
policy objective, inside TRL's own ``_compute_loss``.

TRL 1.16's ``GRPOTrainer._compute_loss`` computes ratio, clip and objective inline (no hook between the policy
forward and the aggregation), so the stage works around it without copying it: at the loss call's policy forward
(where the loss-forward stages run) it computes the surrogate's per-token loss, adds it to the loss call's extra loss
(aggregated after TRL's loss as TRL aggregates its own, :func:`~grpo_family.algorithms.losses.aggregate_token_loss`)
and hands TRL zero advantages, so TRL's own objective ``-min(r * 0, clip(r) * 0)`` is 0 in value and gradient while
TRL still adds its KL penalty, entropy bonus and auxiliary loss, scales for gradient accumulation and logs its metrics.
TRL's ``clip_ratio/*`` metrics (which would read the zero advantages) are replaced by the surrogate's clipped tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..algorithms.surrogates import CLIPPED_RATIO_LOSS_TYPES, get_surrogate
from .stages import LossCall

__all__ = ["apply_surrogate", "check_surrogate", "log_surrogate_clips"]


def check_surrogate(trainer: Any) -> None:
    """Refuse, before training, a surrogate that is not registered or settings it does not follow: a loss type it is
    not written for, or TRL options that reshape TRL's own objective (the surrogate replaces it)."""
    surrogate = get_surrogate(trainer.surrogate)
    problems = []
    if trainer.loss_type not in surrogate.loss_types:
        problems.append(f"loss_type={trainer.loss_type!r} (one of {surrogate.loss_types})")
    if trainer.importance_sampling_level != "token":
        problems.append(f"importance_sampling_level={trainer.importance_sampling_level!r} ('token')")
    if trainer.top_entropy_quantile != 1.0:
        problems.append(f"top_entropy_quantile={trainer.top_entropy_quantile} (1.0)")
    if trainer.off_policy_mask_threshold is not None:
        problems.append(f"off_policy_mask_threshold={trainer.off_policy_mask_threshold} (None)")
    if trainer.beta != 0.0 and getattr(trainer.args, "use_bias_correction_kl", False):
        problems.append("use_bias_correction_kl=True (False: it weighs the KL by TRL's ratio, not the surrogate's)")
    if problems:
        raise ValueError(
            f"{trainer.method_name} replaces TRL's policy objective by the surrogate {surrogate.name!r}; these "
            f"settings change the objective it replaces or its aggregation: {', '.join(problems)}. Use the values in "
            "brackets."
        )


def apply_surrogate(call: LossCall, name: str, options: dict[str, Any]) -> None:
    """The surrogate ``name`` on this loss call's rows (after the loss-forward stages and the loss term): its
    per-token loss joins ``call.extra_loss``, TRL's objective gets zero advantages, its clipped tokens are kept
    for :func:`log_surrogate_clips`."""
    logps = call.logps
    old = call.old_logps if call.old_logps is not None else logps.detach()
    out = get_surrogate(name)(
        logps,
        old,
        call.advantages,
        call.loss_mask.bool(),
        importance_sampling_ratio=call.importance_sampling_ratio,
        **options,
    )
    extra = out.per_token_loss.to(logps.dtype)
    call.extra_loss = extra if call.extra_loss is None else call.extra_loss + extra
    call.advantages = torch.zeros_like(call.advantages)
    call.surrogate_clips = (out.clipped_low, out.clipped_high)
    call.surrogate_metrics = out.metrics


def log_surrogate_clips(trainer: Any, call: LossCall) -> None:
    """TRL's ``clip_ratio/*`` metrics of this loss call, from the surrogate's clipped tokens, with TRL's formulas
    (token means over every process, per-sequence extremes over the gathered rows); they replace the values TRL
    logged from the zero advantages (appended where TRL logs none for the loss type); then the surrogate's own
    per-completion metrics, as ``<method>/<name>``, their mean over every process's rows. One host sync for all."""
    accelerator = trainer.accelerator
    low, high = (flags.float() for flags in call.surrogate_clips)
    mask = call.loss_mask.float()
    token_sums = torch.stack([(low * mask).sum(), (high * mask).sum(), (torch.maximum(low, high) * mask).sum()])
    totals = accelerator.reduce(torch.cat([token_sums, mask.sum()[None]]), reduction="sum")
    low_seq, high_seq = (accelerator.gather((f * mask).sum(-1) / mask.sum(-1)) for f in (low, high))
    inf = torch.tensor(math.inf, device=mask.device)
    values = [
        *(totals[:3] / totals[3].clamp(min=1.0)),
        torch.where(low_seq.isnan(), inf, low_seq).min(),  # TRL's nanmin / nanmax, without their indexing sync
        torch.where(high_seq.isnan(), -inf, high_seq).max(),
        *(accelerator.gather(v.float()).mean() for v in call.surrogate_metrics.values()),
    ]
    values = torch.stack(values).tolist()
    values[3:5] = [v if math.isfinite(v) else math.nan for v in values[3:5]]  # no valid token anywhere: NaN, as TRL
    metrics = trainer._metrics[call.mode]
    replace = trainer.loss_type in CLIPPED_RATIO_LOSS_TYPES
    keys = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
            "clip_ratio/high_max"]  # fmt: skip
    for key, value in zip(keys, values, strict=False):
        if replace and metrics[key]:
            metrics[key][-1] = value
        else:
            metrics[key].append(value)
    for name, value in zip(call.surrogate_metrics, values[len(keys) :], strict=True):
        trainer.log_method_metric(name, value)
