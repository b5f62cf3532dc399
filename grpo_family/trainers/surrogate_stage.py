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

from typing import Any

import torch
from trl.trainer.utils import nanmax, nanmin

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
    per-completion metrics, as ``<method>/<name>``, their mean over every process's rows."""
    low, high = call.surrogate_clips
    mask = call.loss_mask.float()
    metrics = trainer._metrics[call.mode]
    replace = trainer.loss_type in CLIPPED_RATIO_LOSS_TYPES

    def put(key: str, value: float) -> None:
        if replace and metrics[key]:
            metrics[key][-1] = value
        else:
            metrics[key].append(value)

    def global_mean(flags: torch.Tensor) -> float:
        totals = trainer.accelerator.reduce(torch.stack([(flags * mask).sum(), mask.sum()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def per_sequence(flags: torch.Tensor) -> torch.Tensor:
        return trainer.accelerator.gather((flags * mask).sum(-1) / mask.sum(-1))

    low, high = low.float(), high.float()
    put("clip_ratio/low_mean", global_mean(low))
    put("clip_ratio/high_mean", global_mean(high))
    put("clip_ratio/region_mean", global_mean(torch.maximum(low, high)))
    put("clip_ratio/low_min", nanmin(per_sequence(low)).item())
    put("clip_ratio/high_max", nanmax(per_sequence(high)).item())
    for name, values in call.surrogate_metrics.items():
        trainer.log_method_metric(name, trainer.accelerator.gather(values.float()).mean().item())
