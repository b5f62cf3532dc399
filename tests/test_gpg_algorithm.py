"""GPG maths: advantages, the AGE factor alpha and the policy-gradient loss (docs/methods/gpg.md §2, 6, 10, 12)."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grpo_family.algorithms.gpg import (
    count_degenerate_groups,
    degenerate_groups,
    gpg_advantages,
    gpg_alpha,
    gpg_loss,
    group_token_weights,
    scale_grad,
)

NAN = float("nan")


def padded(logps, dtype=torch.float64):
    """Ragged per-completion log-probs -> ``(N, T)`` tensor (padding filled with junk) and mask."""
    width = max(1, max(len(x) for x in logps))
    values = torch.full((len(logps), width), -123.0, dtype=dtype)  # junk on padding must never matter
    mask = torch.zeros(len(logps), width, dtype=torch.bool)
    for i, row in enumerate(logps):
        values[i, : len(row)] = torch.tensor(row, dtype=dtype)
        mask[i, : len(row)] = True
    return values, mask


def loss_and_grad(logps, advantages, g, **kw):
    values, mask = padded(logps)
    values.requires_grad_(True)
    loss = gpg_loss(values, torch.as_tensor(advantages, dtype=torch.float64), mask, g, **kw)
    loss.backward()
    assert torch.all(values.grad[~mask] == 0)
    per_completion = [values.grad[i, 0].item() for i in range(len(logps))]
    # dL/dl is constant within a completion (the advantage is per sequence).
    for i, row in enumerate(logps):
        assert torch.allclose(values.grad[i, : len(row)], values.grad[i, 0].expand(len(row)))
    return loss.item(), per_completion


def brute_force_loss(logps, advantages, g, alpha=1.0, normalization="group"):
    """The formulas of docs/methods/gpg.md (§12 conventions) as explicit loops over groups, completions and tokens."""
    n = len(logps)
    p = n // g
    if normalization == "group":
        total = 0.0
        for q in range(p):
            rows = range(q * g, (q + 1) * g)
            tokens = sum(len(logps[i]) for i in rows)
            if tokens:
                total += sum(-advantages[i] * lp for i in rows for lp in logps[i]) / tokens
        return alpha * total / p
    if normalization == "token":
        tokens = sum(len(x) for x in logps)
        return alpha * sum(-advantages[i] * lp for i in range(n) for lp in logps[i]) / max(tokens, 1)
    return alpha * sum(sum(-advantages[i] * lp for lp in logps[i]) / max(len(logps[i]), 1) for i in range(n)) / n


def brute_force_grad(logps, advantages, g, alpha=1.0, normalization="group"):
    """docs/methods/gpg.md §2.3 / P4: dL/dl_{i,t} = -alpha A_i / (P T_q) (Eq. 5) or -alpha A_i / T_all (token mean)."""
    p = len(logps) // g
    out = []
    for i in range(len(logps)):
        if normalization == "group":
            q = i // g
            denom = p * sum(len(logps[j]) for j in range(q * g, (q + 1) * g))
        elif normalization == "token":
            denom = sum(len(x) for x in logps)
        else:
            denom = len(logps) * len(logps[i])
        out.append(-alpha * advantages[i] / denom if denom else 0.0)
    return out


# tol(defaults): the worked numbers of docs/methods/gpg.md §12 are printed to 6 decimals (<= 5e-7 off; the 4-decimal
# -0.4999 / 1.4997 are -0.25 / 0.5001 and 0.75 / 0.5001, within 2e-7) and computed here in float64 (a few roundings of
# values <= ~2, ~1e-15), so this helper's default atol 1e-6 (rtol 0) covers the printing; allclose's, assert_close's
# and approx's own defaults (rtol 1e-5 / 1.3e-6 float32 / rel 1e-6) compare the same float64 or float32 expression
# computed twice (a few roundings, <= ~4 x 2^-24 relative in float32) or exact count ratios rounded once or twice.
# tol: the helper's default atol 1e-6 is the one derived just above.
def assert_close(actual, expected, atol=1e-6):
    torch.testing.assert_close(  # tol: the caller's atol (default 1e-6, derived above), nothing relative
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


# ---------------------------------------------------------------- worked examples (docs/methods/gpg.md §12)

EX1_R = [[1, 0, 0, 1], [1, 1, 1, 0]]
EX1_L = [[-0.5, -1.0, -0.25], [-2.0, -0.5], [-1.5, -0.5, -0.5, -1.0], [-0.1, -0.3]]
EX1_L += [[-0.8, -0.6], [-1.2, -0.4, -0.9], [-0.3], [-2.2, -0.7, -0.1, -0.4]]


def test_example1_no_degenerate_group():
    r = torch.tensor(EX1_R, dtype=torch.float64)
    assert gpg_alpha(r) == 1.0 and count_degenerate_groups(r) == 0
    a_none = gpg_advantages(r).flatten().tolist()
    a_std = gpg_advantages(r, f_norm="group").flatten().tolist()
    # tol: the advantages r - mean of 0/1 rewards are sums of 4 values in float64 (<= 4 x 2^-53 ~ 4.4e-16 absolute):
    # 1e-15.
    assert_close(a_none, [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75], atol=1e-15)
    assert_close(a_std, [0.865875, -0.865875, -0.865875, 0.865875, 0.4999, 0.4999, 0.4999, -1.4997])
    expected = {
        ("none", "group"): (-0.1625, [-0.022727, 0.022727, 0.022727, -0.022727, -0.0125, -0.0125, -0.0125, 0.0375]),
        ("none", "token"): (
            -0.163095,
            [-0.02381, 0.02381, 0.02381, -0.02381, -0.011905, -0.011905, -0.011905, 0.035714],
        ),
        ("group", "group"): (
            -0.301498,
            [-0.039358, 0.039358, 0.039358, -0.039358, -0.024995, -0.024995, -0.024995, 0.074985],
        ),
        ("group", "token"): (
            -0.301572,
            [-0.041232, 0.041232, 0.041232, -0.041232, -0.023805, -0.023805, -0.023805, 0.071414],
        ),
    }
    for (f_norm, norm), (loss, grad) in expected.items():
        adv = a_none if f_norm == "none" else a_std
        got_loss, got_grad = loss_and_grad(EX1_L, adv, 4, normalization=norm)
        assert_close(got_loss, loss)
        assert_close(got_grad, grad)
        # tol: two float64 computations of the same loss over 20 tokens, |A logp| <= 1.5 x 2.2, weights summing to 1:
        # <= 20 x 2^-53 x Sum|w A logp| (~0.4) ~ 1e-15, far under 1e-12.
        assert_close(got_loss, brute_force_loss(EX1_L, adv, 4, normalization=norm), atol=1e-12)
        # tol: the gradient -A / (P T_q) is 2-3 float64 roundings of a value <= ~0.1 (~3e-17): far under 1e-12.
        assert_close(got_grad, brute_force_grad(EX1_L, adv, 4, normalization=norm), atol=1e-12)
    assert_close(loss_and_grad(EX1_L, a_none, 4, normalization="sequence")[0], -0.10625)
    assert_close(loss_and_grad(EX1_L, a_std, 4, normalization="sequence")[0], -0.189997)
    # Hand check in docs/methods/gpg.md §12: group terms -0.175 and -0.15.
    # tol: a float64 sum of 11 terms |A logp| <= 1 over T_q = 11: <= 11 x 2^-53 ~ 1.2e-15, under 1e-12.
    assert_close(brute_force_loss(EX1_L[:4], a_none[:4], 4), -0.175, atol=1e-12)


EX2_R = [[0, 1, 0, 0], [1, 1, 1, 1], [1, 0, 1, 1]]
EX2_L = [[-0.4, -0.6], [-1.0, -1.0, -0.5], [-0.2, -0.9], [-1.5], [-0.3, -0.3], [-0.7], [-0.2, -0.2, -0.2]]
EX2_L += [[-0.9, -0.1], [-1.1, -0.4, -0.6], [-0.5, -0.5], [-2.0, -0.3], [-0.8, -0.8, -0.8]]


def test_example2_one_all_correct_group():
    r = torch.tensor(EX2_R, dtype=torch.float64)
    assert degenerate_groups(r).tolist() == [False, True, False]
    assert count_degenerate_groups(r) == 1
    alpha = gpg_alpha(r)
    assert alpha == 1.5
    a_none = gpg_advantages(r).flatten().tolist()
    a_std = gpg_advantages(r, f_norm="group").flatten().tolist()
    assert a_none == [-0.25, 0.75, -0.25, -0.25, 0, 0, 0, 0, 0.25, -0.75, 0.25, 0.25]
    assert_close(a_std, [-0.4999, 1.4997, -0.4999, -0.4999, 0, 0, 0, 0, 0.4999, -1.4997, 0.4999, 0.4999])
    cases = [
        ("none", "group", 0.072292, 0.108438),
        ("group", "group", 0.144554, 0.216832),
        ("none", "token", 0.074038, 0.111058),
        ("group", "token", 0.148047, 0.222071),
    ]
    for f_norm, norm, without, with_alpha in cases:
        adv = a_none if f_norm == "none" else a_std
        assert_close(loss_and_grad(EX2_L, adv, 4, normalization=norm)[0], without)
        assert_close(loss_and_grad(EX2_L, adv, 4, normalization=norm, alpha=alpha)[0], with_alpha)
    assert_close(loss_and_grad(EX2_L, a_none, 4, normalization="sequence", alpha=alpha)[0], 0.034375)
    assert_close(loss_and_grad(EX2_L, a_std, 4, normalization="sequence", alpha=alpha)[0], 0.068736)
    grads = {
        ("none", "group"): [0.015625, -0.046875, 0.015625, 0.015625, 0, 0, 0, 0, -0.0125, 0.0375, -0.0125, -0.0125],
        ("group", "group"): [0.031244, -0.093731, 0.031244, 0.031244, 0, 0, 0, 0, -0.024995, 0.074985, -0.024995]
        + [-0.024995],
        ("none", "token"): [0.014423, -0.043269, 0.014423, 0.014423, 0, 0, 0, 0, -0.014423, 0.043269, -0.014423]
        + [-0.014423],
        ("group", "token"): [0.02884, -0.086521, 0.02884, 0.02884, 0, 0, 0, 0, -0.02884, 0.086521, -0.02884, -0.02884],
    }
    for (f_norm, norm), expected in grads.items():
        adv = a_none if f_norm == "none" else a_std
        grad = loss_and_grad(EX2_L, adv, 4, normalization=norm, alpha=alpha)[1]
        assert_close(grad, expected)
        # tol: the gradient -alpha A / (P T_q) is 3 float64 roundings of a value <= ~0.1 on each side: ~1e-16, far
        # under 1e-12.
        assert_close(grad, brute_force_grad(EX2_L, adv, 4, alpha=alpha, normalization=norm), atol=1e-12)


EX3_R = [[1, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0]]
EX3_L = [[-0.5, -0.5], [-1.0], [-0.3, -0.6], [-0.2, -0.2, -0.2], [-0.7, -0.1], [-1.4], [-0.6, -0.6], [-0.9]]
EX3_L += [[-0.4], [-0.8, -0.2, -0.2], [-1.1, -0.5], [-0.6], [-0.3, -0.9], [-0.2], [-1.5, -0.5], [-0.7, -0.7]]


def test_example3_alpha_must_be_global():
    r = torch.tensor(EX3_R, dtype=torch.float64)
    adv = gpg_advantages(r).flatten().tolist()
    assert adv == [0.25, -0.75, 0.25, 0.25, 0, 0, 0, 0, -0.25, 0.75, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]
    rank0 = loss_and_grad(EX3_L[:8], adv[:8], 4)[0]
    rank1 = loss_and_grad(EX3_L[8:], adv[8:], 4)[0]
    assert_close([rank0, rank1], [-0.007812, -0.053571])
    alpha = gpg_alpha(r)
    # tol: alpha = B / (B - M) of exact counts, one float64 division: <= 2^-53 x 4/3 ~ 1.5e-16, under 1e-15.
    assert alpha == pytest.approx(4 / 3, abs=1e-15)
    ddp = (alpha * rank0 + alpha * rank1) / 2  # the same alpha on every rank, then DDP's mean
    assert_close(ddp, -0.040923)
    # tol: the same float64 loss over 32 tokens (|A logp| <= ~2, weights summing to <= 4/3) summed in another grouping:
    # <= 32 x 2^-53 x ~1 ~ 3.6e-15, under 1e-12.
    assert_close(loss_and_grad(EX3_L, adv, 4, alpha=alpha)[0], ddp, atol=1e-12)
    informative = [loss_and_grad(EX3_L[q * 4 : q * 4 + 4], adv[q * 4 : q * 4 + 4], 4)[0] for q in (0, 2, 3)]
    assert_close(informative, [-0.015625, 0.035714, -0.142857])
    # tol: 3 float64 group losses (each a few roundings of <= ~0.15) averaged vs the full loss: ~1e-16 x a few tens of
    # terms, under 1e-12.
    assert_close(sum(informative) / 3, ddp, atol=1e-12)  # alpha * L = mean over informative groups
    per_rank_alpha = [gpg_alpha(r[:2]), gpg_alpha(r[2:])]
    assert per_rank_alpha == [2.0, 1.0]
    wrong = (per_rank_alpha[0] * rank0 + per_rank_alpha[1] * rank1) / 2
    assert_close(wrong, -0.034598)


def test_example4_continuous_rewards():
    r = torch.tensor([[0.9, 0.4, 0.2], [0.25, 0.25, 0.25], [0.7, 0.1, 0.55]], dtype=torch.float64)
    logps = [[-0.6, -0.4], [-1.3], [-0.2, -0.5, -0.7], [-0.9, -0.9], [-0.4, -1.6], [-0.3]]
    logps += [[-1.0, -0.2], [-0.5, -0.5, -0.5], [-0.8]]
    alpha = gpg_alpha(r)
    assert alpha == 1.5
    a_none = gpg_advantages(r).flatten().tolist()
    a_std = gpg_advantages(r, f_norm="group").flatten().tolist()
    # tol: r - mean of 3 float64 rewards in [0, 1]: <= 3 roundings of 2^-53 (~3.3e-16): 1e-12.
    assert_close(a_none, [0.4, -0.1, -0.3, 0, 0, 0, 0.25, -0.35, 0.1], atol=1e-12)
    assert_close(a_std, [1.109093, -0.277273, -0.83182, 0, 0, 0, 0.800384, -1.120538, 0.320154])
    for adv, norm, without, with_alpha in [
        (a_none, "group", -0.016389, -0.024583),
        (a_std, "group", -0.048896, -0.073344),
        (a_none, "token", -0.017353, -0.026029),
        (a_std, "token", -0.051773, -0.077659),
    ]:
        assert_close(loss_and_grad(logps, adv, 3, normalization=norm)[0], without)
        assert_close(loss_and_grad(logps, adv, 3, normalization=norm, alpha=alpha)[0], with_alpha)
    assert_close(loss_and_grad(logps, a_none, 3, normalization="sequence", alpha=alpha)[0], -0.0025)
    assert_close(loss_and_grad(logps, a_std, 3, normalization="sequence", alpha=alpha)[0], -0.003001)
    assert_close(
        loss_and_grad(logps, a_none, 3, alpha=alpha)[1],
        [-0.033333, 0.008333, 0.025, 0, 0, 0, -0.020833, 0.029167, -0.008333],
    )
    assert_close(
        loss_and_grad(logps, a_std, 3, alpha=alpha)[1],
        [-0.092424, 0.023106, 0.069318, 0, 0, 0, -0.066699, 0.093378, -0.026679],
    )


def test_example6_every_group_degenerate():
    r = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    logps = [[-0.5], [-0.7, -0.1], [-1.0], [-0.3]]
    assert count_degenerate_groups(r) == 2
    assert gpg_alpha(r) == 1.0
    adv = gpg_advantages(r)
    assert torch.equal(adv, torch.zeros_like(adv))
    for norm in ("group", "token", "sequence"):
        values, mask = padded(logps)
        values.requires_grad_(True)
        loss = gpg_loss(values, adv.flatten().double(), mask, 2, alpha=gpg_alpha(r), normalization=norm)
        loss.backward()  # the zero loss stays connected to the graph
        assert loss.item() == 0.0
        assert torch.equal(values.grad, torch.zeros_like(values))


def test_example5_threshold_bookkeeping_alpha():
    # Assembled batch after resampling: 4 informative groups + 1 degenerate filler, G = 8.
    informative = torch.tensor([[1.0] + [0.0] * 7] * 4)
    r = torch.cat([informative, torch.zeros(1, 8)])
    assert gpg_alpha(r) == 1.25 and gpg_alpha(r) <= 1 / 0.6
    assert gpg_alpha(torch.cat([informative[:2], torch.zeros(3, 8)])) == 2.5  # round 1 alone


# ---------------------------------------------------------------- NaN (unscorable) rewards (docs/methods/gpg.md §6, 11 A7)


def test_nan_rewards_are_left_out_and_counted_in_m():
    r = torch.tensor([[1.0, NAN, 0.0, 0.0], [NAN, NAN, NAN, 1.0], [0.5, 0.5, NAN, 0.5]])
    assert degenerate_groups(r).tolist() == [False, True, True]
    adv = gpg_advantages(r)
    assert torch.isfinite(adv).all()
    # tol: float32 rewards (torch.tensor's default dtype): the mean 1/3 is one rounding (half a ULP of 1/3, 2^-26) and
    # 1 - mean, 0 - mean one more (half a ULP of 2/3, 2^-25): <= 4.5e-8 from float64 2/3 and -1/3, under 1e-7.
    assert_close(adv[0], [2 / 3, 0.0, -1 / 3, -1 / 3], atol=1e-7)  # mean of the three scorable rewards
    assert torch.equal(adv[1:], torch.zeros(2, 4))
    std = torch.tensor([1.0, 0.0, 0.0]).std().item()
    assert_close(
        gpg_advantages(r, f_norm="group")[0],
        [2 / 3 / (std + 1e-4), 0, -1 / 3 / (std + 1e-4)] + [-1 / 3 / (std + 1e-4)],
    )
    batch_std = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5]).std().item()
    assert_close(
        gpg_advantages(r, f_norm="batch")[0],
        [2 / 3 / (batch_std + 1e-4), 0, -1 / 3 / (batch_std + 1e-4)] + [-1 / 3 / (batch_std + 1e-4)],
    )
    # B = 12 rows; M = 1 NaN row of the informative group + 8 rows of the two degenerate groups.
    assert gpg_alpha(r) == pytest.approx(12 / 3)
    all_nan = torch.full((2, 3), NAN)
    assert gpg_alpha(all_nan) == 1.0 and torch.equal(gpg_advantages(all_nan), torch.zeros(2, 3))


def test_tolerance_for_continuous_rewards_and_alpha_cap():
    r = torch.tensor([[0.5, 0.5 + 1e-9, 0.5], [0.0, 1.0, 0.0]], dtype=torch.float64)
    assert degenerate_groups(r).tolist() == [False, False]
    assert degenerate_groups(r, tol=1e-6).tolist() == [True, False]
    assert torch.equal(gpg_advantages(r, tol=1e-6, f_norm="group")[0], torch.zeros(3, dtype=torch.float64))
    assert gpg_alpha(r, tol=1e-6) == 2.0
    assert gpg_alpha(r, tol=1e-6, max_alpha=1.5) == 1.5


def test_invalid_arguments_raise():
    with pytest.raises(ValueError):
        gpg_advantages(torch.zeros(4), f_norm="none")
    with pytest.raises(ValueError):
        gpg_advantages(torch.zeros(2, 2), f_norm="std")
    with pytest.raises(ValueError):
        gpg_loss(torch.zeros(3, 2), torch.zeros(3), torch.ones(3, 2), 2)
    with pytest.raises(ValueError):
        gpg_loss(torch.zeros(4, 2), torch.zeros(4), torch.ones(4, 2), 2, normalization="dapo")


# ---------------------------------------------------------------- properties (docs/methods/gpg.md §10)


@st.composite
def batches(draw, binary=None):
    g, p = draw(st.integers(2, 5)), draw(st.integers(1, 4))
    is_binary = draw(st.booleans()) if binary is None else binary
    value = st.sampled_from([0.0, 1.0]) if is_binary else st.floats(-3, 3, allow_subnormal=False)
    rewards = [[draw(value) for _ in range(g)] for _ in range(p)]
    lengths = [draw(st.integers(0 if draw(st.booleans()) else 1, 5)) for _ in range(p * g)]
    logps = [[draw(st.floats(-8, -0.01)) for _ in range(n)] for n in lengths]
    return torch.tensor(rewards, dtype=torch.float64), logps, g


def brute_force_alpha(rewards):
    rows = rewards.tolist()
    b = sum(len(row) for row in rows)
    m = sum(len(row) for row in rows if max(row) == min(row))
    return b / (b - m) if m < b else 1.0


@settings(max_examples=120, deadline=None)
@given(batches())
def test_alpha_matches_brute_force_and_is_at_least_one(batch):
    rewards, _, _ = batch
    alpha = gpg_alpha(rewards)
    assert alpha == pytest.approx(brute_force_alpha(rewards))
    assert alpha >= 1.0
    if count_degenerate_groups(rewards) == 0:
        assert alpha == 1.0  # P1


@settings(max_examples=120, deadline=None)
@given(batches(), st.sampled_from(["none", "group", "batch"]))
def test_advantages_match_brute_force(batch, f_norm):
    rewards, _, _ = batch
    rows = rewards.tolist()
    flat = [x for row in rows for x in row]
    batch_mean = sum(flat) / len(flat)
    batch_std = math.sqrt(sum((x - batch_mean) ** 2 for x in flat) / (len(flat) - 1)) if len(flat) > 1 else 0.0
    expected = []
    for row in rows:
        mean = sum(row) / len(row)
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
        scale = {"none": 1.0, "group": std + 1e-4, "batch": batch_std + 1e-4}[f_norm]
        expected.append([0.0 if max(row) == min(row) else (x - mean) / scale for x in row])
    adv = gpg_advantages(rewards, f_norm=f_norm)
    # tol: float64 on both sides: rewards in [-3, 3], means of <= 5 values and stds differ by a few roundings (~6 x
    # 2^-53 x 3 ~ 2e-15), then divided by std + 1e-4 >= 1e-4: <= ~2e-11, under 1e-9.
    assert_close(adv, expected, atol=1e-9)
    assert torch.isfinite(adv).all()
    if f_norm != "batch":
        # tol: a row of <= 5 float64 advantages |A| <= ~6 sums to 0 up to 5 roundings (~6.7e-15), or that divided by
        # std + 1e-4 (<= ~7e-11): under 1e-9.
        assert_close(adv.sum(dim=1), torch.zeros(len(rows)), atol=1e-9)  # P10


@settings(max_examples=80, deadline=None)
@given(batches(binary=False), st.floats(-5, 5), st.floats(0.1, 10))
def test_advantage_shift_and_scale_behaviour(batch, shift, scale):
    rewards, _, _ = batch
    base = gpg_advantages(rewards)
    for moved in (rewards + shift, rewards * scale):  # rounding must not merge distinct rewards
        assume(torch.equal(degenerate_groups(moved), degenerate_groups(rewards)))
    # tol: shifting float64 rewards by |shift| <= 5 rounds each |r + shift| <= 8 once (<= 8 x 2^-53 ~ 9e-16), and r -
    # mean cancels the shift up to a few such roundings: ~1e-14, under 1e-9.
    assert_close(gpg_advantages(rewards + shift), base, atol=1e-9)  # P11: shift-invariant
    # tol: scaling by <= 10 rounds each reward once (relative 2^-53) and the advantage |A| x scale <= 60 carries a few
    # such roundings: ~1e-14, under 1e-9.
    assert_close(gpg_advantages(rewards * scale), base * scale, atol=1e-9)  # linear in the reward scale


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(["group", "token", "sequence"]), st.floats(1.0, 8.0))
def test_loss_and_gradient_match_brute_force(batch, normalization, alpha):
    rewards, logps, g = batch
    adv = gpg_advantages(rewards).flatten().tolist()
    if all(len(x) == 0 for x in logps):
        logps[0] = [-1.0]
    loss, grad = loss_and_grad(logps, adv, g, alpha=alpha, normalization=normalization)
    # tol: a float64 loss over <= 100 tokens with |A logp| <= 6 x 8, alpha <= 8, weights summing to <= 1: <= 100 x
    # 2^-53 x 384 ~ 4e-12, under 1e-10.
    assert loss == pytest.approx(brute_force_loss(logps, adv, g, alpha, normalization), abs=1e-10)
    expected = brute_force_grad(logps, adv, g, alpha, normalization)  # P4
    for i, row in enumerate(logps):
        if row:
            # tol: the gradient -alpha A / (P T_q) is 3 float64 roundings of a value <= 48: <= 3 x 2^-53 x 48 ~
            # 1.6e-14, under 1e-12.
            assert grad[i] == pytest.approx(expected[i], abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(batches(binary=True), st.data())
def test_degenerate_rows_do_not_change_the_gradient(batch, data):
    """P3/P3b: new tokens and lengths for degenerate groups leave the Eq. 5 gradient unchanged."""
    rewards, logps, g = batch
    degenerate = degenerate_groups(rewards).repeat_interleave(g).tolist()
    assume(not all(degenerate))
    adv = gpg_advantages(rewards).flatten().tolist()
    alpha = gpg_alpha(rewards)
    changed = [
        data.draw(st.lists(st.floats(-8, -0.01), min_size=0, max_size=6)) if deg else row
        for deg, row in zip(degenerate, logps)
    ]
    _, before = loss_and_grad(logps, adv, g, alpha=alpha)
    _, after = loss_and_grad(changed, adv, g, alpha=alpha)
    for i, deg in enumerate(degenerate):
        if not deg and logps[i]:
            # tol: the kept rows' gradient is the same expression -alpha A / (P T_q) of the same counts either way:
            # equal up to a rounding or two (2^-53 relative each), rel 1e-12 is ~4500 float64 ULP.
            assert after[i] == pytest.approx(before[i], rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(batches(), st.floats(1.0, 5.0))
def test_alpha_scales_the_gradient_and_scale_grad_keeps_the_forward(batch, alpha):
    """P2: grad(alpha L) = alpha grad(L); ``scale_grad`` gives the same gradient with the unscaled value."""
    rewards, logps, g = batch
    adv = torch.tensor(gpg_advantages(rewards).flatten().tolist(), dtype=torch.float64)
    values, mask = padded(logps)
    grads = []
    for mode in ("plain", "alpha", "hook"):
        x = values.clone().requires_grad_(True)
        loss = gpg_loss(x, adv, mask, g, alpha=alpha if mode == "alpha" else 1.0)
        if mode == "hook":
            scaled = scale_grad(loss, alpha)
            assert scaled.item() == loss.item()
            loss = scaled
        loss.backward()
        grads.append(x.grad)
    # tol: alpha x grad is one float64 multiplication more on one side than grad(alpha L): <= 2 roundings (2^-53
    # relative each), rtol 1e-12.
    torch.testing.assert_close(grads[1], alpha * grads[0], rtol=1e-12, atol=0)
    # tol: the hook multiplies the incoming gradient by alpha once, as the alpha loss does: equal up to a rounding
    # (2^-53 relative), rtol 1e-12.
    torch.testing.assert_close(grads[2], grads[1], rtol=1e-12, atol=0)


@settings(max_examples=60, deadline=None)
@given(batches(), st.data())
def test_group_token_weights_make_any_row_split_exact(batch, data):
    """P12/P16: per-row weights 1/(P T_q) summed over any split of rows (ranks, micro-steps) give Eq. 5.

    Both sides are brute force (explicit loops), not ``gpg_loss``, which is itself built on these weights.
    """
    rewards, logps, g = batch
    adv = gpg_advantages(rewards).flatten()
    values, mask = padded(logps)
    weights = group_token_weights(mask, g)
    p = len(logps) // g
    for i in range(len(logps)):
        tokens = sum(len(logps[j]) for j in range(i // g * g, i // g * g + g))  # T_q of row i's group
        assert weights[i].item() == (1.0 / (p * tokens) if tokens else 0.0)
    full = brute_force_loss(logps, adv.tolist(), g)
    order = data.draw(st.permutations(range(len(logps))))
    cut = data.draw(st.integers(0, len(logps)))
    parts = [list(order[:cut]), list(order[cut:])]
    total = 0.0
    for rows in parts:
        per_row = torch.where(mask[rows], -adv[rows, None] * values[rows], 0.0).sum(dim=1)
        total += (per_row * weights[rows]).sum().item()
    # tol: two float64 sums of the same <= 100 weighted terms (|A logp| <= 6 x 8, weights summing to <= 1) in another
    # order: <= 100 x 2^-53 x 48 ~ 5.3e-13, under 1e-12.
    assert total == pytest.approx(full, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["group", "token"]))
def test_grpo_surrogate_at_theta_old_has_the_same_gradient(batch, normalization):
    """P5 / docs/methods/gpg.md §2.7: with beta = 0 and ratio 1, GRPO's clipped surrogate differentiates like GPG."""
    rewards, logps, g = batch
    adv = gpg_advantages(rewards).flatten()
    values, mask = padded(logps)
    x1 = values.clone().requires_grad_(True)
    gpg_loss(x1, adv, mask, g, normalization=normalization).backward()
    x2 = values.clone().requires_grad_(True)
    ratio = torch.exp(x2 - x2.detach())
    surrogate = -torch.minimum(ratio * adv[:, None], torch.clamp(ratio, 0.8, 1.2) * adv[:, None])
    # The same aggregation as gpg_loss, applied to the surrogate (values differ, gradients agree).
    if normalization == "group":
        per_row = torch.where(mask, surrogate, 0.0).sum(dim=1)
        loss = (per_row * group_token_weights(mask, g)).sum()
    else:
        loss = torch.where(mask, surrogate, 0.0).sum() / mask.sum().clamp(min=1)
    loss.backward()
    # tol: ratio = exp(0) = 1 exactly, so both gradients are -A times the same weight (a rounding or two apart, rtol
    # 1e-12 ~ 4500 float64 ULP); atol 1e-15 for the zero entries of degenerate rows.
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-12, atol=1e-15)


def test_per_token_advantages_and_nonfinite_padding():
    logps = torch.tensor([[-1.0, -2.0, -torch.inf], [-0.5, NAN, NAN]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([0.5, -0.5])
    loss = gpg_loss(logps, adv, mask, 2)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logps.grad).all()
    assert loss.item() == pytest.approx((0.5 * 3 - 0.5 * 0.5) / 3)
    torch.testing.assert_close(gpg_loss(logps, adv[:, None].expand(2, 3), mask, 2), loss)


def test_float32_and_bfloat16_inputs():
    values, mask = padded(EX1_L, dtype=torch.float32)
    adv = gpg_advantages(torch.tensor(EX1_R, dtype=torch.float32)).flatten()
    loss = gpg_loss(values, adv, mask, 4)
    assert loss.dtype == torch.float32
    # tol: a float32 loss: each of the 20 terms carries ~5 roundings (logp, product, row sum, weight, weighted product)
    # of 2^-24 relative on Sum|w A logp| = 0.365: <= 5 x 6e-8 x 0.365 ~ 1.1e-7, plus the result's own rounding: under
    # 1e-6.
    assert loss.item() == pytest.approx(-0.1625, abs=1e-6)
    loss16 = gpg_loss(values.bfloat16(), adv.bfloat16(), mask, 4)
    # tol: bfloat16 rounds to 8 significant bits (unit roundoff 2^-8): each term carries ~5 roundings (logp, product,
    # row sum, weight, weighted product) on Sum|w A logp| = 0.365, and the result one more of |-0.1625|:
    # 5 x 2^-8 x 0.365 + 2^-8 x 0.1625 ~ 7.8e-3. The former 3e-3 was below this worst case (it held on the rounding
    # one CPU did, 5.9e-4 off), so the bound is now 8e-3.
    assert loss16.dtype == torch.bfloat16 and loss16.item() == pytest.approx(-0.1625, abs=8e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    values, mask = padded(EX2_L)
    r = torch.tensor(EX2_R, dtype=torch.float64)
    adv = gpg_advantages(r).flatten()
    alpha = gpg_alpha(r.cuda())
    assert alpha == 1.5
    x = values.cuda().requires_grad_(True)
    loss = gpg_loss(x, gpg_advantages(r.cuda()).flatten(), mask.cuda(), 4, alpha=alpha)
    loss.backward()
    # tol: the same float64 loss over 26 tokens (|alpha A logp| <= 1.5 x 0.75 x 2, weights summing to <= 1) reduced
    # in another order by the CUDA kernels: <= 26 x 2^-53 x 2.25 ~ 6.5e-15, under 1e-12.
    assert loss.item() == pytest.approx(gpg_loss(values, adv, mask, 4, alpha=alpha).item(), abs=1e-12)
    assert x.grad.device.type == "cuda"
