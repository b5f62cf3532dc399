"""D3S: dynamic dual-level down-sampling (``docs/methods/d3s.md``).

Two filters sit between the advantages and the policy loss; the advantages themselves are never recomputed:

* sample level (§2.3): keep the rollouts whose full-group advantages have the largest variance, pooled over the
  batch by default (:func:`select_rollouts`, solver :func:`max_variance_subset`);
* token level (§2.4): inside the kept rollouts, only the top ``ceil(K * n)`` tokens by ``|A| * H`` get gradient
  (:func:`token_keep_mask`), and the loss averages over the kept tokens (:func:`masked_token_loss`, §2.6).

Both sizes follow a linear curriculum over training (:func:`schedule`, §2.5). Flat rollout index = ``b*G + i``.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "LOSS_NORMALIZATIONS",
    "UNIT_WEIGHT_NORMALIZATIONS",
    "chunk_count_table",
    "default_samples_start",
    "loss_denominator",
    "masked_token_loss",
    "max_variance_subset",
    "normalization_weights",
    "planned_kept_tokens",
    "schedule",
    "select_rollouts",
    "token_keep_mask",
    "step_counts",
    "token_keep_mask_in_rollout_order",
    "token_keep_mask_over_parts",
]

SELECTION_SCOPES = ("pooled", "group")
TOKEN_SCOPES = ("batch", "sequence")
LOSS_NORMALIZATIONS = (
    "token_mean_kept",  # default: sum over kept tokens / |T|
    "literal_eq10",  # paper Eq. 10: additionally / |S^| (number of rollouts passed in)
    "seq_mean_kept",  # mean over each rollout's kept tokens, then mean over rollouts with a kept token
    "seq_mean_kept_all",  # same, rollouts without a kept token count as 0
    "mask_only_seq",  # mask only, GRPO denominators: mean over each rollout's valid tokens, mean over rollouts
    "mask_only_token",  # mask only, global denominator: sum over kept tokens / all valid tokens
)

# Tie tolerances of the subset solver (§2.3 step 3). Both are relative to the pool's own scale, so the choice is
# invariant to multiplying the values by c > 0 (§10 property 9).
_VAR_RTOL = 1e-9  # variances within a relative 1e-9 of the best tie ...
_VAR_SCALE_ATOL = 1e-10  # ... or within 1e-10 * (max |value - pool mean|)^2 (prefix-sum rounding)
_MEAN_RTOL = 1e-9  # subset means within 1e-9 * max |value| tie


def _max_variance_rows(values: torch.Tensor, k: int) -> torch.Tensor:
    """Row-wise exact solver of §2.3: values (R, n) -> bool keep-mask (R, n) with min(k, n) True per row.

    Some optimum is a bottom block plus a top block of the sorted row, so every split j (j values from the top,
    k - j from the bottom) is scored with prefix sums: O(n log n). Tie rule: variance within tolerance of the best,
    then smallest |subset mean|, then smallest j. k = 1 (every singleton has variance 0) applies the same rule over
    all singletons: the value closest to 0, the negative one on a tie, then the lowest index.
    """
    rows, n = values.shape
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k >= n:
        return torch.ones(rows, n, dtype=torch.bool, device=values.device)
    if k == 0 or rows == 0:
        return torch.zeros(rows, n, dtype=torch.bool, device=values.device)
    v = values.double()
    mean_tol = _MEAN_RTOL * v.abs().amax(1, keepdim=True)
    if k == 1:
        a = v.abs()
        near = a <= a.amin(1, keepdim=True) + mean_tol
        lowest = torch.where(near, v, float("inf")).amin(1, keepdim=True)
        first = (near & (v == lowest)).int().argmax(1)  # argmax returns the first (lowest) index
        return torch.nn.functional.one_hot(first, n).bool()

    sorted_v, order = torch.sort(v, dim=1, stable=True)  # ascending; equal values keep index order
    mu = v.mean(1, keepdim=True)
    s = sorted_v - mu  # shift for conditioning; variance is shift-invariant, means are shifted back
    zero = s.new_zeros(rows, 1)
    c1 = torch.cat([zero, s.cumsum(1)], 1)
    c2 = torch.cat([zero, (s * s).cumsum(1)], 1)
    j = torch.arange(k + 1, device=v.device)  # number taken from the top
    s1 = c1[:, k - j] + c1[:, n : n + 1] - c1[:, n - j]
    s2 = c2[:, k - j] + c2[:, n : n + 1] - c2[:, n - j]
    mean = s1 / k
    var = (s2 / k - mean * mean).clamp_min(0)

    best = var.amax(1, keepdim=True)
    scale2 = (s * s).amax(1, keepdim=True)
    tied = var >= best - (_VAR_RTOL * best + _VAR_SCALE_ATOL * scale2)
    abs_mean = torch.where(tied, (mean + mu).abs(), float("inf"))
    ok = tied & (abs_mean <= abs_mean.amin(1, keepdim=True) + mean_tol)
    j_star = torch.where(ok, j, k + 1).amin(1, keepdim=True)

    pos = torch.arange(n, device=v.device)
    keep_sorted = (pos < k - j_star) | (pos >= n - j_star)
    return torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)


def max_variance_subset(values: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending indices of the k-subset of a 1-D tensor whose values have the largest variance (docs/methods/d3s.md §2.3).

    Exact, O(n log n): a stable ascending sort, then every split "k - j smallest + j largest" scored with prefix
    sums. Ties (common with binary rewards) follow §11 #2: variance within a relative 1e-9 of the best, then the
    smallest |subset mean|, then the smallest j; among equal values the bottom block takes the lowest indices and
    the top block the highest. k >= n returns every index, k = 0 none; k = 1 returns the value closest to 0
    (docs/methods/d3s.md §2.5 clamps the schedule to k >= 2, where this never arises). Variance = population variance; for a fixed
    k the choice of ddof does not change the argmax.
    """
    if values.dim() != 1:
        raise ValueError(f"values must be 1-D, got shape {tuple(values.shape)}")
    keep = _max_variance_rows(values[None], int(k))[0]
    return keep.nonzero().squeeze(1)


def select_rollouts(
    advantages: torch.Tensor,
    num_generations: int,
    k: int,
    *,
    scope: str = "pooled",
    drop_degenerate_groups: bool = False,
    eligible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample-level D3S selection: sorted flat indices ``b*G + i`` of the kept rollouts (docs/methods/d3s.md §2.3, §3).

    Args:
        advantages: (N,) full-group advantages, N = num_prompts * G, groups contiguous, or (num_prompts, G).
            They are only read; the kept rollouts keep these values (no re-standardisation).
        num_generations: G.
        k: N_s, rollouts kept per prompt (on average, for "pooled").
        scope: ``"pooled"`` (default, the paper's cross-group D3S): one max-variance subset of size
            ``k * num_prompts`` over all rollouts of the batch (all devices), so a prompt can keep 0..G rollouts;
            ``"group"`` (D3S-I / D1S): a max-variance subset of size k inside each group.
        drop_degenerate_groups: ``"group"`` scope only (§11 #13, default off as in the paper): a group whose
            advantages are all equal keeps no rollout.
        eligible: (N,) bool or None (all). Rollouts marked False (completions masked out of the loss, e.g. truncated
            ones) count in the group statistics but take no slot (docs/methods/d3s.md §6): the subset is drawn from the
            eligible ones, at most as many as there are.
    """
    if scope not in SELECTION_SCOPES:
        raise ValueError(f"scope must be one of {SELECTION_SCOPES}, got {scope!r}")
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    adv = advantages.reshape(-1)
    if advantages.dim() not in (1, 2) or adv.numel() % num_generations != 0:
        raise ValueError(f"advantages must be (N,) or (N/G, G) with G = {num_generations}; got {advantages.shape}")
    if advantages.dim() == 2 and advantages.shape[1] != num_generations:
        raise ValueError(f"advantages of shape {tuple(advantages.shape)} do not have G = {num_generations} columns")
    num_prompts = adv.numel() // num_generations
    if eligible is not None and not bool(eligible.all()):
        return _select_eligible(adv, num_generations, k, scope, drop_degenerate_groups, eligible)
    if scope == "pooled":
        if drop_degenerate_groups:
            raise ValueError("drop_degenerate_groups is only defined for scope='group' (docs/methods/d3s.md §11 #13)")
        keep = _max_variance_rows(adv[None], int(k) * num_prompts)[0]
    else:
        groups = adv.reshape(num_prompts, num_generations)
        keep = _max_variance_rows(groups, int(k))
        if drop_degenerate_groups:
            keep &= groups.amax(1, keepdim=True) > groups.amin(1, keepdim=True)
        keep = keep.reshape(-1)
    return keep.nonzero().squeeze(1)


def _select_eligible(advantages, num_generations, k, scope, drop_degenerate_groups, eligible) -> torch.Tensor:
    num_prompts = advantages.numel() // num_generations
    if scope == "pooled":
        pool = eligible.nonzero().squeeze(1)
        return pool[max_variance_subset(advantages[pool], min(int(k) * num_prompts, pool.numel()))]
    kept = []
    for b in range(num_prompts):
        group = advantages[b * num_generations : (b + 1) * num_generations]
        if drop_degenerate_groups and bool(group.max() == group.min()):
            continue
        pool = eligible[b * num_generations : (b + 1) * num_generations].nonzero().squeeze(1)
        kept.append(pool[max_variance_subset(group[pool], min(int(k), pool.numel()))] + b * num_generations)
    return torch.cat(kept) if kept else advantages.new_zeros(0, dtype=torch.long)


def default_samples_start(num_generations: int) -> int:
    """N_init when the user sets none: G/4 rounded half up, the paper's 8 of 32 (docs/methods/d3s.md §4.1)."""
    return max(2, math.floor(num_generations / 4 + 0.5))


def planned_kept_tokens(valid_counts: torch.Tensor, keep_ratio: float) -> torch.Tensor:
    """Kept-token count of ``token_keep_mask`` for scopes of ``valid_counts`` tokens: ``min(n, max(1, ceil(K n)))``.

    The same expression as the algorithm (docs/methods/d3s.md §2.4: ``ceil(K n - 1e-9)``, at least 1, at most n; 0
    for n = 0), so the loss denominator can be fixed before the entropies are known.
    """
    n = valid_counts.double()
    return torch.minimum(torch.ceil(keep_ratio * n - 1e-9).clamp_min(1), n)


def schedule(
    step: int,
    total_steps: int,
    *,
    num_generations: int,
    samples_start: int = 8,
    samples_end: int = 32,
    token_ratio_start: float = 0.05,
    token_ratio_end: float = 0.20,
) -> tuple[int, float]:
    """The linear D3S curriculum (docs/methods/d3s.md §2.5, paper Eq. 9): ``(rollouts kept per prompt N_s, token keep ratio K)``.

    ``p = clamp(step / total_steps, 0, 1)``; ``N_s = clamp(round_half_up((1-p)*samples_start + p*samples_end),
    2, num_generations)``; ``K = (1-p)*token_ratio_start + p*token_ratio_end`` (not rounded). ``step`` is the
    optimizer step at which the batch is generated. ``total_steps <= 0`` means the planned training is already
    over, so p = 1. With ``num_generations = 1`` the sample count is 1 (the cap wins over the floor of 2).
    """
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    for name, r in (("token_ratio_start", token_ratio_start), ("token_ratio_end", token_ratio_end)):
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {r}")
    p = 1.0 if total_steps <= 0 else min(max(step / total_steps, 0.0), 1.0)
    n_real = (1.0 - p) * samples_start + p * samples_end
    n_s = min(num_generations, max(2, math.floor(n_real + 0.5 + 1e-9)))  # half up, not banker's rounding
    ratio = (1.0 - p) * token_ratio_start + p * token_ratio_end
    ratio = min(max(ratio, min(token_ratio_start, token_ratio_end)), max(token_ratio_start, token_ratio_end))
    return n_s, ratio


@torch.no_grad()
def token_keep_mask(
    advantages: torch.Tensor,
    entropies: torch.Tensor,
    mask: torch.Tensor,
    keep_ratio: float,
    *,
    scope: str = "batch",
    min_keep: int = 1,
) -> torch.Tensor:
    """Token-level D3S selection: the top ``ceil(K * n)`` valid tokens by ``|A| * H`` (docs/methods/d3s.md §2.4).

    Args:
        advantages: (N,) per-rollout or (N, T) per-token advantages of the kept rollouts.
        entropies: (N, T) next-token entropies H (selection key only; no gradient).
        mask: (N, T) bool/0-1 valid completion tokens; padding is never kept and may hold any value.
        keep_ratio: K in [0, 1].
        scope: ``"batch"`` (default, §11 #4): one ranking over every valid token of the batch;
            ``"sequence"``: a separate top-K inside each rollout.
        min_keep: floor on the count of a non-empty scope. The documented count (docs/methods/d3s.md §2.4) is
            ``min(n, max(1, ceil(K*n - 1e-9)))`` (n = valid tokens in the scope; the 1e-9 absorbs float artefacts
            such as 0.07 * 100); the floor only matters for K = 0, and ``min_keep=0`` keeps nothing there.

    Returns:
        (N, T) bool. Exactly that many tokens per scope; ties in score go to the earliest (row, position).
    """
    if scope not in TOKEN_SCOPES:
        raise ValueError(f"scope must be one of {TOKEN_SCOPES}, got {scope!r}")
    if not 0.0 <= keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in [0, 1], got {keep_ratio}")
    if min_keep < 0:
        raise ValueError(f"min_keep must be >= 0, got {min_keep}")
    if entropies.dim() != 2 or mask.shape != entropies.shape:
        raise ValueError(f"entropies and mask must be (N, T); got {tuple(entropies.shape)} and {tuple(mask.shape)}")
    n_rows, t = entropies.shape
    if tuple(advantages.shape) not in ((n_rows,), (n_rows, t)):
        raise ValueError(f"advantages must be ({n_rows},) or ({n_rows}, {t}); got {tuple(advantages.shape)}")
    valid = mask != 0
    adv = advantages.double()
    score = (adv[:, None] if adv.dim() == 1 else adv).abs() * entropies.double()

    rows, width = (1, n_rows * t) if scope == "batch" else (n_rows, t)
    valid_s = valid.reshape(rows, width)
    # Ascending sort of -score with padding at +inf: valid tokens by descending score, ties by flat index
    # (= (row, position)) thanks to the stable sort.
    key = torch.where(valid_s, -score.reshape(rows, width), float("inf"))
    order = torch.sort(key, dim=1, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(width, device=order.device).expand(rows, width))
    n = valid_s.sum(1)
    n_keep = torch.ceil(keep_ratio * n.double() - 1e-9).long()
    n_keep = torch.minimum(n_keep.clamp_min(min_keep), n)
    return ((rank < n_keep[:, None]) & valid_s).reshape(n_rows, t)


def token_keep_mask_in_rollout_order(
    advantages: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor, rollout_index: torch.Tensor, ratio: float
) -> torch.Tensor:
    """``token_keep_mask(scope="batch")`` over rows in any order, ties broken by (global rollout index, position)
    (docs/methods/d3s.md §2.4): the rows are ranked in ``rollout_index`` order (padding rows, index -1, have no valid
    token), then put back."""
    order = torch.sort(rollout_index, stable=True).indices
    keep = torch.empty_like(mask, dtype=torch.bool)
    keep[order] = token_keep_mask(advantages[order], entropies[order], mask[order], ratio, scope="batch")
    return keep


def token_keep_mask_over_parts(parts: list[tuple[torch.Tensor, ...]], ratio: float) -> torch.Tensor:
    """:func:`token_keep_mask_in_rollout_order` over the rows of several parts (each ``(advantages, entropies, mask,
    rollout_index)``, widths may differ), ranked together: the parts' rows stacked in order, each right-padded with
    zeros (no valid token) to the widest part."""
    width = max(part[1].size(1) for part in parts)

    def stacked(i):
        pieces = [p[i] if p[i].dim() == 1 else torch.nn.functional.pad(p[i], (0, width - p[i].size(1))) for p in parts]
        return torch.cat(pieces)

    return token_keep_mask_in_rollout_order(stacked(0), stacked(1), stacked(2), stacked(3), ratio)


# Normalisations whose per-token weight is 1 on the kept tokens (their loss value is the D3S loss itself).
UNIT_WEIGHT_NORMALIZATIONS = ("token_mean_kept", "literal_eq10", "mask_only_token")


def loss_denominator(normalization: str, valid_tokens, kept_tokens, num_rollouts):
    """D, the denominator of one optimizer step's loss ``sum w * l / D`` (docs/methods/d3s.md §2.6): the
    normalisation's own for the unit-weight ones, |T| (kept tokens) for the per-rollout ones (whose factors go into
    :func:`normalization_weights`)."""
    return {"literal_eq10": kept_tokens * num_rollouts, "mask_only_token": valid_tokens}.get(
        normalization, kept_tokens
    )


def chunk_count_table(
    valid: list[torch.Tensor], kept: list[torch.Tensor | None], rollout_index: list[torch.Tensor]
) -> torch.Tensor:
    """The ``(chunks, 4)`` float64 count table of one process's micro-steps: valid tokens, kept tokens, rollouts (rows
    whose ``rollout_index`` is not -1) and rollouts with a kept token, from each chunk's per-row valid and kept
    token counts (``kept`` None: not known before the loss call, counted as 0)."""
    rows = []
    for valid_counts, kept_counts, index in zip(valid, kept, rollout_index):
        kept_counts = torch.zeros_like(valid_counts) if kept_counts is None else kept_counts
        rollouts = (index >= 0).sum().double()
        rows.append(torch.stack([valid_counts.sum(), kept_counts.sum(), rollouts, (kept_counts > 0).sum().double()]))
    return torch.stack(rows)


def step_counts(table: torch.Tensor, calls: list[int], normalization: str) -> tuple[torch.Tensor, ...]:
    """``(D, kept tokens, rollouts, rollouts with a kept token)`` of one optimizer step made of the micro-steps
    ``calls`` (rows of the ``(chunks, 4)`` count table: valid tokens, kept tokens, rollouts, rollouts with a kept token
    or -1 where only the loss call knows it; -1 then for the step too). D is :func:`loss_denominator`'s."""
    valid_tokens, kept_tokens, num_rollouts, rows_with_tokens = table[calls].sum(0)
    # torch.where, not an if: no host-device sync in every loss call.
    rows_with_tokens = torch.where((table[calls, 3] < 0).any(), -1.0, rows_with_tokens)
    denominator = loss_denominator(normalization, valid_tokens, kept_tokens, num_rollouts)
    return denominator, kept_tokens, num_rollouts, rows_with_tokens


def normalization_weights(
    keep: torch.Tensor, valid: torch.Tensor, normalization: str, *, kept_tokens, num_rollouts, rows_with_tokens
) -> torch.Tensor:
    """Per-token gradient weights ``w = D * omega`` of rows ``keep`` / ``valid`` (R, T) (docs/methods/d3s.md §2.6),
    ``omega`` the normalisation's weight in ``sum omega * l`` over the optimizer step, whose counts are ``kept_tokens``
    (|T|), ``num_rollouts`` (|S|) and ``rows_with_tokens`` (rollouts with a kept token, for ``seq_mean_kept``)."""
    if normalization in UNIT_WEIGHT_NORMALIZATIONS:
        return keep.float()
    kept_per_row = keep.sum(1, keepdim=True).double()
    if normalization == "mask_only_seq":  # (1 / |y_i|) / |S|
        row = valid.sum(1, keepdim=True).double().clamp_min(1) * num_rollouts
    elif normalization == "seq_mean_kept_all":  # (1 / |T_i|) / |S|
        row = kept_per_row.clamp_min(1) * num_rollouts
    else:  # seq_mean_kept: (1 / |T_i|) / #{i: T_i not empty}
        row = kept_per_row.clamp_min(1) * rows_with_tokens
    return (keep.double() * kept_tokens / row.clamp_min(1)).float()


def masked_token_loss(
    per_token_loss: torch.Tensor,
    keep_mask: torch.Tensor,
    mask: torch.Tensor,
    *,
    normalization: str = "token_mean_kept",
) -> torch.Tensor:
    """Aggregate a per-token loss over the kept tokens T (docs/methods/d3s.md §2.6 and §11 #6; Example 4 has the numbers).

    Args:
        per_token_loss: (N, T) loss to minimise per token (e.g. minus the clipped surrogate plus beta * KL; the KL
            is masked too, Eq. 10). Rows are the kept rollouts S^. Values outside ``keep_mask & mask`` are ignored
            and get zero gradient, even if they are inf or NaN.
        keep_mask, mask: (N, T) bool/0-1: the token-level selection and the valid completion tokens.
        normalization: one of ``LOSS_NORMALIZATIONS``:
            ``"token_mean_kept"`` (default): sum over T / |T|;
            ``"literal_eq10"``: sum over T / (|T| * |S^|), |S^| = N;
            ``"seq_mean_kept"``: mean over each T_i, then mean over the rollouts with a non-empty T_i;
            ``"seq_mean_kept_all"``: the same, but averaged over all N rollouts (empty T_i count as 0);
            ``"mask_only_seq"``: tokens outside T zeroed, GRPO denominators (each rollout's valid-token count,
            then mean over rollouts);
            ``"mask_only_token"``: tokens outside T zeroed, divided by the number of valid tokens.

    Returns:
        A scalar. Empty denominators count as 1, so no kept token gives 0 (with a zero gradient), never NaN.
        Counts are local to the tensors passed: a trainer that splits a batch into micro-batches must rescale
        by its global counts.
    """
    if normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {LOSS_NORMALIZATIONS}, got {normalization!r}")
    if per_token_loss.dim() != 2 or keep_mask.shape != per_token_loss.shape or mask.shape != per_token_loss.shape:
        raise ValueError("per_token_loss, keep_mask and mask must all be (N, T)")
    valid = mask != 0
    kept = (keep_mask != 0) & valid
    x = torch.where(kept, per_token_loss, torch.zeros_like(per_token_loss))
    kept_f, valid_f = kept.to(x.dtype), valid.to(x.dtype)
    num_rows = max(x.shape[0], 1)
    if normalization == "token_mean_kept":
        return x.sum() / kept_f.sum().clamp_min(1)
    if normalization == "literal_eq10":
        return x.sum() / (kept_f.sum().clamp_min(1) * num_rows)
    if normalization in ("seq_mean_kept", "seq_mean_kept_all"):
        per_row = x.sum(1) / kept_f.sum(1).clamp_min(1)
        if normalization == "seq_mean_kept_all":
            return per_row.sum() / num_rows
        return per_row.sum() / kept.any(1).to(x.dtype).sum().clamp_min(1)
    if normalization == "mask_only_seq":
        return (x.sum(1) / valid_f.sum(1).clamp_min(1)).sum() / num_rows
    return x.sum() / valid_f.sum().clamp_min(1)  # mask_only_token
