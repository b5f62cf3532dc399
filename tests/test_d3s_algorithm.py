"""D3S maths (grpo_family/algorithms/d3s.py) against docs/methods/d3s.md: brute force over every subset for n <= 12,
the §12 worked examples, and the §10 properties."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.algorithms.d3s import (
    LOSS_NORMALIZATIONS,
    masked_token_loss,
    max_variance_subset,
    schedule,
    select_rollouts,
    token_keep_mask,
)
from grpo_family.algorithms.reference import token_keep_mask_reference as reference_token_mask

SETTINGS = settings(max_examples=60, deadline=None)
F64 = torch.float64


def t64(x):
    return torch.tensor(x, dtype=F64)


# tol(defaults): every value here is float64 (t64): both sides of a default comparison (pytest.approx's rel 1e-6,
# assert_close's float64 rtol 1e-7 / atol 1e-7) are the same few operations on <= 35 values of size <= ~3, ~1e-15
# apart, or exact fractions (8/9, 1, -1/6) a few roundings off.
def pop_advantages(r):
    r = t64(r)
    return (r - r.mean()) / r.std(correction=0)


def trl_advantages(r):
    r = t64(r)
    return (r - r.mean()) / (r.std() + 1e-4)


def pop_var(x):
    return ((x - x.mean()) ** 2).mean().item() if x.numel() else 0.0


# ----------------------------------------------------------------------------------------------------------------
# Brute force over all subsets, with the tie rule of docs/methods/d3s.md §2.3 step 3 applied to every subset, not only to the
# "bottom block + top block" candidates the solver looks at.
# ----------------------------------------------------------------------------------------------------------------

_COMBOS: dict[tuple[int, int], torch.Tensor] = {}


def combos(n, k):
    if (n, k) not in _COMBOS:
        _COMBOS[n, k] = torch.tensor(list(itertools.combinations(range(n), k)), dtype=torch.long).reshape(-1, k)
    return _COMBOS[n, k]


def brute_force(values: torch.Tensor, k: int):
    """(best variance, the sorted values of every subset the tie rule allows): max variance, then min |mean|, then
    min mean (= fewest taken from the top, for the solver's candidates)."""
    x = values.double()
    vals = x[combos(x.numel(), k)]
    mean = vals.mean(1)
    var = ((vals - mean[:, None]) ** 2).mean(1)
    best = var.max()
    scale2 = ((x - x.mean()) ** 2).max()
    tied = var >= best - (1e-9 * best + 1e-10 * scale2)
    abs_mean = torch.where(tied, mean.abs(), torch.inf)
    mean_tol = 1e-9 * x.abs().max()
    ok = abs_mean <= abs_mean.min() + mean_tol
    ok &= mean <= torch.where(ok, mean, torch.inf).min() + mean_tol
    # In exact arithmetic this leaves one multiset (equal means among the solver's candidates imply equal
    # multisets); more survive only through float-level near-ties such as 0 vs 1e-300, and any of them is right.
    return best.item(), vals[ok].sort(1).values.unique(dim=0)


def check_against_brute_force(values: torch.Tensor, k: int):
    n = values.numel()
    idx = max_variance_subset(values, k)
    assert idx.dtype == torch.long and idx.numel() == min(k, n)
    assert torch.equal(idx, idx.unique()), "indices must be ascending and distinct"
    if k >= n or k == 0:
        assert idx.tolist() == list(range(n))[: min(k, n)]
        return
    best, chosen = brute_force(values, k)
    got = values.double()[idx]
    assert pop_var(got) >= best - 1e-9 * max(best, 1e-12) - 1e-12
    assert (chosen == got.sort().values).all(1).any(), f"tie rule picked {got.tolist()}, brute force {chosen.tolist()}"
    # Index rule among equal values: the bottom block takes the lowest indices, the top block the highest.
    selected = torch.zeros(n, dtype=torch.bool)
    selected[idx] = True
    for v in got.unique():
        copies = (values.double() == v).nonzero().squeeze(1)
        taken, left = copies[selected[copies]], copies[~selected[copies]]
        if left.numel() == 0:
            continue
        unselected = values.double()[~selected]
        bottom = k == 1 or bool((unselected >= v).all())
        expected = copies[: taken.numel()] if bottom else copies[copies.numel() - taken.numel() :]
        assert torch.equal(taken, expected), f"value {v.item()}: took {taken.tolist()}, expected {expected.tolist()}"


def value_sets(n, seed):
    gen = torch.Generator().manual_seed(seed)
    r_bin = torch.randint(0, 2, (n,), generator=gen).to(F64)
    yield "normal", torch.randn(n, generator=gen, dtype=F64)
    yield "small ints", torch.randint(-2, 3, (n,), generator=gen).to(F64)
    yield "binary advantages", (r_bin - r_bin.mean()) / (r_bin.std(correction=0) + 1e-4)
    yield "few levels", t64([-1.3, 0.2, 0.9, 2.4])[torch.randint(0, 4, (n,), generator=gen)]
    yield "symmetric", t64([-1.0, 1.0])[torch.randint(0, 2, (n,), generator=gen)]
    yield "all equal", torch.full((n,), 0.7, dtype=F64)
    yield "skewed", torch.rand(n, generator=gen, dtype=F64) ** 4


@pytest.mark.parametrize("n", range(1, 13))
def test_max_variance_subset_equals_brute_force_every_n_and_k(n):
    for seed in range(2):
        for name, values in value_sets(n, seed * 100 + n):
            for k in range(n + 2):
                try:
                    check_against_brute_force(values, k)
                except AssertionError as e:
                    raise AssertionError(f"{name} n={n} k={k} values={values.tolist()}: {e}") from e


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=10),
        st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=10),
    ),
    st.integers(0, 11),
)
def test_max_variance_subset_brute_force_property(values, k):
    check_against_brute_force(t64(values), k)


# ----------------------------------------------------------------------------------------------------------------
# Worked examples (docs/methods/d3s.md §12)
# ----------------------------------------------------------------------------------------------------------------


def test_example1_unbalanced_split():
    r = [0.05, 0.9, 0.2, 0.1, 0.15, 0.3, 0.0, 0.25]
    a = pop_advantages(r)
    # tol: the §12 Example 1 advantages, printed to 6 decimals (<= 5e-7 off), float64 here (~4 roundings of <= 2.5:
    # ~1e-15): 1e-6.
    torch.testing.assert_close(
        a,
        t64([-0.730880, 2.475561, -0.165037, -0.542266, -0.353652, 0.212191, -0.919494, 0.023577]),
        atol=1e-6,
        rtol=0,
    )
    idx = max_variance_subset(a, 4)
    assert idx.tolist() == [0, 1, 3, 6]  # 1 from the top + 3 from the bottom, not the balanced 2 + 2
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(a[idx]) == pytest.approx(1.945525, abs=1e-6)
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert a[idx].mean().item() == pytest.approx(0.070730, abs=1e-6)
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(a[[0, 1, 5, 6]]) == pytest.approx(1.821012, abs=1e-6)  # the balanced split is worse
    a_trl = trl_advantages(r)
    assert max_variance_subset(a_trl, 4).tolist() == [0, 1, 3, 6]
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(a_trl[idx]) == pytest.approx(1.701134, abs=1e-6)


@pytest.mark.parametrize(
    "k, expected, var_pop, var_trl",
    [(4, [0, 1, 2, 3], 1.333333, 1.166163), (5, [0, 1, 2, 3, 4], 1.28, 1.119516), (3, [1, 2, 3], 1.185185, 1.036589)],
)
def test_example2a_binary_ties(k, expected, var_pop, var_trl):
    r = [1, 0, 0, 1, 0, 0, 0, 0]
    a, a_trl = pop_advantages(r), trl_advantages(r)
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert a.max().item() == pytest.approx(1.732051, abs=1e-6) and a_trl.max().item() == pytest.approx(
        1.619835, abs=1e-6
    )
    assert max_variance_subset(a, k).tolist() == expected
    assert max_variance_subset(a_trl, k).tolist() == expected
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(a[expected]) == pytest.approx(var_pop, abs=1e-6)
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(a_trl[expected]) == pytest.approx(var_trl, abs=1e-6)


def test_example2b_equal_abs_mean_takes_fewer_from_top():
    a = pop_advantages([1, 1, 0, 1, 0, 0, 1, 0])
    idx = max_variance_subset(a, 5)
    assert idx.tolist() == [2, 3, 4, 5, 6]
    # tol: exact in real arithmetic (binary rewards: A = +-1, Var 0.96 of five of them); float64 mean / std / squares
    # of 8 values ~1: ~1e-15, under 1e-9.
    assert pop_var(a[idx]) == pytest.approx(0.96, abs=1e-9)
    # tol: exactly -0.2 in real arithmetic; a float64 mean of 5 values +-1 (~1e-16): 1e-9.
    assert a[idx].mean().item() == pytest.approx(-0.2, abs=1e-9)
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(trl_advantages([1, 1, 0, 1, 0, 0, 1, 0])[idx]) == pytest.approx(0.839686, abs=1e-6)


def test_example2c_magnitudes_for_g32():
    for c, (pos, neg) in {1: (5.567764, -0.179605), 4: (2.645751, -0.377964), 16: (1.0, -1.0)}.items():
        a = pop_advantages([1] * c + [0] * (32 - c))
        # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64
        # (a mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
        assert a.max().item() == pytest.approx(pos, abs=1e-6) and a.min().item() == pytest.approx(neg, abs=1e-6)
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert trl_advantages([1] + [0] * 31).max().item() == pytest.approx(5.476979, abs=1e-6)


def example3_advantages(trl=False):
    f = trl_advantages if trl else pop_advantages
    g2 = torch.zeros(4, dtype=F64)  # all wrong: A = 0
    return torch.cat([f([1, 0, 0, 0]), f([1, 1, 0, 0]), g2])


@pytest.mark.parametrize("trl, cross_var, intra_var", [(False, 1.185185, 0.851852), (True, 0.888560, 0.638647)])
def test_example3_cross_group_vs_intra_group(trl, cross_var, intra_var):
    a = example3_advantages(trl)
    cross = select_rollouts(a, 4, 2)
    assert cross.tolist() == [0, 1, 4, 5, 6, 7]
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(a[cross]) == pytest.approx(cross_var, abs=1e-6)
    intra = select_rollouts(a, 4, 2, scope="group")
    assert intra.tolist() == [0, 1, 5, 6, 8, 9]
    # tol: a worked value of docs/methods/d3s.md §12, printed to 6 decimals (<= 5e-7 off), computed here in float64 (a
    # mean, a std and a few products of <= 32 values <= ~6: ~1e-14): 1e-6.
    assert pop_var(a[intra]) == pytest.approx(intra_var, abs=1e-6)
    assert select_rollouts(a.reshape(3, 4), 4, 2).tolist() == cross.tolist()  # (num_prompts, G) input


EX4_ADV = t64([1.5, -0.5, -2.0])
EX4_H = t64([[0.75, 0.125, 1.25, 0.0625, 0.25], [3.0, 0.25, 2.5, 99, -99], [0.375, 0.5, 0.0625, 0.625, 99]])
EX4_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]).bool()
EX4_KEEP = [[0, 0, 1, 0, 0], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]]


def test_example4_token_selection():
    keep = token_keep_mask(EX4_ADV, EX4_H, EX4_MASK, 0.25)
    assert keep.dtype == torch.bool and keep.int().tolist() == EX4_KEEP  # (1,2) beats (2,3) on the 1.25 tie
    per_token_adv = EX4_ADV[:, None].expand(3, 5)
    assert token_keep_mask(per_token_adv, EX4_H, EX4_MASK, 0.25).int().tolist() == EX4_KEEP
    seq = token_keep_mask(EX4_ADV, EX4_H, EX4_MASK, 0.25, scope="sequence")
    assert seq.int().tolist() == [[1, 0, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 1, 0]]


@pytest.mark.parametrize(
    "normalization, expected",
    [
        ("token_mean_kept", -0.166667),
        ("literal_eq10", -0.055556),
        ("seq_mean_kept", -0.5),
        ("seq_mean_kept_all", -0.333333),
        ("mask_only_seq", 0.011111),
        ("mask_only_token", -0.041667),
    ],
)
def test_example4_loss_normalisations(normalization, expected):
    logp = torch.zeros(3, 5, dtype=F64, requires_grad=True)
    ratio = torch.exp(logp - logp.detach())  # = 1, no clipping active, beta = 0
    per_token = -ratio * EX4_ADV[:, None]
    loss = masked_token_loss(per_token, torch.tensor(EX4_KEEP), EX4_MASK, normalization=normalization)
    # tol: the worked losses are printed to 6 decimals (<= 5e-7 off); float64 masked means of <= 15 terms |A| <= 2 add
    # ~1e-15: 1e-6.
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    if normalization == "token_mean_kept":  # per-token gradient weights of the default
        (grad,) = torch.autograd.grad(loss, logp)
        expected_grad = torch.zeros(3, 5, dtype=F64)
        expected_grad[0, 2], expected_grad[1, 0], expected_grad[1, 2] = -0.5, 1 / 6, 1 / 6
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize(
    "step, total, n_s, ratio",
    [
        (0, 1000, 8, 0.05),
        (250, 1000, 14, 0.0875),
        (500, 1000, 20, 0.125),
        (750, 1000, 26, 0.1625),
        (999, 1000, 32, 0.19985),
        (1000, 1000, 32, 0.20),
        (3, 16, 13, 0.078125),  # N_real = 12.5 -> 13: half up
    ],
)
def test_example5_schedule(step, total, n_s, ratio):
    got = schedule(step, total, num_generations=32)
    assert got[0] == n_s and isinstance(got[0], int)
    # tol: the token ratio is a float64 linear interpolation (a product and a sum of values <= 0.2: <= 3 roundings,
    # ~8e-17): 1e-12.
    assert got[1] == pytest.approx(ratio, abs=1e-12)


def test_example5_run_averages():
    kept = [schedule(s, 1000, num_generations=32) for s in range(1000)]
    # tol: a float64 sum of 1000 terms <= 1 (<= 1000 x 2^-53 x 1000 ~ 1e-10 worst case) against the spec's 6-decimal
    # value (<= 5e-7): 1e-6.
    assert sum(n / 32 for n, _ in kept) / 1000 == pytest.approx(0.624625, abs=1e-6)
    # tol: a float64 sum of 1000 terms <= 0.2 (<= ~2e-11 worst case) against the spec's 6-decimal value (<= 5e-7):
    # 1e-6.
    assert sum(n / 32 * k for n, k in kept) / 1000 == pytest.approx(0.087413, abs=1e-6)


def test_example6_lemma1_needs_unbiased_conventions():
    a = pop_advantages([1, 1, 0, 0])
    assert pop_var(a[max_variance_subset(a, 3)]) == pytest.approx(8 / 9)
    r = t64([1, 1, 0, 0])
    a = (r - r.mean()) / r.std()
    assert a[max_variance_subset(a, 3)].var().item() == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------------------------
# Sample level: §10 properties 2-9
# ----------------------------------------------------------------------------------------------------------------


@st.composite
def grouped_advantages(draw, max_b=4, max_g=8):
    b, g = draw(st.integers(1, max_b)), draw(st.integers(2, max_g))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["binary", "levels", "continuous"]))
    if kind == "binary":
        r = torch.randint(0, 2, (b, g), generator=gen).to(F64)
    elif kind == "levels":
        r = torch.randint(0, 4, (b, g), generator=gen).to(F64)
    else:
        r = torch.rand(b, g, generator=gen, dtype=F64)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    return adv, g


@SETTINGS
@given(grouped_advantages(), st.integers(0, 9))
def test_select_rollouts_sizes_and_scopes(batch, k):
    adv, g = batch
    b = adv.shape[0]
    pooled = select_rollouts(adv.reshape(-1), g, k)
    assert pooled.tolist() == max_variance_subset(adv.reshape(-1), k * b).tolist()
    assert pooled.numel() == min(k * b, b * g)
    group = select_rollouts(adv.reshape(-1), g, k, scope="group")
    expected = [i * g + j for i in range(b) for j in max_variance_subset(adv[i], k).tolist()]
    assert group.tolist() == expected and group.numel() == b * min(k, g)
    assert torch.equal(group, group.sort().values)


@SETTINGS
@given(grouped_advantages(), st.integers(2, 8))
def test_cross_group_dominates_intra_group(batch, k):
    """Property 5: for the same total, the pooled subset's variance >= that of the per-group selections."""
    adv, g = batch
    flat = adv.reshape(-1)
    cross, intra = select_rollouts(flat, g, k), select_rollouts(flat, g, k, scope="group")
    assert cross.numel() == intra.numel()
    assert pop_var(flat[cross]) >= pop_var(flat[intra]) - 1e-9


@SETTINGS
@given(grouped_advantages(max_b=1, max_g=12))
def test_lemma1_and_monotonicity_with_unbiased_conventions(batch):
    """Properties 6 and 7 (n-1 conventions): best subset variance >= 1 for every 2 <= k <= G, non-increasing in k."""
    adv, g = batch
    a = adv[0]
    if a.std() == 0:
        return
    a = a / a.std()  # undo TRL's +1e-4: standardised with the unbiased std
    best = [a[max_variance_subset(a, k)].var().item() for k in range(2, g + 1)]
    assert min(best) >= 1 - 1e-9
    assert all(x >= y - 1e-9 for x, y in itertools.pairwise(best))


@SETTINGS
@given(st.integers(2, 12), st.data())
def test_binary_closed_form(g, data):
    """Property 8: with n+ correct, q kept correct maximises q(k-q) over the feasible range; Var = q(k-q)/k^2 (A+ - A-)^2."""
    n_pos = data.draw(st.integers(1, g - 1))
    k = data.draw(st.integers(2, g))
    r = torch.zeros(g, dtype=F64)
    r[torch.randperm(g, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 999))))[:n_pos]] = 1
    a = pop_advantages(r.tolist())
    idx = max_variance_subset(a, k)
    q = int(r[idx].sum().item())
    feasible = range(max(0, k - (g - n_pos)), min(k, n_pos) + 1)
    assert q * (k - q) == max(x * (k - x) for x in feasible)
    gap = (a.max() - a.min()).item()
    # tol: float64, <= 12 advantages |A| <= ~3.5: the variance and the closed form q (k - q) / k^2 gap^2 are a few tens
    # of roundings of values <= ~12 (~1e-14): 1e-9.
    assert pop_var(a[idx]) == pytest.approx(q * (k - q) / k**2 * gap**2, abs=1e-9)


@SETTINGS
@given(grouped_advantages(), st.integers(0, 9), st.sampled_from([1e-3, 0.5, 0.935239, 2.0, 1e4]))
def test_scale_invariance(batch, k, c):
    """Property 9: multiplying the advantages by c > 0 selects the same rollouts (paper vs TRL conventions)."""
    adv, g = batch
    for scope in ("pooled", "group"):
        assert torch.equal(select_rollouts(adv, g, k, scope=scope), select_rollouts(c * adv, g, k, scope=scope))


def test_max_variance_subset_edge_cases():
    a = t64([0.3, -1.0, 2.0, -0.1, 1.0])
    assert max_variance_subset(a, 0).tolist() == [] and max_variance_subset(a, 0).dtype == torch.long
    assert max_variance_subset(a, 5).tolist() == [0, 1, 2, 3, 4]
    assert max_variance_subset(a, 99).tolist() == [0, 1, 2, 3, 4]
    assert max_variance_subset(a, 1).tolist() == [3]  # variance 0 for every singleton: the value closest to 0
    assert max_variance_subset(t64([1.0, -1.0, 1.0, -1.0]), 1).tolist() == [1]  # negative first, lowest index
    assert max_variance_subset(a, 2).tolist() == [1, 2]
    assert max_variance_subset(torch.full((6,), 0.25), 3).tolist() == [0, 1, 2]  # all equal: first k
    assert max_variance_subset(torch.zeros(0), 2).tolist() == []
    assert max_variance_subset(torch.tensor([1, 5, 2, 9]), 2).tolist() == [0, 3]  # integer input
    with pytest.raises(ValueError):
        max_variance_subset(a, -1)
    with pytest.raises(ValueError):
        max_variance_subset(a.reshape(1, 5), 2)


def test_select_rollouts_options():
    a = example3_advantages()
    assert select_rollouts(a, 4, 4).tolist() == list(range(12))  # k >= G: keep everything
    assert select_rollouts(a, 4, 0).tolist() == []
    # intra-group with all-equal group 2: the tie rule keeps its first k; the option drops it
    assert select_rollouts(a, 4, 2, scope="group").tolist()[-2:] == [8, 9]
    # group 1 = [1, 1, -1, -1], k = 3: j = 0 (the first three in stable order) already gives the best multiset
    assert select_rollouts(a, 4, 3, scope="group", drop_degenerate_groups=True).tolist() == [0, 1, 2, 4, 6, 7]
    with pytest.raises(ValueError):
        select_rollouts(a, 4, 2, drop_degenerate_groups=True)
    with pytest.raises(ValueError):
        select_rollouts(a, 5, 2)
    with pytest.raises(ValueError):
        select_rollouts(a, 4, 2, scope="batch")
    with pytest.raises(ValueError):
        select_rollouts(a.reshape(4, 3), 4, 2)


# ----------------------------------------------------------------------------------------------------------------
# Schedule
# ----------------------------------------------------------------------------------------------------------------


def test_schedule_endpoints_clamping_and_total_steps():
    assert schedule(0, 100, num_generations=32) == (8, 0.05)
    assert schedule(100, 100, num_generations=32) == (32, 0.2)
    assert schedule(-5, 100, num_generations=32) == (8, 0.05)  # clamped to p = 0
    assert schedule(500, 100, num_generations=32) == (32, 0.2)  # clamped to p = 1
    assert schedule(0, 1, num_generations=32) == (8, 0.05)
    assert schedule(1, 1, num_generations=32) == (32, 0.2)
    assert schedule(0, 0, num_generations=32) == (32, 0.2)  # nothing planned: the curriculum is over
    kw = {"samples_start": 2, "samples_end": 6, "token_ratio_start": 0.1, "token_ratio_end": 0.5}
    assert schedule(0, 4, num_generations=8, **kw) == (2, 0.1)
    assert schedule(4, 4, num_generations=8, **kw) == (6, 0.5)


def test_schedule_rounding_caps_and_floor():
    # N_real = 12.5 -> 13 and 13.5 -> 14: half up (banker's rounding would give 12 and 14)
    assert schedule(1, 2, num_generations=32, samples_start=10, samples_end=15)[0] == 13
    assert schedule(1, 2, num_generations=32, samples_start=11, samples_end=16)[0] == 14
    assert schedule(1, 4, num_generations=32, samples_start=10, samples_end=11)[0] == 10  # 10.25
    assert schedule(3, 4, num_generations=32, samples_start=10, samples_end=11)[0] == 11  # 10.75
    assert schedule(0, 10, num_generations=16)[0] == 8
    assert schedule(10, 10, num_generations=16)[0] == 16  # capped by G
    assert schedule(0, 10, num_generations=4)[0] == 4  # every step capped: no sample-level down-sampling
    assert schedule(0, 10, num_generations=32, samples_start=1)[0] == 2  # floor of 2 (k = 1 is meaningless)
    assert schedule(0, 10, num_generations=1)[0] == 1  # the cap wins for G = 1
    assert schedule(7, 10, num_generations=32, token_ratio_start=1.0, token_ratio_end=1.0)[1] == 1.0
    with pytest.raises(ValueError):
        schedule(0, 10, num_generations=32, token_ratio_end=1.5)
    with pytest.raises(ValueError):
        schedule(0, 10, num_generations=0)


@SETTINGS
@given(
    st.integers(1, 2000),
    st.integers(2, 64),
    st.integers(1, 40),
    st.integers(1, 64),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_schedule_monotone_and_bounded(total, g, n0, n1, k0, k1):
    n0, n1 = min(n0, n1), max(n0, n1)
    k0, k1 = min(k0, k1), max(k0, k1)
    kw = {"samples_start": n0, "samples_end": n1, "token_ratio_start": k0, "token_ratio_end": k1}
    steps = sorted({0, total // 3, total // 2, total - 1, total, total + 5})
    out = [schedule(s, total, num_generations=g, **kw) for s in steps]
    for (na, ka), (nb, kb) in itertools.pairwise(out):
        assert na <= nb and ka <= kb
    for n_s, ratio in out:
        assert min(2, g) <= n_s <= g and k0 <= ratio <= k1


# ----------------------------------------------------------------------------------------------------------------
# Token level
# ----------------------------------------------------------------------------------------------------------------


@st.composite
def token_batches(draw):
    n, t = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    levels = draw(st.sampled_from(["ties", "continuous", "zero_adv"]))
    if levels == "ties":
        ent = t64([0.0, 0.25, 0.5, 1.0])[torch.randint(0, 4, (n, t), generator=gen)]
        adv = t64([-1.0, -0.5, 0.0, 0.5, 1.0])[torch.randint(0, 5, (n,), generator=gen)]
    else:
        ent = torch.rand(n, t, generator=gen, dtype=F64) * 3
        adv = torch.randn(n, generator=gen, dtype=F64) * (levels == "continuous")
    if draw(st.booleans()):
        adv = adv[:, None] * (1 + torch.randint(0, 2, (n, t), generator=gen))  # per-token advantages
    mask = torch.rand(n, t, generator=gen) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    return adv, ent, mask


@settings(max_examples=120, deadline=None)
@given(
    token_batches(),
    st.sampled_from([0.0, 0.05, 0.07, 0.25, 1 / 3, 0.5, 0.99, 1.0]),
    st.sampled_from(["batch", "sequence"]),
    st.sampled_from([0, 1]),
)
def test_token_keep_mask_matches_reference(batch, ratio, scope, min_keep):
    adv, ent, mask = batch
    keep = token_keep_mask(adv, ent, mask, ratio, scope=scope, min_keep=min_keep)
    assert torch.equal(keep, reference_token_mask(adv, ent, mask, ratio, scope, min_keep))
    assert not keep[~mask].any()
    # exact count per scope and score dominance
    a = adv[:, None].expand_as(ent) if adv.dim() == 1 else adv
    score = a.abs() * ent
    rows = [(keep.reshape(-1), mask.reshape(-1), score.reshape(-1))] if scope == "batch" else zip(keep, mask, score)
    for k_row, m_row, s_row in rows:
        n = int(m_row.sum())
        assert int(k_row.sum()) == min(n, max(min_keep, math.ceil(ratio * n - 1e-9)))
        if k_row.any() and (m_row & ~k_row).any():
            assert s_row[k_row].min() >= s_row[m_row & ~k_row].max()


def test_token_keep_mask_counts_ratio_edges_and_padding():
    gen = torch.Generator().manual_seed(0)
    ent, adv = torch.rand(10, 10, generator=gen, dtype=F64), torch.randn(10, generator=gen, dtype=F64)
    full = torch.ones(10, 10, dtype=torch.bool)
    assert token_keep_mask(adv, ent, full, 0.07).sum() == 7  # 0.07 * 100 = 7.000000000000001 must not give 8
    assert token_keep_mask(adv, ent, full, 1.0).all()
    # The documented floor of one token (docs/methods/d3s.md §2.4).
    assert token_keep_mask(adv, ent, full, 0.0).sum() == 1
    assert token_keep_mask(adv, ent, full, 0.0, min_keep=0).sum() == 0
    assert token_keep_mask(adv, ent, full, 0.0, scope="sequence").sum(1).tolist() == [1] * 10
    mask = torch.zeros(10, 10, dtype=torch.bool)
    assert not token_keep_mask(adv, ent, mask, 0.5).any()  # a batch of padding
    garbage = torch.where(full.triu(), ent, torch.nan)
    mask = full.triu()
    assert torch.equal(token_keep_mask(adv, garbage, mask, 0.3), token_keep_mask(adv, ent, mask, 0.3))


def test_token_keep_mask_one_token_completions_and_zero_advantages():
    ent = t64([[0.5], [2.0], [1.0], [0.1]])
    assert token_keep_mask(t64([1.0, 1.0, -3.0, 0.0]), ent, torch.ones(4, 1), 0.5).squeeze(1).tolist() == [
        False,
        True,
        True,
        False,
    ]
    assert token_keep_mask(t64([1.0, 1.0, -3.0, 0.0]), ent, torch.ones(4, 1), 0.1, scope="sequence").all()
    # all-zero advantages: every score is 0, ties go to the earliest (row, position)
    keep = token_keep_mask(torch.zeros(3), torch.rand(3, 4, dtype=F64), torch.ones(3, 4), 0.5)
    assert keep.int().tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]]


def test_token_keep_mask_invalid_arguments():
    ent, mask = torch.rand(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError):
        token_keep_mask(torch.ones(2), ent, mask, 1.5)
    with pytest.raises(ValueError):
        token_keep_mask(torch.ones(2), ent, mask, 0.5, scope="micro")
    with pytest.raises(ValueError):
        token_keep_mask(torch.ones(3), ent, mask, 0.5)


# ----------------------------------------------------------------------------------------------------------------
# Loss normalisation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalization", LOSS_NORMALIZATIONS)
def test_loss_zero_gradient_outside_kept_tokens(normalization):
    gen = torch.Generator().manual_seed(1)
    logp = torch.randn(4, 6, generator=gen, dtype=F64, requires_grad=True)
    mask = torch.rand(4, 6, generator=gen) < 0.8
    keep = token_keep_mask(torch.randn(4, generator=gen), torch.rand(4, 6, generator=gen), mask, 0.3)
    per_token = torch.where(mask, -torch.exp(logp) * 1.7, torch.nan)  # NaN on padding must not leak
    loss = masked_token_loss(per_token, keep, mask, normalization=normalization)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert (grad[~keep] == 0).all() and (grad[keep] != 0).all()


@pytest.mark.parametrize("normalization", LOSS_NORMALIZATIONS)
def test_loss_without_kept_tokens_is_zero(normalization):
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    loss = masked_token_loss(x, torch.zeros(3, 4), torch.ones(3, 4), normalization=normalization)
    (grad,) = torch.autograd.grad(loss, x)
    assert loss.item() == 0.0 and (grad == 0).all()
    assert masked_token_loss(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4)).item() == 0.0


def test_loss_reduces_to_base_when_everything_is_kept():
    """Property 12: N_s = G and K = 1 give the base loss with global token-mean normalisation; mask_only_seq then
    equals GRPO's per-sequence mean."""
    gen = torch.Generator().manual_seed(2)
    x, mask = torch.randn(5, 7, generator=gen, dtype=F64), torch.rand(5, 7, generator=gen) < 0.7
    mask[:, 0] = True
    keep = token_keep_mask(torch.randn(5, generator=gen), torch.rand(5, 7, generator=gen), mask, 1.0)
    assert torch.equal(keep, mask)
    dapo = (x * mask).sum() / mask.sum()
    grpo = ((x * mask).sum(1) / mask.sum(1)).mean()
    assert masked_token_loss(x, keep, mask).item() == pytest.approx(dapo.item())
    assert masked_token_loss(x, keep, mask, normalization="mask_only_token").item() == pytest.approx(dapo.item())
    assert masked_token_loss(x, keep, mask, normalization="mask_only_seq").item() == pytest.approx(grpo.item())
    assert masked_token_loss(x, keep, mask, normalization="seq_mean_kept").item() == pytest.approx(grpo.item())
    with pytest.raises(ValueError):
        masked_token_loss(x, keep, mask, normalization="sum")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    a = pop_advantages([0.05, 0.9, 0.2, 0.1, 0.15, 0.3, 0.0, 0.25])
    assert max_variance_subset(a.cuda(), 4).cpu().tolist() == [0, 1, 3, 6]
    assert select_rollouts(example3_advantages().cuda(), 4, 2).cpu().tolist() == [0, 1, 4, 5, 6, 7]
    keep = token_keep_mask(EX4_ADV.cuda(), EX4_H.cuda(), EX4_MASK.cuda(), 0.25)
    assert keep.device.type == "cuda" and keep.int().cpu().tolist() == EX4_KEEP
    loss = masked_token_loss(-EX4_ADV[:, None].expand(3, 5).cuda(), keep, EX4_MASK.cuda())
    assert loss.item() == pytest.approx(-1 / 6)


def test_select_rollouts_leaves_ineligible_rollouts_out():
    """Ineligible rollouts (masked out of the loss) count in no slot: the subset is the max-variance one of the
    eligible rollouts, pooled or per group, at most as many as there are (docs/methods/d3s.md §6)."""
    advantages = torch.tensor([3.0, -3.0, 0.5, 0.0, 2.0, -2.0, 0.1, -0.1], dtype=F64)
    eligible = torch.tensor([False, True, True, True, True, True, False, False])
    pooled = select_rollouts(advantages, 4, 2, eligible=eligible)
    pool = eligible.nonzero().squeeze(1)
    assert torch.equal(pooled, pool[max_variance_subset(advantages[pool], 4)])
    assert not eligible[pooled].logical_not().any()
    grouped = select_rollouts(advantages, 4, 2, scope="group", eligible=eligible)
    assert grouped.tolist() == [1, 2, 4, 5]  # group 2 has only rows 4 and 5 eligible
    everyone = torch.ones(8, dtype=torch.bool)
    assert torch.equal(select_rollouts(advantages, 4, 2, eligible=everyone), select_rollouts(advantages, 4, 2))


def test_token_keep_mask_over_parts_ranks_the_stacked_parts_as_one_batch():
    from grpo_family.algorithms.d3s import token_keep_mask_in_rollout_order, token_keep_mask_over_parts

    generator = torch.Generator().manual_seed(0)
    wide = (
        torch.randn(3, generator=generator),
        torch.rand(3, 5, generator=generator),
        torch.ones(3, 5, dtype=torch.int32),
    )
    narrow = (
        torch.randn(2, generator=generator),
        torch.rand(2, 3, generator=generator),
        torch.ones(2, 3, dtype=torch.int32),
    )
    parts = [(*wide, torch.tensor([4, 0, 2])), (*narrow, torch.tensor([1, -1]))]
    keep = token_keep_mask_over_parts(parts, 0.3)
    pad = torch.nn.functional.pad
    expected = token_keep_mask_in_rollout_order(
        torch.cat([wide[0], narrow[0]]),
        torch.cat([wide[1], pad(narrow[1], (0, 2))]),
        torch.cat([wide[2], pad(narrow[2], (0, 2))]),
        torch.tensor([4, 0, 2, 1, -1]),
        0.3,
    )
    assert keep.shape == (5, 5) and torch.equal(keep, expected)
    assert not keep[3:, 3:].any()  # the narrow part's padding columns are never kept
    assert int(keep.sum()) == math.ceil(0.3 * 21)


def test_chunk_count_table_and_step_counts():
    from grpo_family.algorithms.d3s import chunk_count_table, loss_denominator, step_counts

    valid = [torch.tensor([3.0, 2.0], dtype=torch.float64), torch.tensor([4.0, 0.0], dtype=torch.float64)]
    kept = [torch.tensor([1.0, 0.0], dtype=torch.float64), None]
    table = chunk_count_table(valid, kept, [torch.tensor([0, 5]), torch.tensor([3, -1])])
    assert table.dtype == torch.float64
    assert table.tolist() == [[5.0, 1.0, 2.0, 1.0], [4.0, 0.0, 1.0, 0.0]]
    denominator, kept_tokens, rollouts, rows = step_counts(table, [0, 1], "literal_eq10")
    assert (kept_tokens, rollouts, rows) == (1.0, 3.0, 1.0)
    assert denominator == loss_denominator("literal_eq10", 9.0, 1.0, 3.0) == 3.0
    table[1, 3] = -1.0  # known only in the loss call: unknown for the whole step
    assert (
        step_counts(table, [0, 1], "token_mean_kept")[3] == -1.0
        and step_counts(table, [0], "token_mean_kept")[3] == 1.0
    )
