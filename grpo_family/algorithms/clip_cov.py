"""Clip-Cov: no gradient for a random few of the tokens whose covariance lies in a band (Cui et al., 2025, "The Entropy
Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617; ``docs/methods/clip_cov.md``).

Under policy-gradient updates a token's contribution to the change of the policy entropy is minus the covariance
between its log-probability and its advantage (the paper's Sec. 3). Clip-Cov keeps the clipped surrogate and detaches
``max(1, int(r * N))`` tokens drawn uniformly at random among the loss call's ``N`` valid tokens whose

    cov_t = (A_t - mean A) * (logp_t - mean logp)          (means over the call's valid tokens)

lies strictly between ``lower`` and ``upper`` and that the surrogate's own clip has not already cut
(``-A_t clip(r_t) > -A_t r_t``): their loss and gradient are 0. The same formula as verl's
``compute_policy_loss_clip_cov`` (``verl/trainer/ppo/core_algos.py``), which evaluates it per micro-batch on each rank
(with the global random generator); the trainers call this term on the loss call's rows of every process, so the
means, the band and the draw are global, from a generator seeded by the step.
"""

from __future__ import annotations

import torch

from .losses import CLIPPED_RATIO_LOSS_TYPES, LossTermOutput, covariance, register_loss_term

__all__ = ["clip_cov_loss_term", "clip_cov_tokens"]


def clip_cov_tokens(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float,
    lower: float,
    upper: float,
    clip_low: float,
    clip_high: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Bool ``(N, T)``: the tokens Clip-Cov detaches. Candidates are valid, not clipped by the surrogate with ratio
    bounds ``[1 - clip_low, 1 + clip_high]``, and have ``lower < cov < upper``; ``max(1, int(ratio * n))`` of them
    (``n`` valid tokens) are drawn without replacement from ``generator`` (a CPU generator), all when fewer."""
    valid = mask.bool()
    adv = advantages.detach()
    adv = (adv if adv.dim() == 2 else adv[:, None]).expand_as(logps)
    ratios = torch.exp(logps.detach() - old_logps.detach())
    unclipped, clipped = -adv * ratios, -adv * torch.clamp(ratios, 1 - clip_low, 1 + clip_high)
    cov = covariance(logps, advantages, valid)
    candidates = valid & ~(clipped > unclipped) & (cov > lower) & (cov < upper)
    selected = torch.zeros_like(valid)
    index = candidates.reshape(-1).nonzero().squeeze(1)
    if index.numel():
        k = max(1, int(ratio * int(valid.sum())))
        draw = torch.randperm(index.numel(), generator=generator)[:k].to(index.device)
        selected.view(-1)[index[draw]] = True
    return selected


@register_loss_term("clip_cov", sampled=True, token_level=True, loss_types=CLIPPED_RATIO_LOSS_TYPES)
def clip_cov_loss_term(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float = 2e-4,
    lower: float = 1.0,
    upper: float = 5.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    generator: torch.Generator | None = None,
) -> LossTermOutput:
    """Per-token advantages with 0 on :func:`clip_cov_tokens` (the clipped surrogate's loss and gradient there are
    then 0, as verl's ``max(pg_losses1, pg_losses2) * corr``). Metrics: ``detached_tokens`` and ``detached_frac``
    (of the valid tokens, verl's ``pg_clipfrac``)."""
    selected = clip_cov_tokens(
        logps, old_logps, advantages, mask, ratio=ratio, lower=lower, upper=upper, clip_low=clip_low,
        clip_high=clip_high, generator=generator,
    )  # fmt: skip
    adv = advantages.detach()
    adv = (adv if adv.dim() == 2 else adv[:, None]).expand_as(logps)
    count = selected.sum()
    metrics = {"detached_tokens": count, "detached_frac": count.double() / mask.bool().sum().clamp(min=1)}
    return LossTermOutput(advantages=torch.where(selected, torch.zeros_like(adv), adv), metrics=metrics)
