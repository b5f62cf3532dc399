"""MS-GRPO maths (grpo_family/algorithms/ms_grpo.py) against docs/methods/ms_grpo.md: worked numbers (§12), brute
force, the testable properties (§10) and the accelerated scheme (§2.8)."""

import itertools
import math
import statistics
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.algorithms import ms_grpo as ms_module
from grpo_family.algorithms.ms_grpo import (
    MAX_ENUMERATED_SUBGROUPS,
    diverse_subgroups,
    draw_scales,
    dss_intervals,
    multiscale_advantages,
    num_subgroups,
    scale_weights,
    validate_multiscale_options,
)
from grpo_family.algorithms.reference import multiscale_advantages_reference as ms_reference

EXACT_METHODS = ("auto", "enumerate", "counts")
SETTINGS = settings(max_examples=40, deadline=None)


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def one_hot(G, tau_min, tau):
    return [1.0 if k == tau else 0.0 for k in range(tau_min, G + 1)]


def grpo(r, std="population", eps=1e-6):
    r = t(r)
    sd = r.std(-1, correction=0 if std == "population" else 1, keepdim=True)
    return (r - r.mean(-1, keepdim=True)) / (sd + eps)


# tol: the helper's default atol 5e-7: see the comment on its allclose below.
def close(a, b, atol=5e-7):
    # tol: 5e-7 is half a unit of the 6th decimal the worked values of docs/methods/ms_grpo.md §12 are printed to; the
    # float64 computation adds ~1e-15, and allclose's default rtol 1e-5 x |value| on top covers it for values not near 0.
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=atol)


# ------------------------------------------------------------------------------------- worked examples §12


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_spec_12_1_lone_success_g4(method):
    r = t([[1, 0, 0, 0]])
    scales = {2: [1.0, -1 / 3], 3: [1.414214, -0.471405], 4: [1.732051, -0.577350]}
    for tau, (a1, a0) in scales.items():
        out = multiscale_advantages(r, eps=0.0, weights=one_hot(4, 2, tau), method=method)
        assert close(out, [[a1, a0, a0, a0]])
    assert close(multiscale_advantages(r, eps=0.0, method=method), [[1.382088] + [-0.460696] * 3])
    assert close(multiscale_advantages(r, method=method), [[1.382085] + [-0.460695] * 3])
    sample = {2: [0.707106, -0.235702], 3: [1.154699, -0.384900], 4: [1.499997, -0.499999]}
    for tau, (a1, a0) in sample.items():
        out = multiscale_advantages(r, std="sample", weights=one_hot(4, 2, tau), method=method)
        # tol: the sample-std worked values are printed to 6 decimals (<= 5e-7 off: 4.6e-7 at tau = 3) and float64 adds
        # ~1e-15; 1e-6 doubles the printing's half unit (the 5e-7 default would hold too).
        assert close(out, [[a1, a0, a0, a0]], atol=1e-6)
    assert close(multiscale_advantages(r, std="sample", method=method), [[1.120600] + [-0.373533] * 3])


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_spec_12_2_continuous_g5(method):
    r = t([[0.2, 0.9, 0.5, 0.5, 0.0]])
    table = {
        2: [-0.499998, 0.999996, 0.249999, 0.249999, -0.999995],
        3: [-0.749254, 1.284626, 0.329859, 0.329859, -1.195091],
        4: [-0.739370, 1.446980, 0.303878, 0.303878, -1.315365],
        5: [-0.719090, 1.568924, 0.261487, 0.261487, -1.372808],
    }
    for tau, row in table.items():
        assert close(multiscale_advantages(r, weights=one_hot(5, 2, tau), method=method), [row])
    assert close(multiscale_advantages(r, method=method), [[-0.676928, 1.325131, 0.286306, 0.286306, -1.220815]])
    flat = multiscale_advantages(r, weights="flat", eps=0.0, method=method)
    assert close(flat, [[-0.678142, 1.270977, 0.297078, 0.297078, -1.186991]])


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_spec_12_3_binary_g8(method):
    r = t([[1, 0, 1, 1, 0, 0, 0, 0]])
    ones = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    scales = [0.714284, 1.010150, 1.148776, 1.218851, 1.256102, 1.276537, 1.290992]
    wrong = [-0.428571, -0.606090, -0.689266, -0.731310, -0.753661, -0.765922, -0.774595]
    for tau, a1, a0 in zip(range(2, 9), scales, wrong):
        out = multiscale_advantages(r, weights=one_hot(8, 2, tau), method=method)[0]
        assert close(out[ones], [a1] * 3) and close(out[~ones], [a0] * 5)
    out = multiscale_advantages(r, method=method)[0]
    assert close(out[ones], [1.130813] * 3) and close(out[~ones], [-0.678488] * 5)
    # tol: the advantages of a group sum to 0 up to float64 rounding: 8 values |A| <= ~1.3, each an average of subgroup
    # z-scores (~1e-15 each), summed: ~1e-14, under 1e-12.
    assert abs(out.sum()) < 1e-12
    # tol: kappa(3, 8) is printed to 4 decimals in the spec (<= 5e-5 off); the float64 ratio adds ~1e-15.
    assert abs(out[0] / grpo([1, 0, 1, 1, 0, 0, 0, 0])[0] - 0.8759) < 5e-5  # kappa(3, 8)
    sample = multiscale_advantages(r, std="sample", method=method)[0]
    assert close(sample[ones], [0.993003] * 3) and close(sample[~ones], [-0.595802] * 5)
    pair = multiscale_advantages(r, std="sample", weights=one_hot(8, 2, 2), method=method)[0]
    assert close(pair[:2], [0.505076, -0.303045])


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_spec_12_4_global_weights_sample_std(method):
    # tol: the global weights (tau - tau_min + 1) / sum are one float64 division each (<= 2^-53 x 0.4 ~ 4.4e-17):
    # 1e-15.
    assert close(scale_weights(6, 3, "global"), [0.1, 0.2, 0.3, 0.4], atol=1e-15)
    r = t([[0, 0.25, 0.5, 1, 1, 0.75]])
    table = {
        3: [-0.995949, -0.693948, -0.237206, 0.819258, 0.819258, 0.288586],
        4: [-1.188411, -0.786995, -0.245314, 0.921349, 0.921349, 0.378023],
        5: [-1.326607, -0.817176, -0.216729, 0.981542, 0.981542, 0.397428],
        6: [-1.428519, -0.816297, -0.204074, 1.020371, 1.020371, 0.408148],
    }
    opts = dict(tau_min=3, std="sample", eps=1e-4, method=method)
    for tau, row in table.items():
        assert close(multiscale_advantages(r, weights=one_hot(6, 3, tau), **opts), [row])
    expected = [[-1.306667, -0.798465, -0.219432, 0.968806, 0.968806, 0.386951]]
    assert close(multiscale_advantages(r, weights="global", **opts), expected)
    assert close(multiscale_advantages(r, weights=[1, 2, 3, 4], **opts), expected)  # unnormalised sequence


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_spec_12_5_sign_flip(method):
    r = t([[0, 5, 6, 7]])
    assert close(
        multiscale_advantages(r, eps=0.0, weights=[0, 1, 0], method=method),
        [[-1.385853, -0.125687, 0.476055, 1.035485]],
    )
    out = multiscale_advantages(r, eps=0.0, method=method)
    assert close(out, [[-1.352370, -0.091108, 0.455491, 0.987987]])
    assert grpo([0, 5, 6, 7], eps=0.0)[1] > 0 > out[0, 1]


@pytest.mark.parametrize("method", EXACT_METHODS)
def test_spec_12_6_degenerate_cases(method):
    for std in ("population", "sample"):
        assert torch.equal(
            multiscale_advantages(t([[0.3, 0.3, 0.3]]), std=std, method=method), torch.zeros(1, 3).double()
        )
    assert close(multiscale_advantages(t([[0.8, 0.2]]), method=method), [[0.999997, -0.999997]])
    assert close(multiscale_advantages(t([[0.8, 0.2]]), std="sample", method=method), [[0.707105, -0.707105]])


def test_spec_12_7_accelerated():
    r = t([[0.2, 0.9, 0.4, 0.4]])
    for partition in ("bottom", "paper"):
        acc = multiscale_advantages(r, num_scales=3, subgroups_per_scale=6, partition=partition)
        assert close(acc, [[-1.071387, 1.340221, -0.134417, -0.134417]])
        # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
        # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups:
        # ~1e-13, under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
        assert torch.allclose(acc, multiscale_advantages(r), atol=1e-12)
    assert diverse_subgroups(8, 2, 8) == ((0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (4, 6), (5, 7))
    assert diverse_subgroups(8, 4, 8) == (
        (0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 4, 5), (2, 3, 6, 7), (0, 1, 6, 7), (2, 3, 4, 5), (0, 2, 4, 6), (1, 3, 5, 7),
    )  # fmt: skip
    assert diverse_subgroups(8, 6, 8) == (
        (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 6, 7), (0, 1, 4, 5, 6, 7), (2, 3, 4, 5, 6, 7),
        (0, 1, 2, 3, 4, 6), (0, 1, 2, 3, 5, 7), (0, 2, 4, 5, 6, 7), (1, 3, 4, 5, 6, 7),
    )  # fmt: skip
    # (b): find a seed whose bottom-partition draw is T = {2, 4, 6, 8}, then run with that seed
    seed = next(s for s in range(1000) if draw_scales(1, 8, num_scales=4, generator=torch.Generator().manual_seed(s))[0].nonzero().flatten().tolist() == [0, 2, 4, 6])  # fmt: skip
    out = multiscale_advantages(
        t([[1, 0, 1, 1, 0, 0, 0, 0]]),
        num_scales=4,
        subgroups_per_scale=8,
        generator=torch.Generator().manual_seed(seed),
    )
    expected = [1.081599, -0.864088, 0.830849, 1.035846, -0.534259, -0.507844, -0.534259, -0.507844]
    assert close(out, [expected])
    # tol: the advantages of a group sum to 0 up to float64 rounding (8 values |A| <= ~1.1, ~1e-14): 1e-12.
    assert abs(out.sum()) < 1e-12


def binary_closed_form(P, G, std, eps=0.0, tau_min=2):
    """docs/methods/ms_grpo.md §3.2 binary closed form, A_+ and A_- with uniform weights (written independently of the module)."""
    Q, f = G - P, {}
    plus = minus = 0.0
    for tau in range(tau_min, G + 1):
        f = 1.0 if std == "population" else math.sqrt(tau / (tau - 1))

        def a(c, y, tau=tau, f=f):
            if c in (0, tau):
                return 0.0
            p = c / tau
            return (y - p) / (f * math.sqrt(p * (1 - p)) + eps)

        n = math.comb(G - 1, tau - 1)
        plus += sum(math.comb(P - 1, j) * math.comb(Q, tau - 1 - j) * a(j + 1, 1) for j in range(tau)) / n
        minus += sum(math.comb(P, j) * math.comb(Q - 1, tau - 1 - j) * a(j, 0) for j in range(tau)) / n
    R = G - tau_min + 1
    return plus / R, minus / R


def test_spec_12_8_binary_table_and_kappa():
    pop = [1.9254, 1.4473, 1.1308, 0.8870, 0.6785, 0.4824, 0.2751]
    sam = [1.7049, 1.2744, 0.9930, 0.7782, 0.5958, 0.4248, 0.2436]
    kappa = [0.7277, 0.8356, 0.8759, 0.8870, 0.8759, 0.8356, 0.7277]
    rows = t([[1.0] * P + [0.0] * (8 - P) for P in range(1, 8)])
    out = multiscale_advantages(rows, eps=0.0)
    out_s = multiscale_advantages(rows, eps=0.0, std="sample")
    for i, P in enumerate(range(1, 8)):
        # tol: the §12.8 table is printed to 4 decimals (<= 5e-5 off); float64 adds ~1e-15.
        assert abs(out[i, 0] - pop[i]) < 5e-5 and abs(out_s[i, 0] - sam[i]) < 5e-5
        # tol: the wrong completions' advantage is -P A_+ / (8 - P) by zero sum: two float64 roundings of values <= ~2
        # on each side (~1e-15): 1e-12 (+ allclose's default rtol 1e-5).
        assert torch.allclose(out[i, P:], (-P * out[i, 0] / (8 - P)).expand(8 - P), atol=1e-12)
        # tol: kappa printed to 4 decimals (<= 5e-5 off); float64 ratio adds ~1e-15.
        assert abs(out[i, 0] / grpo(rows[i].tolist(), eps=0.0)[0] - kappa[i]) < 5e-5  # P9


def test_binary_g64_matches_closed_form():
    G = 64
    P = torch.tensor([1, 5, 17, 32, 50, 63])
    rows = (torch.arange(G)[None, :] < P[:, None]).double()
    for std in ("population", "sample"):
        for eps in (0.0, 1e-6):
            out = multiscale_advantages(rows, std=std, eps=eps)
            for i, p in enumerate(P.tolist()):
                plus, minus = binary_closed_form(p, G, std, eps)
                # tol: the closed form sums C(63, tau - 1) weighted z-scores over 63 scales in float64, the engine by
                # counts: relative ~1e3 x 2^-53 on |A| <= ~8 (~2e-12): 1e-9.
                assert abs(out[i, 0] - plus) < 1e-9 and abs(out[i, -1] - minus) < 1e-9
            kappa = out[:, 0] / grpo(rows.tolist(), std=std, eps=eps)[:, 0]
            assert bool((kappa < 1).all()) and bool((kappa > 0).all())  # P9: shrunk, sign kept
    # unscorable completions leave the two-valued table path; the general count engine must agree with it
    masked = rows[2:3].clone()
    masked[0, [0, 20, 40, 63]] = float("nan")
    out = multiscale_advantages(masked)[0]
    keep = ~torch.isnan(masked[0])
    # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
    # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups: ~1e-13,
    # under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
    assert torch.allclose(out[keep], multiscale_advantages(masked[:, keep])[0], atol=1e-9)
    assert bool((out[~keep] == 0).all())


# ------------------------------------------------------------------------- engines agree with brute force

few_valued = st.integers(2, 9).flatmap(
    lambda G: st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5]), min_size=G, max_size=G)
)
options = st.fixed_dictionaries(
    {
        "std": st.sampled_from(["population", "sample"]),
        "eps": st.sampled_from([0.0, 1e-6, 1e-3]),
        "weights": st.sampled_from(["uniform", "global", "local", "flat"]),
        "tau_min": st.integers(2, 4),
    }
)


@SETTINGS
@given(few_valued, options)
def test_engines_agree_with_reference(r, opts):
    G = len(r)
    if opts["tau_min"] > G:
        return
    w = scale_weights(G, opts["tau_min"], opts["weights"]).tolist()
    ref = ms_reference(r, opts["tau_min"], w, opts["std"], opts["eps"])
    rows = t([r])
    outs = [multiscale_advantages(rows, method=m, **opts) for m in EXACT_METHODS]
    R = G - opts["tau_min"] + 1
    outs.append(multiscale_advantages(rows, num_scales=R, subgroups_per_scale=math.comb(G, G // 2), **opts))
    outs.append(multiscale_advantages(rows, num_scales=R, **opts))  # DSS only, every scale drawn
    for out in outs:
        # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
        # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups:
        # ~1e-13, under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
        assert torch.allclose(out, t([ref]), atol=1e-9, rtol=0)


@pytest.mark.parametrize("values", [(0.0, 1.0), (0.0, 0.5, 1.0), (0.0, 1.0, 2.0, 3.5)])
def test_counts_engine_matches_enumeration_at_g13(values):
    gen = torch.Generator().manual_seed(len(values))
    idx = torch.randint(0, len(values), (12, 13), generator=gen)
    rows = torch.tensor(values, dtype=torch.float64)[idx]
    rows[0, :4] = float("nan")  # unscorable completions take the same route in both engines
    for std in ("population", "sample"):
        a = multiscale_advantages(rows, std=std, method="counts")
        b = multiscale_advantages(rows, std=std, method="enumerate")
        # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
        # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups:
        # ~1e-13, under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
        assert torch.allclose(a, b, atol=1e-9, rtol=0)
        # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
        # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups:
        # ~1e-13, under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
        assert torch.allclose(multiscale_advantages(rows, std=std), a, atol=1e-9, rtol=0)


@pytest.mark.parametrize("r", [[0.0, 1e4, 1e-3, 0.0, 2e-3, 5.0], [0.3, 1000.1, 1 / 3, 0.3, 0.1]])
def test_heavy_tailed_rewards_keep_precision(r):
    # subgroups whose spread is tiny next to the group's (one-pass variance would lose ~8 digits here)
    for std in ("population", "sample"):
        ref = t([ms_reference(r, std=std, eps=0.0)])
        for opts in ({}, {"method": "enumerate"}, {"num_scales": len(r) - 1, "subgroups_per_scale": 20}):
            # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a
            # few roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred
            # subgroups: ~1e-13, under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
            assert torch.allclose(multiscale_advantages(t([r]), std=std, eps=0.0, **opts), ref, atol=1e-9, rtol=0)


def test_batch_rows_are_independent_of_each_other():
    gen = torch.Generator().manual_seed(3)
    rows = torch.cat(
        [
            (torch.rand(4, 12, generator=gen) < 0.5).double(),
            torch.rand(3, 12, generator=gen, dtype=torch.float64),
            torch.randint(0, 3, (3, 12), generator=gen).double(),
            t([[float("nan")] * 3 + [1.0] * 4 + [0.0] * 5, [2.0] * 12]),
        ]
    )
    batch = multiscale_advantages(rows)
    for i in range(len(rows)):
        # tol: one row computed alone or in a batch: the same float64 operations on the same values, up to the batch
        # kernels' reduction order (~1e-15 on |A| <= ~3): 1e-12 (+ allclose's default rtol 1e-5).
        assert torch.allclose(batch[i], multiscale_advantages(rows[i : i + 1])[0], atol=1e-12)


# --------------------------------------------------------------------------------- properties (docs/methods/ms_grpo.md §10)

general = st.integers(2, 7).flatmap(
    lambda G: st.lists(st.integers(-20, 20).map(lambda v: v / 10), min_size=G, max_size=G)
)


@SETTINGS
@given(general, options, st.integers(-50, 50))
def test_zero_sum_shift_invariance_and_permutation(r, opts, shift):
    if opts["tau_min"] > len(r):
        return
    a = multiscale_advantages(t([r]), **opts)
    # tol: the advantages sum to 0 up to float64 rounding of <= 7 values |A| <= ~3 averaged over <= 120 subgroups
    # (~1e-13): 1e-9.
    assert abs(a.sum()) < 1e-9  # P4
    # tol: shifting rewards in [-2, 2] by <= 50 rounds each once (|r + shift| <= 52: ~6e-15 absolute); divided by sd >=
    # ~0.05 (rewards on a 0.1 grid) that moves z by ~1e-13: 1e-9 (+ allclose's default rtol 1e-5).
    assert torch.allclose(multiscale_advantages(t([r]) + shift, **opts), a, atol=1e-9)  # P5
    perm = torch.randperm(len(r), generator=torch.Generator().manual_seed(len(r)))
    # tol: a permutation reorders the same float64 sums over <= 7 values: ~7 x 2^-53 x |z| <= 3 (~5e-15): 1e-12 (+
    # allclose's default rtol 1e-5).
    assert torch.allclose(multiscale_advantages(t([r])[:, perm], **opts), a[:, perm], atol=1e-12)  # P6
    if opts["eps"] == 0:
        # tol: scaling by 3.7 rounds each reward once (relative 2^-53), and z = (r - mean) / sd is scale-free up to
        # those: ~1e-13 with sd >= ~0.05: 1e-9 (+ allclose's default rtol 1e-5).
        assert torch.allclose(multiscale_advantages(t([r]) * 3.7, **opts), a, atol=1e-9)  # P5, scale


@SETTINGS
@given(general, options)
def test_strict_order_preservation_and_ties(r, opts):  # P6, P7
    if opts["tau_min"] > len(r):
        return
    a = multiscale_advantages(t([r]), **opts)[0].tolist()
    for i, j in itertools.permutations(range(len(r)), 2):
        if r[i] > r[j]:
            assert a[i] > a[j]
        elif r[i] == r[j]:
            # tol: tied rewards get the same average of z-scores computed over other subgroups in another order: ~10
            # roundings of |z| <= ~3 (~7e-15): 1e-12.
            assert a[i] == pytest.approx(a[j], abs=1e-12)


@SETTINGS
@given(general, st.sampled_from(["population", "sample"]), st.sampled_from([0.0, 1e-6, 1e-4]))
def test_grpo_recovered(r, std, eps):
    G = len(r)
    expected = grpo(r, std, eps) if len(set(r)) > 1 else torch.zeros(G).double()
    out = multiscale_advantages(t([r]), weights=one_hot(G, 2, G), std=std, eps=eps)[0]  # P3
    # tol: one-hot full-group weights reduce to GRPO: the same mean / std in another order, ~1e-15 relative on |A| <=
    # ~3: 1e-9 (+ allclose's default rtol 1e-5).
    assert torch.allclose(out, expected, atol=1e-9)
    pair = multiscale_advantages(t([r[:2]]), std=std, eps=eps)[0]  # P2
    # tol: a pair is GRPO on two rewards: the same few float64 roundings (~1e-15): 1e-9 (+ allclose's default rtol
    # 1e-5).
    assert torch.allclose(pair, grpo(r[:2], std, eps) if r[0] != r[1] else torch.zeros(2).double(), atol=1e-9)
    assert torch.equal(multiscale_advantages(t([[r[0]] * G]), std=std, eps=eps), torch.zeros(1, G).double())  # P1


@SETTINGS
@given(general)
def test_pair_scale_is_a_rank_score_and_flat_is_the_flat_mean(r):
    G = len(r)
    pair = multiscale_advantages(t([r]), weights=one_hot(G, 2, 2), eps=0.0)[0]  # P8
    ranks = [(sum(v < x for v in r) - sum(v > x for v in r)) / (G - 1) for x in r]
    # tol: the pair-scale z-score of two distinct rewards is exactly +-1 up to one float64 rounding, averaged over G -
    # 1 pairs: ~1e-15, under 1e-12.
    assert torch.allclose(pair, t(ranks), atol=1e-12)
    flat = [0.0] * G  # P15: one plain mean over every subgroup containing i
    for i in range(G):
        zs = []
        for tau in range(2, G + 1):
            for S in itertools.combinations(range(G), tau):
                if i in S:
                    vals = [r[j] for j in S]
                    sd = statistics.pstdev(vals)
                    zs.append(0.0 if len(set(vals)) == 1 else (r[i] - statistics.fmean(vals)) / sd)
        flat[i] = statistics.fmean(zs)
    # tol: two float64 computations (engine, statistics.fmean / pstdev) of averages of <= 120 z-scores |z| <= ~3:
    # ~1e-13, under 1e-9 (+ allclose's default rtol 1e-5).
    assert torch.allclose(multiscale_advantages(t([r]), weights="flat", eps=0.0)[0], t(flat), atol=1e-9)


# ------------------------------------------------------------------------------ unscorable completions


def test_nan_rewards_are_excluded_and_get_zero():
    r = t([[1.0, float("nan"), 0.0, 0.5, float("inf"), 0.0]])
    for method in EXACT_METHODS:
        out = multiscale_advantages(r, method=method)
        assert out[0, 1] == 0 and out[0, 4] == 0
        # tol: the scorable completions alone vs with NaNs skipped: the same float64 operations (~1e-15 on |A| <= ~2):
        # 1e-12 (+ allclose's default rtol 1e-5).
        assert torch.allclose(out[0, [0, 2, 3, 5]], multiscale_advantages(t([[1.0, 0.0, 0.5, 0.0]]))[0], atol=1e-12)
    acc = multiscale_advantages(r, num_scales=2, subgroups_per_scale=3, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(acc).all() and acc[0, 1] == 0 and acc[0, 4] == 0
    nan_rows = t([[float("nan")] * 4, [float("nan"), 1.0, float("nan"), float("nan")], [float("nan"), 1.0, 0.0, 1.0]])
    out = multiscale_advantages(nan_rows, tau_min=3)  # fewer than tau_min scorable -> zeros
    assert torch.equal(out[:2], torch.zeros(2, 4).double())
    # tol: the same float64 operations on the same three scorable rewards (~1e-15): 1e-12 (+ allclose's default rtol
    # 1e-5).
    assert torch.allclose(out[2, 1:], multiscale_advantages(t([[1.0, 0.0, 1.0]]), tau_min=3)[0], atol=1e-12)
    # explicit weights only on the full-group scale, which one NaN removes: GRPO on the scorable completions
    out = multiscale_advantages(t([[1.0, 0.0, 0.0, float("nan")]]), weights=[0, 0, 1])
    # tol: GRPO on the scorable rewards either way: the same few float64 roundings (~1e-15): 1e-12 (+ allclose's
    # default rtol 1e-5).
    assert torch.allclose(out[0, :3], grpo([1.0, 0.0, 0.0]), atol=1e-12) and out[0, 3] == 0


# --------------------------------------------------------------------------------- accelerated scheme


def test_dss_intervals_and_subgroup_counts():
    assert dss_intervals(8, 2, 4, "paper") == [(2, 2), (3, 4), (5, 6), (7, 8)]
    assert dss_intervals(8, 2, 4, "bottom") == [(2, 3), (4, 5), (6, 7), (8, 8)]
    assert dss_intervals(6, 2, 4, "paper") == [(2, 2), (3, 4), (5, 6)]  # first interval [2, 0] is empty
    assert dss_intervals(8, 2, 6, "bottom") == dss_intervals(8, 2, 4, "bottom")
    assert num_subgroups(8) == 247
    assert num_subgroups(8, num_scales=4, subgroups_per_scale=8) == 25
    assert num_subgroups(8, subgroups_per_scale=8) == 49
    assert num_subgroups(8, num_scales=4) == (28 + 56) / 2 + (70 + 56) / 2 + (28 + 8) / 2 + 1  # in 93..155
    assert num_subgroups(8, num_scales=4, subgroups_per_scale=8, partition="paper") == 8 + 8 + 8 + (8 + 1) / 2


def test_num_subgroups_counts_only_scales_with_weight():
    # docs/methods/ms_grpo.md §2.8d: sum over the scales actually used; a zero-weight scale is skipped by the estimator
    assert num_subgroups(8, weights=one_hot(8, 2, 8)) == 1  # only the full group
    assert num_subgroups(8, weights=one_hot(8, 2, 2)) == 28
    assert num_subgroups(8, subgroups_per_scale=8, weights=one_hot(8, 2, 8)) == 1
    # bottom, M=4: the full group [8, 8] is always drawn; [6, 7] gives tau = 7 half of the time
    w = [0, 0, 0, 0, 0, 1, 1]  # tau = 7, 8
    assert num_subgroups(8, num_scales=4, subgroups_per_scale=8, weights=w) == 8 / 2 + 1
    # paper, M=4: [2, 2] always, [7, 8] gives 8 or 1
    w = [1, 0, 0, 0, 0, 0, 1]  # tau = 2, 8
    assert num_subgroups(8, num_scales=4, subgroups_per_scale=8, partition="paper", weights=w) == 8 + 1 / 2
    assert num_subgroups(3, tau_min=4) == 0  # no admissible subgroup


def test_draw_scales_one_per_interval_and_determinism():
    for partition in ("bottom", "paper"):
        spans = dss_intervals(16, 2, 4, partition)
        d = draw_scales(500, 16, num_scales=4, partition=partition, generator=torch.Generator().manual_seed(1))
        for s, e in spans:
            assert bool((d[:, s - 2 : e - 1].sum(1) == 1).all())
        assert int(d.sum()) == 500 * len(spans)
        assert len(torch.unique(d, dim=0)) > 1
    batch = draw_scales(50, 16, num_scales=4, draw="per_batch", generator=torch.Generator().manual_seed(1))
    assert bool((batch == batch[0]).all())
    rows = torch.rand(64, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for selection in ("greedy", "random"):
        opts = dict(num_scales=4, subgroups_per_scale=8, selection=selection, permute_labels=selection == "random")
        a = multiscale_advantages(rows, generator=torch.Generator().manual_seed(5), **opts)
        b = multiscale_advantages(rows, generator=torch.Generator().manual_seed(5), **opts)
        c = multiscale_advantages(rows, generator=torch.Generator().manual_seed(6), **opts)
        assert torch.equal(a, b) and not torch.equal(a, c) and torch.isfinite(a).all()


def test_greedy_selection_balance_and_diversity():
    for tau in range(2, 7):  # P14: each completion in K*tau/G of the selected subgroups
        counts = torch.zeros(8)
        for S in diverse_subgroups(8, tau, 8):
            counts[list(S)] += 1
        assert bool((counts == 8 * tau / 8).all())

    def jaccard_sum(sel):
        return sum(1 - len(set(a) & set(b)) / len(set(a) | set(b)) for a, b in itertools.permutations(sel, 2))

    for tau, expected in ((3, 46.20), (4, 40.00), (5, 33.31)):
        assert round(jaccard_sum(diverse_subgroups(8, tau, 8)), 2) == expected
    cache = ms_module.MultiscaleCache()  # the caller's (a trainer keeps one per run)
    # docs/methods/ms_grpo.md §11.9: warn ...
    with pytest.warns(UserWarning, match=r"C\(24, 12\) = 2704156 .* random pool"):
        big = diverse_subgroups(24, 12, 5, cache=cache)  # C(24, 12) > pool limit: greedy on a fixed-seed random pool
    assert len(set(big)) == 5 and big[0] == tuple(range(12)) and all(len(S) == 12 for S in big)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ... once: the pool is kept in the cache per (G, tau)
        assert diverse_subgroups(24, 12, 5, cache=cache) == big
        assert len(diverse_subgroups(24, 12, 7, cache=cache)) == 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning while the full pool is enumerated
        diverse_subgroups(16, 8, 3)  # C(16, 8) = 12870 <= 20000


@SETTINGS
@given(general, st.sampled_from(["bottom", "paper"]), st.sampled_from(["greedy", "random"]), st.booleans())
def test_accelerated_full_budget_equals_exact(r, partition, selection, permute):
    G = len(r)
    opts = dict(num_scales=G - 1, subgroups_per_scale=math.comb(G, G // 2), partition=partition, selection=selection)
    out = multiscale_advantages(t([r]), permute_labels=permute, generator=torch.Generator().manual_seed(0), **opts)
    # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
    # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups: ~1e-13,
    # under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
    assert torch.allclose(out, multiscale_advantages(t([r])), atol=1e-9)


def test_accelerated_default_is_zero_sum_at_g8_and_covers_with_fallback():
    rows = torch.rand(200, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = multiscale_advantages(rows, num_scales=4, subgroups_per_scale=8, generator=torch.Generator().manual_seed(3))
    # tol: 200 rows of 8 advantages |A| <= ~2 summed: ~8 roundings of 2^-53 x 2 per row (~2e-15), and the balanced
    # greedy cover is exactly zero-sum in exact arithmetic: 1e-9.
    assert out.sum(1).abs().max() < 1e-9  # balanced greedy coverage (spec P4)
    # K * tau < G: only (0, 1) at scale 2; the other completions are uncovered -> GRPO advantage
    r = [0.2, 0.9, 0.4, 0.4, 0.1, 0.8, 0.3, 0.6]
    out = multiscale_advantages(t([r]), num_scales=7, subgroups_per_scale=1, weights=one_hot(8, 2, 2))[0]
    assert close(out[:2], [-0.999997, 0.999997])
    # tol: the uncovered completions get GRPO's advantage: the same float64 mean / std (~1e-15 on |A| <= ~2): 1e-12 (+
    # allclose's default rtol 1e-5).
    assert torch.allclose(out[2:], grpo(r)[2:], atol=1e-12)


def test_accelerated_without_weight_at_the_drawn_scales_falls_back_to_grpo():
    r = [0.2, 0.9, 0.4, 0.1]
    for seed in range(6):  # one scale drawn from [2, 4]; only tau = 4 (the full group) has weight
        gen = torch.Generator().manual_seed(seed)
        out = multiscale_advantages(t([r, r]), num_scales=1, subgroups_per_scale=2, weights=[0, 0, 1], generator=gen)
        # tol: the fallback is GRPO itself: the same float64 operations (~1e-15): 1e-12 (+ allclose's default rtol
        # 1e-5).
        assert torch.allclose(out, grpo(r).expand(2, 4), atol=1e-12)


# ------------------------------------------------------------------------------------- options, errors


@pytest.mark.parametrize(
    "G, kwargs, match",
    [
        (4, dict(tau_min=1), "tau_min"),
        (4, dict(tau_min=2.0), "tau_min"),
        (4, dict(weights=[1, 1]), "one entry per scale"),
        (4, dict(weights=[1, -1, 1]), ">= 0"),
        (4, dict(weights=[0, 0, 0]), "not all zero"),
        (4, dict(weights=[1, float("nan"), 1]), "finite"),
        (4, dict(weights="geometric"), "uniform"),
        (4, dict(std="mad"), "population"),
        (4, dict(eps=-1.0), "eps"),
        (4, dict(num_scales=0), "num_scales"),
        (4, dict(subgroups_per_scale=0), "subgroups_per_scale"),
        (4, dict(partition="top"), "bottom"),
        (4, dict(selection="best"), "greedy"),
        (4, dict(draw="per_step"), "per_group"),
        (4, dict(method="fast"), "enumerate"),
        (4, dict(permute_labels="yes"), "permute_labels"),
        # groups smaller than tau_min return zeros, but the options themselves are still checked
        (1, dict(std="mad"), "population"),
        (2, dict(tau_min=3, weights=[1, -1]), ">= 0"),
        (2, dict(tau_min=3, draw="per_step"), "per_group"),
    ],
)
def test_invalid_options_raise(G, kwargs, match):
    with pytest.raises(ValueError, match=match):
        validate_multiscale_options(G, **kwargs)
    with pytest.raises(ValueError, match=match):
        multiscale_advantages(torch.rand(2, G), **kwargs)


@pytest.mark.parametrize("accelerated", [False, True])
def test_groups_smaller_than_tau_min_get_zeros(accelerated):
    """docs/methods/ms_grpo.md §6 ("G < tau_min: ... at runtime return zeros", "G = 1: zeros") and §3.1; the config check stays."""
    kw = dict(num_scales=2, subgroups_per_scale=2, generator=torch.Generator().manual_seed(0)) if accelerated else {}
    for rewards, tau_min in ((t([[0.3], [1.0]]), 2), (t([[1.0, 0.0], [0.2, 0.9]]), 3), (t([[1.0, 0.0, 2.0]]), 4)):
        out = multiscale_advantages(rewards, tau_min=tau_min, **kw)
        assert torch.equal(out, torch.zeros_like(rewards))
        out = multiscale_advantages(rewards.float(), tau_min=tau_min, weights=[1.0, 2.0], **kw)  # any length
        assert out.dtype == torch.float32 and torch.equal(out, torch.zeros_like(out))
        with pytest.raises(ValueError, match=f"tau_min={tau_min} exceeds num_generations={rewards.size(1)}"):
            validate_multiscale_options(rewards.size(1), tau_min=tau_min)


@pytest.mark.filterwarnings("ignore:MS-GRPO diverse subgroups")  # C(20, tau) > 20000: the sampled pool
def test_general_rewards_at_large_g_ask_for_the_accelerated_scheme():
    rows = torch.rand(8, 20, generator=torch.Generator().manual_seed(0))
    assert num_subgroups(20) > MAX_ENUMERATED_SUBGROUPS
    with pytest.raises(ValueError, match="num_scales.*subgroups_per_scale"):
        multiscale_advantages(rows)
    out = multiscale_advantages(rows, num_scales=4, subgroups_per_scale=8, generator=torch.Generator().manual_seed(0))
    assert out.shape == rows.shape and out.dtype == torch.float32 and torch.isfinite(out).all()
    binary = (rows > 0.5).float()  # few-valued rewards at the same G stay exact
    assert torch.isfinite(multiscale_advantages(binary)).all()


def test_dtypes():
    r = torch.tensor([[1, 0, 1, 0]])
    assert multiscale_advantages(r).dtype == torch.get_default_dtype()
    assert multiscale_advantages(r.float()).dtype == torch.float32
    # tol: float32 against float64 on 0/1 rewards: |A| <= ~1.2, each a few float32 roundings (2^-24 relative, ~3e-7 in
    # all): 1e-6 (+ allclose's default rtol 1e-5).
    assert torch.allclose(multiscale_advantages(r.float()).double(), multiscale_advantages(r.double()), atol=1e-6)


@pytest.mark.parametrize("G", [4, 6, 9])
@pytest.mark.parametrize("n_values", [2, 3, 4, 5])
@pytest.mark.parametrize("shared_values", [True, False])
def test_vectorised_counts_path_matches_brute_force(G, n_values, shared_values):
    """The batched value-class tables (one value set for the batch, or per-prompt patterns) against
    brute-force enumeration of every subgroup, with NaN rows, all-equal rows and both std conventions."""
    gen = torch.Generator().manual_seed(100 * G + 10 * n_values + shared_values)
    B = 10
    levels = torch.tensor([0.0, 0.5, 1.0, 1.5, 3.0][:n_values], dtype=torch.float64)
    if shared_values:
        rows = levels[torch.randint(0, n_values, (B, G), generator=gen)]
    else:  # each prompt its own few values
        own = torch.rand(B, n_values, generator=gen, dtype=torch.float64) * 10
        rows = own.gather(1, torch.randint(0, n_values, (B, G), generator=gen))
    rows[0, : G // 2] = float("nan")
    rows[1] = rows[1, 0]  # all equal
    rows[2, 1:] = float("nan")  # fewer scorable than tau_min
    for std in ("population", "sample"):
        got = multiscale_advantages(rows, std=std, method="counts")
        ref = []
        for row in rows.tolist():
            keep = [i for i, v in enumerate(row) if not math.isnan(v)]
            adv = [0.0] * G
            if len(keep) >= 2:
                vals = [row[i] for i in keep]
                sub = ms_reference(vals, std=std) if len(set(vals)) > 1 else None
                for j, i in enumerate(keep):
                    adv[i] = sub[j] if sub is not None else 0.0
            ref.append(adv)
        # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
        # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups:
        # ~1e-13, under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
        assert torch.allclose(got, torch.tensor(ref, dtype=torch.float64), atol=1e-10, rtol=0)
        got32 = multiscale_advantages(rows.float(), std=std, method="counts")
        ref32 = multiscale_advantages(rows.float(), std=std, method="enumerate")
        # tol: float32, two engines on the same float32 rewards: z-scores |z| <= ~3 of a few roundings (2^-24) each,
        # amplified by max|r| / gap between values, up to 136 for these seeded rows: the worst case (~4 x 6e-8 x 136 x
        # 2 ~ 6.5e-5) exceeds 1e-5; it holds because the roundings do not add up in the same direction (flagged in the
        # audit report).
        assert torch.allclose(got32, ref32, atol=1e-5, rtol=0)


def test_cached_value_set_tables_follow_group_size_and_value_set():
    """The batch-value-set tables are cached across calls: a later call with another G (same largest number of
    scorable completions), a subset of the last value set, or a new value set must not reuse a wrong table."""
    levels = torch.tensor([0.0, 0.5, 1.0, 1.5], dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    first = levels[torch.randint(0, 4, (6, 5), generator=gen)]
    wider = torch.cat([first, torch.full((6, 2), float("nan"), dtype=torch.float64)], 1)  # G=7, 5 scorable
    subset = levels[:2][torch.randint(0, 2, (6, 5), generator=gen)] + 0.0
    shifted = first + 0.25
    for rows in (first, wider, subset, shifted, first):
        got = multiscale_advantages(rows, method="counts")
        # tol: float64, two computations of the same subgroup z-scores (r - mean) / (sd + eps), |z| <= ~3, each a few
        # roundings amplified by max|r| / sd (<= ~15 for these rewards), averaged over <= a few hundred subgroups:
        # ~1e-13, under 1e-9 (allclose adds its default rtol 1e-5 where rtol is not given).
        assert torch.allclose(got, multiscale_advantages(rows, method="enumerate"), atol=1e-10, rtol=0)


def test_the_option_defaults_are_stated_once():
    """multiscale_advantages's signature is the one statement of the options' defaults: MSGRPOConfig's fields take
    theirs from MULTISCALE_DEFAULTS, and every other function's keyword default of the same option agrees."""
    import dataclasses
    import inspect

    from grpo_family.algorithms import ms_grpo
    from grpo_family.trainers.ms_grpo import MSGRPOConfig

    defaults = ms_grpo.MULTISCALE_DEFAULTS
    assert set(defaults) == {"tau_min", "weights", "std", "eps", "num_scales", "subgroups_per_scale", "partition",
                             "selection", "draw", "permute_labels"}  # fmt: skip
    fields = {f.name: f.default for f in dataclasses.fields(MSGRPOConfig)}
    assert {name: fields[name] for name in defaults} == defaults
    checked = 0
    for function in (ms_grpo.scale_weights, ms_grpo.validate_multiscale_options, ms_grpo.draw_scales,
                     ms_grpo.num_subgroups, ms_grpo.dss_intervals):  # fmt: skip
        for name, parameter in inspect.signature(function).parameters.items():
            if name in defaults and parameter.default is not inspect.Parameter.empty:
                assert parameter.default == defaults[name], (function.__name__, name)
                checked += 1
    assert checked >= 15
