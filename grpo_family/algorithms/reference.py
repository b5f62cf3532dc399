"""Readable reference implementations: each method's definition written out with plain Python loops over the
subgroups, tokens or scopes it names, in float64 / Python floats.

They are slow on purpose: no vectorisation, no tables, no caches, so that a reader can check them against the
method's document line by line. The tests hold the fast implementations of the other modules to these
(``tests/test_ms_grpo_algorithm.py``, ``test_cw_grpo_algorithm.py``, ``test_d3s_algorithm.py``,
``test_sgpo_algorithm.py``); use them the same way when you change a method's maths.
"""

from __future__ import annotations

import itertools
import math
import statistics

import torch

__all__ = [
    "covariance_weights_reference",
    "group_advantages_reference",
    "multiscale_advantages_reference",
    "token_keep_mask_reference",
]


def group_advantages_reference(rewards: list[list[float]], ddof: int = 1, eps: float = 1e-4) -> list[list[float]]:
    """GRPO's group advantage per prompt (docs/methods/sgpo.md §2.8): NaN rewards are left out of the mean and std and
    get 0; a group with fewer than 2 scorable rewards, or no spread, gets 0. ``rewards``: one list per prompt."""
    out = []
    for row in rewards:
        valid = [r for r in row if not math.isnan(r)]
        if len(valid) < 2:
            out.append([0.0] * len(row))
            continue
        mean = sum(valid) / len(valid)
        std = math.sqrt(sum((r - mean) ** 2 for r in valid) / (len(valid) - ddof))
        out.append([0.0 if math.isnan(r) or std == 0 else (r - mean) / (std + eps) for r in row])
    return out


def multiscale_advantages_reference(
    rewards: list[float], tau_min: int = 2, weights: list[float] | None = None, std: str = "population",
    eps: float = 1e-6,
) -> list[float]:  # fmt: skip
    """MS-GRPO's exact advantage of one prompt's ``G`` rewards (docs/methods/ms_grpo.md §3.1): for every scale
    ``tau = tau_min..G`` and every subgroup of that size, each member's z-score in the subgroup (0 in a subgroup of
    equal rewards, which still counts); a completion's per-scale value is the mean over the ``C(G-1, tau-1)``
    subgroups that hold it; the scales are mixed with ``weights`` (uniform by default)."""
    G = len(rewards)
    weights = weights or [1.0 / (G - tau_min + 1)] * (G - tau_min + 1)
    out = [0.0] * G
    for k, tau in enumerate(range(tau_min, G + 1)):
        acc = [0.0] * G
        for subgroup in itertools.combinations(range(G), tau):
            values = [rewards[j] for j in subgroup]
            if len(set(values)) == 1:
                continue  # degenerate: contributes 0 but counts in the denominator
            mu = statistics.fmean(values)
            sd = statistics.pstdev(values) if std == "population" else statistics.stdev(values)
            for j in subgroup:
                acc[j] += (rewards[j] - mu) / (sd + eps)
        for j in range(G):
            out[j] += weights[k] * acc[j] / math.comb(G - 1, tau - 1)
    return out


def covariance_weights_reference(
    logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, num_generations: int, *, scope: str = "group",
    adv_center: str = "token", std_ddof: int = 0, bandwidth_scale: float = 1.0, normalize: bool = True,
) -> torch.Tensor:  # fmt: skip
    """CW-GRPO's token weights (docs/methods/cw_grpo.md §2.4, steps 1-7) over the valid tokens of each scope (a group
    of ``num_generations`` rows, or the batch): the covariance term ``c = (logp - mean logp)(A - mean A)``, its std
    ``sigma``, the Gaussian kernel ``exp(-c^2 / 2 (kappa sigma)^2)``, rescaled to mean 1 per scope; weight 1 on a
    scope with no spread. ``(N, T)`` float64, 0 off the mask."""
    lp, m = logps.tolist(), mask.tolist()
    n_rows, t_len = len(lp), len(lp[0]) if lp else 0
    adv = advantages.tolist()

    def a(i, t):
        return adv[i] if advantages.dim() == 1 else adv[i][t]

    g = num_generations
    scopes = [list(range(s, s + g)) for s in range(0, n_rows, g)] if scope == "group" else [list(range(n_rows))]
    out = [[0.0] * t_len for _ in range(n_rows)]
    for rows in scopes:
        toks = [(i, t) for i in rows for t in range(t_len) if m[i][t]]
        n = len(toks)
        if n == 0:
            continue
        l_bar = math.fsum(lp[i][t] for i, t in toks) / n
        if adv_center == "token":
            a_bar = math.fsum(a(i, t) for i, t in toks) / n
        else:
            per_row = []
            for i in rows:
                ts = [t for t in range(t_len) if m[i][t]]
                if ts:
                    per_row.append(math.fsum(a(i, t) for t in ts) / len(ts))
            a_bar = math.fsum(per_row) / len(per_row)
        c = {(i, t): (lp[i][t] - l_bar) * (a(i, t) - a_bar) for i, t in toks}
        c_bar = math.fsum(c.values()) / n
        std = math.sqrt(math.fsum((x - c_bar) ** 2 for x in c.values()) / max(n - std_ddof, 1))
        constant = len({lp[i][t] for i, t in toks}) == 1 or len({a(i, t) for i, t in toks}) == 1
        if std <= 1e-8 or constant or math.isinf(bandwidth_scale):  # degenerate, or an infinitely wide kernel
            for i, t in toks:
                out[i][t] = 1.0
            continue
        sigma = std * bandwidth_scale
        logw = {k: -(x * x) / (2 * sigma * sigma) for k, x in c.items()}
        top = max(logw.values())
        e = {k: math.exp(x - top) if normalize else math.exp(x) for k, x in logw.items()}
        total = math.fsum(e.values())
        for (i, t), x in e.items():
            out[i][t] = n * x / total if normalize else x
    return torch.tensor(out, dtype=torch.float64) if out else torch.zeros(0, t_len, dtype=torch.float64)


def token_keep_mask_reference(
    advantages: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor, ratio: float, scope: str,
    min_keep: int = 1,
) -> torch.Tensor:  # fmt: skip
    """D3S's token filter (docs/methods/d3s.md §2.4): in each scope (the batch, or each sequence) the
    ``min(n, max(min_keep, ceil(ratio * n)))`` valid tokens with the largest ``|A| x entropy``, ties to the earlier
    (row, position). ``advantages`` ``(N,)`` or ``(N, T)``; a bool ``(N, T)``."""
    n_rows, t = entropies.shape
    a = advantages[:, None].expand(n_rows, t) if advantages.dim() == 1 else advantages
    keep = torch.zeros(n_rows, t, dtype=torch.bool)
    scopes = [[(i, j) for i in range(n_rows) for j in range(t)]] if scope == "batch" else []
    if scope == "sequence":
        scopes = [[(i, j) for j in range(t)] for i in range(n_rows)]
    for cells in scopes:
        valid = [(i, j) for i, j in cells if mask[i, j]]
        n = len(valid)
        n_keep = min(n, max(min_keep, math.ceil(ratio * n - 1e-9)))
        ranked = sorted(valid, key=lambda c: (-(abs(a[c].item()) * entropies[c].item()), c[0], c[1]))
        for c in ranked[:n_keep]:
            keep[c] = True
    return keep
