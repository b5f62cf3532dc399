"""CW-GRPO: Gaussian-kernel covariance weights on token advantages (``docs/methods/cw_grpo.md``).

For every valid completion token the per-token covariance term (docs/methods/cw_grpo.md §2.4)

    c = (logp - mean logp) * (A - mean A)

is computed over a statistics scope (one prompt's group by default, or the whole batch). The token's
weight is ``exp(-c^2 / 2 sigma^2)``, where sigma is the population std of the scope's c values. The
weights are then rescaled to mean 1 over the scope, and the trainer multiplies each token's advantage
by its (detached) weight. Nothing else in GRPO changes.

Layout: rows ``[g*G, (g+1)*G)`` hold the G completions of prompt g (TRL's order after gathering).
All statistics are computed in float64 and ignore masked positions, which may hold any value,
including inf or NaN.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["CovarianceStats", "covariance_stats", "covariance_weights"]

SCOPES = ("group", "batch")
ADV_CENTERS = ("token", "sequence")


class CovarianceStats(NamedTuple):
    """Diagnostics of one call, one entry per scope (S = num_prompts for "group", 1 for "batch")."""

    terms: torch.Tensor  # (N, T) float64: c_{i,t}, 0 on padding
    sigma: torch.Tensor  # (S,) kernel bandwidth: the std of c times bandwidth_scale (0 where the std is 0)
    covariance: torch.Tensor  # (S,) mean of c = population Cov(logp, A) over the scope's tokens (token centring)
    num_tokens: torch.Tensor  # (S,) valid tokens in the scope
    degenerate: torch.Tensor  # (S,) bool: the weights fall back to 1 (GRPO)


def _validate(logps, advantages, mask, num_generations, scope, adv_center, std_ddof, bandwidth_scale, eps):
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    if adv_center not in ADV_CENTERS:
        raise ValueError(f"adv_center must be one of {ADV_CENTERS}, got {adv_center!r}")
    if std_ddof not in (0, 1):
        raise ValueError(f"std_ddof must be 0 or 1, got {std_ddof!r}")
    if not bandwidth_scale > 0:
        raise ValueError(f"bandwidth_scale must be > 0 (math.inf allowed: GRPO), got {bandwidth_scale!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if logps.dim() != 2 or mask.shape != logps.shape:
        raise ValueError(f"logps and mask must both be (N, T); got {tuple(logps.shape)} and {tuple(mask.shape)}")
    n, t = logps.shape
    if tuple(advantages.shape) not in ((n,), (n, t)):
        raise ValueError(f"advantages must be (N,) or (N, T) = ({n},) or ({n}, {t}); got {tuple(advantages.shape)}")
    if scope == "group" and (num_generations < 1 or n % num_generations != 0):
        raise ValueError(f"group scope needs N = {n} to be a multiple of num_generations = {num_generations}")


def _scoped_terms(logps, advantages, mask, num_generations, scope, adv_center, std_ddof, bandwidth_scale, eps):
    """The §2.4 steps 1-4 and 7 per scope. Returns (c, valid, n, cov, sigma, degenerate), each (S, ...)."""
    n_rows, t = logps.shape
    valid = mask != 0
    # torch.where, never x * mask: padded positions may hold -inf or NaN (docs/methods/cw_grpo.md §6).
    lp = torch.where(valid, logps.double(), 0.0)
    adv = advantages.double()
    a_tok = torch.where(valid, adv[:, None].expand(n_rows, t) if adv.dim() == 1 else adv, 0.0)

    num_scopes = n_rows // num_generations if scope == "group" else 1
    width = num_generations * t if scope == "group" else n_rows * t
    lp_s, a_s, v_s = lp.reshape(num_scopes, width), a_tok.reshape(num_scopes, width), valid.reshape(num_scopes, width)
    m_s = v_s.double()

    n = m_s.sum(-1)
    nc = n.clamp_min(1)
    lp_bar = lp_s.sum(-1) / nc
    if adv_center == "token":  # token-weighted mean: each token carries its completion's advantage (A2)
        a_bar = a_s.sum(-1) / nc
    else:  # plain mean of the per-completion advantages; completions with no valid token are left out (§6)
        row_n = valid.sum(1).double()
        a_seq = a_tok.sum(1) / row_n.clamp_min(1)  # = A_i for (N,) input or constant (N, T) rows
        has = (row_n > 0).double()
        a_bar = (a_seq * has).reshape(num_scopes, -1).sum(-1) / has.reshape(num_scopes, -1).sum(-1).clamp_min(1)

    c = (lp_s - lp_bar[:, None]) * (a_s - a_bar[:, None]) * m_s
    cov = c.sum(-1) / nc
    var = (((c - cov[:, None]) * m_s) ** 2).sum(-1) / (n - std_ddof).clamp_min(1)
    std = var.sqrt()
    # kappa scales the kernel only; a std of 0 stays 0 (0 * inf would be NaN).
    sigma = torch.where(std > 0, std * bandwidth_scale, 0.0)

    # A scope whose valid log-probs or advantages are all equal has c = 0 exactly; detect it exactly so that
    # rounding in the means cannot turn it into noise-driven weights (e.g. A = 1e9 for every token).
    def constant(x):
        if x.shape[-1] == 0:  # empty batch
            return torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        hi = torch.where(v_s, x, float("-inf")).amax(-1)
        lo = torch.where(v_s, x, float("inf")).amin(-1)
        return hi == lo

    # The degeneracy test (docs/methods/cw_grpo.md §2.4 step 7) is on the std of c itself, before kappa: kappa widens or narrows the
    # kernel of a scope that has a spread, it does not decide whether the scope has one.
    degenerate = (std <= eps) | constant(lp_s) | constant(a_s)
    return c, v_s, n, cov, sigma, degenerate


@torch.no_grad()
def covariance_stats(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_generations: int,
    *,
    scope: str = "group",
    adv_center: str = "token",
    std_ddof: int = 0,
    bandwidth_scale: float = 1.0,
    eps: float = 1e-8,
) -> CovarianceStats:
    """Per-token covariance terms and per-scope statistics behind :func:`covariance_weights` (docs/methods/cw_grpo.md §2.4, §3.2).

    Same arguments as :func:`covariance_weights`. Meant for logging (the trainer's ``cw_grpo/sigma_mean``,
    ``cw_grpo/cov_mean`` and ``cw_grpo/degenerate_frac``) and for tests. ``covariance`` equals Cov(logp, A) over
    the scope's tokens with token centring.
    """
    _validate(logps, advantages, mask, num_generations, scope, adv_center, std_ddof, bandwidth_scale, eps)
    c, _, n, cov, sigma, degenerate = _scoped_terms(
        logps, advantages, mask, num_generations, scope, adv_center, std_ddof, bandwidth_scale, eps
    )
    return CovarianceStats(c.reshape(logps.shape), sigma, cov, n, degenerate)


@torch.no_grad()
def covariance_weights(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_generations: int,
    *,
    scope: str = "group",
    adv_center: str = "token",
    std_ddof: int = 0,
    bandwidth_scale: float = 1.0,
    eps: float = 1e-8,
    normalize: bool = True,
) -> torch.Tensor:
    """CW-GRPO token weights ``w~`` (docs/methods/cw_grpo.md §2.4; defaults are §2.6, the options are §4.1 and §9).

    Args:
        logps: (N, T) log-probs of the sampled tokens under the rollout policy, N = num_prompts * num_generations,
            groups contiguous. Treated as constants.
        advantages: (N,) per-completion advantages, or (N, T) per-token advantages.
        mask: (N, T) bool/0-1, the tokens that enter the loss. Masked positions are ignored, whatever they hold.
        num_generations: G, completions per prompt (used by ``scope="group"`` only).
        scope: ``"group"`` (default, A1): the statistics, sigma and the mean-1 normalisation run over the valid
            tokens of one prompt's G completions; ``"batch"``: over every valid token of the batch.
        adv_center: ``"token"`` (default, A2): mean A = token-weighted mean over the scope's valid tokens;
            ``"sequence"``: plain mean of the per-completion advantages (completions with no valid token excluded).
        std_ddof: 0 (default, A4) = population std of c; 1 = sample std.
        bandwidth_scale: kappa > 0, the kernel uses (kappa * sigma)^2. Not in the paper (ablation only); 1.0 =
            paper; ``math.inf`` gives weight exactly 1 on every valid token (GRPO, the kappa -> inf limit).
        eps: a scope whose std of c (before kappa) is <= eps gets weight 1 on every valid token (A9): all
            advantages equal, a single token, all c identical. Scopes with constant log-probs or constant
            advantages count too.
        normalize: True (default, paper) rescales to mean 1 per scope; False returns the raw kernel values in
            (0, 1] (ablation "without renormalisation", §9).

    Returns:
        (N, T) weights, detached, float32 (float64 if logps or advantages are float64). 0 on padding. Per scope
        with at least one valid token, the valid weights sum to the scope's number of valid tokens.
        Normalisation is done in log space (``N * softmax(-c^2 / 2 sigma^2)``), so it stays finite when every
        raw weight underflows (docs/methods/cw_grpo.md §6, Example 4).
    """
    _validate(logps, advantages, mask, num_generations, scope, adv_center, std_ddof, bandwidth_scale, eps)
    c, valid, n, _, sigma, degenerate = _scoped_terms(
        logps, advantages, mask, num_generations, scope, adv_center, std_ddof, bandwidth_scale, eps
    )
    out_dtype = torch.float64 if torch.float64 in (logps.dtype, advantages.dtype) else torch.float32
    if logps.numel() == 0:
        return torch.zeros(logps.shape, dtype=out_dtype, device=logps.device)
    if math.isinf(bandwidth_scale):  # infinitely wide kernel: every raw weight is exp(0) = 1 (GRPO)
        logw = torch.where(valid, 0.0, float("-inf")).to(c.dtype)
    else:  # degenerate scopes are overwritten below; the others have sigma = kappa * std > 0
        s = torch.where(degenerate, 1.0, sigma)[:, None]
        logw = torch.where(valid, -(c * c) / (2 * s * s), float("-inf"))
    if normalize:
        top = logw.amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, 0.0)  # scope without valid tokens
        e = torch.exp(logw - top)  # the smallest |c| gets exactly 1, so a non-empty sum is >= 1
        w = n[:, None] * e / e.sum(-1, keepdim=True).clamp_min(1.0)
    else:
        w = torch.exp(logw)
    w = torch.where(degenerate[:, None] & valid, 1.0, w)  # degenerate scope -> GRPO
    w = torch.where(valid, w, 0.0)
    return w.reshape(logps.shape).to(out_dtype)
