"""MS-GRPO: multi-scale group-relative advantages (``docs/methods/ms_grpo.md``).

Every completion is standardised against every subgroup of its group with at least ``tau_min`` members
(docs/methods/ms_grpo.md §2.4), the z-scores are averaged within each subgroup size ("scale", §2.5) and the per-scale
averages are mixed with scale weights (§2.6). Three exact engines compute the same numbers:

* **value-class tables** (few distinct rewards, e.g. binary correctness or sums of binary checks): a
  subgroup's statistics depend only on how many copies of each value it holds, so a per-scale average is a
  multivariate-hypergeometric sum over count vectors (§3.2) — polynomial in G, computed for every prompt
  at once by tensor ops (tables of the batch's value set, which a caller-owned :class:`MultiscaleCache` keeps
  across calls: a warm call is a gather), which makes exact MS-GRPO practical at G = 64;
* **enumeration**: every subgroup as a row of a 0/1 membership matrix, statistics for all prompts
  by matrix products (§3.1); refused above ``MAX_ENUMERATED_SUBGROUPS`` subgroups per prompt;
* the **accelerated** scheme (§2.8): dilated scale sampling (``num_scales`` = M) and greedy
  Jaccard-diverse subgroups (``subgroups_per_scale`` = K), both reward-independent and shared by every
  process given the same ``torch.Generator``.

Conventions (docs/methods/ms_grpo.md §11): per-sequence scalar rewards; ``A_i(S) = (r_i - mu_S) / (sigma_S + eps)``;
degenerate subgroups (all rewards equal, detected exactly) contribute 0 and still count; population std
by default. Non-finite rewards (NaN = unscorable) are removed from every subgroup and get advantage 0:
the prompt is treated as the group of its scorable completions (docs/methods/ms_grpo.md §6, optional policy).
"""

from __future__ import annotations

import inspect
import itertools
import math
import numbers
import warnings
from typing import Any

import torch

from .estimators import option_names_check, register_estimator

__all__ = [
    "MULTISCALE_DEFAULTS",
    "MultiscaleCache",
    "diverse_subgroups",
    "draw_scales",
    "dss_intervals",
    "multiscale_advantages",
    "num_subgroups",
    "scale_weights",
    "validate_multiscale_options",
]

WEIGHT_SCHEMES = ("uniform", "global", "local", "flat")
STD_CONVENTIONS = ("population", "sample")
PARTITIONS = ("bottom", "paper")
SELECTIONS = ("greedy", "random")
DRAWS = ("per_group", "per_batch")
METHODS = ("auto", "enumerate", "counts")

# Exact enumeration is refused (method="auto") above this many subgroups per prompt: 2**16 admits
# G <= 16 at tau_min = 2 (65 519 subgroups; seconds per 1024 prompts on one CPU core, G = 12 about 0.2 s);
# G = 17 would need 131 054, and the cost doubles with every further completion.
MAX_ENUMERATED_SUBGROUPS = 2**16
# method="auto" uses value-class tables for a prompt whose rewards have counts n_d per distinct value when
# its count vectors prod(n_d + 1) are at most MAX_COUNT_VECTORS and 8x fewer than its subgroups, and it
# has more than MIN_COUNTS_SUBGROUPS subgroups (below that batched enumeration is cheaper than a table per
# reward pattern). Binary rewards at G = 64 need at most 33**2 = 1089 count vectors instead of 2**64.
MAX_COUNT_VECTORS = 2**16
MIN_COUNTS_SUBGROUPS = 2**10
# Greedy diverse selection runs on all C(G, tau) candidates up to this many, else on a fixed-seed random
# pool of this size (docs/methods/ms_grpo.md §11.9).
GREEDY_POOL_LIMIT = 20_000
_TIE_TOL = 1e-9  # greedy ties (docs/methods/ms_grpo.md §2.8b)


# ----------------------------------------------------------------------------------------------- cache


class MultiscaleCache:
    """Work :func:`multiscale_advantages` can reuse from one call to the next, owned by its caller (a trainer keeps
    one per run; ``algorithms.estimators`` registers it as the ``ms_grpo`` estimator's cache). Without one, every
    call computes everything it needs, so the work a call does never depends on what ran before it.

    Holds: tables of the batches' reward value sets (``value_set_tables``: a dense index over the count vectors
    pointing at rows computed once, least recently used dropped beyond ``max_value_set_tables``), the last value set
    per device (tried first: no sort when the rewards repeat it), and the constant tables of each ``(G, tau)``
    (subgroup membership, greedy-diverse rows, two-valued lookup tables).
    """

    def __init__(self, max_value_set_tables: int = 16):
        self.max_value_set_tables = max_value_set_tables
        self.value_set_tables: dict = {}
        self.last_value_set: dict = {}
        self.constants: dict = {}


def _constant(cache: MultiscaleCache | None, key: tuple, compute):
    """``compute()``, kept in ``cache`` under ``key`` when there is a cache."""
    if cache is None:
        return compute()
    if key not in cache.constants:
        cache.constants[key] = compute()
    return cache.constants[key]


# ----------------------------------------------------------------------------------------------- options


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_choice(name: str, value, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _weights_key(weights) -> str | tuple[float, ...]:
    if isinstance(weights, str):
        return weights
    if isinstance(weights, torch.Tensor):
        weights = weights.flatten().tolist()
    try:
        return tuple(float(w) for w in weights)
    except (TypeError, ValueError):
        raise ValueError(f"weights must be one of {WEIGHT_SCHEMES} or a sequence of floats, got {weights!r}") from None


def _scale_weights(num_generations: int, tau_min: int, key: str | tuple[float, ...]) -> tuple[float, ...]:
    G, R = num_generations, num_generations - tau_min + 1
    taus = range(tau_min, G + 1)
    if key == "uniform":
        w = [1.0] * R
    elif key == "global":
        w = [float(t - tau_min + 1) for t in taus]
    elif key == "local":
        w = [float(G - t + 1) for t in taus]
    elif key == "flat":
        w = [float(math.comb(G - 1, t - 1)) for t in taus]
    elif isinstance(key, str):
        raise ValueError(f"weights must be one of {WEIGHT_SCHEMES} or a sequence of floats, got {key!r}")
    else:
        w = list(key)
        if len(w) != R:
            raise ValueError(
                f"explicit weights need one entry per scale tau = {tau_min}..{G} ({R} entries), got {len(w)}"
            )
        if not all(math.isfinite(v) and v >= 0 for v in w) or sum(w) <= 0:
            raise ValueError(f"explicit weights must be finite, >= 0 and not all zero, got {w}")
    total = sum(w)
    return tuple(v / total for v in w)


def scale_weights(num_generations: int, tau_min: int = 2, weights="uniform") -> torch.Tensor:
    """Scale weights ``w_tau`` for ``tau = tau_min..num_generations`` normalised to sum 1 (docs/methods/ms_grpo.md §2.6), float64.

    "uniform": 1; "global": ``tau - tau_min + 1``; "local": ``G - tau + 1``; "flat": ``C(G-1, tau-1)`` (the
    no-hierarchy ablation); or an explicit sequence of ``G - tau_min + 1`` non-negative floats.
    """
    _check_int("num_generations", num_generations, 1)
    _check_int("tau_min", tau_min, 2)
    if tau_min > num_generations:
        raise ValueError(f"tau_min={tau_min} exceeds num_generations={num_generations}")
    return torch.tensor(_scale_weights(num_generations, tau_min, _weights_key(weights)), dtype=torch.float64)


def _check_weights_shape_free(weights) -> None:
    """The checks on ``weights`` that need no group size: a named scheme, or finite floats >= 0, not all 0."""
    key = _weights_key(weights)
    if isinstance(key, str):
        if key not in WEIGHT_SCHEMES:
            raise ValueError(f"weights must be one of {WEIGHT_SCHEMES} or a sequence of floats, got {key!r}")
    elif not all(math.isfinite(v) and v >= 0 for v in key) or sum(key) <= 0:
        raise ValueError(f"explicit weights must be finite, >= 0 and not all zero, got {list(key)}")


def _validate_group_free(
    *, tau_min, weights, std, eps, num_scales, subgroups_per_scale, partition, selection, draw, method, permute_labels
) -> None:
    """Every check of :func:`validate_multiscale_options` that does not depend on the group size."""
    _check_int("tau_min", tau_min, 2)
    _check_choice("std", std, STD_CONVENTIONS)
    _check_choice("partition", partition, PARTITIONS)
    _check_choice("selection", selection, SELECTIONS)
    _check_choice("draw", draw, DRAWS)
    _check_choice("method", method, METHODS)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite real >= 0, got {eps!r}")
    if num_scales is not None:
        _check_int("num_scales", num_scales, 1)
    if subgroups_per_scale is not None:
        _check_int("subgroups_per_scale", subgroups_per_scale, 1)
    if not isinstance(permute_labels, bool):
        raise ValueError(f"permute_labels must be True or False, got {permute_labels!r}")
    _check_weights_shape_free(weights)


def validate_multiscale_options(
    num_generations: int,
    *,
    tau_min: int = 2,
    weights="uniform",
    std: str = "population",
    eps: float = 1e-6,
    num_scales: int | None = None,
    subgroups_per_scale: int | None = None,
    partition: str = "bottom",
    selection: str = "greedy",
    draw: str = "per_group",
    permute_labels: bool = False,
    method: str = "auto",
) -> None:
    """Raise ``ValueError`` naming what is allowed if the options are invalid for groups of ``num_generations``.

    Needs no rewards, so a trainer config can call it at init. Allowed: ``2 <= tau_min <= num_generations``
    (docs/methods/ms_grpo.md §6: ``G < tau_min`` is a configuration error at init, while :func:`multiscale_advantages` returns zeros
    for such groups at runtime); weights in ``WEIGHT_SCHEMES`` or ``num_generations - tau_min + 1`` finite
    non-negative floats, not all 0; std in ``STD_CONVENTIONS``; finite ``eps >= 0``; ``num_scales`` and
    ``subgroups_per_scale`` None or integers >= 1; partition in ``PARTITIONS``; selection in ``SELECTIONS``; draw
    in ``DRAWS``; ``permute_labels`` a bool; method in ``METHODS``.
    """
    _check_int("num_generations", num_generations, 1)
    _validate_group_free(
        tau_min=tau_min, weights=weights, std=std, eps=eps, num_scales=num_scales,
        subgroups_per_scale=subgroups_per_scale, partition=partition, selection=selection, draw=draw, method=method,
        permute_labels=permute_labels,
    )  # fmt: skip
    if tau_min > num_generations:
        raise ValueError(
            f"tau_min={tau_min} exceeds num_generations={num_generations}; need 2 <= tau_min <= num_generations"
        )
    _scale_weights(num_generations, tau_min, _weights_key(weights))


# ------------------------------------------------------------------------- acceleration (docs/methods/ms_grpo.md §2.8 a, b)


def dss_intervals(num_generations: int, tau_min: int, num_scales: int, partition: str = "bottom") -> list[tuple]:
    """Non-empty scale intervals ``[s, e]`` of dilated scale sampling (docs/methods/ms_grpo.md §2.8a); ``L = ceil(R / M)``.

    "bottom" (default, reproduces the paper's reported subgroup counts): ``s_j = tau_min + (j-1)L``,
    ``e_j = min(tau_min + jL - 1, G)``. "paper" (printed formula): ``e_j = G - (M-j)L``,
    ``s_j = max(tau_min, e_{j-1} + 1)``. Empty intervals are dropped, so there may be fewer than M.
    """
    G, M = num_generations, num_scales
    L = -(-(G - tau_min + 1) // M)
    if partition == "bottom":
        spans = [(tau_min + j * L, min(tau_min + (j + 1) * L - 1, G)) for j in range(M)]
    else:
        ends = [G - (M - j) * L for j in range(1, M + 1)]
        spans = [(tau_min if j == 0 else max(tau_min, ends[j - 1] + 1), ends[j]) for j in range(M)]
    return [(s, e) for s, e in spans if s <= e]


def draw_scales(
    num_prompts: int,
    num_generations: int,
    *,
    tau_min: int = 2,
    num_scales: int | None = None,
    partition: str = "bottom",
    draw: str = "per_group",
    generator: torch.Generator | None = None,
    device=None,
) -> torch.Tensor:
    """Boolean ``(num_prompts, G - tau_min + 1)``: column k is True where scale ``tau_min + k`` is used.

    One scale uniformly from each non-empty DSS interval, independently per prompt ("per_group") or once
    for the batch ("per_batch"); every scale when ``num_scales`` is None. Draws come from ``generator``
    (its device), so every process seeded alike draws the same scales.
    """
    R = num_generations - tau_min + 1
    if num_scales is None:
        return torch.ones(num_prompts, R, dtype=torch.bool, device=device)
    mask = torch.zeros(num_prompts, R, dtype=torch.bool, device=device)
    rows = torch.arange(num_prompts, device=device)
    n = num_prompts if draw == "per_group" else 1
    gen_device = generator.device if generator is not None else device
    for s, e in dss_intervals(num_generations, tau_min, num_scales, partition):
        t = torch.randint(s, e + 1, (n,), generator=generator, device=gen_device).to(device)
        mask[rows, (t - tau_min).expand(num_prompts)] = True
    return mask


def _candidate_pool(G: int, tau: int) -> torch.Tensor:
    """Bool ``[N, G]`` size-``tau`` subsets in lexicographic order: all of them, or a fixed-seed sample (§11.9)."""
    if math.comb(G, tau) <= GREEDY_POOL_LIMIT:
        idx = torch.tensor(list(itertools.combinations(range(G), tau)), dtype=torch.long).reshape(-1, tau)
        return torch.zeros(len(idx), G, dtype=torch.bool).scatter_(1, idx, True)
    warnings.warn(
        f"MS-GRPO diverse subgroups: C({G}, {tau}) = {math.comb(G, tau)} candidate subgroups exceed "
        f"GREEDY_POOL_LIMIT={GREEDY_POOL_LIMIT}, so the greedy Jaccard selection runs on a fixed-seed random pool of "
        f"{GREEDY_POOL_LIMIT} of them (docs/methods/ms_grpo.md §11.9): an approximation of the paper's greedy, outside its G=8 setting.",
        UserWarning,
        stacklevel=2,
    )
    gen = torch.Generator().manual_seed(1_000_003 * G + tau)  # reward-independent, identical on every process
    idx = torch.rand(GREEDY_POOL_LIMIT, G, generator=gen).argsort(1)[:, :tau]
    pool = torch.zeros(GREEDY_POOL_LIMIT + 1, G, dtype=torch.bool)
    pool[0, :tau] = True  # keep the lexicographically first subset, the tie rule's first pick
    pool[1:].scatter_(1, idx, True)
    # descending 0/1 rows (index 0 most significant) == lexicographic order of the index tuples
    return torch.unique(1 - pool.to(torch.uint8), dim=0) == 0


def _greedy_rows(G: int, tau: int, K: int, cache=None) -> torch.Tensor:
    pool = _constant(cache, ("pool", G, tau), lambda: _candidate_pool(G, tau))
    if len(pool) <= K:
        return pool
    members = pool.double()
    score = torch.zeros(len(pool), dtype=torch.float64)
    chosen = torch.zeros(len(pool), dtype=torch.bool)
    picks = []
    for _ in range(K):
        masked = score.masked_fill(chosen, -math.inf)
        pick = int(torch.nonzero(masked >= masked.max() - _TIE_TOL)[0])  # ties -> earliest candidate
        chosen[pick] = True
        picks.append(pick)
        inter = members @ members[pick]
        score += 1.0 - inter / (2 * tau - inter)  # Jaccard distance between equal-size sets
    return pool[picks]


def diverse_subgroups(
    num_generations: int, tau: int, k: int, *, cache: MultiscaleCache | None = None
) -> tuple[tuple[int, ...], ...]:
    """Greedy Jaccard-diverse selection of ``k`` size-``tau`` subgroups (docs/methods/ms_grpo.md §2.8b, Eq. 7-9).

    Each step adds the candidate with the largest summed Jaccard distance to those already chosen; ties
    (within 1e-9) go to the lexicographically earliest, so the first pick is ``(0, ..., tau-1)``. All
    subgroups when ``C(G, tau) <= k``. Depends only on ``(G, tau, k)``, never on rewards; ``cache`` keeps the
    candidate pool and the selection for later calls.
    """
    rows = _constant(cache, ("greedy", num_generations, tau, k), lambda: _greedy_rows(num_generations, tau, k, cache))
    return tuple(tuple(torch.nonzero(r).flatten().tolist()) for r in rows)


def num_subgroups(
    num_generations: int,
    *,
    tau_min: int = 2,
    num_scales: int | None = None,
    subgroups_per_scale: int | None = None,
    partition: str = "bottom",
    weights="uniform",
) -> float:
    """Expected number of subgroups used per prompt (over the scale draw), for logging (docs/methods/ms_grpo.md §2.8d).

    ``sum_tau P(tau drawn) * min(K, C(G, tau))`` over the scales with a positive weight (the estimator skips
    the others); exact count when nothing is random (e.g. 247 for G=8 exhaustive, 25 for G=8, M=4, K=8 bottom
    partition, 49 for DGS only, 1 for weights one-hot on tau=G). 28.5 for G=8, M=4, K=8 with the "paper"
    partition (25 or 32 per draw, each with probability 1/2). 0 when ``G < tau_min`` (no admissible subgroup).
    """
    G, K = num_generations, subgroups_per_scale
    if G < tau_min:
        return 0.0
    w = _scale_weights(G, tau_min, _weights_key(weights))
    if num_scales is None:
        probs = [(tau, 1.0) for tau in range(tau_min, G + 1)]
    else:
        spans = dss_intervals(G, tau_min, num_scales, partition)
        probs = [(tau, 1.0 / (e - s + 1)) for s, e in spans for tau in range(s, e + 1)]
    probs = [(tau, p) for tau, p in probs if w[tau - tau_min] > 0]
    n = (math.comb(G, tau) if K is None else min(K, math.comb(G, tau)) for tau, _ in probs)
    return float(sum(p * c for (_, p), c in zip(probs, n)))


# ----------------------------------------------------------------------------------------- shared helpers


def _binomials(n_max: int) -> torch.Tensor:
    """float64 ``[n_max+1, n_max+1]``, ``C(n, k)`` (exact ints rounded once; 0 for k > n)."""
    rows = [[float(math.comb(n, k)) for k in range(n_max + 1)] for n in range(n_max + 1)]
    return torch.tensor(rows, dtype=torch.float64)


def _all_subsets(G: int, tau: int, device: str = "cpu") -> torch.Tensor:
    idx = torch.tensor(list(itertools.combinations(range(G), tau)), dtype=torch.long).reshape(-1, tau)
    return torch.zeros(len(idx), G, dtype=torch.float64).scatter_(1, idx, 1.0).to(device)


def _value_classes(x: torch.Tensor, finite: torch.Tensor):
    """Per prompt: class of each completion (rank of its distinct value), class counts and class values."""
    B, G = x.shape
    xs, order = torch.where(finite, x, math.inf).sort(dim=1)
    fin = finite.gather(1, order)
    new = fin.clone()
    new[:, 1:] &= xs[:, 1:] != xs[:, :-1]
    cls_sorted = (new.long().cumsum(1) - 1).clamp_min(0)
    slot = torch.where(fin, cls_sorted, G)  # column G collects the unscorable
    counts = torch.zeros(B, G + 1, dtype=torch.long, device=x.device).scatter_add_(1, slot, torch.ones_like(slot))
    values = torch.zeros(B, G + 1, dtype=torch.float64, device=x.device).scatter_(1, slot, torch.where(fin, xs, 0.0))
    cls = torch.empty_like(order).scatter_(1, order, cls_sorted)
    return cls, counts[:, :G], values[:, :G], new.sum(1)


def _row_weights(g_eff: torch.Tensor, G: int, tau_min: int, weights) -> torch.Tensor:
    """``[B, R]`` base weights per prompt, resolved for its number of scorable completions ``g_eff``."""
    R = G - tau_min + 1
    key = _weights_key(weights)
    out = torch.zeros(len(g_eff), R, dtype=torch.float64, device=g_eff.device)
    lo, hi = torch.aminmax(g_eff) if len(g_eff) else (g_eff.new_tensor(0), g_eff.new_tensor(-1))
    one = int(lo) == int(hi)  # usually every completion is scorable: one g, no row selection
    for g in [int(lo)] if one else torch.unique(g_eff).tolist():
        if g < tau_min:
            continue  # no admissible subgroup: advantages 0
        # a named scheme is resolved for the g scorable completions; explicit weights lose the scales > g
        w = (
            _scale_weights(g, tau_min, key)
            if isinstance(key, str)
            else _scale_weights(G, tau_min, key)[: g - tau_min + 1]
        )
        out[slice(None) if one else g_eff == g, : len(w)] = torch.tensor(w, dtype=torch.float64, device=g_eff.device)
    return out


def _grpo_scorable(x, finite, n_cls, std, eps):
    """GRPO advantage over the scorable completions (the fallback of docs/methods/ms_grpo.md §2.8c), 0 for degenerate groups."""
    f = finite.double()
    g = f.sum(1, keepdim=True)
    mu = (x * f).sum(1, keepdim=True) / g.clamp_min(1)
    ss = (((x - mu) * f) ** 2).sum(1, keepdim=True)
    sd = (ss / (g if std == "population" else g - 1).clamp_min(1)).sqrt()
    ok = (n_cls > 1)[:, None] & finite
    return torch.where(ok, (x - mu) / (sd + eps), 0.0)


# ----------------------------------------------------------------------------------- value-class engine


def _class_tables(n: torch.Tensor, v: torch.Tensor, R: int, tau_min: int, std: str, eps: float) -> torch.Tensor:
    """Exact per-scale averages ``[U, R, D]`` for U value patterns at once (docs/methods/ms_grpo.md §3.2):
    pattern u holds ``n[u, d]`` copies of value ``v[u, d]`` (``n = 0``: an absent class, whose column is 0);
    row ``tau - tau_min``, column = value class.

    A subgroup is a count vector ``c`` (``0 <= c_d <= n_d``), enumerated per pattern in mixed radix
    (``prod(n_d + 1)`` of them, padded to the largest in the batch). A member of class d lies in
    ``prod_e C(n_e - [e=d], c_e - [e=d]) = (c_d / n_d) prod_e C(n_e, c_e)`` subgroups with counts c, out of
    ``C(g-1, tau-1)`` of size tau, g = sum(n). Single-valued subgroups are degenerate: they contribute 0.
    """
    U, D = n.shape
    out = torch.zeros(U, R, D, dtype=torch.float64, device=n.device)
    if U == 0:
        return out
    radix = n + 1
    size = radix.prod(1)
    stride = torch.cumprod(torch.cat([torch.ones_like(radix[:, :1]), radix[:, :-1]], 1), 1)
    g = n.sum(1)
    binom = _binomials(int(g.max())).to(n.device)
    step = max(1, 2**21 // (int(size.max()) * D))  # patterns per chunk: [u, P, D] tensors of ~2M entries
    for a in range(0, U, step):
        r = slice(a, a + step)
        k = torch.arange(int(size[r].max()), device=n.device)
        c = torch.div(k[None, :, None], stride[r, None, :], rounding_mode="floor") % radix[r, None, :]  # [u, P, D]
        tau = c.sum(-1)
        ok = (k[None, :] < size[r, None]) & (tau >= tau_min) & ((c > 0).sum(-1) > 1)
        cf, tf, vr = c.double(), tau.double().clamp_min(1), v[r, None, :]
        dev = vr - ((cf * vr).sum(-1) / tf)[..., None]  # two passes: mean, then deviations
        var = (cf * dev * dev).sum(-1) / (tf if std == "population" else (tf - 1).clamp_min(1))
        ways = binom[n[r, None, :], c].prod(-1) / binom[g[r, None] - 1, (tau - 1).clamp_min(0)]
        w = torch.where(ok, ways / (var.sqrt() + eps), 0.0)  # where, not *: degenerate var + eps may be 0
        contrib = dev * w[..., None] * cf / n[r, None, :].clamp_min(1)
        row = (tau - tau_min).clamp(0, R - 1)[..., None].expand_as(contrib)
        out[r].scatter_add_(1, row, contrib)
    return out


def _anchored(values: torch.Tensor, present: torch.Tensor, eps: float) -> torch.Tensor:
    """Values as differences to the present value of smallest magnitude (shift-invariant, and no difference
    between two values is rounded away, as a shift by the smallest value would for {-1e20, 0, 1e-6}), also
    divided by the spread when eps = 0 (scale-free, §10 P5); a row per pattern, absent classes anything."""
    mag = torch.where(present, values.abs(), math.inf)
    out = values - values.gather(-1, mag.argmin(-1, keepdim=True))
    if eps == 0:
        hi = torch.where(present, values, -math.inf).amax(-1, keepdim=True)
        lo = torch.where(present, values, math.inf).amin(-1, keepdim=True)
        out = out / torch.where(hi > lo, hi - lo, 1.0)
    return out


_GLOBAL_GRID_MAX = 2**20  # (G + 1) ** (distinct values in the batch) count-vector slots at most


def _global_tables(
    N: torch.Tensor, V: torch.Tensor, R: int, tau_min: int, std: str, eps: float, cache: MultiscaleCache | None
) -> torch.Tensor:
    """``[B, R, D]`` tables for counts ``N`` ``[B, D]`` over one batch-wide value set ``V`` ``[D]``: a dense index over
    the ``(G+1)^D`` count vectors points at rows computed once (kept in ``cache`` across calls, so a warm call is two
    gathers); missing patterns are computed together by :func:`_class_tables`."""
    B, D = N.shape
    G = int(N.sum(1).max())
    key = (G, R, D, tau_min, std, eps, str(V.device), tuple(V.tolist()))
    entry = cache.value_set_tables.pop(key, None) if cache is not None else None
    if entry is None:
        entry = (torch.full(((G + 1) ** D,), -1, dtype=torch.long, device=V.device),
                 torch.zeros(0, R, D, dtype=torch.float64, device=V.device))  # fmt: skip
    index, table = entry
    radix = torch.tensor([(G + 1) ** k for k in range(D)], device=N.device)
    flat = (N * radix).sum(1)
    slot = index.index_select(0, flat)
    missing = slot < 0
    if bool(missing.any()):
        new = torch.unique(flat[missing])
        n_new = torch.div(new[:, None], radix, rounding_mode="floor") % (G + 1)
        vkey = _anchored(V[None], torch.ones(1, D, dtype=torch.bool, device=V.device), eps)[0]
        rows = _class_tables(n_new, vkey.expand(len(new), D), R, tau_min, std, eps)
        index[new] = torch.arange(len(table), len(table) + len(new), device=N.device)
        table = torch.cat([table, rows])
        slot = index.index_select(0, flat)
    if cache is not None:
        cache.value_set_tables[key] = (index, table)  # most recently used last
        while len(cache.value_set_tables) > cache.max_value_set_tables:
            cache.value_set_tables.pop(next(iter(cache.value_set_tables)))
    return table.index_select(0, slot)


def _classes_of(x, finite, V):
    """``(cls, ok)``: index of each reward in the sorted value set ``V`` (one comparison per value; arbitrary
    where unscorable) and whether every finite reward is in ``V``."""
    cls = torch.zeros(x.shape, dtype=torch.uint8 if len(V) < 256 else torch.long, device=x.device)
    for v in V[1:].tolist():
        cls += x >= v
    cls = cls.long()
    return cls, bool(((V.take(cls) == x) | ~finite).all())


def _batch_value_set(x, finite, cache: MultiscaleCache | None):
    """``(V, cls)``: the batch's distinct finite rewards and each reward's index in them, when one table set can
    serve every prompt: few enough for a dense index over ``(G+1)^D`` count vectors, and well
    separated, so that one set of anchored differences rounds no gap noticeably (<= 2^-42 relative when every
    gap is >= 2^-10 of the largest magnitude); otherwise None and each pattern keeps its own anchor
    (docs/methods/ms_grpo.md §3.2). With a cache, the last batch's value set is tried first."""
    G = x.shape[1]
    key = str(x.device)
    V = cache.last_value_set.get(key) if cache is not None else None
    if V is not None:  # the common case in training: the same reward levels as the last batch
        cls, ok = _classes_of(x, finite, V)
        if ok and len(V) * math.log2(G + 1) <= math.log2(
            _GLOBAL_GRID_MAX
        ):  # a subset of V: its gaps are no smaller, the same tables serve (absent classes have count 0)
            return V, cls
    V = torch.unique(x[finite])
    D = len(V)
    if D < 2 or D * math.log2(G + 1) > math.log2(_GLOBAL_GRID_MAX):
        return None
    if float((V[1:] - V[:-1]).min()) < 2**-10 * float(V.abs().max()):
        return None
    if cache is not None:
        cache.last_value_set[key] = V
    return V, _classes_of(x, finite, V)[0]


def _counts_engine(x, finite, W, cls, counts, values, n_cls, tau_min, std, eps, V=None, cache=None):
    """Exact mix for prompts whose rewards take few distinct values (docs/methods/ms_grpo.md §3.2), vectorised
    over prompts. With a batch value set ``V`` (``cls`` then indexes it and ``counts`` ``[b, D]`` counts it),
    every prompt's counts index one table set (kept in ``cache``); otherwise each distinct (counts, anchored values) pattern
    of the batch is tabulated, all in one batched computation."""
    R = W.shape[1]
    if V is not None:
        tables = _global_tables(counts, V, R, tau_min, std, eps, cache)
        return (tables * W[..., None]).sum(1).gather(1, cls) * finite
    D = int(n_cls.max())
    n, v = counts[:, :D], values[:, :D]
    v = torch.where(n > 0, _anchored(v, n > 0, eps), 0.0)
    uniq, inv = torch.unique(torch.cat([n.double(), v], 1), dim=0, return_inverse=True)
    tables = _class_tables(uniq[:, :D].long(), uniq[:, D:], R, tau_min, std, eps)
    per_class = torch.einsum("br,brd->bd", W, tables[inv])
    return per_class.gather(1, cls.clamp(max=D - 1)) * finite


def _two_valued_table(G: int, delta: float, tau_min: int, std: str, eps: float, w: tuple, device: str):
    """``[G+1, 2]``: mixed advantage of (lower, upper) value when ``P`` of G rewards take the upper one."""
    p = torch.arange(1, G)
    n = torch.stack([G - p, p], 1)
    v = torch.tensor([0.0, 1.0 if eps == 0 else delta], dtype=torch.float64).expand(G - 1, 2)  # §10 P5 if eps = 0
    tables = _class_tables(n, v, len(w), tau_min, std, eps)
    table = torch.zeros(G + 1, 2, dtype=torch.float64)
    table[1:G] = torch.einsum("r,prd->pd", torch.tensor(w, dtype=torch.float64), tables)
    return table.to(device)


def _two_valued_fast(rewards, w: tuple, tau_min, std, eps, cache=None):
    """Exact MS advantages when every prompt has at most two distinct finite rewards (binary correctness),
    as a table lookup by the number of upper values; None when the batch is not of that kind."""
    B, G = rewards.shape
    first = rewards[0]  # cheap early exit for a batch whose first prompt already has three distinct values
    if bool(((first != first.min()) & (first != first.max())).any()):
        return None
    lo, hi_val = torch.aminmax(rewards, dim=1, keepdim=True)
    hi = rewards == hi_val
    if not bool((hi | (rewards == lo)).all()):
        return None
    delta = (hi_val - lo).squeeze(1).double()
    deltas = torch.unique(delta[delta > 0])
    if not bool(torch.isfinite(deltas).all()) or len(deltas) > 8:
        return None
    dtype = rewards.dtype
    if len(deltas) == 0:
        return torch.zeros(B, G, dtype=dtype, device=rewards.device)
    dev = str(rewards.device)
    tables = [
        _constant(
            cache,
            ("two_valued", G, d, tau_min, std, eps, w, dev),
            lambda d=d: _two_valued_table(G, d, tau_min, std, eps, w, dev),
        )
        for d in deltas.tolist()
    ]
    n_hi = hi.sum(1)
    if len(tables) == 1:  # the usual case: one reward gap in the whole batch
        vals = tables[0][n_hi]
    else:  # rows with delta 0 have n_hi = G, whose table row is 0 in every table
        which = torch.searchsorted(deltas, delta).clamp(max=len(tables) - 1)
        vals = torch.stack(tables)[which, n_hi]
    vals = vals.to(dtype)
    return torch.where(hi, vals[:, 1:], vals[:, :1])


# ----------------------------------------------------------------------------------------- subset engine


def _subset_scales(xc, x, ids, bad, members, tau, std, eps):
    """Sums of ``A_i(S)`` over the given subgroups containing i, per scale, and their numbers:
    ``([b, J, G], [b or 1, J, G])``. ``xc``: the rewards centred on their group mean; ``x``: as given.

    ``members``: 0/1 float64 ``[J, n, G]`` (shared) or ``[b, J, n, G]`` (per prompt): n subgroups of size
    ``tau`` (``[J]`` or ``[b, J]``) per scale, all-zero padding rows being inert. Subgroups holding an
    unscorable completion are skipped; degeneracy is exact (integer class ids).
    """
    b, G = xc.shape
    J, n = members.shape[-3], members.shape[-2]
    if members.dim() == 3:
        flat = members.reshape(J * n, G)
        fwd = lambda f: (f @ flat.T).unflatten(-1, (J, n))  # noqa: E731
        back = lambda s: torch.einsum("bjn,jng->bjg", s, members)  # noqa: E731
    else:
        fwd = lambda f: torch.einsum("...bg,bjng->...bjn", f, members)  # noqa: E731
        back = lambda s: torch.einsum("bjn,bjng->bjg", s, members)  # noqa: E731
    t = tau[..., None]  # [J, 1] or [b, J, 1], against statistics [b, J, n]
    s1, s2, i1, i2 = fwd(torch.stack([xc, xc * xc, ids, ids * ids])).unbind(0)
    keep = i2.mul_(t).sub_(i1.mul_(i1)) > 0.5  # spread of integer class ids, exact: False = degenerate
    if bad is None:  # every completion scorable: every subgroup is valid
        cnt = members.sum(-2).expand(1, J, G) if members.dim() == 3 else members.sum(-2)
    else:
        valid = fwd(bad) == 0
        keep &= valid
        cnt = back(valid.double())
    mu = s1.div_(t)
    meansq = s2.div_(t)
    var = meansq - mu * mu  # one pass: loses digits when the subgroup's spread is tiny next to its offset ...
    fragile = keep & (var <= 1e-4 * meansq)  # ... so those few subgroups are redone in two passes below
    keep &= ~fragile
    if std == "sample":
        var.mul_(t / (t - 1))
    sd = var.clamp_min_(0).sqrt_()
    inv = torch.where(keep, sd.add_(eps).reciprocal_(), 0.0)  # where, not *: 1/0 * 0 would be NaN
    # sum_{S containing i} (x_i - mu_S) * inv_S, as two products instead of a [b, N, G] tensor (docs/methods/ms_grpo.md §3.1)
    out = xc[:, None, :] * back(inv) - back(mu.mul_(inv))
    if bool(fragile.any()):
        bi, ji, ni = fragile.nonzero(as_tuple=True)
        m = members[ji, ni] if members.dim() == 3 else members[bi, ji, ni]  # [F, G]
        tf = (tau[ji] if tau.dim() == 1 else tau[bi, ji])[:, None]
        # Two passes on the rewards as given, shifted by one member's value: the group-mean centring of ``xc``
        # rounds away a subgroup's spread when its rewards are tiny next to others in the group (1e-6 and 1e20).
        xf, on = x[bi], m > 0
        y = torch.where(on, xf - xf.gather(1, m.argmax(1, keepdim=True)), 0.0)
        dev = torch.where(on, y - y.sum(1, keepdim=True) / tf, 0.0)
        var_f = (dev * dev).sum(1, keepdim=True) / (tf if std == "population" else tf - 1)
        out.index_put_((bi, ji), dev / (var_f.sqrt() + eps), accumulate=True)
    return out, cnt


def _stack(blocks):
    """Pad member matrices ``[..., n_j, G]`` of several scales to one ``[..., J, n, G]`` (zero rows are inert)."""
    n = max(m.shape[-2] for m in blocks)
    return torch.stack([torch.nn.functional.pad(m, (0, 0, 0, n - m.shape[-2])) for m in blocks], dim=-3)


def _subset_engine(x, finite, W, cls, n_cls, tau_min, std, eps, groups):
    """Mix per-scale averages over given subgroups, with coverage-aware renormalisation (docs/methods/ms_grpo.md §2.8c): a
    scale where i lies in no subgroup is dropped for i; none left -> GRPO advantage.

    ``groups`` yields ``(scale, members)``: ``scale`` a LongTensor ``[J]`` of scale indices (``tau - tau_min``)
    shared by every prompt with ``members`` ``[J, n, G]``, or ``[B, J]`` per prompt with ``[B, J, n, G]``.
    """
    B, G = x.shape
    f = finite.double()
    xc = (x - (x * f).sum(1, keepdim=True) / f.sum(1, keepdim=True).clamp_min(1)) * f  # centring: conditioning
    ids = cls.double() * f
    bad = None if bool(finite.all()) else 1.0 - f
    num = torch.zeros(B, G, dtype=torch.float64, device=x.device)
    den = torch.zeros_like(num)
    for scale, members in groups:
        per_row = scale.dim() == 2
        w = W.gather(1, scale) if per_row else W[:, scale]  # [B, J]
        tau = (scale + tau_min).double()
        step = max(1, 2**17 // (members.shape[-3] * members.shape[-2]))  # row chunks that stay in cache
        for a in range(0, B, step):
            r = slice(a, a + step)
            m, t = (members[r], tau[r]) if per_row else (members, tau)
            s, cnt = _subset_scales(xc[r], x[r], ids[r], None if bad is None else bad[r], m, t, std, eps)
            wk = w[r, :, None] * (cnt > 0)
            num[r] += (wk * s / cnt.clamp_min(1)).sum(1)
            den[r] += wk.sum(1)
    out = num / den.clamp_min(1e-300)
    fallback = (den == 0) & finite & (f.sum(1, keepdim=True) >= tau_min)
    if bool(fallback.any()):
        out = torch.where(fallback, _grpo_scorable(x, finite, n_cls, std, eps), out)
    return out


# ------------------------------------------------------------------------------------------ dispatch


def _exact_advantages(x, finite, W, *, tau_min, std, eps, method, cache=None):
    """Per prompt, weights ``W`` mixed over the exact per-scale averages; engine chosen per prompt."""
    B, G = x.shape
    found = _batch_value_set(x, finite, cache) if method != "enumerate" else None
    V = None
    if found is None:
        cls, counts, values, n_cls = _value_classes(x, finite)
    else:  # classes of the batch value set (distinct integer ids per distinct value, as the engines need)
        V, cls = found
        counts = torch.zeros(B, len(V), dtype=torch.long, device=x.device).scatter_add_(1, cls, finite.long())
        values = None
        n_cls = (counts > 0).sum(1)
    g_eff = finite.sum(1)
    live = (n_cls > 1) & (g_eff >= tau_min)  # others: all equal or too few scorable -> 0
    n_enum = (_binomials(G).to(x.device).index_select(0, g_eff)[:, tau_min:] * (W > 0)).sum(
        1
    )  # subgroups at the used scales
    n_vectors = torch.exp(torch.log1p(counts.double()).sum(1))  # count vectors prod(n_d + 1)
    if method == "auto":
        few = (n_vectors <= MAX_COUNT_VECTORS) & (8 * n_vectors <= n_enum) & (n_enum > MIN_COUNTS_SUBGROUPS)
        use_counts = live & few
        too_big = live & ~use_counts & (n_enum > MAX_ENUMERATED_SUBGROUPS)
        if bool(too_big.any()):
            raise ValueError(
                f"exact MS-GRPO for rewards that are not few-valued would enumerate {int(n_enum[too_big].max())} "
                f"subgroups per prompt (G={G}, tau_min={tau_min}; limit MAX_ENUMERATED_SUBGROUPS="
                f"{MAX_ENUMERATED_SUBGROUPS}). Set num_scales (M) and subgroups_per_scale (K) for the accelerated "
                f"scheme (paper: M=4, K=8), or raise tau_min."
            )
    else:
        use_counts = live & (method == "counts")
    out = torch.zeros(B, G, dtype=torch.float64, device=x.device)
    r = use_counts
    if B > 0 and bool(r.all()):  # the usual few-valued batch: no row selection
        Wn = W / W.sum(1, keepdim=True).clamp_min(1e-300)
        out = _counts_engine(x, finite, Wn, cls, counts, values, n_cls, tau_min, std, eps, V, cache)
    elif bool(r.any()):
        Wn = W[r] / W[r].sum(1, keepdim=True).clamp_min(1e-300)
        vals = None if values is None else values[r]
        out[r] = _counts_engine(x[r], finite[r], Wn, cls[r], counts[r], vals, n_cls[r], tau_min, std, eps, V, cache)
    if bool(r.any()):
        empty = r & (W.sum(1) == 0)  # no weight left at this prompt's scales: GRPO fallback (§2.8c)
        if bool(empty.any()):
            out[empty] = _grpo_scorable(x[empty], finite[empty], n_cls[empty], std, eps)
    r = live & ~use_counts
    if bool(r.any()):
        used = torch.nonzero((W[r] > 0).any(0)).flatten().tolist()
        groups = _enumeration_groups(G, tau_min, used, x.device, cache)
        out[r] = _subset_engine(x[r], finite[r], W[r], cls[r], n_cls[r], tau_min, std, eps, groups)
    return out


def _subsets(cache, G: int, tau: int, device) -> torch.Tensor:
    return _constant(cache, ("subsets", G, tau, str(device)), lambda: _all_subsets(G, tau, str(device)))


def _enumeration_groups(G, tau_min, used, device, cache=None):
    """Every subgroup of each used scale; scales with few subgroups are padded together into one pass."""
    batch = []
    for k in used:
        m = _subsets(cache, G, tau_min + k, device)
        if batch and (len(batch) + 1) * max(len(m), *(len(b) for _, b in batch)) > 256:
            yield torch.tensor([j for j, _ in batch], device=device), _stack([b for _, b in batch])
            batch = []
        batch.append((k, m))
    if batch:
        yield torch.tensor([j for j, _ in batch], device=device), _stack([b for _, b in batch])


def _diverse_advantages(x, finite, W, K, selection, generator, *, tau_min, std, eps, cache=None):
    """Per-scale averages over K greedy-diverse (or random) subgroups at each drawn scale (docs/methods/ms_grpo.md §2.8b, c).

    Each prompt gathers only its own drawn scales' subgroups, so the work is ``B * M * K * G``."""
    B, G = x.shape
    cls, _, _, n_cls = _value_classes(x, finite)
    live = (n_cls > 1) & (finite.sum(1) >= tau_min)
    out = torch.zeros(B, G, dtype=torch.float64, device=x.device)
    if not bool(live.any()):
        return out
    x, finite, W, cls, n_cls = x[live], finite[live], W[live], cls[live], n_cls[live]
    n, R = len(x), W.shape[1]
    used = (W > 0).any(0).tolist()
    empty = torch.zeros(0, G, dtype=torch.float64, device=x.device)

    def members(k):  # [n_k, G] shared, or [n, n_k, G] per prompt (random selection)
        tau = tau_min + k
        if not used[k]:
            return empty
        if selection == "greedy" or math.comb(G, tau) <= K:
            rows = _constant(cache, ("greedy", G, tau, K), lambda: _greedy_rows(G, tau, K, cache))
            return rows.to(device=x.device, dtype=torch.float64)
        return _random_rows(G, tau, K, n, generator, x.device, cache)

    blocks = [members(k) for k in range(R)]
    if any(m.dim() == 3 for m in blocks):
        blocks = [m.expand(n, -1, -1) if m.dim() == 2 else m for m in blocks]
    stacked = _stack(blocks)  # [R, n_max, G] or [n, R, n_max, G]
    mask = W > 0
    J = int(mask.sum(1).max())
    scale = torch.sort(mask.int(), dim=1, descending=True, stable=True).indices[:, :J]  # [n, J] drawn scales
    rows = torch.arange(n, device=x.device)[:, None]
    groups = [(scale, stacked[scale] if stacked.dim() == 3 else stacked[rows, scale])] if J else []
    out[live] = _subset_engine(x, finite, W, cls, n_cls, tau_min, std, eps, groups)
    return out


def _random_rows(G: int, tau: int, K: int, n: int, generator, device, cache=None) -> torch.Tensor:
    """``[n, K', G]`` uniformly random size-``tau`` subgroups per prompt (the paper's random-K ablation):
    K distinct ones when ``C(G, tau)`` is enumerable, otherwise K independent draws (repeats possible but
    vanishingly rare, probability < K^2 / (2 * GREEDY_POOL_LIMIT))."""
    gen_dev = generator.device if generator is not None else device
    N = math.comb(G, tau)
    if N <= GREEDY_POOL_LIMIT:
        pool = _subsets(cache, G, tau, device)
        pick = torch.rand(n, N, generator=generator, device=gen_dev).topk(min(K, N), dim=1).indices.to(device)
        return pool[pick]
    idx = torch.rand(n, K, G, generator=generator, device=gen_dev).argsort(-1)[..., :tau].to(device)
    return torch.zeros(n, K, G, dtype=torch.float64, device=device).scatter_(-1, idx, 1.0)


def _rescale_extreme(rewards: torch.Tensor, eps: float) -> tuple[torch.Tensor, float]:
    """Divide float64 rewards and eps by one power of two when the largest finite |reward| is above 2**500
    (squares would overflow: NaN advantages at 1e300) or below 2**-500 (squares underflow). Exact, and every
    z-score ``(r - mu) / (sigma + eps)`` is unchanged by it; a no-op in the usual range."""
    finite = rewards[torch.isfinite(rewards)]
    if finite.numel() == 0:
        return rewards, eps
    top = float(finite.abs().max())
    if top == 0 or 2.0**-500 <= top <= 2.0**500:
        return rewards, eps
    exponent = math.frexp(top)[1]  # top = m * 2**exponent with 0.5 <= m < 1
    return rewards * math.ldexp(1.0, -exponent), math.ldexp(eps, -exponent)


# ---------------------------------------------------------------------------------------------- public


def multiscale_advantages(
    rewards: torch.Tensor,
    *,
    tau_min: int = 2,
    weights="uniform",
    std: str = "population",
    eps: float = 1e-6,
    num_scales: int | None = None,
    subgroups_per_scale: int | None = None,
    partition: str = "bottom",
    generator: torch.Generator | None = None,
    selection: str = "greedy",
    draw: str = "per_group",
    permute_labels: bool = False,
    method: str = "auto",
    cache: MultiscaleCache | None = None,
) -> torch.Tensor:
    """MS-GRPO advantages ``(num_prompts, G)`` for rewards ``(num_prompts, G)`` (docs/methods/ms_grpo.md §2.4-2.6, §2.8).

    Exact (every subgroup of size >= ``tau_min``) when ``num_scales`` and ``subgroups_per_scale`` are None;
    otherwise accelerated: ``num_scales`` = M dilated scale draws (``partition`` "bottom" | "paper", one
    draw per prompt or per batch), ``subgroups_per_scale`` = K subgroups per drawn scale chosen greedily
    Jaccard-diverse (``selection="greedy"``) or uniformly at random ("random", the
    paper's ablation); ``permute_labels`` shuffles completion labels per prompt first (accelerated mode only:
    the exact estimator is permutation-equivariant). Randomness comes from ``generator`` only.

    Groups too small for any subgroup (``G < tau_min``, e.g. ``G = 1``) get zeros (docs/methods/ms_grpo.md §6); the other options
    are still checked. :func:`validate_multiscale_options`, for configs, rejects such a ``G``.

    ``method`` (exact mode): "auto" uses value-class tables when rewards take few distinct values and
    enumeration otherwise, and raises ``ValueError`` if general rewards would need more than
    ``MAX_ENUMERATED_SUBGROUPS`` subgroups per prompt; "counts" / "enumerate" force one engine.
    Non-finite rewards are unscorable: excluded from every subgroup, advantage 0. Float64 inside; returns
    the rewards' dtype. ``cache`` (a :class:`MultiscaleCache` the caller keeps) lets later calls reuse tables; the
    result is the same with or without one.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_prompts, num_generations), got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    B, G = rewards.shape
    _validate_group_free(
        tau_min=tau_min, weights=weights, std=std, eps=eps, num_scales=num_scales,
        subgroups_per_scale=subgroups_per_scale, partition=partition, selection=selection, draw=draw, method=method,
        permute_labels=permute_labels,
    )  # fmt: skip
    # No admissible subgroup (docs/methods/ms_grpo.md §3.1, §6: G < tau_min and G = 1 give zeros at runtime).
    if G < tau_min:
        return torch.zeros_like(rewards)
    w = _scale_weights(G, tau_min, _weights_key(weights))  # the one check that needs G: explicit weights' length
    eps, dtype = float(eps), rewards.dtype
    if dtype == torch.float64:  # float32/16 rewards cannot leave the safe range once cast to float64
        rewards, eps = _rescale_extreme(rewards, eps)
    accelerated = num_scales is not None or subgroups_per_scale is not None
    if not accelerated and method != "enumerate" and B > 0:
        fast = _two_valued_fast(rewards, w, tau_min, std, eps, cache)
        if fast is not None:
            return fast

    x = rewards.double()
    finite = torch.isfinite(x)
    x = torch.where(finite, x, 0.0)
    perm = None
    if permute_labels and accelerated:  # exact mode is permutation-equivariant: nothing to do there
        gen_dev = generator.device if generator is not None else x.device
        perm = torch.rand(B, G, generator=generator, device=gen_dev).argsort(1).to(x.device)
        x, finite = x.gather(1, perm), finite.gather(1, perm)
    drawn = draw_scales(B, G, tau_min=tau_min, num_scales=num_scales, partition=partition, draw=draw,
                        generator=generator, device=x.device)  # fmt: skip
    W = _row_weights(finite.sum(1), G, tau_min, weights) * drawn  # [B, R]; 0 at undrawn scales
    opts = dict(tau_min=tau_min, std=std, eps=eps, cache=cache)
    if subgroups_per_scale is None:
        out = _exact_advantages(x, finite, W, method=method, **opts)
    else:
        out = _diverse_advantages(x, finite, W, subgroups_per_scale, selection, generator, **opts)
    if perm is not None:
        out = torch.empty_like(out).scatter_(1, perm, out)
    return out.to(dtype)


# The options' defaults, stated once: multiscale_advantages's signature. MSGRPOConfig's fields take theirs from here,
# and tests/test_ms_grpo_algorithm.py checks that the other functions' keyword defaults agree.
MULTISCALE_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(multiscale_advantages).parameters.items()
    if parameter.kind is parameter.KEYWORD_ONLY and name not in ("generator", "method", "cache")
}


# --- The "ms_grpo" advantage estimator (the registry: algorithms/estimators.py) ---


def _validate_multiscale_estimator(num_generations: int, **options: Any) -> None:
    option_names_check("ms_grpo", multiscale_advantages)(num_generations, **options)
    validate_multiscale_options(num_generations, **options)


@register_estimator("ms_grpo", _validate_multiscale_estimator, sampled=True, new_cache=MultiscaleCache)
def ms_grpo_estimator(rewards: torch.Tensor, *, generator=None, cache=None, **options: Any) -> torch.Tensor:
    """:func:`multiscale_advantages` as the ``ms_grpo`` estimator (a run keeps one ``MultiscaleCache``)."""
    return multiscale_advantages(rewards, generator=generator, cache=cache, **options)
