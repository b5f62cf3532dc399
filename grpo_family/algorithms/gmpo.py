"""GMPO: the geometric mean of the token-level importance ratios, clipped per token in log space (Zhao et al., 2025,
"Geometric-Mean Policy Optimization", arXiv 2507.20673; ``docs/methods/gmpo.md``).

GRPO maximises the arithmetic mean over a completion's tokens of the clipped ratios ``r_t A``; one token with an
extreme ratio moves that mean, and the update, a lot. GMPO maximises, per completion ``o`` of ``|o|`` valid tokens,

    J(o) = A * exp( (1/|o|) * sum_t clip_sgn(A)(log r_t, -eps_low, eps_high) ),   log r_t = logp_t - logp_old,t

the geometric mean of the ratios (times the advantage), each log-ratio clipped one-sidedly by the advantage's sign as
PPO clips (``min`` with the clamped value for ``A > 0``, ``max`` for ``A <= 0``), so that the ratio range is
``(e^-eps_low, e^eps_high)``; the paper's default is ``eps_low = eps_high = 0.4``. The loss is ``-J`` averaged over
the completions. Registered as the surrogate ``gmpo`` (:mod:`.surrogates`): its per-sequence loss is broadcast to the
completion's tokens, so a per-sequence mean (TRL's ``loss_type="grpo"``) gives ``-J(o)`` back.

The same formula as TRL 1.16's ``trl.experimental.gmpo.GMPOTrainer._compute_loss`` (tests/test_gmpo_algorithm.py
evaluates both on the same inputs).
"""

from __future__ import annotations

import torch

from .losses import SEQUENCE_MEAN_LOSS_TYPES
from .surrogates import SurrogateOutput, register_surrogate

__all__ = ["gmpo_clipped_log_ratio", "gmpo_sequence_loss", "gmpo_surrogate"]


def gmpo_clipped_log_ratio(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per token ``(N, T)``: the sign-aware clipped log-ratio ``log r_t`` (``min(log r, clamp(log r))`` where
    ``A > 0``, ``max`` elsewhere), and the tokens clipped below (``log r < -eps_low`` with ``A < 0``) and above
    (``log r > eps_high`` with ``A > 0``), bool. ``advantages`` ``(N,)``."""
    log_ratio = logps - old_logps
    adv = advantages[:, None]
    clamped = torch.clamp(log_ratio, min=-epsilon_low, max=epsilon_high)
    clipped = torch.where(adv > 0, torch.minimum(log_ratio, clamped), torch.maximum(log_ratio, clamped))
    low = (log_ratio < -epsilon_low) & (adv < 0)
    high = (log_ratio > epsilon_high) & (adv > 0)
    return clipped, low, high


def gmpo_sequence_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
) -> torch.Tensor:
    """``(N,)``: ``-A_i * exp(mean over the valid tokens of the clipped log-ratios)``, GMPO's loss of each
    completion (a row without valid tokens: geometric mean 1, as TRL's)."""
    clipped, _, _ = gmpo_clipped_log_ratio(
        logps, old_logps, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high
    )
    mask = mask.to(clipped.dtype)
    return -torch.exp((clipped * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)) * advantages


@register_surrogate("gmpo", loss_types=SEQUENCE_MEAN_LOSS_TYPES)
def gmpo_surrogate(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> SurrogateOutput:
    """The surrogate ``gmpo``: :func:`gmpo_sequence_loss` broadcast over each completion's tokens ``(N, T)``, and
    the metric ``ratio``, each completion's clipped geometric-mean ratio. ``advantages`` ``(N,)``: GMPO's objective
    is per sequence. TRL's vLLM importance-sampling correction, when given, must be per sequence ``(N, 1)`` (TRL's
    ``sequence_*`` modes) and weighs each completion's loss (TRL's GMPOTrainer does not apply it)."""
    if importance_sampling_ratio is not None and importance_sampling_ratio.shape != (logps.size(0), 1):
        raise ValueError(
            "GMPO's objective is one value per completion: TRL's vLLM importance-sampling correction must be per "
            f"sequence (vllm_importance_sampling_mode 'sequence_mask' or 'sequence_truncate'), got a ratio of shape "
            f"{tuple(importance_sampling_ratio.shape)}."
        )
    if advantages.dim() != 1:
        raise ValueError(
            f"GMPO weighs a completion's geometric-mean ratio by one advantage: advantages must be (N,), got "
            f"{tuple(advantages.shape)}; per-token advantage stages do not combine with the gmpo surrogate."
        )
    clipped, low, high = gmpo_clipped_log_ratio(
        logps, old_logps, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high
    )
    mask = mask.to(clipped.dtype)
    ratio = torch.exp((clipped * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))  # the geometric mean, (N,)
    per_sequence = -ratio * advantages
    if importance_sampling_ratio is not None:
        per_sequence = per_sequence * importance_sampling_ratio[:, 0]
    return SurrogateOutput(per_sequence[:, None].expand_as(logps), low, high, {"ratio": ratio.detach()})
