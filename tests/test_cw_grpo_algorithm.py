"""CW-GRPO maths (grpo_family/algorithms/cw_grpo.py) against docs/methods/cw_grpo.md: the §12 worked examples, an
independent loop-based reference, and the §10 properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.algorithms.cw_grpo import covariance_stats, covariance_weights
from grpo_family.algorithms.reference import covariance_weights_reference as reference_weights

# tol(defaults): float64 on both sides of the same few operations (weights O(1) from exp of arguments <= ~N, sums of <=
# 12 values): a few tens of 2^-53 roundings, far inside assert_close's float64 defaults (rtol 1e-7, atol 1e-7) and
# approx's rel 1e-6; test_dtypes compares float32 weights of Example 1 (exp of arguments <= ~2, ~5 roundings of 2^-24
# relative: ~1e-6 relative on weights <= 1.3) with assert_close's float32 defaults (atol 1e-5 ~ 84 ULP of 1, rtol
# 1.3e-6).
SETTINGS = settings(max_examples=60, deadline=None)
F64 = torch.float64


def t64(x):
    return torch.tensor(x, dtype=F64)


# ----------------------------------------------------------------------------------------------------------------
# The independent reference (grpo_family.algorithms.reference): plain Python loops over the valid tokens of each scope
# (docs/methods/cw_grpo.md §2.4, steps 1-7).
# ----------------------------------------------------------------------------------------------------------------


@st.composite
def batches(draw, max_b=3, max_g=4, max_t=6):
    """Padded group-contiguous batches: random shapes, masks (some rows or groups empty), advantage kinds."""
    b, g, t = draw(st.integers(1, max_b)), draw(st.integers(1, max_g)), draw(st.integers(1, max_t))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n = b * g
    logp_kind = draw(st.sampled_from(["grid", "tied", "continuous"]))
    if logp_kind == "grid":
        logps = -(torch.rand(n, t, generator=gen, dtype=F64) * 500).round() / 100
    elif logp_kind == "tied":
        logps = t64([-0.05, -0.5, -2.0])[torch.randint(0, 3, (n, t), generator=gen)]
    else:
        logps = -torch.rand(n, t, generator=gen, dtype=F64) * 6
    adv_kind = draw(st.sampled_from(["binary", "normal", "zero", "mixed"]))
    if adv_kind == "normal":
        adv = torch.randn(n, generator=gen, dtype=F64)
    elif adv_kind == "zero":
        adv = torch.zeros(n, dtype=F64)
    else:  # TRL group advantages of binary rewards; "mixed" also zeroes whole groups
        r = torch.randint(0, 2, (b, g), generator=gen).to(F64)
        if adv_kind == "mixed":
            r[torch.rand(b, generator=gen) < 0.5] = 1.0
        std = r.std(1, keepdim=True) if g > 1 else torch.zeros(b, 1, dtype=F64)
        adv = ((r - r.mean(1, keepdim=True)) / (std + 1e-4)).reshape(-1)
    mask_kind = draw(st.sampled_from(["prefix", "random", "full"]))
    if mask_kind == "full":
        mask = torch.ones(n, t, dtype=torch.bool)
    elif mask_kind == "prefix":
        lengths = torch.randint(0, t + 1, (n,), generator=gen)
        mask = torch.arange(t)[None] < lengths[:, None]
    else:
        mask = torch.rand(n, t, generator=gen) < 0.7
    return logps, adv, mask, g


def scope_view(x, g, scope):
    n, t = x.shape
    return x.reshape(n // g, g * t) if scope == "group" else x.reshape(1, n * t)


OPTIONS = st.fixed_dictionaries(
    {
        "scope": st.sampled_from(["group", "batch"]),
        "adv_center": st.sampled_from(["token", "sequence"]),
        "std_ddof": st.sampled_from([0, 1]),
        "bandwidth_scale": st.sampled_from([1.0, 0.5, 3.0, math.inf]),
        "normalize": st.booleans(),
    }
)


# ----------------------------------------------------------------------------------------------------------------
# Worked examples (docs/methods/cw_grpo.md §12)
# ----------------------------------------------------------------------------------------------------------------


EX1 = (t64([[-0.20, -1.50, -0.05], [-2.00, -0.30, 0.00]]), t64([1.0, -1.0]), t64([[1, 1, 1], [1, 1, 0]]))


def test_example1_padding():
    logps, adv, mask = EX1
    w = covariance_weights(logps, adv, mask, 2)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(w, t64([[1.266106, 1.196810, 1.132839], [0.276071, 1.128174, 0.0]]), atol=1e-6, rtol=0)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(
        w * adv[:, None], t64([[1.266106, 1.196810, 1.132839], [-0.276071, -1.128174, 0.0]]), atol=1e-6, rtol=0
    )
    stats = covariance_stats(logps, adv, mask, 2)
    # tol: the terms are products of two float64 differences of 2-decimal values (3 roundings of values <= ~2, ~7e-16):
    # 1e-12.
    torch.testing.assert_close(stats.terms, t64([[0.488, -0.552, 0.608], [1.428, -0.612, 0.0]]), atol=1e-12, rtol=0)
    # tol: the covariance is a mean of 5 such terms (<= 8 roundings of values <= ~1.5, ~1.3e-15): 1e-12.
    assert stats.covariance.item() == pytest.approx(0.272, abs=1e-12)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    assert stats.sigma.item() == pytest.approx(0.768937, abs=1e-6)
    assert stats.num_tokens.tolist() == [5.0] and stats.degenerate.tolist() == [False]
    raw = covariance_weights(logps, adv, mask, 2, normalize=False)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(
        raw, t64([[0.817597, 0.772849, 0.731539], [0.178275, 0.728526, 0.0]]), atol=1e-6, rtol=0
    )


EX2_LOGPS = t64(
    [
        [-0.10, -0.30, -4.50, -0.20, -0.05],
        [-0.60, -1.20, -0.40, 0.00, 0.00],
        [-0.30, -0.90, -0.70, -1.10, 0.00],
        [-0.15, -0.25, -0.35, 0.00, 0.00],
    ]
)
EX2_MASK = t64([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])


def ex2_advantages():
    r = t64([1.0, 0.0, 0.0, 1.0])
    adv = (r - r.mean()) / (r.std() + 1e-4)  # TRL: unbiased std + 1e-4
    # tol: (r - mean) / (std + 1e-4) of 0/1 rewards in float64 (~4 roundings, ~4e-16) against 6-decimal printed values
    # (<= 5e-7): 1e-6.
    torch.testing.assert_close(adv, t64([0.865875, -0.865875, -0.865875, 0.865875]), atol=1e-6, rtol=0)
    return adv


@pytest.mark.parametrize(
    "options, expected, sigma",
    [
        (
            {},
            [
                [0.982528, 1.079808, 0.002435, 1.034532, 0.954381],
                [1.162081, 1.041439, 1.100107, 0, 0],
                [1.052196, 1.158107, 1.174084, 1.091350, 0],
                [1.009297, 1.058083, 1.099573, 0, 0],
            ],
            0.864363,
        ),
        (
            {"adv_center": "sequence"},
            [
                [0.974799, 1.072588, 0.002240, 1.027061, 0.946527],
                [1.158452, 1.064077, 1.110262, 0, 0],
                [1.072588, 1.155379, 1.167717, 1.103404, 0],
                [1.001696, 1.050739, 1.092471, 0, 0],
            ],
            0.920326,
        ),
        (
            {"std_ddof": 1},
            [
                [0.988236, 1.079266, 0.003654, 1.036970, 0.961787],
                [1.155826, 1.043430, 1.098191, 0, 0],
                [1.053486, 1.152137, 1.166965, 1.090030, 0],
                [1.013343, 1.058986, 1.097693, 0, 0],
            ],
            0.894701,
        ),
    ],
)
def test_example2_one_extreme_token_and_variants(options, expected, sigma):
    adv = ex2_advantages()
    w = covariance_weights(EX2_LOGPS, adv, EX2_MASK, 4, **options)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(w, t64(expected), atol=1e-6, rtol=0)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    assert covariance_stats(EX2_LOGPS, adv, EX2_MASK, 4, **options).sigma.item() == pytest.approx(sigma, abs=1e-6)


def test_example2_statistics_and_weighted_advantages():
    adv = t64([0.865875, -0.865875, -0.865875, 0.865875])  # the rounded values printed in docs/methods/cw_grpo.md §12
    stats = covariance_stats(EX2_LOGPS, adv, EX2_MASK, 4)
    # tol: the spec's terms printed to 6 decimals (<= 5e-7), float64 products of differences here (~1e-15): 1e-6.
    torch.testing.assert_close(
        stats.terms[0], t64([0.517216, 0.355586, -3.038644, 0.436401, 0.557623]), atol=1e-6, rtol=0
    )
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    assert stats.covariance.item() == pytest.approx(0.002309, abs=1e-6)
    raw = covariance_weights(EX2_LOGPS, adv, EX2_MASK, 4, normalize=False)
    # tol: a float64 sum of 16 raw weights <= 1 (<= 16 x 2^-53 x 16 ~ 3e-14) against the 6-decimal printed total (<=
    # 5e-7): 1e-6.
    assert raw.sum().item() == pytest.approx(12.764253, abs=1e-6)
    w = covariance_weights(EX2_LOGPS, adv, EX2_MASK, 4)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(
        (w * adv[:, None])[:2],
        t64([[0.850746, 0.934978, 0.002108, 0.895775, 0.826375], [-1.006217, -0.901756, -0.952556, 0, 0]]),
        atol=1e-6,
        rtol=0,
    )


EX3 = (
    t64([[-0.40, -0.90, -0.10], [-1.30, -0.20, 0.00], [-0.05, -2.20, -0.60], [-0.80, -0.35, -0.50]]),
    t64([0.0, 0.0, 0.707007, -0.707007]),
    t64([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]]),
)


def test_example3_group_scope():
    logps, adv, mask = EX3
    w = covariance_weights(logps, adv, mask, 2)
    expected = [[1, 1, 1], [1, 1, 0], [0.776526, 0.120814, 1.331755], [1.362845, 1.136375, 1.271686]]
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(w, t64(expected), atol=1e-6, rtol=0)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(
        (w * adv[:, None])[2:],
        t64([[0.549009, 0.085416, 0.941560], [-0.963541, -0.803425, -0.899091]]),
        atol=1e-6,
        rtol=0,
    )
    stats = covariance_stats(logps, adv, mask, 2)
    assert stats.degenerate.tolist() == [True, False]
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    assert stats.sigma[1].item() == pytest.approx(0.465409, abs=1e-6)
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(
        stats.terms[2:], t64([[0.494905, -1.025160, 0.106051], [0.035350, -0.282803, -0.176752]]), atol=1e-6, rtol=0
    )


def test_example3_batch_scope():
    logps, adv, mask = EX3
    w = covariance_weights(logps, adv, mask, 2, scope="batch")
    b = 1.198224
    expected = [[b, b, b], [b, b, 0], [0.550915, 0.011188, 1.185592], [1.159958, 0.972533, 1.128693]]
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    torch.testing.assert_close(w, t64(expected), atol=1e-6, rtol=0)
    stats = covariance_stats(logps, adv, mask, 2, scope="batch")
    # tol: the worked values of docs/methods/cw_grpo.md §12 are printed to 6 decimals (<= 5e-7 off) and computed here
    # in float64 (a few tens of roundings of values <= ~5, ~1e-14): 1e-6.
    assert stats.sigma.item() == pytest.approx(0.353177, abs=1e-6)
    assert stats.num_tokens.tolist() == [11.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_example4_clustered_terms_stay_finite(dtype):
    logps = torch.tensor([[-0.50, -0.5002], [-1.50, -1.4999]], dtype=dtype)
    adv, mask = torch.tensor([1.0, -1.0], dtype=dtype), torch.ones(2, 2)
    stats = covariance_stats(logps.double(), adv.double(), mask, 2)
    # tol: sigma = 7.90569e-5 is printed to 6 significant digits (6e-7 relative). In float64 the rest is ~1e-12
    # relative (differences of 2e-4 from values ~1, 2^-53 x 1 / 1e-4); in float32 the literals -0.5002 and -1.4999 are
    # rounded first (half a ULP, 3e-8 and 6e-8, fixed by IEEE 754 and so the same on every machine), which moves sigma
    # by -7.2e-5 relative: rel 1e-4 bounds these two exactly rounded inputs, not arbitrary rounding.
    assert stats.sigma.item() == pytest.approx(0.0000790569, rel=1e-4)
    # The literal w * N / sum(w) is 0/0 here: every raw weight underflows.
    assert covariance_weights(logps, adv, mask, 2, normalize=False).sum().item() == 0.0
    w = covariance_weights(logps, adv, mask, 2)
    assert w.dtype == dtype
    # tol: Example 4's weights are 0 and 4 exactly in exact arithmetic; the log-space normalisation (softmax of
    # arguments ~1e8 apart) returns them to within a few ULP of 4 (4 x 2^-23 ~ 5e-7 in float32): 1e-6.
    torch.testing.assert_close(w, torch.tensor([[0.0, 4.0], [0.0, 0.0]], dtype=dtype), atol=1e-6, rtol=0)


def test_example5_equal_abs_terms_is_grpo():
    logps, adv = t64([[-0.5, -1.5], [-1.5, -0.5]]), t64([1.0, -1.0])
    assert covariance_stats(logps, adv, torch.ones(2, 2), 2).sigma.item() == pytest.approx(0.5)
    torch.testing.assert_close(covariance_weights(logps, adv, torch.ones(2, 2), 2), torch.ones(2, 2, dtype=F64))


def test_example6_single_valid_token():
    x = float("nan")  # garbage under the mask
    w = covariance_weights(t64([[-0.7, x], [x, x]]), t64([0.5, -0.5]), t64([[1, 0], [0, 0]]), 2)
    assert w.tolist() == [[1.0, 0.0], [0.0, 0.0]]


# ----------------------------------------------------------------------------------------------------------------
# Reference implementation and the §10 properties
# ----------------------------------------------------------------------------------------------------------------


@SETTINGS
@given(batches(), OPTIONS, st.booleans())
def test_matches_loop_reference(batch, options, per_token_adv):
    logps, adv, mask, g = batch
    if per_token_adv:  # (N, T) advantages, constant along each row, garbage at padding
        adv = torch.where(mask, adv[:, None].expand_as(logps), torch.full_like(logps, 1e30))
    w = covariance_weights(logps, adv, mask, g, **options)
    # tol: two float64 computations (vectorised and Python loops) of weights exp(-c^2 / 2 kappa^2 sigma^2) with
    # arguments <= ~N = 72: relative error <= |argument| x a few roundings (~72 x 10 x 2^-53 ~ 1e-13) after a sum of <=
    # 72 terms for the normalisation: 1e-9 absolute + relative is ~1e4 x that.
    torch.testing.assert_close(w, reference_weights(logps, adv, mask, g, **options), atol=1e-9, rtol=1e-9)


@SETTINGS
@given(batches(), st.sampled_from(["group", "batch"]))
def test_finite_zero_on_padding_and_mean_one(batch, scope):
    logps, adv, mask, g = batch
    w = covariance_weights(logps, adv, mask, g, scope=scope)
    assert torch.isfinite(w).all() and not w.requires_grad
    assert (w[~mask] == 0).all() and (w[mask] >= 0).all()
    w_s, m_s = scope_view(w, g, scope), scope_view(mask, g, scope)
    n = m_s.sum(1).to(F64)
    # tol: a float64 sum of n <= 72 weights <= n: <= n x 2^-53 x n ~ 1e-12 absolute at n = 72, the bound 1e-9 x n
    # scales with n.
    torch.testing.assert_close(w_s.sum(1), n, atol=1e-9 * max(n.max().item(), 1.0), rtol=0)


@SETTINGS
@given(batches(), st.sampled_from(["group", "batch"]))
def test_range_and_monotone_in_abs_covariance(batch, scope):
    logps, adv, mask, g = batch
    w = covariance_weights(logps, adv, mask, g, scope=scope)
    raw = covariance_weights(logps, adv, mask, g, scope=scope, normalize=False)
    c = covariance_stats(logps, adv, mask, g, scope=scope).terms
    assert (raw[mask] <= 1).all() and (raw[mask] >= 0).all()
    for ws, cs, ms in zip(scope_view(w, g, scope), scope_view(c, g, scope), scope_view(mask, g, scope)):
        if not ms.any():
            continue
        wv, cv = ws[ms], cs[ms].abs()
        assert wv.max() >= 1 - 1e-12 and wv.min() <= 1 + 1e-12  # max w~ >= 1 >= min w~ (property 4)
        smaller = cv[:, None] < cv[None, :] - 1e-12  # |c_a| < |c_b|  =>  w~_a >= w~_b (property 3)
        assert (wv[:, None] >= wv[None, :] - 1e-12)[smaller].all()


@SETTINGS
@given(batches())
def test_stable_form_equals_literal_form(batch):
    logps, adv, mask, g = batch
    w = covariance_weights(logps, adv, mask, g)
    raw = covariance_weights(logps, adv, mask, g, normalize=False)
    raw_s, m_s = scope_view(raw, g, "group"), scope_view(mask, g, "group")
    total = raw_s.sum(1, keepdim=True)
    # tol: not a comparison tolerance: an underflow guard; the literal form w N / sum(w) is 0/0 when every raw weight
    # underflows, and a total under 1e-200 leaves too few bits for a 1e-9 comparison of the literal form.
    if (total[m_s.any(1)] < 1e-200).any():
        return  # underflow: the literal form is 0/0 (Example 4); covered there
    literal = torch.where(m_s, m_s.sum(1, keepdim=True) * raw_s / total.clamp_min(1e-300), 0.0)
    # tol: the stable (log-space softmax) and literal (w N / sum w) forms in float64: exp and a sum of <= 72 terms each
    # side, ~100 roundings of 2^-53 relative (~1e-14): 1e-9.
    torch.testing.assert_close(w, literal.reshape(w.shape), atol=1e-9, rtol=1e-9)


@SETTINGS
@given(batches(), st.sampled_from(["group", "batch"]), st.sampled_from(["token", "sequence"]))
def test_padding_values_are_ignored(batch, scope, adv_center):
    logps, adv, mask, g = batch
    adv_tok = adv[:, None].expand_as(logps).clone()
    garbage = t64([float("nan"), float("inf"), -float("inf"), 1e300, -7.0])
    pad = garbage[torch.arange(logps.numel()).reshape(logps.shape) % 5]
    w = covariance_weights(logps, adv_tok, mask, g, scope=scope, adv_center=adv_center)
    w_pad = covariance_weights(
        torch.where(mask, logps, pad),
        torch.where(mask, adv_tok, pad.flip(0)),
        mask,
        g,
        scope=scope,
        adv_center=adv_center,
    )
    assert torch.equal(w, w_pad)
    assert torch.equal(w, covariance_weights(logps, adv, mask, g, scope=scope, adv_center=adv_center))


@SETTINGS
@given(
    batches(),
    st.sampled_from(["group", "batch"]),
    st.sampled_from([-2.0, -0.5, 0.5, 3.0]),
    st.sampled_from([-1.0, 0.0, 4.0]),
    st.sampled_from([-1.0, 0.25, 2.0]),
    st.sampled_from([0.0, 1.5, -10.0]),
)
def test_affine_invariance(batch, scope, a, b, k, d):
    logps, adv, mask, g = batch
    w = covariance_weights(logps, adv, mask, g, scope=scope)
    w2 = covariance_weights(a * logps + b, k * adv + d, mask, g, scope=scope)
    # tol: a logps + b and k adv + d round each input once (|values| <= ~22: ~2.4e-15 absolute); the centred terms c
    # and sigma carry that relative to their scale, and the weights exp(-c^2 / 2 sigma^2) multiply it by (c / sigma)^2
    # <= ~N = 72: ~1e-12 relative unless a scope's sigma is within ~1e-8 of its terms' rounding (the strategy draws
    # O(1) or 0.01-grid logps, so sigma is 0 or >= ~1e-3): 1e-7.
    torch.testing.assert_close(w2, w, atol=1e-7, rtol=1e-7)


@SETTINGS
@given(batches(max_b=3), st.integers(0, 2**31 - 1))
def test_group_independence(batch, seed):
    logps, adv, mask, g = batch
    n_groups = logps.shape[0] // g
    gen = torch.Generator().manual_seed(seed)
    logps2, adv2, mask2 = logps.clone(), adv.clone(), mask.clone()
    logps2[g:] = -torch.rand(logps2[g:].shape, generator=gen, dtype=F64) * 3
    adv2[g:] = torch.randn(adv2[g:].shape, generator=gen, dtype=F64)
    mask2[g:] = torch.rand(mask2[g:].shape, generator=gen) < 0.5
    w, w2 = covariance_weights(logps, adv, mask, g), covariance_weights(logps2, adv2, mask2, g)
    assert torch.equal(w[:g], w2[:g])
    assert n_groups == 1 or not torch.equal(logps[g:], logps2[g:])  # the other groups did change


@pytest.mark.parametrize("seed", range(4))
def test_batch_scope_couples_the_groups_and_group_scope_does_not(seed):
    """Changing group 2's log-probs, advantages and mask changes group 1's weights under scope="batch" (shared
    means, sigma and normalisation) and leaves them bit-identical under scope="group" (property 7)."""
    gen = torch.Generator().manual_seed(seed)
    g, t = 4, 6
    logps = -torch.rand(3 * g, t, generator=gen, dtype=F64) * 3
    adv = torch.randn(3 * g, generator=gen, dtype=F64)
    mask = torch.arange(t)[None] < torch.randint(2, t + 1, (3 * g,), generator=gen)[:, None]
    logps2, adv2, mask2 = logps.clone(), adv.clone(), mask.clone()
    group2 = slice(g, 2 * g)
    logps2[group2] = -torch.rand(g, t, generator=gen, dtype=F64) * 3
    adv2[group2] = torch.randn(g, generator=gen, dtype=F64) * 2
    mask2[group2] = torch.arange(t)[None] < torch.randint(2, t + 1, (g,), generator=gen)[:, None]
    for scope in ("group", "batch"):
        w = covariance_weights(logps, adv, mask, g, scope=scope)
        w2 = covariance_weights(logps2, adv2, mask2, g, scope=scope)
        for other in (slice(0, g), slice(2 * g, 3 * g)):  # groups 1 and 3
            if scope == "group":
                assert torch.equal(w2[other], w[other])
            else:
                assert (w2[other] - w[other]).abs().max() > 1e-3


@SETTINGS
@given(batches(), st.sampled_from(["group", "batch"]), st.integers(0, 2**31 - 1))
def test_permutation_equivariance_within_groups(batch, scope, seed):
    logps, adv, mask, g = batch
    gen = torch.Generator().manual_seed(seed)
    n = logps.shape[0]
    perm = torch.cat([torch.randperm(g, generator=gen) + s for s in range(0, n, g)])
    tok_perm = torch.randperm(logps.shape[1], generator=gen)  # token order inside a row is irrelevant too
    w = covariance_weights(logps, adv, mask, g, scope=scope)
    w2 = covariance_weights(logps[perm][:, tok_perm], adv[perm], mask[perm][:, tok_perm], g, scope=scope)
    # tol: a permutation only reorders the float64 sums (<= 72 terms) inside mean, std and the normalisation: ~72 x
    # 2^-53 relative, times (c / sigma)^2 <= 72 in the exponent: ~1e-12, under 1e-9.
    torch.testing.assert_close(w2, w[perm][:, tok_perm], atol=1e-9, rtol=1e-9)


@SETTINGS
@given(batches())
def test_huge_bandwidth_recovers_grpo(batch):
    logps, adv, mask, g = batch
    w = covariance_weights(logps, adv, mask, g, bandwidth_scale=1e4)
    # tol: not rounding: with kappa = 1e4 the kernel is 1 - c^2 / (2e8 sigma^2) + ..., so the normalised weights differ
    # from 1 by ~spread(c^2) / (2e8 sigma^2), ~N x 5e-9 ~ 3.6e-7 for N <= 72 tokens when |c| / sigma <= ~sqrt(N) (terms
    # near their mean). A scope whose covariance (the mean of c) is many sigma from 0 could exceed 1e-6: flagged in the
    # audit report.
    assert ((w[mask] - 1).abs() < 1e-6).all()


@SETTINGS
@given(batches(), st.sampled_from(["group", "batch"]), st.sampled_from(["token", "sequence"]), st.booleans())
def test_infinite_bandwidth_is_exactly_grpo(batch, scope, adv_center, normalize):
    """kappa = inf (docs/methods/cw_grpo.md §9 ablation value; §4.1: kappa -> inf recovers GRPO): weight exactly 1 on every valid
    token, whatever the scope's sigma, and finite statistics."""
    logps, adv, mask, g = batch
    options = dict(scope=scope, adv_center=adv_center, bandwidth_scale=math.inf)
    w = covariance_weights(logps, adv, mask, g, normalize=normalize, **options)
    assert torch.equal(w, mask.to(w.dtype))
    stats = covariance_stats(logps, adv, mask, g, **options)
    assert not torch.isnan(stats.sigma).any()
    assert torch.equal(stats.degenerate, covariance_stats(logps, adv, mask, g, scope=scope).degenerate)


@pytest.mark.parametrize("normalize", [True, False])
def test_infinite_bandwidth_with_a_zero_sigma_group(normalize):
    """A group whose c are all identical (sigma = 0) although its log-probs and advantages vary (property 9d),
    next to a normal group: kappa = inf gives ones, not 0 * inf = NaN."""
    logps = torch.cat([t64([[-0.5, -0.5], [-1.5, -1.5]]), EX1[0][:, :2]])
    adv = torch.cat([t64([1.0, -1.0]), EX1[1]])
    mask = torch.ones(4, 2)
    stats = covariance_stats(logps, adv, mask, 2, bandwidth_scale=math.inf)
    assert stats.sigma[0].item() == 0.0 and stats.degenerate.tolist() == [True, False]
    for scope in ("group", "batch"):
        w = covariance_weights(logps, adv, mask, 2, scope=scope, bandwidth_scale=math.inf, normalize=normalize)
        assert torch.equal(w, torch.ones(4, 2, dtype=F64))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4, math.inf])
def test_degeneracy_is_decided_on_the_std_before_the_bandwidth_scale(scale):
    """docs/methods/cw_grpo.md §2.4 step 7: a scope is degenerate when the std of c is <= eps; kappa only sets the kernel width.
    Example 1 shrunk so that std(c) = 0.77 * 1e-6 (> eps = 1e-8): kappa = 1e-3 still weights it (like the unshrunk
    example with the same kappa, by affine invariance); shrunk to std(c) = 0.77 * 1e-10 (< eps): weights 1 even
    with kappa = 1e4."""
    logps, adv, mask = EX1
    live = covariance_weights(logps * 1e-3, adv * 1e-3, mask, 2, bandwidth_scale=scale)
    expected = covariance_weights(logps, adv, mask, 2, bandwidth_scale=scale)
    # tol: scaling logps and adv by 1e-3 scales c by 1e-6 and sigma with it: the ratio c / sigma carries a few float64
    # roundings (~1e-15), times (c / sigma)^2 <= 5 / kappa^2 in the exponent (kappa = 1e-3: ~5e6 x 1e-15 = 5e-9
    # relative on weights <= 2): 1e-9 absolute + 1e-9 relative.
    torch.testing.assert_close(live, expected, atol=1e-9, rtol=1e-9)
    assert scale > 1 or (live[mask.bool()] - 1).abs().max() > 0.1  # a wide kernel is ~1 anyway
    dead = covariance_weights(logps * 1e-5, adv * 1e-5, mask, 2, bandwidth_scale=scale)
    assert torch.equal(dead, mask.to(F64))
    assert covariance_stats(logps * 1e-5, adv * 1e-5, mask, 2, bandwidth_scale=scale).degenerate.all()


@SETTINGS
@given(
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
    st.floats(-5, -0.5),
    st.floats(0.01, 0.4),
    st.floats(0.1, 3),
    st.integers(0, 2**31 - 1),
)
def test_equal_abs_terms_give_all_ones(b, half_g, half_t, centre, delta, alpha, seed):
    """All |c| equal (property 9a): half the rows +alpha, half -alpha; each row half centre+delta, half centre-delta."""
    gen = torch.Generator().manual_seed(seed)
    g, t = 2 * half_g, 2 * half_t
    signs = torch.tensor([1.0] * half_t + [-1.0] * half_t, dtype=F64)
    logps = torch.stack([centre + delta * signs[torch.randperm(t, generator=gen)] for _ in range(b * g)])
    adv = (alpha * torch.tensor([1.0] * half_g + [-1.0] * half_g, dtype=F64)).repeat(b)
    w = covariance_weights(logps, adv, torch.ones(b * g, t), g)
    # tol: all |c| equal: c^2 / sigma^2 is the same for every token up to a few float64 roundings of (centre +- delta -
    # mean) x alpha (~1e-15 relative), so the normalised weights are 1 within ~N x 1e-15: 1e-9.
    torch.testing.assert_close(w, torch.ones_like(w), atol=1e-9, rtol=0)
    assert not covariance_stats(logps, adv, torch.ones(b * g, t), g).degenerate.any()


@pytest.mark.parametrize("value", [0.0, 0.37, -2.5, 1e9])
def test_equal_advantages_give_all_ones(value):
    gen = torch.Generator().manual_seed(0)
    logps = -torch.rand(6, 5, generator=gen, dtype=F64) * 4
    mask = torch.rand(6, 5, generator=gen) < 0.8
    w = covariance_weights(logps, torch.full((6,), value, dtype=F64), mask, 3)
    assert torch.equal(w, mask.to(F64))


def test_identical_terms_give_all_ones():
    # two perfectly correlated tokens: c = 0.5 for both, sigma = 0 (property 9d)
    logps, adv = t64([[-0.5], [-1.5]]), t64([1.0, -1.0])
    assert covariance_stats(logps, adv, torch.ones(2, 1), 2).terms.tolist() == [[0.5], [0.5]]
    assert covariance_weights(logps, adv, torch.ones(2, 1), 2).tolist() == [[1.0], [1.0]]


@SETTINGS
@given(batches(max_t=1), st.sampled_from(["group", "batch"]))
def test_single_token_completions(batch, scope):
    logps, adv, mask, g = batch
    w = covariance_weights(logps, adv, mask, g, scope=scope)
    assert torch.isfinite(w).all()
    # tol: the weights of a scope sum to its token count n <= 72 up to a float64 sum of n terms (<= 72 x 2^-53 x 72 ~
    # 1e-12): 1e-9.
    torch.testing.assert_close(
        scope_view(w, g, scope).sum(1), scope_view(mask, g, scope).sum(1).to(F64), atol=1e-9, rtol=0
    )


@pytest.mark.parametrize("scope", ["group", "batch"])
def test_all_padding(scope):
    nan = torch.full((4, 3), float("nan"), dtype=F64)
    w = covariance_weights(nan, torch.zeros(4, dtype=F64), torch.zeros(4, 3), 2, scope=scope)
    assert torch.equal(w, torch.zeros(4, 3, dtype=F64))
    stats = covariance_stats(nan, torch.zeros(4, dtype=F64), torch.zeros(4, 3), 2, scope=scope)
    assert torch.isfinite(stats.sigma).all() and (stats.num_tokens == 0).all()


def test_group_of_only_padding_next_to_a_normal_group():
    logps, adv, mask = EX3
    mask = mask.clone()
    mask[:2] = 0
    w = covariance_weights(logps, adv, mask, 2)
    assert (w[:2] == 0).all()
    torch.testing.assert_close(w[2:], covariance_weights(logps[2:], adv[2:], mask[2:], 2), atol=0, rtol=0)
    for adv_center in ("token", "sequence"):
        wb = covariance_weights(logps, adv, mask, 2, scope="batch", adv_center=adv_center)
        assert torch.isfinite(wb).all() and wb.sum().item() == pytest.approx(6.0)


@pytest.mark.parametrize("scope", ["group", "batch"])
def test_empty_batch(scope):
    w = covariance_weights(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, 4), 2, scope=scope)
    assert w.shape == (0, 4)


def test_covariance_identity():
    """mean over the scope of c = population Cov(logp, A) over the group's valid tokens (property 13)."""
    gen = torch.Generator().manual_seed(3)
    logps = -torch.rand(8, 6, generator=gen, dtype=F64) * 3
    adv, mask = torch.randn(8, generator=gen, dtype=F64), torch.rand(8, 6, generator=gen) < 0.7
    stats = covariance_stats(logps, adv, mask, 4)
    for g in range(2):
        rows = slice(4 * g, 4 * g + 4)
        m = mask[rows]
        x, y = logps[rows][m], adv[rows][:, None].expand(4, 6)[m]
        expected = torch.cov(torch.stack([x, y]), correction=0)[0, 1]
        # tol: the covariance as a mean of c (<= 48 terms, |c| <= ~3 x 3) against torch.cov (another order, another
        # formula): <= ~100 float64 roundings of ~10: ~1e-13, under 1e-12.
        assert stats.covariance[g].item() == pytest.approx(expected.item(), abs=1e-12)


def test_weights_are_detached_and_gradient_is_rescaled():
    """Property 11: with detached weights, dL_CW/dlogp = w~ * dL_GRPO/dlogp for the policy term."""
    logps, adv, mask = (x.clone() for x in EX1)
    logps.requires_grad_(True)
    w = covariance_weights(logps, adv, mask, 2)
    assert not w.requires_grad
    old = logps.detach()
    (grad_grpo,) = torch.autograd.grad(-(torch.exp(logps - old) * adv[:, None] * mask).sum(), logps)
    (grad_cw,) = torch.autograd.grad(-(torch.exp(logps - old) * (w * adv[:, None]) * mask).sum(), logps)
    torch.testing.assert_close(grad_cw, w * grad_grpo)


def test_dtypes():
    logps, adv, mask = EX1
    assert covariance_weights(logps.float(), adv.float(), mask, 2).dtype == torch.float32
    assert covariance_weights(logps.bfloat16(), adv.float(), mask.bool(), 2).dtype == torch.float32
    assert covariance_weights(logps.float(), adv, mask, 2).dtype == torch.float64
    torch.testing.assert_close(
        covariance_weights(logps.float(), adv.float(), mask, 2), covariance_weights(logps, adv, mask, 2).float()
    )


def test_invalid_arguments():
    logps, adv, mask = EX1
    with pytest.raises(ValueError):
        covariance_weights(logps, adv, mask, 3)  # N not a multiple of G
    with pytest.raises(ValueError):
        covariance_weights(logps, adv, mask, 2, scope="micro")
    with pytest.raises(ValueError):
        covariance_weights(logps, adv, mask, 2, adv_center="median")
    with pytest.raises(ValueError):
        covariance_weights(logps, adv, mask, 2, std_ddof=2)
    for bad in (0.0, -1.0, -math.inf, math.nan):
        with pytest.raises(ValueError, match="bandwidth_scale must be > 0"):
            covariance_weights(logps, adv, mask, 2, bandwidth_scale=bad)
    with pytest.raises(ValueError):
        covariance_weights(logps, adv[:1], mask, 2)
    assert covariance_weights(logps, adv, mask, 3, scope="batch").shape == logps.shape  # G unused for batch


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    for logps, adv, mask in (EX1, EX3):
        for scope in ("group", "batch"):
            cpu = covariance_weights(logps, adv, mask, 2, scope=scope)
            gpu = covariance_weights(logps.cuda().float(), adv.cuda().float(), mask.cuda(), 2, scope=scope)
            assert gpu.device.type == "cuda"
            # tol: float32 on the GPU against float64 on the CPU: Example 1 and 3 weights <= ~1.4 carry ~5 roundings of
            # 2^-24 relative (~3e-7) plus the exponent's error, |argument| x that, on small weights only (the largest
            # argument, ~4.5, gives a weight ~0.01: ~2e-8 absolute): 1e-6 absolute + 1e-6 relative.
            torch.testing.assert_close(gpu.cpu(), cpu.float(), atol=1e-6, rtol=1e-6)
