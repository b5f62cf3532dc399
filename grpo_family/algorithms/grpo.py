"""GRPO's group-relative advantage, exactly as TRL 1.16 computes it.

``A_i = (r_i - mean(group)) / (std(group) + eps)``, with NaN rewards (unscorable completions) left out of
the statistics and given advantage 0. The operations mirror ``trl.GRPOTrainer`` one for one (NaN-aware mean,
Bessel-corrected NaN-aware std, ``+1e-4``), so ``grpo`` through ``GRPOFamilyTrainer`` trains bit-for-bit like
stock TRL, with two repairs that only touch inputs where TRL's float arithmetic goes wrong:

* a group whose scorable rewards are all equal gets advantage exactly 0 and std exactly 0. TRL's float mean of
  equal values can be off by an ulp, and dividing that residue by a std of the same size gives such a group
  advantages of order 1 when the rewards are large (float32 rewards of 6578.0 in a group of 5: |A| = 0.76);
* a variance whose squares overflow (|r - mean| above ~1.8e19 in float32) or underflow below the smallest
  normal float is recomputed on rescaled deviations, instead of giving a spread group a zero (or inf) std.

Anywhere else the operations, and so the bits, are TRL's.
"""

from __future__ import annotations

from typing import Any

import torch

from .estimators import option_names_check, register_estimator

__all__ = [
    "group_advantages",
    "is_constant",
    "nanstd",
    "normalize_then_sum_advantages",
    "weighted_reward_sum",
    "zero_std_mask",
]


def weighted_reward_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each completion's reward from its ``(N, F)`` per-function rewards, as TRL sums them: the weighted sum over the
    scored functions (NaN = unscored, left out), NaN where no function scored it."""
    rewards = (rewards_per_func * weights).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def _nan_extreme(x: torch.Tensor, dim: int | None, largest: bool) -> torch.Tensor:
    """NaN-ignoring max (or min) along ``dim`` (every dim for None), keepdim; -inf (inf) where all are NaN."""
    fill = float("-inf") if largest else float("inf")
    filled = torch.where(torch.isnan(x), fill, x)
    dims = tuple(range(x.dim())) if dim is None else dim
    return filled.amax(dim=dims, keepdim=True) if largest else filled.amin(dim=dims, keepdim=True)


def is_constant(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Boolean, reduced over ``dim`` with keepdim: the non-NaN values are all equal (or there are none).

    Exact (a comparison, no arithmetic), so it is the test for a degenerate group that rounding cannot fool.
    """
    nan = torch.isnan(x)
    dims = tuple(range(x.dim())) if dim is None else dim
    highest = torch.where(nan, float("-inf"), x).amax(dim=dims, keepdim=True)
    lowest = torch.where(nan, float("inf"), x).amin(dim=dims, keepdim=True)
    return ~(highest > lowest)


def nanstd(x: torch.Tensor, dim: int | None = None, *, ddof: int = 1, keepdim: bool = False) -> torch.Tensor:
    """NaN-aware standard deviation with ``ddof`` (TRL's ``nanstd`` for ``ddof=1``).

    NaN where fewer than ``ddof + 1`` finite values are present (the caller maps that to a zero advantage);
    exactly 0 where the non-NaN values are all equal. TRL's arithmetic everywhere else, except that a variance
    that overflowed or underflowed is recomputed on deviations divided by their largest magnitude.
    """
    return _nanstd(x, dim, ddof, keepdim)


def _nanstd(x: torch.Tensor, dim: int | None, ddof: int, keepdim: bool, constant: torch.Tensor | None = None):
    """``nanstd``; ``constant`` = ``is_constant(x, dim)`` when the caller has it already."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    deviation = x - mean
    variance = torch.nanmean(deviation**2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    constant = (is_constant(x, dim) if constant is None else constant) & (count > 0)
    variance = torch.where(constant, torch.zeros_like(variance), variance)  # not an ulp of noise from the mean
    rescale = (torch.isinf(variance) | (variance < torch.finfo(variance.dtype).tiny)) & ~constant
    unit = None
    if bool(rescale.any()):  # rare: |x - mean| beyond ~1.8e19 or below ~1e-19 (float32)
        largest = _nan_extreme(deviation.abs(), dim, True)
        unit = torch.where(rescale & (largest > 0), largest, torch.ones_like(largest))
        variance = torch.where(rescale, torch.nanmean((deviation / unit) ** 2, dim=dim, keepdim=True), variance)
    if ddof:
        # in the variance's dtype: int / int is float32, which cost float64 input 3e-8 of relative precision
        correction = count.to(variance.dtype) / (count - ddof).to(variance.dtype)
        correction = torch.where(count > ddof, correction, torch.full_like(correction, float("nan")))
        variance = variance * correction
    std = torch.sqrt(variance)
    if unit is not None:
        std = std * unit
    if keepdim:
        return std
    return std.squeeze(dim) if dim is not None else std.reshape(())


def _scale(rewards: torch.Tensor, scale: str, ddof: int, constant: torch.Tensor | None = None) -> torch.Tensor:
    """The std each advantage is divided by; ``constant`` = ``is_constant(rewards, 1)`` if already computed."""
    if scale in ("group", "none"):
        if rewards.size(1) > 1:
            return _nanstd(rewards, 1, ddof, True, constant).expand_as(rewards)
        return torch.zeros_like(rewards)
    if scale == "batch":
        if rewards.numel() > 1:
            return nanstd(rewards, ddof=ddof).expand_as(rewards)
        return torch.zeros_like(rewards)
    raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}.")


def group_advantages(rewards: torch.Tensor, *, scale: str = "group", ddof: int = 1, eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages for ``rewards`` of shape ``(num_prompts, num_generations)``.

    Args:
        rewards: one row per prompt, one column per completion; NaN marks an unscorable completion, which is
            excluded from its group's statistics and gets advantage 0.
        scale: ``"group"`` divides by the group's std (GRPO), ``"batch"`` by the std of the whole batch
            (Dr. GRPO-style robustness), ``"none"`` only centres (Dr. GRPO).
        ddof: delta degrees of freedom of the std (1 = sample std, TRL's choice; 0 = population std).
        eps: added to the std before dividing.

    Returns:
        advantages with the shape of ``rewards``; finite wherever the input is finite.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_prompts, num_generations), got shape {tuple(rewards.shape)}.")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}.")
    constant = is_constant(rewards, 1)
    advantages = rewards - torch.nanmean(rewards, dim=1, keepdim=True)
    if scale != "none":
        advantages = advantages / (_scale(rewards, scale, ddof, constant) + eps)
    # A group of equal rewards has advantage exactly 0, not the float mean's rounding residue over its std.
    advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    return torch.nan_to_num(advantages, nan=0.0)


def zero_std_mask(rewards: torch.Tensor, *, scale: str = "group", ddof: int = 1) -> torch.Tensor:
    """Boolean ``(num_prompts, num_generations)``: whose advantage was divided by a zero std.

    TRL logs its mean as ``frac_reward_zero_std`` (the share of degenerate groups for ``scale="group"``).
    """
    std = _scale(rewards, scale, ddof)
    return torch.isclose(std, torch.zeros_like(std))


def normalize_then_sum_advantages(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, *, eps: float = 1e-4
) -> torch.Tensor:
    """TRL's ``multi_objective_aggregation="normalize_then_sum"`` (GDPO-style).

    Each reward function is z-scored within its group, the z-scores are summed with ``weights``, and the sum is
    standardised over the whole batch. ``rewards_per_func`` is ``(num_prompts, num_generations, num_funcs)``;
    a completion every function failed to score (all NaN) gets advantage 0.
    """
    mean_k = torch.nanmean(rewards_per_func, dim=1, keepdim=True)
    if rewards_per_func.size(1) > 1:
        std_k = nanstd(rewards_per_func, dim=1, keepdim=True)
    else:
        std_k = torch.zeros_like(mean_k)
    z = (rewards_per_func - mean_k) / (std_k + eps)
    z = torch.where(is_constant(rewards_per_func, 1), torch.zeros_like(z), z)  # exact 0 for a constant group
    summed = (z * weights.to(z.device)).nansum(dim=-1)
    summed[torch.isnan(rewards_per_func).all(dim=-1)] = torch.nan
    std = nanstd(summed) if summed.numel() > 1 else torch.zeros(())
    advantages = (summed - torch.nanmean(summed)) / (std + eps)
    advantages = torch.where(is_constant(summed), torch.zeros_like(advantages), advantages)
    return torch.nan_to_num(advantages, nan=0.0)


# --- The "grpo" advantage estimator (the registry: algorithms/estimators.py) ---


def _validate_grpo_estimator(num_generations: int, **options: Any) -> None:
    option_names_check("grpo", grpo_estimator)(num_generations, **options)
    if options.get("scale", "group") not in ("group", "batch", "none"):
        raise ValueError(f"The 'grpo' estimator's scale must be 'group', 'batch' or 'none', got {options['scale']!r}.")


@register_estimator("grpo", lambda num_generations, **options: _validate_grpo_estimator(num_generations, **options))
def grpo_estimator(rewards: torch.Tensor, *, scale: str = "group", generator=None) -> torch.Tensor:
    """TRL's group advantages (:func:`group_advantages`) as the ``grpo`` estimator."""
    return group_advantages(rewards, scale=scale)
