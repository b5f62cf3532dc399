"""Property tests (hypothesis) for every public function of ``grpo_family/algorithms/`` at the numeric edges.

The per-method test files check the specs' worked numbers and brute-force references at ordinary magnitudes.
This file throws random shapes at every function together with the inputs that break float arithmetic: ties,
all-equal groups, all-zero groups, huge (1e30) and tiny (1e-30) values, values of both sizes in one group,
float32 and float64, and NaN (= unscorable) wherever the contract accepts it. Each test asserts the shape and
dtype, finiteness (or NaN exactly where the contract puts it) and the documented invariants
(``docs/methods/<method>.md``, sections "Testable properties" and "Edge cases").

| module | function | properties tested here |
|---|---|---|
| grpo | ``group_advantages`` | shape/dtype; finite; NaN -> 0; all-equal group -> exactly 0; equals a float64 reference (TRL's maths) for scale group/batch/none, ddof 0/1; zero-sum per group; ``|A| <= (n-1)/sqrt(n)`` (ddof 1); ``A(a*r; eps=a*eps) = A(r; eps)`` for a = 1e-30..1e30; shift invariance; permutation equivariance |
| grpo | ``nanstd`` | equals a float64 reference at every magnitude; NaN where count <= ddof; exactly 0 for equal values; keepdim / dim=None shapes |
| grpo | ``is_constant`` | equals "at most one distinct non-NaN value" per row and over the whole tensor |
| grpo | ``zero_std_mask`` | bool, shape; True on every all-equal group, False where the reference std > 1e-6 |
| grpo | ``normalize_then_sum_advantages`` | shape/dtype; finite; all-NaN completion -> 0; batch mean 0; invariant to scaling each reward function by 1e-30..1e30 |
| ms_grpo | ``multiscale_advantages`` | exact and accelerated: shape/dtype; finite; NaN -> 0; all-equal or < tau_min scorable -> 0; zero-sum (exact); ties -> equal advantages; permutation equivariance (exact); weak order preservation; counts engine == enumeration; ``A(a*r; a*eps) = A(r; eps)``; shift invariance; same generator -> same output; regression: float64 1e300 rewards |
| ms_grpo | ``scale_weights`` | float64, length G - tau_min + 1, non-negative, sum 1; each scheme's shape (uniform flat, global increasing, local decreasing, flat ~ C(G-1, tau-1), explicit proportional) |
| ms_grpo | ``validate_multiscale_options`` | raises ValueError exactly when ``multiscale_advantages`` does, over valid and invalid options, except G < tau_min (rejected; the function returns zeros) |
| ms_grpo | ``dss_intervals`` | a partition of tau_min..G into at most M sorted intervals of length <= ceil(R/M) |
| ms_grpo | ``draw_scales`` | bool (B, R); one drawn scale inside each interval per prompt; per_batch rows equal; all True without M; reproducible |
| ms_grpo | ``diverse_subgroups`` | min(k, C(G, tau)) distinct sorted size-tau tuples, first (0..tau-1), deterministic |
| ms_grpo | ``num_subgroups`` | equals the interval/binomial formula and the size of ``diverse_subgroups``; <= the exhaustive count |
| cw_grpo | ``covariance_weights`` | shape; dtype rule; finite; 0 on (garbage-filled) padding; >= 0; valid weights sum to the valid-token count per scope; detached; raw kernel in [0, 1]; affine invariance ``w(a l + b, k A + d; eps * abs(a k)) = w(l, A; eps)`` for a, k from 1e-30 to 1e30 and sign flips; permutation equivariance in a group |
| cw_grpo | ``covariance_stats`` / ``CovarianceStats`` | field shapes; terms finite and 0 on padding; token counts; covariance = mean term; sigma >= 0; degenerate on constant advantages and <= 1 token; degenerate -> weights 1 |
| d3s | ``max_variance_subset`` | sorted unique indices, size min(k, n); variance = brute-force maximum at every magnitude; same indices after scaling by 1e-30 / 1e30; permutation leaves the chosen variance unchanged |
| d3s | ``select_rollouts`` | pooled size min(k*B, N), group size min(k, G) per group; (N,) and (B, G) inputs agree; drop_degenerate_groups drops exactly the all-equal groups |
| d3s | ``schedule`` | N_s an int in [min(2, G), G]; ratio between its endpoints; monotone in step, for huge / negative steps and total_steps <= 0 |
| d3s | ``token_keep_mask`` | bool, inside the mask; the documented count per scope; every kept score >= every unkept valid score; padding garbage ignored |
| d3s | ``masked_token_loss`` | finite scalar with NaN/inf outside the kept tokens; zero gradient there; equals a loop reference per normalisation; linear in the loss (1e-30..1e30) |
| sgpo | ``is_failure`` | True exactly for a float NaN |
| sgpo | ``trajectory_score`` | (k-1)/K in [0, 1), 1 for None, NaN for a failure, 0 for K = 0; increasing in k |
| sgpo | ``vote_first_error`` | result is a cast vote (or NaN when all failed); unanimity wins; extra failures change nothing |
| sgpo | ``partial_credit`` | shape/dtype; NaN exactly where RTS is NaN; in [0, 1) for beta, gamma from 1e-30 to 1e30; non-decreasing in RTS; linear mode = RTS capped below 1 |
| sgpo | ``groups_to_judge`` | (B,) bool; all_negative = no correct answer, all_incorrect = some incorrect, the first inside the second |
| sgpo | ``sgpo_rewards`` | shape, default dtype; 1 for correct, 0/1 outside judged groups; judged incorrect in [0, 1) or NaN exactly on a failed verdict; through ``group_advantages``: finite, zero-sum, NaN -> 0 |
| gpg | ``degenerate_groups`` / ``count_degenerate_groups`` | equal the "< 2 scorable or max - min <= tol" reference; count = sum; monotone in tol |
| gpg | ``gpg_advantages`` | shape/dtype; finite; NaN and degenerate -> exactly 0; zero-sum (none/group); f_norm none: ``A(a*r) = a*A(r)``; group/batch: ``A(a*r; a*eps) = A(r; eps)``; group == ``group_advantages`` |
| gpg | ``gpg_alpha`` | python float = B / (B - M) >= 1; 1 when every row is degenerate; capped by max_alpha |
| gpg | ``gpg_loss`` | finite scalar with garbage padding and 1e30 log-probs or advantages; = row-weight form; linear in alpha; zero advantages -> zero loss and gradient |
| gpg | ``group_token_weights`` / ``loss_row_weights`` | float64 (N,), >= 0, constant per group (group); sum of weight x length = share of non-empty groups / rows (1 for token) |
| gpg | ``scale_grad`` | forward identity (values, dtype); gradient times factor |

Bugs these tests found, fixed in ``algorithms/`` (regression examples at the end of this file): float32 rewards
above ~1.8e19 made ``group_advantages`` / ``nanstd`` / ``normalize_then_sum_advantages`` / ``gpg_advantages``
(group, batch) return zero advantages (the variance overflowed to inf); tiny rewards with eps = 0 gave
advantages of +-3.4e38 (the variance underflowed to 0); a group of equal float32 rewards such as 6578.0 got
advantages of order 1 in ``group_advantages`` (the float mean of equal values is off by an ulp, divided by a
std of the same size); float64 rewards above ~1e154 gave ``multiscale_advantages`` wrong values and NaN at 1e300;
a group holding rewards of very different sizes (e.g. 2.5e-31, 0.55, 6.5 and -3.4e26) gave distinct rewards equal
advantages, broke the zero-sum (by 0.5 in one float32 case) and made the two exact engines disagree (the
group-mean centring rounded the small rewards' differences away); ``nanstd``
of float64 input lost 3e-8 of relative precision (its ddof correction was computed in float32).
"""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from grpo_family.algorithms.cw_grpo import CovarianceStats, covariance_stats, covariance_weights
from grpo_family.algorithms.d3s import (
    LOSS_NORMALIZATIONS,
    masked_token_loss,
    max_variance_subset,
    schedule,
    select_rollouts,
    token_keep_mask,
)
from grpo_family.algorithms.gpg import (
    count_degenerate_groups,
    degenerate_groups,
    gpg_advantages,
    gpg_alpha,
    gpg_loss,
    group_token_weights,
    loss_row_weights,
    scale_grad,
)
from grpo_family.algorithms.grpo import (
    group_advantages,
    is_constant,
    nanstd,
    normalize_then_sum_advantages,
    zero_std_mask,
)
from grpo_family.algorithms.ms_grpo import (
    diverse_subgroups,
    draw_scales,
    dss_intervals,
    multiscale_advantages,
    num_subgroups,
    scale_weights,
    validate_multiscale_options,
)
from grpo_family.algorithms.sgpo import (
    groups_to_judge,
    is_failure,
    partial_credit,
    sgpo_rewards,
    trajectory_score,
    vote_first_error,
)

NAN = float("nan")
F64 = torch.float64
# tol(defaults): assert_close's defaults (float64 rtol 1e-7 / atol 1e-7; float32 rtol 1.3e-6 ~ 11 ULP, atol 1e-5)
# compare the same few operations in another order or through another engine: float64 weights, advantages and scale
# weights a few tens of 2^-53 roundings apart (~1e-14, also after exact rescaling by 1e154..1e-300), float32 covariance
# weights within ~5 roundings of 2^-24 relative on weights <= ~N (exp of arguments <= ~2 for the O(1) weights), float32
# advantages of [[1e-30, 0]] against 7-decimal values (<= 5e-8 printing + ~4 roundings of 0.71 x 2^-24).
DTYPES = (torch.float32, torch.float64)
MAGNITUDES = (1e-30, 1e-3, 1.0, 1e3, 1e30)  # every one is representable (and normal) in float32
KINDS = ("continuous", "ties", "binary", "all_equal", "zeros", "mixed_magnitudes")


SOAK = int(os.environ.get("GRPO_FAMILY_PROPERTY_SOAK", "1"))  # e.g. 20 for a long hunt for counterexamples


def fast(n: int = 30):
    """Few examples per property (the file must stay well under a minute on two busy cores)."""
    return settings(max_examples=n * SOAK, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def base_values(kind: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Float64 values of magnitude ~1 (or spread over 1e-30..1e30 for "mixed_magnitudes")."""
    if kind == "continuous":
        return torch.randn(shape, generator=gen, dtype=F64)
    if kind == "ties":  # three non-dyadic levels, so means of equal values are not exact in float
        return torch.tensor([-0.7, 0.3, 1.9], dtype=F64)[torch.randint(0, 3, shape, generator=gen)]
    if kind == "binary":
        return torch.randint(0, 2, shape, generator=gen).to(F64)
    if kind == "all_equal":  # one non-dyadic value per row
        row = torch.randn(shape[:-1] + (1,), generator=gen, dtype=F64) + 0.1
        return row.expand(shape).clone()
    if kind == "zeros":
        return torch.zeros(shape, dtype=F64)
    exponents = torch.randint(-30, 31, shape, generator=gen).to(F64)
    return torch.randn(shape, generator=gen, dtype=F64) * 10.0**exponents


@st.composite
def reward_batches(draw, *, min_g=1, max_g=8, max_b=4, nan=True, kinds=KINDS, magnitudes=MAGNITUDES, dtypes=DTYPES):
    """``(num_prompts, G)`` rewards: a kind, a magnitude, a dtype; some rows made all-equal; NaN if allowed."""
    b, g = draw(st.integers(1, max_b)), draw(st.integers(min_g, max_g))
    kind, magnitude, dtype = (
        draw(st.sampled_from(kinds)),
        draw(st.sampled_from(magnitudes)),
        draw(st.sampled_from(dtypes)),
    )
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    values = base_values(kind, (b, g), gen)
    constant_rows = torch.rand(b, generator=gen) < draw(st.sampled_from([0.0, 0.4]))
    values[constant_rows] = values[constant_rows, :1]
    r = (values * (1.0 if kind == "mixed_magnitudes" else magnitude)).to(dtype)
    if nan:
        unscorable = torch.rand(b, g, generator=gen) < draw(st.sampled_from([0.0, 0.0, 0.3]))
        if draw(st.booleans()):
            unscorable[draw(st.integers(0, b - 1))] = True  # a group nobody could score
        r = r.masked_fill(unscorable, NAN)
    return r


def rows_scorable(r: torch.Tensor) -> list[list[float]]:
    return [[v for v in row if not math.isnan(v)] for row in r.double().tolist()]


def fsum_mean(values):
    return math.fsum(values) / len(values)


def ref_std(values, ddof):
    """Float64 std scaled by the largest deviation: exact enough at 1e30 and 1e-30 alike."""
    n = len(values)
    if n <= ddof:
        return NAN
    mean = fsum_mean(values)
    dev = [v - mean for v in values]
    unit = max(abs(d) for d in dev) or 1.0
    return math.sqrt(math.fsum((d / unit) ** 2 for d in dev) / (n - ddof)) * unit


def assert_finite(x: torch.Tensor):
    assert bool(torch.isfinite(x).all()), x


def close(a, b, *, dtype, scale=1.0):
    """Elementwise ``|a - b| <= tol * max(scale, |b|)`` with a dtype-dependent relative tol."""
    tol = 2e-4 if dtype == torch.float32 else 1e-9
    a, b = torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64)
    return bool(((a - b).abs() <= tol * torch.maximum(b.abs(), torch.full_like(b, scale))).all())


# ====================================================================================================== grpo.py


def ref_group_advantages(r: torch.Tensor, scale: str, ddof: int, eps: float) -> torch.Tensor:
    rows = rows_scorable(r)
    batch_std = ref_std([v for row in rows for v in row], ddof) if r.numel() > 1 else 0.0
    out = torch.zeros(r.shape, dtype=F64)
    for b, row in enumerate(r.double().tolist()):
        vals = rows_scorable(r[b : b + 1])[0]
        if len(set(vals)) <= 1:
            continue  # all-equal (or <= 1 scorable): exactly 0
        mean = fsum_mean(vals)
        std = (ref_std(vals, ddof) if r.shape[1] > 1 else 0.0) if scale != "batch" else batch_std
        for i, v in enumerate(row):
            if math.isnan(v):
                continue
            a = v - mean if scale == "none" else (v - mean) / (std + eps)
            out[b, i] = 0.0 if math.isnan(a) else a
    return out


@fast(40)
@given(reward_batches(), st.sampled_from(["group", "batch", "none"]), st.sampled_from([0, 1]))
def test_group_advantages_contract_and_reference(r, scale, ddof):
    a = group_advantages(r, scale=scale, ddof=ddof)
    assert a.shape == r.shape and a.dtype == r.dtype
    assert_finite(a)
    assert bool((a[torch.isnan(r)] == 0).all())
    expected = ref_group_advantages(r, scale, ddof, 1e-4)
    spread = max(1.0, float(expected.abs().max())) if scale != "none" else float(expected.abs().max()) or 1.0
    assert close(a, expected, dtype=r.dtype, scale=spread)
    for b, vals in enumerate(rows_scorable(r)):
        if len(set(vals)) <= 1:
            assert bool((a[b] == 0).all()), "an all-equal group must get exactly 0"
        n = len(vals)
        if scale == "group" and ddof == 1 and n > 1:
            assert float(a[b].abs().max()) <= (n - 1) / math.sqrt(n) * (1 + 1e-5)


@fast()
@given(
    reward_batches(magnitudes=(1.0,), kinds=("continuous", "ties", "binary", "all_equal")),
    st.sampled_from(MAGNITUDES),
    st.sampled_from(["group", "batch", "none"]),
)
def test_group_advantages_scale_covariance_from_1e_minus30_to_1e30(r, factor, scale):
    """(a r - a mu) / (a sigma + a eps) = (r - mu) / (sigma + eps): with eps scaled along, the advantages of
    rewards of size 1e30 or 1e-30 are those of rewards of size 1 (squares overflow / underflow in float32)."""
    base = group_advantages(r, scale=scale)
    scaled = group_advantages(r * factor, scale=scale, eps=1e-4 * factor)
    expected = base.double() * (factor if scale == "none" else 1.0)
    assert_finite(scaled)
    assert close(scaled, expected, dtype=r.dtype, scale=float(expected.abs().max()) or 1.0)


@fast()
@given(reward_batches(dtypes=(F64,), kinds=("continuous", "ties", "binary", "all_equal")), st.data())
def test_group_advantages_shift_invariance_and_permutation_equivariance(r, data):
    a = group_advantages(r)
    top = float(torch.nan_to_num(r, nan=0.0).abs().max())
    shifted = group_advantages(r + data.draw(st.sampled_from([-3.0, 3.0])) * max(top, 1e-300))
    assert close(shifted, a, dtype=F64, scale=1.0) or top == 0
    perm = torch.randperm(r.shape[1], generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    assert close(group_advantages(r[:, perm]), a[:, perm], dtype=F64)


@fast(40)
@given(reward_batches(), st.sampled_from([0, 1]), st.booleans())
def test_nanstd_matches_reference_at_every_magnitude(r, ddof, keepdim):
    std = nanstd(r, dim=1, ddof=ddof, keepdim=keepdim)
    assert std.shape == ((r.shape[0], 1) if keepdim else (r.shape[0],)) and std.dtype == r.dtype
    for b, vals in enumerate(rows_scorable(r)):
        got = float(std.reshape(-1)[b])
        if len(vals) <= ddof:
            assert math.isnan(got)
        elif len(set(vals)) == 1:
            assert got == 0.0, "equal values have std exactly 0"
        else:
            assert close(got, ref_std(vals, ddof), dtype=r.dtype, scale=0.0)
    everything = nanstd(r, ddof=ddof)
    assert everything.shape == ()
    all_vals = [v for row in rows_scorable(r) for v in row]
    if len(all_vals) > ddof and len(set(all_vals)) > 1:
        assert close(everything, ref_std(all_vals, ddof), dtype=r.dtype, scale=0.0)


@fast()
@given(reward_batches())
def test_is_constant_is_at_most_one_distinct_value(r):
    per_row = is_constant(r, 1)
    assert per_row.shape == (r.shape[0], 1) and per_row.dtype == torch.bool
    assert per_row.flatten().tolist() == [len(set(vals)) <= 1 for vals in rows_scorable(r)]
    assert bool(is_constant(r).reshape(())) == (len({v for row in rows_scorable(r) for v in row}) <= 1)


@fast()
@given(reward_batches(min_g=2))
def test_zero_std_mask_flags_every_all_equal_group(r):
    mask = zero_std_mask(r)
    assert mask.shape == r.shape and mask.dtype == torch.bool
    for b, vals in enumerate(rows_scorable(r)):
        if len(vals) >= 2 and len(set(vals)) == 1:
            assert bool(mask[b].all())
        elif len(vals) >= 2 and ref_std(vals, 1) > 1e-6:
            assert not bool(mask[b].any())


@st.composite
def per_function_rewards(draw):
    """``(B, G, K)`` rewards of magnitude ~1, float32 or float64, with NaN (some completions unscorable by all)."""
    b, g, k = draw(st.integers(1, 4)), draw(st.integers(2, 6)), draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["continuous", "ties", "binary"]))
    r = base_values(kind, (b, g, k), gen).to(draw(st.sampled_from(DTYPES)))
    r = r.masked_fill(torch.rand(b, g, k, generator=gen) < 0.15, NAN)
    r[torch.rand(b, g, generator=gen) < 0.15] = NAN
    weights = torch.tensor(draw(st.lists(st.floats(0.1, 3.0), min_size=k, max_size=k)))
    return r, weights


@fast()
@given(per_function_rewards(), st.lists(st.sampled_from(MAGNITUDES), min_size=3, max_size=3))
def test_normalize_then_sum_is_finite_centred_and_scale_free_per_function(batch, factors):
    r, weights = batch
    a = normalize_then_sum_advantages(r, weights)
    assert a.shape == r.shape[:2] and a.dtype == r.dtype
    assert_finite(a)
    unscorable = torch.isnan(r).all(-1)
    assert bool((a[unscorable] == 0).all())
    # tol: the outputs are (summed - mean) / (std + 1e-4): their sum is n (m - m_hat) / (std + 1e-4), and the float32
    # mean of n <= 24 weighted z-score sums |x| <= ~20 is off by <= n x 2^-24 x 20 ~ 3e-5, so 1e-3 per element holds
    # while the summed z-scores' std is >= ~3e-2; typical draws have std ~1. A draw with nearly equal sums in float32
    # could exceed it (flagged in the audit report).
    assert abs(float(a[~unscorable].double().sum())) <= 1e-3 * max(1, int((~unscorable).sum()))
    # With eps = 0 each function's z-scores are scale-free, so scaling one function by 1e-30 or 1e30 changes
    # nothing, except where the weighted sum of z-scores is (nearly) the same for every completion: the final
    # batch standardisation then divides rounding noise by a spread of the same size (ill-posed at eps = 0).
    assume(summed_spread(r, weights) > (1e-2 if r.dtype == torch.float32 else 1e-6))
    factor = torch.tensor(factors[: r.shape[-1]], dtype=r.dtype)
    scaled = normalize_then_sum_advantages(r * factor, weights, eps=0.0)
    assert_finite(scaled)
    assert close(scaled, normalize_then_sum_advantages(r, weights, eps=0.0), dtype=r.dtype, scale=1.0)


def summed_spread(r: torch.Tensor, weights: torch.Tensor) -> float:
    """Float64 reference of the std of the weighted per-function z-scores (before the batch standardisation)."""
    summed = []
    for group in r.double().tolist():
        z = [[NAN] * len(group[0]) for _ in group]
        for k in range(len(group[0])):
            vals = [row[k] for row in group if not math.isnan(row[k])]
            for i, row in enumerate(group):
                if not math.isnan(row[k]):
                    z[i][k] = 0.0 if len(set(vals)) <= 1 else (row[k] - fsum_mean(vals)) / ref_std(vals, 1)
        for zi in z:
            if not all(math.isnan(v) for v in zi):
                summed.append(math.fsum(w * v for w, v in zip(weights.tolist(), zi) if not math.isnan(v)))
    return ref_std(summed, 1) if len(summed) > 1 else 0.0


# =================================================================================================== ms_grpo.py


@st.composite
def ms_options(draw, g: int):
    tau_min = draw(st.integers(2, min(3, g)))
    r_scales = g - tau_min + 1
    weights = draw(
        st.sampled_from(["uniform", "global", "local", "flat"])
        | st.lists(st.floats(0.0, 2.0), min_size=r_scales, max_size=r_scales).filter(lambda w: sum(w) > 0.01)
    )
    return dict(tau_min=tau_min, weights=weights, std=draw(st.sampled_from(["population", "sample"])))


@fast(40)
@given(reward_batches(min_g=2), st.data())
def test_multiscale_exact_contract_and_invariants(r, data):
    g = r.shape[1]
    assume(g >= 2)
    opts = data.draw(ms_options(g))
    a = multiscale_advantages(r, **opts)
    assert a.shape == r.shape and a.dtype == r.dtype
    assert_finite(a)
    assert bool((a[torch.isnan(r)] == 0).all())
    scale = max(1.0, float(a.abs().max()))
    tol = (5e-5 if r.dtype == torch.float32 else 1e-9) * scale
    for b, vals in enumerate(rows_scorable(r)):
        if len(set(vals)) <= 1 or len(vals) < opts["tau_min"]:
            assert bool((a[b] == 0).all())
        assert abs(float(a[b].double().sum())) <= tol * g  # P4 zero-sum over the scorable completions
        row = r[b].double().tolist()
        for i, j in itertools.permutations(range(g), 2):
            if math.isnan(row[i]) or math.isnan(row[j]):
                continue
            if row[i] == row[j]:  # P6: ties -> identical advantages
                assert abs(float(a[b, i]) - float(a[b, j])) <= tol
            elif row[i] > row[j]:  # P7 (weakly, to float precision)
                assert float(a[b, i]) >= float(a[b, j]) - tol
    perm = torch.randperm(g, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    assert close(multiscale_advantages(r[:, perm], **opts), a[:, perm], dtype=r.dtype, scale=scale)
    if g <= 8:  # the value-class tables and the subgroup enumeration compute the same numbers
        counts = multiscale_advantages(r, method="counts", **opts)
        enumerate_ = multiscale_advantages(r, method="enumerate", **opts)
        assert close(counts, enumerate_, dtype=r.dtype, scale=scale)


@fast()
@given(
    reward_batches(min_g=2, magnitudes=(1.0,), kinds=("continuous", "ties", "binary", "all_equal")),
    st.sampled_from(MAGNITUDES),
    st.booleans(),
)
def test_multiscale_scale_covariance_from_1e_minus30_to_1e30(r, factor, accelerated):
    """A(a r; a eps) = A(r; eps) exactly in maths, in both modes (the accelerated subgroups never look at rewards)."""
    kw = dict(num_scales=2, subgroups_per_scale=3) if accelerated else {}
    base = multiscale_advantages(r, generator=torch.Generator().manual_seed(1), **kw)
    scaled = multiscale_advantages(r * factor, eps=1e-6 * factor, generator=torch.Generator().manual_seed(1), **kw)
    assert_finite(scaled)
    assert close(scaled, base, dtype=r.dtype, scale=1.0)


@fast()
@given(reward_batches(min_g=2, dtypes=(F64,), kinds=("continuous", "ties", "binary", "all_equal")), st.data())
def test_multiscale_shift_invariance_and_accelerated_determinism(r, data):
    top = float(torch.nan_to_num(r, nan=0.0).abs().max())
    assume(top > 0)
    shift = data.draw(st.sampled_from([-3.0, 3.0])) * top
    assert close(multiscale_advantages(r + shift), multiscale_advantages(r), dtype=F64)
    kw = dict(
        num_scales=data.draw(st.integers(1, 3)),
        subgroups_per_scale=data.draw(st.integers(1, 5)),
        selection=data.draw(st.sampled_from(["greedy", "random"])),
        permute_labels=data.draw(st.booleans()),
    )
    first = multiscale_advantages(r, generator=torch.Generator().manual_seed(7), **kw)
    assert torch.equal(first, multiscale_advantages(r, generator=torch.Generator().manual_seed(7), **kw))
    assert first.shape == r.shape and first.dtype == r.dtype
    assert_finite(first)
    assert bool((first[torch.isnan(r)] == 0).all())
    for b, vals in enumerate(rows_scorable(r)):
        if len(set(vals)) <= 1:
            assert bool((first[b] == 0).all())
    assert close(multiscale_advantages(r + shift, generator=torch.Generator().manual_seed(7), **kw), first, dtype=F64)


@fast()
@given(st.integers(2, 12), st.data())
def test_scale_weights_sum_to_one_with_each_schemes_shape(g, data):
    tau_min = data.draw(st.integers(2, g))
    n = g - tau_min + 1
    explicit = data.draw(st.lists(st.floats(0.0, 1e30), min_size=n, max_size=n).filter(lambda w: sum(w) > 0))
    for scheme in ("uniform", "global", "local", "flat", explicit):
        w = scale_weights(g, tau_min, scheme)
        assert w.dtype == F64 and w.shape == (n,)
        # tol: <= 11 float64 weights w / total, each a rounding (2^-53 relative), summed: <= ~12 x 2^-53 ~ 1.3e-15,
        # under 1e-12.
        assert bool((w >= 0).all()) and abs(float(w.sum()) - 1.0) <= 1e-12
        diffs = w[1:] - w[:-1]
        if scheme == "uniform":
            # tol: the uniform weights are the same float64 expression 1 / n for every scale: equal, or at most one ULP
            # of <= 0.5 apart (5.6e-17), under 1e-15.
            assert bool((diffs.abs() <= 1e-15).all())
        elif scheme == "global":
            assert bool((diffs > 0).all())
        elif scheme == "local":
            assert bool((diffs < 0).all())
        elif scheme == "flat":
            binom = torch.tensor([math.comb(g - 1, t - 1) for t in range(tau_min, g + 1)], dtype=F64)
            torch.testing.assert_close(w, binom / binom.sum())
        else:
            torch.testing.assert_close(w, torch.tensor(explicit, dtype=F64) / math.fsum(explicit))


@fast(40)
@given(st.integers(1, 6), st.data())
def test_validate_multiscale_options_accepts_exactly_what_runs(g, data):
    """Every option set the validator accepts runs and gives finite advantages (also M > R, K > C(G, tau), empty
    "paper" intervals); every one it rejects makes the function raise ValueError, except groups smaller than
    tau_min with otherwise valid options: a config error for the validator, zeros at runtime (docs/methods/ms_grpo.md §6)."""
    r_scales = max(g - 1, 1)
    opts = dict(
        tau_min=data.draw(st.sampled_from([0, 1, 2, 3, g + 1, 2.5])),
        weights=data.draw(st.sampled_from(["uniform", "flat", "bogus", [1.0] * r_scales, [-1.0] * r_scales, [0.0]])),
        std=data.draw(st.sampled_from(["population", "sample", "bogus"])),
        eps=data.draw(st.sampled_from([0.0, 1e-6, -1.0, NAN, math.inf, True])),
        num_scales=data.draw(st.sampled_from([None, 0, 1, 3])),
        subgroups_per_scale=data.draw(st.sampled_from([None, 0, 1, 4])),
        partition=data.draw(st.sampled_from(["bottom", "paper", "middle"])),
    )
    try:
        validate_multiscale_options(g, **opts)
        valid = True
    except ValueError:
        valid = False
    rewards = torch.arange(2 * g, dtype=torch.float32).reshape(2, g) % 3
    tau_min, weights = opts["tau_min"], opts["weights"]
    too_small = isinstance(tau_min, int) and tau_min > g  # no admissible subgroup in a group of g
    weights_ok = weights in ("uniform", "flat") or (isinstance(weights, list) and min(weights) >= 0 < sum(weights))
    if too_small and weights_ok:  # the other options, checked where tau_min fits and the weights are a scheme
        try:
            validate_multiscale_options(tau_min, **{**opts, "weights": "uniform"})
        except ValueError:
            too_small = False
    if valid or (too_small and weights_ok):
        out = multiscale_advantages(rewards, generator=torch.Generator().manual_seed(0), **opts)
        assert_finite(out)
        assert valid or torch.equal(out, torch.zeros_like(out))
    else:
        with pytest.raises(ValueError):
            multiscale_advantages(rewards, generator=torch.Generator().manual_seed(0), **opts)


@fast()
@given(st.integers(2, 40), st.data())
def test_dss_intervals_partition_the_scales(g, data):
    tau_min = data.draw(st.integers(2, g))
    m = data.draw(st.integers(1, g + 2))
    partition = data.draw(st.sampled_from(["bottom", "paper"]))
    spans = dss_intervals(g, tau_min, m, partition)
    length = -(-(g - tau_min + 1) // m)
    assert 1 <= len(spans) <= m
    assert [t for s, e in spans for t in range(s, e + 1)] == list(range(tau_min, g + 1))
    assert all(s <= e and e - s + 1 <= length for s, e in spans)


@fast()
@given(st.integers(1, 5), st.integers(2, 16), st.data())
def test_draw_scales_one_scale_per_interval(b, g, data):
    tau_min = data.draw(st.integers(2, g))
    m = data.draw(st.none() | st.integers(1, 5))
    draw_kind = data.draw(st.sampled_from(["per_group", "per_batch"]))
    partition = data.draw(st.sampled_from(["bottom", "paper"]))
    kw = dict(tau_min=tau_min, num_scales=m, partition=partition, draw=draw_kind)
    mask = draw_scales(b, g, generator=torch.Generator().manual_seed(3), **kw)
    assert mask.shape == (b, g - tau_min + 1) and mask.dtype == torch.bool
    assert torch.equal(mask, draw_scales(b, g, generator=torch.Generator().manual_seed(3), **kw))
    if m is None:
        assert bool(mask.all())
        return
    for s, e in dss_intervals(g, tau_min, m, partition):
        assert bool((mask[:, s - tau_min : e - tau_min + 1].sum(1) == 1).all())
    assert int(mask.sum()) == b * len(dss_intervals(g, tau_min, m, partition))
    if draw_kind == "per_batch":
        assert bool((mask == mask[:1]).all())


@fast()
@given(st.integers(2, 12), st.data())
def test_diverse_subgroups_are_distinct_sorted_and_deterministic(g, data):
    tau = data.draw(st.integers(1, g))
    k = data.draw(st.integers(1, 12))
    chosen = diverse_subgroups(g, tau, k)
    assert len(chosen) == min(k, math.comb(g, tau)) and len(set(chosen)) == len(chosen)
    assert all(len(s) == tau and list(s) == sorted(s) and 0 <= s[0] and s[-1] < g for s in chosen)
    assert chosen[0] == tuple(range(tau))
    assert diverse_subgroups(g, tau, k) == chosen


@fast()
@given(st.integers(2, 14), st.data())
def test_num_subgroups_matches_the_formula_and_the_selection(g, data):
    tau_min = data.draw(st.integers(2, g))
    m = data.draw(st.none() | st.integers(1, 5))
    k = data.draw(st.none() | st.integers(1, 10))
    partition = data.draw(st.sampled_from(["bottom", "paper"]))
    got = num_subgroups(g, tau_min=tau_min, num_scales=m, subgroups_per_scale=k, partition=partition)

    def used(tau):
        return math.comb(g, tau) if k is None else len(diverse_subgroups(g, tau, k))

    if m is None:
        expected = sum(used(t) for t in range(tau_min, g + 1))
    else:
        spans = dss_intervals(g, tau_min, m, partition)
        expected = sum(sum(used(t) for t in range(s, e + 1)) / (e - s + 1) for s, e in spans)
    # tol: the expected count is a float64 sum of <= ~11 fractions of integers (a rounding each): ~11 x 2^-53 relative,
    # rel 1e-12.
    assert math.isclose(got, expected, rel_tol=1e-12)
    assert 1 - 1e-12 <= got <= sum(math.comb(g, t) for t in range(tau_min, g + 1))


# =================================================================================================== cw_grpo.py


@st.composite
def token_batches(draw, *, max_b=3, max_g=4, max_t=6, magnitudes=MAGNITUDES, dtypes=DTYPES, kinds=KINDS):
    """``(logps, advantages, mask, G)``: padding filled with garbage (inf, NaN, 1e30), advantages (N,) or (N, T)."""
    b, g, t = draw(st.integers(1, max_b)), draw(st.integers(1, max_g)), draw(st.integers(1, max_t))
    n = b * g
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    dtype = draw(st.sampled_from(dtypes))
    lp_scale, adv_scale = draw(st.sampled_from(magnitudes)), draw(st.sampled_from(magnitudes))
    logps = -(torch.rand(n, t, generator=gen, dtype=F64) * 5 * lp_scale)
    if draw(st.booleans()):
        logps = logps.round(decimals=1)  # ties in log-probs
    per_token = draw(st.booleans())
    kind = draw(st.sampled_from(kinds))
    adv = base_values(kind, (n, t) if per_token else (b, g), gen).reshape((n, t) if per_token else (n,))
    adv = adv * (1.0 if kind == "mixed_magnitudes" else adv_scale)  # mixed: already 1e-30..1e30
    mask = torch.rand(n, t, generator=gen) < draw(st.sampled_from([0.5, 0.9, 1.0]))
    if draw(st.booleans()):
        mask[draw(st.integers(0, n - 1))] = False  # an empty completion
    garbage = torch.tensor([NAN, math.inf, -math.inf, 1e30], dtype=F64)[torch.randint(0, 4, (n, t), generator=gen)]
    logps = torch.where(mask, logps, garbage)
    if per_token:
        adv = torch.where(mask, adv, garbage)
    return logps.to(dtype), adv.to(dtype), mask, g


def scope_slices(n_rows, g, scope):
    return [slice(s, s + g) for s in range(0, n_rows, g)] if scope == "group" else [slice(0, n_rows)]


@fast(40)
@given(token_batches(), st.sampled_from(["group", "batch"]), st.sampled_from(["token", "sequence"]))
def test_covariance_weights_contract(batch, scope, adv_center):
    logps, adv, mask, g = batch
    w = covariance_weights(logps.requires_grad_(), adv, mask, g, scope=scope, adv_center=adv_center)
    assert w.shape == logps.shape and w.dtype == logps.dtype and not w.requires_grad
    assert_finite(w)
    assert bool((w[~mask] == 0).all()) and bool((w >= 0).all())
    tol = 1e-4 if logps.dtype == torch.float32 else 1e-9
    for s in scope_slices(len(mask), g, scope):
        n = int(mask[s].sum())
        assert abs(float(w[s].double().sum()) - n) <= tol * max(n, 1), "mean 1 over the scope's valid tokens"
    raw = covariance_weights(logps, adv, mask, g, scope=scope, normalize=False)
    assert bool(((raw >= 0) & (raw <= 1)).all()) and bool((raw[~mask] == 0).all())


@fast(40)
@given(
    token_batches(magnitudes=(1.0,), dtypes=(F64,), kinds=("continuous", "ties", "binary")),
    st.sampled_from([-1.0, *MAGNITUDES]),
    st.sampled_from([-2.0, *MAGNITUDES]),
    st.sampled_from(["group", "batch"]),
    st.integers(0, 99),
)
def test_covariance_weights_affine_invariance_and_permutation(batch, a, k, scope, seed):
    """docs/methods/cw_grpo.md §10.5 for a, k from 1e-30 to 1e30, sign flips and shifts (with the absolute bandwidth floor eps of
    A9 scaled by |a k|, the one scale-dependent choice); §10.8, permutation equivariance within a group."""
    logps, adv, mask, g = batch
    w = covariance_weights(logps, adv, mask, g, scope=scope)
    # c scales by a*k, so the bandwidth floor eps (A9) scales along; the shifts are relative to each scale.
    moved = covariance_weights(
        a * logps + 3.0 * abs(a), k * adv - 0.5 * abs(k), mask, g, scope=scope, eps=1e-8 * abs(a * k)
    )
    assert_finite(moved)
    # tol: float64 (the strategy draws F64 here): a logps + 3|a| and k adv - 0.5|k| round each input once (2^-53
    # relative); c / sigma carries that amplified by (|logp| + 3) / spread(logp) <= ~80 (log-probs on a 0.1 grid at
    # worst), and the weights exp(-c^2 / 2 sigma^2) multiply it by (c / sigma)^2 <= N = 72: ~1e-12 relative, under 1e-6
    # x max(|w|, 1).
    assert bool(((moved - w).abs() <= 1e-6 * w.abs().clamp_min(1.0)).all())
    gen = torch.Generator().manual_seed(seed)
    n = len(mask)
    if scope == "group":  # shuffle inside each group
        perm = torch.cat([q * g + torch.randperm(g, generator=gen) for q in range(n // g)])
    else:
        perm = torch.randperm(n, generator=gen)
    permuted = covariance_weights(logps[perm], adv[perm], mask[perm], g, scope=scope)
    torch.testing.assert_close(permuted, w[perm])


@fast(40)
@given(token_batches(), st.sampled_from(["group", "batch"]))
def test_covariance_stats_fields_and_degeneracy(batch, scope):
    logps, adv, mask, g = batch
    stats = covariance_stats(logps, adv, mask, g, scope=scope)
    assert isinstance(stats, CovarianceStats)
    n_scopes = len(mask) // g if scope == "group" else 1
    assert stats.terms.shape == logps.shape
    assert all(x.shape == (n_scopes,) for x in (stats.sigma, stats.covariance, stats.num_tokens, stats.degenerate))
    assert_finite(stats.terms)
    assert_finite(stats.sigma)
    assert_finite(stats.covariance)
    assert bool((stats.terms[~mask] == 0).all()) and bool((stats.sigma >= 0).all())
    weights = covariance_weights(logps, adv, mask, g, scope=scope)
    adv_tok = adv[:, None].expand_as(logps) if adv.dim() == 1 else adv
    for j, s in enumerate(scope_slices(len(mask), g, scope)):
        n = int(mask[s].sum())
        assert int(stats.num_tokens[j]) == n
        if n:
            terms = stats.terms[s][mask[s]].double()
            tol = 1e-12 * float(terms.abs().max())
            # tol: the covariance is computed in float64 whatever the input dtype (grpo_family/algorithms/cw_grpo.py):
            # a mean of <= 24 terms in two orders differs by <= 24 x 2^-53 x max|terms| (~2.7e-15 x max|terms|), under
            # abs_tol 1e-12 x max|terms| and rel 1e-9.
            assert math.isclose(float(stats.covariance[j]), float(terms.mean()), rel_tol=1e-9, abs_tol=tol)
        valid_adv = set(adv_tok[s][mask[s]].double().tolist())
        if n <= 1 or len(valid_adv) <= 1:
            assert bool(stats.degenerate[j])
        if bool(stats.degenerate[j]):
            assert bool((weights[s][mask[s]] == 1).all()), "a degenerate scope is weighted like GRPO"


# ======================================================================================================= d3s.py


@st.composite
def pools(draw, max_n=9):
    n = draw(st.integers(1, max_n))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(KINDS))
    values = base_values(kind, (n,), gen) * (1.0 if kind == "mixed_magnitudes" else draw(st.sampled_from(MAGNITUDES)))
    return values.to(draw(st.sampled_from(DTYPES)))


def population_variance(values) -> float:
    values = list(values)
    unit = max(abs(v) for v in values) or 1.0
    scaled = [v / unit for v in values]
    mean = fsum_mean(scaled)
    return math.fsum((v - mean) ** 2 for v in scaled) / len(scaled) * unit * unit


@fast(40)
@given(pools(), st.data())
def test_max_variance_subset_is_optimal_at_every_magnitude(values, data):
    n = len(values)
    k = data.draw(st.integers(0, n + 1))
    idx = max_variance_subset(values, k)
    assert idx.dtype == torch.long and idx.shape == (min(k, n),)
    assert idx.tolist() == sorted(set(idx.tolist())) and all(0 <= i < n for i in idx.tolist())
    if 2 <= k < n:
        vals = values.double().tolist()
        best = max(population_variance(c) for c in itertools.combinations(vals, k))
        got = population_variance(vals[i] for i in idx.tolist())
        assert got >= best * (1 - 1e-9)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(k))
        again = population_variance(values[perm][max_variance_subset(values[perm], k)].double().tolist())
        # tol: the same float64 population variance of the same k values summed in another order: <= ~2k roundings of
        # 2^-53 relative to the sum of squares (~1e-15), rel 1e-9.
        assert math.isclose(again, got, rel_tol=1e-9, abs_tol=0.0)


@fast()
@given(pools().filter(lambda v: v.dtype == F64 and float(v.abs().max()) < 1e10), st.data())
def test_max_variance_subset_same_choice_after_scaling_to_1e30_or_1e_minus30(values, data):
    k = data.draw(st.integers(0, len(values)))
    factor = data.draw(st.sampled_from([1e-30, 1e30]))
    assume(float(values.abs().max()) == 0 or float(values.abs().max()) * factor > 1e-280)
    assert torch.equal(max_variance_subset(values * factor, k), max_variance_subset(values, k))


@fast(40)
@given(reward_batches(min_g=1, nan=False), st.integers(0, 9), st.sampled_from(["pooled", "group"]), st.booleans())
def test_select_rollouts_sizes_and_degenerate_groups(adv, k, scope, drop):
    b, g = adv.shape
    drop = drop and scope == "group"
    flat = select_rollouts(adv.reshape(-1), g, k, scope=scope, drop_degenerate_groups=drop)
    assert torch.equal(flat, select_rollouts(adv, g, k, scope=scope, drop_degenerate_groups=drop))
    kept = flat.tolist()
    assert kept == sorted(set(kept)) and all(0 <= i < b * g for i in kept)
    per_group = [sum(1 for i in kept if i // g == q) for q in range(b)]
    if scope == "pooled":
        assert len(kept) == min(k * b, b * g)
    else:
        for q, vals in enumerate(adv.double().tolist()):
            constant = len(set(vals)) == 1
            assert per_group[q] == (0 if drop and constant else min(k, g))


@fast()
@given(
    st.integers(-(10**12), 10**12),
    st.integers(-5, 10**12),
    st.integers(1, 64),
    st.integers(0, 100),
    st.integers(0, 100),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_schedule_bounds_and_monotonicity_for_extreme_steps(step, total, g, n0, n1, k0, k1):
    kw = dict(num_generations=g, samples_start=n0, samples_end=n1, token_ratio_start=k0, token_ratio_end=k1)
    n_s, ratio = schedule(step, total, **kw)
    assert isinstance(n_s, int) and min(2, g) <= n_s <= g
    assert min(k0, k1) <= ratio <= max(k0, k1) and math.isfinite(ratio)
    n_next, ratio_next = schedule(step + 1, total, **kw)
    if n1 >= n0:
        assert n_next >= n_s
    if k1 >= k0:
        assert ratio_next >= ratio - 1e-15


def reference_keep_count(n, ratio, min_keep):
    return min(n, max(min_keep, math.ceil(ratio * n - 1e-9)))


@fast(40)
@given(token_batches(), st.floats(0, 1), st.sampled_from(["batch", "sequence"]), st.integers(0, 2))
def test_token_keep_mask_counts_and_order(batch, ratio, scope, min_keep):
    _, adv, mask, _ = batch
    gen = torch.Generator().manual_seed(int(mask.sum()))
    entropies = torch.rand(mask.shape, generator=gen, dtype=F64) * 10.0 ** torch.randint(
        -30, 31, mask.shape, generator=gen
    )
    entropies = torch.where(mask, entropies, torch.tensor(NAN, dtype=F64)).to(adv.dtype)  # NaN on padding
    keep = token_keep_mask(adv, entropies, mask, ratio, scope=scope, min_keep=min_keep)
    assert keep.shape == mask.shape and keep.dtype == torch.bool
    assert not bool((keep & ~mask).any())
    adv_tok = (adv[:, None].expand_as(mask) if adv.dim() == 1 else adv).double()
    score = adv_tok.abs() * entropies.double()
    scopes = [slice(None)] if scope == "batch" else [i for i in range(len(mask))]
    for s in scopes:
        valid, kept = mask[s], keep[s]
        assert int(kept.sum()) == reference_keep_count(int(valid.sum()), ratio, min_keep)
        if bool(kept.any()) and bool((valid & ~kept).any()):
            assert float(score[s][kept].min()) >= float(score[s][valid & ~kept].max())


def reference_loss(x, keep, mask, normalization):
    rows = [
        [v for v, k, m in zip(xr, kr, mr) if k and m] for xr, kr, mr in zip(x.tolist(), keep.tolist(), mask.tolist())
    ]
    valid = [sum(mr) for mr in mask.tolist()]
    total, n_kept, n = math.fsum(v for r in rows for v in r), sum(len(r) for r in rows), max(len(rows), 1)
    if normalization == "token_mean_kept":
        return total / max(n_kept, 1)
    if normalization == "literal_eq10":
        return total / (max(n_kept, 1) * n)
    per_row = [math.fsum(r) / max(len(r), 1) for r in rows]
    if normalization == "seq_mean_kept":
        return math.fsum(per_row) / max(sum(1 for r in rows if r), 1)
    if normalization == "seq_mean_kept_all":
        return math.fsum(per_row) / n
    if normalization == "mask_only_seq":
        return math.fsum(math.fsum(r) / max(v, 1) for r, v in zip(rows, valid)) / n
    return total / max(sum(valid), 1)


@fast(40)
@given(token_batches(dtypes=(F64,)), st.sampled_from(LOSS_NORMALIZATIONS), st.sampled_from(MAGNITUDES))
def test_masked_token_loss_finite_reference_linear_and_zero_gradient_outside(batch, normalization, factor):
    logps, _, mask, _ = batch  # logps: finite on valid tokens, NaN/inf/1e30 garbage elsewhere
    keep = torch.rand(mask.shape, generator=torch.Generator().manual_seed(int(mask.sum()))) < 0.5
    x = logps.clone().requires_grad_(True)
    loss = masked_token_loss(x, keep, mask, normalization=normalization)
    assert loss.shape == () and math.isfinite(loss.item())
    clean = torch.where(keep & mask, logps, 0.0)
    # tol: float64, the kept log-probs all have one sign (no cancellation): a sum of <= 72 terms is within 72 x 2^-53 ~
    # 8e-15 relative of math.fsum's exactly rounded one, divided once more: rel 1e-9; abs_tol 1e-300 only lets an exact
    # 0 (no kept token) equal 0.
    assert math.isclose(loss.item(), reference_loss(clean, keep, mask, normalization), rel_tol=1e-9, abs_tol=1e-300)
    loss.backward()
    assert bool((x.grad[~(keep & mask)] == 0).all())
    scaled = masked_token_loss(logps * factor, keep, mask, normalization=normalization)
    # tol: scaling the float64 inputs by a power of ten rounds each once (2^-53 relative), the same-sign sum adds <= 72
    # more: ~1e-14 relative, rel 1e-9; abs_tol 1e-300 for an exact 0.
    assert math.isclose(float(scaled), factor * loss.item(), rel_tol=1e-9, abs_tol=1e-300)


# ====================================================================================================== sgpo.py

VERDICT_JUNK = st.sampled_from([None, NAN, 0.0, 1.5, math.inf, -math.inf, 3, 0, -1, "x"])


@given(VERDICT_JUNK)
def test_is_failure_only_for_a_float_nan(verdict):
    assert is_failure(verdict) == (isinstance(verdict, float) and math.isnan(verdict))


@fast()
@given(st.integers(0, 60), st.data())
def test_trajectory_score_range_and_monotonicity(k_steps, data):
    if k_steps == 0:
        assert trajectory_score(data.draw(st.sampled_from([None, NAN, 1, 5])), 0) == 0.0
        return
    k = data.draw(st.integers(1, k_steps))
    score = trajectory_score(k, k_steps)
    assert 0.0 <= score < 1.0 and score == (k - 1) / k_steps
    assert trajectory_score(None, k_steps) == 1.0 and math.isnan(trajectory_score(NAN, k_steps))
    if k < k_steps:
        assert trajectory_score(k + 1, k_steps) > score


@fast()
@given(st.integers(1, 8), st.data())
def test_vote_first_error_returns_a_cast_vote(k_steps, data):
    verdict = st.none() | st.just(NAN) | st.integers(1, k_steps)
    votes = data.draw(st.lists(verdict, min_size=0, max_size=7))
    result = vote_first_error(votes, k_steps)
    cast = [v for v in votes if not is_failure(v)]
    if not cast:
        assert is_failure(result)
    else:
        assert result in cast
    assert vote_first_error(votes + [NAN] * data.draw(st.integers(0, 3)), k_steps) == result or not cast
    if cast and len(set(cast)) == 1:
        assert result == cast[0]


@fast(40)
@given(
    st.lists(st.floats(0, 1) | st.just(NAN), min_size=0, max_size=12),
    st.sampled_from([1e-30, 0.1, 10.0, 1e30]),
    st.sampled_from([-1e30, 0.0, 0.5, 1.0, 1e30]),
    st.sampled_from(["sigmoid", "linear"]),
    st.sampled_from(DTYPES),
)
def test_partial_credit_range_nan_and_monotonicity(rts_list, beta, gamma, mode, dtype):
    rts = torch.tensor(sorted(rts_list, key=lambda v: (math.isnan(v), v)), dtype=dtype)
    credit = partial_credit(rts, beta=beta, gamma=gamma, mode=mode)
    assert credit.shape == rts.shape and credit.dtype == dtype
    nan = torch.isnan(rts)
    assert torch.equal(torch.isnan(credit), nan)
    ok = credit[~nan]
    assert bool(((ok >= 0) & (ok < 1)).all()), "partial credit stays strictly below the correct reward 1"
    assert bool((ok[1:] >= ok[:-1]).all()), "non-decreasing in RTS"
    if mode == "linear":
        below_one = 1.0 - torch.finfo(dtype).eps / 2
        assert torch.equal(ok, rts[~nan].clamp(max=below_one))


@fast()
@given(st.integers(1, 5), st.integers(1, 8), st.integers(0, 2**31 - 1), st.booleans())
def test_groups_to_judge_definitions(b, g, seed, as_int):
    correct = torch.rand(b, g, generator=torch.Generator().manual_seed(seed)) < 0.3
    given_ = correct.long() if as_int else correct
    negative = groups_to_judge(given_)
    incorrect = groups_to_judge(given_, scope="all_incorrect")
    assert negative.shape == incorrect.shape == (b,) and negative.dtype == torch.bool
    assert torch.equal(negative, ~correct.any(1)) and torch.equal(incorrect, ~correct.all(1))
    assert not bool((negative & ~incorrect).any())


@st.composite
def sgpo_batches(draw):
    b, g = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    correct = torch.rand(b, g, generator=gen) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    steps = [[draw(st.integers(0, 6)) for _ in range(g)] for _ in range(b)]
    verdicts = [
        [draw(st.none() | st.just(NAN) | st.integers(1, max(s, 1))) if s else None for s in row] for row in steps
    ]
    return correct, verdicts, steps


@fast(40)
@given(
    sgpo_batches(),
    st.sampled_from(["all_negative", "all_incorrect"]),
    st.sampled_from(["sigmoid", "linear"]),
    st.sampled_from([1e-30, 10.0, 1e30]),
)
def test_sgpo_rewards_contract_and_advantages(batch, scope, mode, beta):
    correct, verdicts, steps = batch
    r = sgpo_rewards(correct, verdicts, steps, scope=scope, mode=mode, beta=beta)
    assert r.shape == correct.shape and r.dtype == torch.get_default_dtype()
    judged = groups_to_judge(correct, scope=scope)
    for b in range(correct.shape[0]):
        for i in range(correct.shape[1]):
            v = float(r[b, i])
            if bool(correct[b, i]):
                assert v == 1.0
            elif not bool(judged[b]):
                assert v == 0.0
            elif steps[b][i] > 0 and is_failure(verdicts[b][i]):
                assert math.isnan(v), "NaN exactly where the judge failed"
            else:
                assert 0.0 <= v < 1.0
    a = group_advantages(r)  # what the trainer trains on
    assert_finite(a)
    assert bool((a[torch.isnan(r)] == 0).all())
    # zero-sum per group, checked in float64 (float32 rounding of the mean is amplified by stds of ~1e-3 here)
    # tol: float64 group sums of n <= 16 advantages: n (m - m_hat) / (std + 1e-4) with m_hat <= n x 2^-53 off for
    # credits in [0, 1] and std >= ~1e-3: <= ~2e-12, under 1e-9.
    assert bool((group_advantages(r.double()).sum(1).abs() <= 1e-9).all())


# ======================================================================================================= gpg.py


@fast(40)
@given(reward_batches(), st.sampled_from([0.0, 1e-6, 0.5]))
def test_degenerate_groups_reference_count_and_tolerance(r, tol):
    flags = degenerate_groups(r, tol=tol)
    expected = [len(v) < 2 or max(v) - min(v) <= tol for v in rows_scorable(r)]
    assert flags.dtype == torch.bool and flags.tolist() == expected
    assert count_degenerate_groups(r, tol=tol) == sum(expected)
    assert not bool((degenerate_groups(r) & ~flags).any()), "a larger tol only adds degenerate groups"


@fast(40)
@given(reward_batches(), st.sampled_from(["none", "group", "batch"]))
def test_gpg_advantages_contract(r, f_norm):
    a = gpg_advantages(r, f_norm=f_norm)
    assert a.shape == r.shape and a.dtype == r.dtype
    assert_finite(a)
    zero = degenerate_groups(r)[:, None] | torch.isnan(r)
    assert bool((a[zero.expand_as(r)] == 0).all())
    if f_norm == "none":
        scale = float(a.abs().max()) or 1.0
    else:
        scale = max(1.0, float(a.abs().max()))
    tol = 1e-5 if r.dtype == torch.float32 else 1e-12
    if f_norm != "batch":
        assert bool((a.double().sum(1).abs() <= tol * scale * r.shape[1]).all()), "P10: zero-sum per group"
    if f_norm == "group":
        assert close(a, group_advantages(r), dtype=r.dtype, scale=1.0)


@fast()
@given(
    reward_batches(magnitudes=(1.0,), kinds=("continuous", "ties", "binary", "all_equal")),
    st.sampled_from(MAGNITUDES),
    st.sampled_from(["none", "group", "batch"]),
)
def test_gpg_advantages_scale_behaviour_from_1e_minus30_to_1e30(r, factor, f_norm):
    """P11: F_norm = 1 scales linearly; std normalisation is scale-free once eps is scaled along."""
    base = gpg_advantages(r, f_norm=f_norm).double()
    scaled = gpg_advantages(r * factor, f_norm=f_norm, eps=1e-4 * factor)
    assert_finite(scaled)
    expected = base * factor if f_norm == "none" else base
    assert close(scaled, expected, dtype=r.dtype, scale=float(expected.abs().max()) or 1.0)


@fast(40)
@given(reward_batches(), st.none() | st.floats(1.0, 10.0))
def test_gpg_alpha_is_b_over_b_minus_m(r, max_alpha):
    alpha = gpg_alpha(r, max_alpha=max_alpha)
    assert isinstance(alpha, float) and alpha >= 1.0
    dead = sum(
        len(row) if (len(vals) < 2 or len(set(vals)) == 1) else sum(math.isnan(v) for v in row)
        for row, vals in zip(r.double().tolist(), rows_scorable(r))
    )
    expected = r.numel() / (r.numel() - dead) if dead < r.numel() else 1.0
    assert alpha == (expected if max_alpha is None else min(expected, max_alpha))


@fast(40)
@given(
    token_batches(kinds=("continuous", "ties", "binary", "all_equal", "zeros")),
    st.sampled_from(["group", "token", "sequence"]),
    st.sampled_from([1.0, 2.5]),
)
def test_gpg_loss_finite_row_weight_form_and_alpha(batch, normalization, alpha):
    logps, adv, mask, g = batch
    if adv.dim() == 2:
        adv = adv[:, 0].nan_to_num(0.0, posinf=0.0, neginf=0.0)  # gpg advantages are per sequence
    # keep the true loss representable: one of log-probs / advantages may be 1e30, not both
    top_lp = float(torch.where(mask, logps.double(), 0.0).abs().max())
    if top_lp > 1e3:
        adv = adv / adv.abs().max().clamp_min(1)
    x = logps.clone().requires_grad_(True)
    loss = gpg_loss(x, adv, mask, g, alpha=alpha, normalization=normalization)
    assert loss.shape == () and math.isfinite(loss.item())
    w = loss_row_weights(mask, g, normalization=normalization)
    terms = torch.where(mask, -adv.double()[:, None] * logps.double(), 0.0)
    expected = alpha * float((w * terms.sum(1)).sum())
    size = alpha * float((w * terms.abs().sum(1)).sum())  # the scale of the sum, whatever cancels inside it
    underflow = alpha * int(mask.sum()) * torch.finfo(logps.dtype).tiny  # products below the smallest float
    assert abs(loss.item() - expected) <= (1e-5 if logps.dtype == torch.float32 else 1e-12) * size + underflow
    loss.backward()
    assert bool((x.grad[~mask] == 0).all()) and bool(torch.isfinite(x.grad).all())
    y = logps.clone().requires_grad_(True)
    zero = gpg_loss(y, torch.zeros_like(adv), mask, g, alpha=alpha, normalization=normalization)
    zero.backward()
    assert zero.item() == 0.0 and bool((y.grad == 0).all())


@fast(40)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_group_token_and_loss_row_weights_add_up(b, g, t, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(b * g, t, generator=gen) < 0.4
    lengths = mask.sum(1).double()
    group_w = group_token_weights(mask, g)
    assert group_w.dtype == F64 and group_w.shape == (b * g,) and bool((group_w >= 0).all())
    assert bool((group_w.reshape(b, g) == group_w.reshape(b, g)[:, :1]).all()), "one weight per group"
    nonempty_groups = int((mask.reshape(b, -1).sum(1) > 0).sum())
    # tol: float64, a sum of <= 30 products weight x length (weights 1 / (B T_q), one rounding each): ~30 x 2^-53
    # relative (~3e-15), rel 1e-12; abs_tol 1e-15 for an exact 0.
    assert math.isclose(float((group_w * lengths).sum()), nonempty_groups / b, rel_tol=1e-12, abs_tol=1e-15)
    assert torch.equal(loss_row_weights(mask, g, normalization="group"), group_w)
    token = loss_row_weights(mask, g, normalization="token")
    # tol: float64, <= 30 products (1 / T_all) x length summed: ~30 x 2^-53 relative, rel 1e-12.
    assert math.isclose(float((token * lengths).sum()), 1.0 if mask.any() else 0.0, rel_tol=1e-12)
    sequence = loss_row_weights(mask, g, normalization="sequence")
    nonempty_rows = int((lengths > 0).sum())
    # tol: float64, <= 30 products (1 / (B G length)) x length summed: ~30 x 2^-53 relative, rel 1e-12; abs_tol 1e-15
    # for an exact 0.
    assert math.isclose(float((sequence * lengths).sum()), nonempty_rows / (b * g), rel_tol=1e-12, abs_tol=1e-15)
    with pytest.raises(ValueError):
        group_token_weights(mask, 0)
    if g > 1:
        with pytest.raises(ValueError):
            group_token_weights(torch.ones(b * g + 1, t), g)


@fast()
@given(st.sampled_from([0.0, 1e-30, 0.5, 3.0, 1e30]), st.sampled_from(DTYPES), st.integers(1, 6))
def test_scale_grad_is_identity_forward_and_scales_backward(factor, dtype, n):
    x = torch.linspace(-1, 1, n, dtype=dtype).requires_grad_(True)
    y = scale_grad(x, factor)
    assert torch.equal(y, x.detach()) and y.dtype == dtype
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, factor))


# ============================================================================= regression examples (bugs found)


def test_regression_equal_large_float32_rewards_get_exactly_zero_advantage():
    """The float mean of five 6577.959 is off by an ulp; TRL's formula turned that residue into |A| = 0.76."""
    r = torch.full((1, 5), 6577.958984375)
    assert float(torch.nanmean(r) - r[0, 0]) != 0.0  # the rounding this guards against is really there
    assert torch.equal(group_advantages(r), torch.zeros(1, 5))
    assert torch.equal(group_advantages(r, scale="none"), torch.zeros(1, 5))
    assert float(nanstd(r, dim=1)) == 0.0 and bool(zero_std_mask(r).all())
    per_func = r[..., None].expand(1, 5, 2)
    assert torch.equal(normalize_then_sum_advantages(per_func, torch.ones(2)), torch.zeros(1, 5))


@pytest.mark.parametrize("magnitude", [1e20, 1e30, 1e38])
def test_regression_huge_float32_rewards_are_not_zeroed_by_an_overflowing_variance(magnitude):
    unit = torch.tensor([[1.0, -1.0, 1.0, 0.0], [0.25, 0.5, NAN, 1.0]])
    expected = group_advantages(unit.double(), eps=0.0)
    for scale in ("group", "batch"):
        got = group_advantages(unit * magnitude, scale=scale, eps=0.0)
        # tol: float32 rewards up to 1e38, scaled before squaring: the advantages |A| <= ~1.7 carry ~10 roundings of
        # 2^-24 relative (~1e-6) against float64 unit rewards: atol 1e-5 (+ allclose's default rtol 1e-5).
        assert torch.allclose(got.double(), group_advantages(unit.double(), scale=scale, eps=0.0), atol=1e-5)
    # tol: the default eps = 1e-4 is negligible next to a std of ~1e20 (relative 1e-24), so this is the eps = 0 float64
    # expectation again: ~10 float32 roundings of 2^-24 on |A| <= ~1.7 (~1e-6), atol 1e-5 (+ allclose's default rtol
    # 1e-5).
    assert torch.allclose(group_advantages(unit * magnitude).double(), expected, atol=1e-5)
    # tol: GPG's group scale, float32 at 1e20..1e38 against float64 unit rewards with eps = 0 on both effective sides:
    # ~10 roundings of 2^-24 on |A| <= ~1.7 (~1e-6): atol 1e-5 (+ rtol 1e-5).
    assert torch.allclose(gpg_advantages(unit * magnitude, f_norm="group").double(), expected, atol=1e-5)
    # tol: a float32 std of 4 values scaled by up to 1e38 (the scale itself rounded to float32, 2^-24 relative) against
    # the float64 std times the scale: ~6 roundings, ~4e-7 relative, rel_tol 1e-5.
    assert math.isclose(
        float(nanstd(unit[:1] * magnitude)), float(nanstd(unit[:1].double())) * magnitude, rel_tol=1e-5
    )
    per_func = (unit * magnitude)[..., None]
    # tol: not rounding: normalize_then_sum's default eps = 1e-4 is negligible next to the huge rewards' stds but 1e-4
    # / std_k ~ 1.0e-4 and 2.6e-4 of the unit rewards' two group stds (0.96, 0.38), so the z-scores differ relatively
    # by up to ~1.6e-4 between groups; after the batch standardisation |A| <= ~1.7 moves by ~3e-4, plus float32
    # rounding (~1e-6): 1e-3.
    torch.testing.assert_close(normalize_then_sum_advantages(per_func, torch.ones(1)), normalize_then_sum_advantages(unit[..., None], torch.ones(1)), atol=1e-3, rtol=0)  # fmt: skip


def test_regression_tiny_float32_rewards_with_eps_zero_do_not_explode():
    """Squares of 1e-30 underflow to 0 in float32: the std was 0 and the advantages +-3.4e38."""
    got = group_advantages(torch.tensor([[1e-30, 0.0]]), eps=0.0)
    torch.testing.assert_close(got, torch.tensor([[0.7071068, -0.7071068]]))
    torch.testing.assert_close(gpg_advantages(torch.tensor([[1e-30, 0.0]]), f_norm="group", eps=0.0), got)


@pytest.mark.parametrize("magnitude", [1e154, 1e300, 1e-300])
def test_regression_multiscale_float64_beyond_squares(magnitude):
    """Squares of float64 rewards overflow above ~1e154: wrong values there and NaN at 1e300."""
    unit = torch.tensor([[1.0, -1.0, 1.0, 0.0], [0.5, 0.25, 0.75, 0.5]], dtype=F64)
    for kw in ({}, dict(num_scales=2, subgroups_per_scale=2)):
        expected = multiscale_advantages(unit, eps=0.0, generator=torch.Generator().manual_seed(0), **kw)
        got = multiscale_advantages(unit * magnitude, eps=0.0, generator=torch.Generator().manual_seed(0), **kw)
        torch.testing.assert_close(got, expected)


def test_regression_multiscale_group_of_very_different_magnitudes():
    """The group-mean centring rounded the small rewards' differences away: distinct rewards got equal advantages,
    and the value-class tables and the enumeration disagreed (found at float32, as cast to float64 here)."""
    r = torch.tensor([[0.55075, 2.7036e-06, 6.4725, 2.49e-31, -3.354e26]], dtype=F64)
    a = multiscale_advantages(r)
    order = torch.argsort(r[0])
    assert bool((a[0, order][1:] > a[0, order][:-1]).all()), "strict order preservation (P7)"
    r = torch.tensor([[5.6355e28, 1.1431e-15, 8.5901e-30, 7.0559e27, -3.4056e-01, -1.2720e11]], dtype=F64)
    counts, enumerated = (multiscale_advantages(r, method=m) for m in ("counts", "enumerate"))
    torch.testing.assert_close(counts, enumerated)
    # tol: float64 advantages |A| <= ~3 of 6 rewards (z-score averages, scale-free) summed: ~6 x 2^-53 x 3 (~2e-15),
    # under 1e-12.
    assert abs(float(counts.sum())) < 1e-12 and abs(float(multiscale_advantages(r).sum())) < 1e-12


def test_regression_float64_nanstd_keeps_float64_precision():
    x = torch.tensor([[1.5409961082440434, -0.2934289057609464, -2.1787893820745577, 0.5684312772806678]], dtype=F64)
    # tol: a float64 std of 4 values ~1 against the float64 reference: ~10 roundings of 2^-53 relative (~1.1e-15),
    # rel_tol 1e-14.
    assert math.isclose(float(nanstd(x, dim=1)), ref_std(x[0].tolist(), 1), rel_tol=1e-14)
