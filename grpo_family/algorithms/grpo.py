"""GRPO's group-relative advantage, exactly as TRL 1.16 computes it.

``A_i = (r_i - mean(group)) / (std(group) + eps)``, with NaN rewards (unscorable completions) left out of
the statistics and given advantage 0. The operations mirror ``trl.GRPOTrainer`` one for one (NaN-aware mean,
Bessel-corrected NaN-aware std, ``+1e-4``), so ``grpo`` through ``GRPOFamilyTrainer`` trains bit-for-bit like
stock TRL.
"""

from __future__ import annotations

import torch

__all__ = ["group_advantages", "nanstd", "normalize_then_sum_advantages", "zero_std_mask"]


def nanstd(x: torch.Tensor, dim: int | None = None, *, ddof: int = 1, keepdim: bool = False) -> torch.Tensor:
    """NaN-aware standard deviation with ``ddof`` (TRL's ``nanstd`` for ``ddof=1``).

    NaN where fewer than ``ddof + 1`` finite values are present (the caller maps that to a zero advantage).
    """
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    if ddof:
        correction = count / (count - ddof)
        correction = torch.where(count > ddof, correction, torch.full_like(correction, float("nan")))
        variance = variance * correction
    std = torch.sqrt(variance)
    if keepdim:
        return std
    return std.squeeze(dim) if dim is not None else std.reshape(())


def _scale(rewards: torch.Tensor, scale: str, ddof: int) -> torch.Tensor:
    if scale in ("group", "none"):
        if rewards.size(1) > 1:
            return nanstd(rewards, dim=1, ddof=ddof, keepdim=True).expand_as(rewards)
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
    std = _scale(rewards, scale, ddof)
    advantages = rewards - torch.nanmean(rewards, dim=1, keepdim=True)
    if scale != "none":
        advantages = advantages / (std + eps)
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
    summed = (z * weights.to(z.device)).nansum(dim=-1)
    summed[torch.isnan(rewards_per_func).all(dim=-1)] = torch.nan
    std = nanstd(summed) if summed.numel() > 1 else torch.zeros(())
    return torch.nan_to_num((summed - torch.nanmean(summed)) / (std + eps), nan=0.0)
