"""GPG: group policy gradient with the AGE correction (docs/methods/gpg.md §2.2-2.6, §6, §11).

Plain on-policy REINFORCE with a per-prompt group-mean baseline; no ratio, no clip, no KL, no reference model:

1. ``gpg_advantages``: ``A_i = (r_i - mean_group) / F_norm`` with ``F_norm = 1`` by default (Eq. 6);
   degenerate groups (all rewards equal) get exactly 0.
2. ``gpg_alpha``: ``alpha = B / (B - M)`` over the whole global batch, ``M`` = rows that cannot carry gradient
   (rows of degenerate groups, plus unscorable rows); 1 when every row is such (Eqs. 7-8, App. A).
3. ``gpg_loss``: ``alpha * (1/P) * sum_q (1/T_q) * sum_{i in q, t} -A_i * logp_{i,t}`` (Eq. 5, per-group token
   normalisation), or a global token mean, or a per-sequence mean.

Rewards are ``(num_prompts, G)`` with NaN marking an unscorable completion (advantage 0, counted in ``M``).
``group_token_weights`` and ``scale_grad`` are the pieces a trainer needs to apply Eq. 5 and alpha exactly
when the batch is split over ranks and gradient-accumulation micro-steps (docs/methods/gpg.md §3.2-3.3).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .estimators import option_names_check, register_estimator

__all__ = [
    "F_NORMS",
    "NORMALIZATIONS",
    "assemble_rewards",
    "count_degenerate_groups",
    "degenerate_groups",
    "gpg_advantages",
    "gpg_alpha",
    "gpg_loss",
    "group_token_weights",
    "informative_fraction",
    "informative_share",
    "loss_row_weights",
    "plan_assembly",
    "scale_grad",
]

F_NORMS = ("none", "group", "batch")
NORMALIZATIONS = ("group", "token", "sequence")


def _check_rewards(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_prompts, G), got shape {tuple(rewards.shape)}.")


def _nan_mean_std(x: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN-aware mean and Bessel-corrected std; std is 0 where fewer than 2 values are finite.

    The squares are taken of deviations divided by their largest magnitude, so the std neither overflows
    (|x - mean| above ~1.8e19 in float32) nor underflows to 0 for tiny but distinct values.
    """
    valid = ~torch.isnan(x)
    keep = dim is not None
    count = valid.sum(dim=dim, keepdim=keep)
    zeros = torch.zeros_like(x)
    mean = torch.where(valid, x, zeros).sum(dim=dim, keepdim=keep) / count.clamp(min=1)
    deviation = torch.where(valid, x - mean, zeros)
    unit = deviation.abs().amax(dim=dim if keep else tuple(range(x.dim())), keepdim=keep)
    unit = torch.where(unit > 0, unit, torch.ones_like(unit))
    std = torch.sqrt(((deviation / unit) ** 2).sum(dim=dim, keepdim=keep) / (count - 1).clamp(min=1)) * unit
    return mean, torch.where(count > 1, std, torch.zeros_like(std))


def degenerate_groups(rewards: torch.Tensor, *, tol: float = 0.0) -> torch.Tensor:
    """Boolean ``(num_prompts,)``: groups that carry no gradient (docs/methods/gpg.md §2.1, §6, §11 A7).

    A group is degenerate when its scorable (non-NaN) rewards satisfy ``max - min <= tol`` (all equal for the
    default ``tol = 0``; docs/methods/gpg.md §4 suggests ``1e-6`` for continuous rewards), or when fewer than two are scorable.
    """
    _check_rewards(rewards)
    valid = ~torch.isnan(rewards)
    hi = torch.where(valid, rewards, torch.full_like(rewards, -torch.inf)).amax(dim=1)
    lo = torch.where(valid, rewards, torch.full_like(rewards, torch.inf)).amin(dim=1)
    return (valid.sum(dim=1) < 2) | ~(hi - lo > tol)


def count_degenerate_groups(rewards: torch.Tensor, *, tol: float = 0.0) -> int:
    """Number of degenerate groups ``P_0`` (see :func:`degenerate_groups`)."""
    return int(degenerate_groups(rewards, tol=tol).sum())


def gpg_advantages(
    rewards: torch.Tensor, *, f_norm: str = "none", tol: float = 0.0, eps: float = 1e-4
) -> torch.Tensor:
    """GPG advantages ``(num_prompts, G)`` (paper Eq. 6; docs/methods/gpg.md §2.2).

    ``A_i = r_i - mean_group`` for ``f_norm="none"`` (GPG's default), divided by ``std_group + eps`` for
    ``"group"`` (GRPO's normalisation) or by ``std_batch + eps`` for ``"batch"`` (Table 13 ablation); stds are
    Bessel-corrected (ddof = 1) and NaN-aware. Unscorable (NaN) rows are left out of the statistics and get 0;
    every row of a degenerate group is set to exactly 0 (a float mean of equal values may be off by an ulp).
    alpha is *not* folded in (apply it with :func:`gpg_loss` or :func:`scale_grad`).
    """
    _check_rewards(rewards)
    if f_norm not in F_NORMS:
        raise ValueError(f"f_norm must be one of {F_NORMS}, got {f_norm!r}.")
    mean, group_std = _nan_mean_std(rewards, dim=1)
    advantages = rewards - mean
    if f_norm == "group":
        advantages = advantages / (group_std + eps)
    elif f_norm == "batch":
        advantages = advantages / (_nan_mean_std(rewards, dim=None)[1] + eps)
    zero = degenerate_groups(rewards, tol=tol)[:, None] | torch.isnan(rewards)
    return torch.where(zero, torch.zeros_like(advantages), advantages)


def _no_grad_rows(rewards: torch.Tensor, tol: float) -> torch.Tensor:
    """``M``'s rows: every row of a degenerate group and unscorable (NaN) rows of the others (docs/methods/gpg.md §6, A7)."""
    return degenerate_groups(rewards, tol=tol)[:, None] | torch.isnan(rewards)


def informative_fraction(rewards: torch.Tensor, *, tol: float = 0.0) -> float:
    """``rho = (B - M) / B`` of a batch, ``M`` counted as :func:`gpg_alpha` counts it, so ``rho = 1 / alpha``
    (before any ``max_alpha`` cap, and for ``M < B``) and ``rho >= beta_th`` is exactly ``alpha <= 1 / beta_th``
    (docs/methods/gpg.md §2.6, P13)."""
    _check_rewards(rewards)
    return 1.0 - int(_no_grad_rows(rewards, tol).sum()) / rewards.numel()


def gpg_alpha(rewards: torch.Tensor, *, tol: float = 0.0, max_alpha: float | None = None) -> float:
    """AGE factor ``alpha = B / (B - M)`` over the global batch (paper Eqs. 7-8, App. A; docs/methods/gpg.md §2.4).

    ``B`` counts completions (rows) and ``M`` the rows that cannot carry gradient: all rows of degenerate
    groups plus unscorable (NaN) rows of the other groups (docs/methods/gpg.md §6). With equal-size groups and no NaN this
    is ``P / (P - P_0)``. ``alpha >= 1``; exactly 1 with no degenerate group, and 1 by convention when every
    row is degenerate (the gradient is zero anyway). ``rewards`` must be the *globally gathered* batch of one
    optimizer step: a per-rank or per-micro-batch alpha is wrong (docs/methods/gpg.md §12 Example 3).
    ``max_alpha`` optionally caps it (not in the paper; off by default).
    """
    _check_rewards(rewards)
    total, dead = rewards.numel(), int(_no_grad_rows(rewards, tol).sum())
    alpha = total / (total - dead) if dead < total else 1.0
    return min(alpha, max_alpha) if max_alpha is not None else alpha


def group_token_weights(mask: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Per-row Eq. 5 weights ``1 / (P * T_q)``, shape ``(N,)`` (docs/methods/gpg.md §3.2).

    ``T_q`` is the number of loss tokens of row's group and ``P`` the number of groups. With these weights
    ``sum_i w_i * sum_t -A_i logp_{i,t} mask_{i,t}`` is Eq. 5 on the full batch, and the same sum restricted to
    any split of rows (ranks, micro-steps) adds up to it exactly. A group without tokens gets weight 0.
    """
    num_rows = mask.shape[0]
    if num_generations < 1 or num_rows % num_generations:
        raise ValueError(f"{num_rows} rows do not split into groups of {num_generations}.")
    num_groups = num_rows // num_generations
    group_tokens = mask.reshape(num_groups, -1).to(torch.float64).sum(dim=1)
    weight = torch.where(group_tokens > 0, 1.0 / (num_groups * group_tokens.clamp(min=1)), 0.0)
    return weight.repeat_interleave(num_generations)


def loss_row_weights(mask: torch.Tensor, num_generations: int, *, normalization: str = "group") -> torch.Tensor:
    """Per-row weights ``w_i`` (float64, ``(N,)``) that make every ``gpg_loss`` aggregation a plain row sum.

    ``gpg_loss(logps, A, mask, G, normalization=n) == sum_i w_i * sum_t -A_i * logp_{i,t} * mask_{i,t}`` with
    ``"group"``: ``1 / (P * T_q)`` (Eq. 5, :func:`group_token_weights`); ``"token"``: ``1 / T_all``;
    ``"sequence"``: ``1 / (N * |o_i|)``. Computed once on the *global* mask of one optimizer step, the weights
    make the loss of any split of the rows (ranks, micro-steps) add up to the full-batch loss (docs/methods/gpg.md §3.2).
    Rows (or groups, or batches) without tokens get weight 0.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}.")
    if normalization == "group":
        return group_token_weights(mask.bool(), num_generations)
    lengths = mask.bool().to(torch.float64).sum(dim=1)
    if normalization == "token":
        total = lengths.sum()
        return torch.where(total > 0, 1.0 / total.clamp(min=1), 0.0).expand_as(lengths).clone()
    return torch.where(lengths > 0, 1.0 / (lengths.numel() * lengths.clamp(min=1)), 0.0)


def gpg_loss(
    per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_generations: int,
    *,
    alpha: float = 1.0,
    normalization: str = "group",
    row_weights: torch.Tensor | None = None,
    token_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """GPG policy-gradient loss, a scalar to minimise (paper Eq. 5 with Eq. 8's alpha; docs/methods/gpg.md §2.3, A1).

    Per token ``-A_i * logp_{i,t}`` (REINFORCE: no ratio, clip, KL or entropy), aggregated by
    ``normalization``:

    * ``"group"`` (Eq. 5): sum over each group's tokens divided by the group's token count ``T_q``, then the mean
      over groups; ``dL/dlogp_{i,t} = -alpha * A_i / (P * T_q)``.
    * ``"token"``: mean over all loss tokens of the batch (TRL's ``"dapo"`` normaliser);
      ``dL/dlogp_{i,t} = -alpha * A_i / T_all``.
    * ``"sequence"``: mean over each completion's tokens, then over completions (the authors' multimodal code).

    Args:
        per_token_logps: ``(N, T)`` log-probabilities of the sampled tokens (differentiable).
        advantages: ``(N,)`` (or per token ``(N, T)``), groups of ``num_generations`` contiguous rows.
        mask: ``(N, T)``, nonzero on completion tokens; masked positions never affect the loss or gradient.
        num_generations: group size ``G``.
        alpha: AGE factor (:func:`gpg_alpha`), multiplies the loss.
        row_weights: ``(N,)`` per-row weights ``w_i`` made once for the whole batch (:func:`loss_row_weights` of its
            global mask); when given, the loss is ``sum_i w_i * sum_t -A_i * logp_{i,t}`` over these rows and
            ``normalization`` is not used, so a trainer's micro-batches and processes add up to the full-batch loss.
        token_scale: ``(N, T)`` or ``(N, 1)`` factors of the per-token loss (e.g. TRL's vLLM importance-sampling
            ratio), or None.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}.")
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    keep = mask.bool()
    zero = torch.zeros_like(per_token_logps)
    per_token = -advantages * per_token_logps
    if token_scale is not None:
        per_token = per_token * token_scale
    # torch.where (not a product with the mask) so non-finite log-probs on padding cannot leak in.
    per_token = torch.where(keep, per_token, zero)
    if row_weights is not None:
        loss = (per_token.sum(dim=1) * row_weights.to(per_token.dtype)).sum()
    elif normalization == "group":
        weights = group_token_weights(keep, num_generations).to(per_token)
        loss = (per_token.sum(dim=1) * weights).sum()
    elif normalization == "token":
        loss = per_token.sum() / keep.sum().clamp(min=1)
    else:
        loss = (per_token.sum(dim=1) / keep.sum(dim=1).clamp(min=1)).mean()
    return alpha * loss


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Identity in the forward pass, multiplies the incoming gradient by ``factor`` in the backward pass.

    The project's way to apply alpha (docs/methods/gpg.md §3.3, "Project decision"): ``scale_grad(loss, alpha)`` logs the
    unscaled loss yet yields exactly ``alpha * grad(loss)``, before any DDP/ZeRO-3 reduction or clipping.
    """
    return _ScaleGrad.apply(x, factor)


def plan_assembly(degenerate: list[torch.Tensor], num_processes: int) -> list[tuple[int, int]]:
    """Which group fills each slot of the assembled generation batch (docs/methods/gpg.md §2.6 step 4, A8, Example 5).

    ``degenerate[k]`` is the global ``(P,)`` degenerate mask of generation round ``k``; process ``r`` generated
    groups ``[r * P / W, (r + 1) * P / W)`` of every round. Each process keeps its informative round-0 groups in
    place, fills its other slots, in order, with its own informative groups of later rounds, in (round, group)
    order, and the slots still left with its own degenerate groups of the *last* round (the filler), so no
    completion moves between processes. Returns ``(round, group)`` per global slot; every process computes the same
    plan from the same gathered masks. With a single round the plan is the identity.
    """
    num_groups = degenerate[0].numel()
    # Python booleans, read from the device once per round (indexing the tensors per group would make every
    # group's test a host-device synchronisation: 2 per group and round on a GPU).
    degenerate = [d.tolist() if isinstance(d, torch.Tensor) else list(d) for d in degenerate]
    per_process = num_groups // num_processes
    last = len(degenerate) - 1
    plan = []
    for rank in range(num_processes):
        mine = range(rank * per_process, (rank + 1) * per_process)
        extra = iter([(k, g) for k in range(1, len(degenerate)) for g in mine if not degenerate[k][g]])
        # Enough filler always: slots without an informative group = per_process - (informative groups of all
        # rounds) <= per_process - (informative groups of the last round) = degenerate groups of the last round.
        filler = iter([(last, g) for g in mine if degenerate[last][g]])
        plan.extend((0, g) if not degenerate[0][g] else next(extra, None) or next(filler) for g in mine)
    return plan


def assemble_rewards(
    rewards: list[torch.Tensor], num_processes: int, *, tol: float = 0.0
) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """The :func:`plan_assembly` plan for rounds with these gathered ``(P, G)`` rewards, and the assembled rewards."""
    plan = plan_assembly([degenerate_groups(r, tol=tol) for r in rewards], num_processes)
    return plan, torch.stack([rewards[k][g] for k, g in plan])


def informative_share(rewards: list[torch.Tensor], num_processes: int, *, tol: float = 0.0) -> float:
    """:func:`informative_fraction` of the batch :func:`plan_assembly` builds from rounds with these rewards."""
    return informative_fraction(assemble_rewards(rewards, num_processes, tol=tol)[1], tol=tol)


# --- The "gpg" advantage estimator (the registry: algorithms/estimators.py) ---


def _validate_gpg_estimator(num_generations: int, **options: Any) -> None:
    option_names_check("gpg", gpg_estimator)(num_generations, **options)
    if options.get("f_norm", "none") not in F_NORMS:
        raise ValueError(f"The 'gpg' estimator's f_norm must be one of {F_NORMS}, got {options['f_norm']!r}.")
    tol = options.get("tol", 0.0)
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol >= 0):
        raise ValueError(f"The 'gpg' estimator's tol must be a finite number >= 0, got {tol!r}.")


@register_estimator("gpg", lambda num_generations, **options: _validate_gpg_estimator(num_generations, **options))
def gpg_estimator(rewards: torch.Tensor, *, f_norm: str = "none", tol: float = 0.0, generator=None) -> torch.Tensor:
    """:func:`gpg_advantages` as the ``gpg`` estimator (``f_norm`` ``"none"`` by default, as in GPG)."""
    return gpg_advantages(rewards, f_norm=f_norm, tol=tol)
