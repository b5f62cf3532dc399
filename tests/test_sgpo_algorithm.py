"""SGPO maths: RTS, majority vote, partial credit and rewards (docs/methods/sgpo.md §2.4-2.10, 11, 13)."""

import itertools
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.algorithms.grpo import group_advantages
from grpo_family.algorithms.reference import group_advantages_reference as reference_advantages
from grpo_family.algorithms.sgpo import (
    groups_to_judge,
    partial_credit,
    sgpo_rewards,
    trajectory_score,
    vote_first_error,
)

NAN = float("nan")


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def library_advantages(rewards, ddof=1, eps=1e-4):
    """The library's GRPO advantage (grpo_family.algorithms.grpo.group_advantages), in float64."""
    return group_advantages(torch.tensor(rewards, dtype=torch.float64), ddof=ddof, eps=eps)


def stable_sigmoid(z):
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


# tol(defaults): the worked numbers of docs/methods/sgpo.md §13 are printed to 6 decimals (<= 5e-7 off the exact value;
# the 4-decimal -0.4999 and 1.4997 are -0.25 / 0.5001 and 0.75 / 0.5001, within 2e-7); the tests compute them in
# float64 (the `float64` fixture: ~1e-15 off) or, on the float32 paths (the GPU test, the trainers' default dtype),
# with a sigmoid of ~4 roundings of a value <= 1 (<= 2.4e-7): atol 1e-6 (this helper's default, rtol 0) covers the
# printing plus the rounding, and pytest.approx's default rel 1e-6 the float64 ratios k/K.
# tol: the helper's default atol 1e-6 is the one derived just above.
def assert_close(actual, expected, atol=1e-6):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    # tol: the caller's atol (default 1e-6, derived above), nothing relative.
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0, equal_nan=True)


# ---------------------------------------------------------------- worked examples (docs/methods/sgpo.md §13)


def test_trajectory_score_paper_examples():
    assert trajectory_score(4, 5) == pytest.approx(3 / 5)
    assert trajectory_score(3, 5) == pytest.approx(2 / 5)
    assert trajectory_score(1, 7) == 0.0
    assert trajectory_score(None, 7) == 1.0
    assert trajectory_score(0 + 1, 1) == 0.0
    assert math.isnan(trajectory_score(NAN, 4))
    # Empty completion: K = 0 -> RTS 0 whatever placeholder verdict comes along (it is never judged).
    assert trajectory_score(None, 0) == 0.0
    assert trajectory_score(NAN, 0) == 0.0


def test_e1_reward_map():
    rts = torch.tensor([0, 0.1, 0.2, 0.25, 1 / 3, 0.4, 0.5, 0.6, 2 / 3, 0.75, 0.8, 0.9, 1], dtype=torch.float64)
    default = [0.006693, 0.017986, 0.047426, 0.075858, 0.158869, 0.268941, 0.5, 0.731059, 0.841131, 0.924142]
    default += [0.952574, 0.982014, 0.993307]
    literal = [0.006693, 0.007034, 0.007392, 0.007577, 0.007897, 0.008163, 0.008577, 0.009013, 0.009316]
    literal += [0.009708, 0.009952, 0.010457, 0.010987]
    assert_close(partial_credit(rts), default)
    assert_close(partial_credit(rts, beta=0.5, gamma=10.0), literal)
    linear = partial_credit(rts, mode="linear")
    # tol: exact: the linear map returns RTS itself (atol 0, rtol 0 in the helper).
    assert_close(linear[:-1], rts[:-1], atol=0)
    # Linear RTS = 1 is capped one ulp below the correct reward.
    # tol: the cap is the largest float64 below 1, 1 - 2^-53 ~ 1 - 1.1e-16: within 1e-15 (~9 float64 ULP of 1), and
    # strictly below.
    assert linear[-1] < 1 and linear[-1] == pytest.approx(1, abs=1e-15)


E2_K = [10, 12, 8, 5, 20, 6, 15, 4]
E2_K_ERR = [3, 10, None, 1, 11, 4, 10, 2]
E2_R = [0.047426, 0.924142, 0.993307, 0.006693, 0.5, 0.5, 0.731059, 0.075858]


def test_e2_all_negative_group(float64):
    correct = torch.zeros(1, 8, dtype=torch.bool)
    r = sgpo_rewards(correct, [E2_K_ERR], [E2_K])
    assert r.dtype == torch.float64
    assert_close(r, [E2_R])
    assert_close(r.mean(), 0.472311)
    assert_close(r.std(), 0.396155)
    # Every advantage is checked twice: the library's group_advantages (what the trainers run) and the reference
    # written out above, both against the numbers of docs/methods/sgpo.md §13.
    for advantages in (reference_advantages, library_advantages):
        assert_close(
            advantages(r.tolist()),
            [[-1.072249, 1.140252, 1.314800, -1.175044, 0.069878, 0.069878, 0.652983, -1.000497]],
        )
        assert_close(
            advantages(r.tolist(), ddof=0, eps=0),
            [[-1.146572, 1.219289, 1.405935, -1.256492, 0.074721, 0.074721, 0.698244, -1.069846]],
        )
    linear = sgpo_rewards(correct, [E2_K_ERR], [E2_K], mode="linear")
    # tol: linear rewards are RTS = (k - 1) / K, one float64 division (<= 2^-53 relative ~ 1.1e-16): 1e-15 is ~9
    # float64 ULP of values <= 1.
    assert_close(linear, [[0.2, 0.75, 1.0, 0.0, 0.5, 0.5, 0.6, 0.25]], atol=1e-15)
    literal = sgpo_rewards(correct, [E2_K_ERR], [E2_K], beta=0.5, gamma=10.0)
    assert_close(literal.mean(), 0.008566)
    assert_close(literal.std(), 0.001375)
    for advantages in (reference_advantages, library_advantages):
        assert_close(
            advantages(linear.tolist()),
            [[-0.857196, 0.857196, 1.636465, -1.480611, 0.077927, 0.077927, 0.389634, -0.701342]],
        )
        assert_close(
            advantages(literal.tolist()),
            [[-0.796076, 0.774846, 1.641667, -1.269800, 0.008014, 0.008014, 0.303503, -0.670168]],
        )
        assert_close(
            advantages(literal.tolist(), eps=0),
            [[-0.853977, 0.831203, 1.761071, -1.362157, 0.008597, 0.008597, 0.325578, -0.718912]],
        )


def test_e2_default_float32_path():
    r = sgpo_rewards(torch.zeros(1, 8, dtype=torch.bool), [E2_K_ERR], [E2_K])
    assert r.dtype == torch.float32
    assert_close(r, [E2_R])


E3_CORRECT = [[True, False, False, True, False, False, False, False]]
E3_K = [[0, 7, 10, 0, 5, 8, 6, 12]]
E3_ERR = [[None, 2, 6, None, 5, 1, 4, None]]


def test_e3_mixed_group_is_plain_grpo():
    correct = torch.tensor(E3_CORRECT)
    r = sgpo_rewards(correct, E3_ERR, E3_K)
    assert torch.equal(r, correct.float())
    assert not groups_to_judge(correct).any()
    for advantages in (reference_advantages, library_advantages):
        assert_close(
            advantages(r.tolist()),
            [[1.619835, -0.539945, -0.539945, 1.619835, -0.539945, -0.539945, -0.539945, -0.539945]],
        )


def test_e3b_all_incorrect_scope(float64):
    correct = torch.tensor(E3_CORRECT)
    assert groups_to_judge(correct, scope="all_incorrect").tolist() == [True]
    r = sgpo_rewards(correct, E3_ERR, E3_K, scope="all_incorrect")
    assert_close(r, [[1, 0.027347, 0.5, 1, 0.952574, 0.006693, 0.5, 0.993307]])
    for advantages in (reference_advantages, library_advantages):
        assert_close(
            advantages(r.tolist()),
            [[0.877523, -1.383413, -0.284729, 0.877523, 0.767282, -1.431423, -0.284729, 0.861966]],
        )


def test_e4_failure_empty_and_no_error(float64):
    correct = torch.zeros(1, 6, dtype=torch.bool)
    r = sgpo_rewards(correct, [[4, 4, NAN, None, None, 9]], [[10, 10, 7, 0, 9, 16]])
    assert_close(r, [[0.119203, 0.119203, NAN, 0.006693, 0.993307, 0.5]])
    valid = r[~r.isnan()]
    assert_close(valid.mean(), 0.347681)
    assert_close(valid.std(), 0.406421)
    for advantages in (reference_advantages, library_advantages):
        assert_close(advantages(r.tolist()), [[-0.562033, -0.562033, 0.0, -0.838797, 1.588174, 0.374689]])


def test_e5_majority_vote():
    votes = [[4, 4, 6, NAN], [None, None, 7, 7], [2, 3, 2, 3], [9, None, 9, 10]]
    num_steps = [10, 8, 5, 12]
    voted = [vote_first_error(v, k) for v, k in zip(votes, num_steps)]
    assert voted == [4, 7, 2, 9]
    r = sgpo_rewards(torch.zeros(1, 4, dtype=torch.bool), [voted], [num_steps])
    assert_close(r, [[0.119203, 0.924142, 0.047426, 0.841131]])
    for advantages in (reference_advantages, library_advantages):
        assert_close(advantages(r.tolist()), [[-0.784401, 0.951285, -0.939174, 0.772289]])


def test_e6_batch_of_three_groups():
    correct = torch.tensor([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    # Verdicts outside judged groups are placeholders, even invalid ones: they must never be read.
    first_error = [[99, 99, 99, 99], [99, 99, 99, 99], [7, 2, None, 4]]
    num_steps = [[1, 1, 1, 1], [1, 1, 1, 1], [8, 10, 3, 16]]
    assert groups_to_judge(correct).tolist() == [False, False, True]
    r = sgpo_rewards(correct, first_error, num_steps)
    # tol: exact: outside the judged scope the rewards are the 0/1 correctness itself (atol 0, rtol 0 in the helper).
    assert_close(r[:2], correct[:2].float(), atol=0)
    assert_close(r[2], [0.924142, 0.017986, 0.993307, 0.042088])
    for advantages in (reference_advantages, library_advantages):
        assert_close(
            advantages(r.tolist()),
            [[0, 0, 0, 0], [-0.4999, 1.4997, -0.4999, -0.4999], [0.800134, -0.886957, 0.928907, -0.842085]],
        )
    # After the window (epoch >= 3) the same batch is plain GRPO: binary rewards, group 3 all zero.
    assert_close(
        library_advantages(correct.double().tolist()),
        [[0, 0, 0, 0], [-0.4999, 1.4997, -0.4999, -0.4999], [0, 0, 0, 0]],
    )


# ---------------------------------------------------------------- no_error_policy (docs/methods/sgpo.md §7, §12 A12)


def test_no_error_policy_last_step_on_hand_computed_numbers(float64):
    # "full_credit" (default): NONE -> RTS 1. "last_step": NONE on a response with a (wrong) final answer -> k = K.
    assert trajectory_score(None, 5) == 1.0
    assert trajectory_score(None, 5, no_error_policy="last_step", has_final_answer=True) == pytest.approx(4 / 5)
    assert trajectory_score(None, 5, no_error_policy="last_step", has_final_answer=False) == 1.0  # truncated
    assert trajectory_score(None, 1, no_error_policy="last_step", has_final_answer=True) == 0.0
    assert trajectory_score(None, 5, has_final_answer=True) == 1.0  # full_credit ignores it
    assert trajectory_score(2, 5, no_error_policy="last_step", has_final_answer=True) == pytest.approx(1 / 5)
    assert trajectory_score(None, 0, no_error_policy="last_step", has_final_answer=True) == 0.0  # empty

    correct = torch.zeros(1, 4, dtype=torch.bool)
    first_error, num_steps = [[None, None, None, 2]], [[3, 2, 4, 4]]
    answered = [[True, False, True, True]]
    # RTS: 2/3, 1 (no answer), 3/4, 1/4 -> sigmoid(10 (RTS - 0.5)) from the E1 table of docs/methods/sgpo.md §13.
    last = sgpo_rewards(correct, first_error, num_steps, no_error_policy="last_step", has_final_answer=answered)
    assert_close(last, [[0.841131, 0.993307, 0.924142, 0.075858]])
    full = sgpo_rewards(correct, first_error, num_steps, has_final_answer=answered)
    assert_close(full, [[0.993307, 0.993307, 0.993307, 0.075858]])
    # mean 0.708610, std(ddof=1) 0.426397, A = (r - mean) / (std + 1e-4), worked out with math.exp alone.
    for advantages in (reference_advantages, library_advantages):
        assert_close(advantages(last.tolist()), [[0.310721, 0.667526, 0.505355, -1.483601]])
    linear = sgpo_rewards(
        correct, first_error, num_steps, mode="linear", no_error_policy="last_step", has_final_answer=answered
    )
    # tol: linear rewards are RTS = k / K, one float64 division (<= 1.1e-16 relative): 1e-15 is ~9 float64 ULP of
    # values <= 1.
    assert_close(linear, [[2 / 3, 1.0, 0.75, 0.25]], atol=1e-15)


def test_no_error_policy_inputs_are_checked():
    correct = torch.zeros(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="no_error_policy"):
        trajectory_score(None, 3, no_error_policy="zero")
    with pytest.raises(ValueError, match="no_error_policy"):
        sgpo_rewards(correct, [[None, 1]], [[2, 2]], no_error_policy="zero")
    with pytest.raises(ValueError, match="has_final_answer"):
        sgpo_rewards(correct, [[None, 1]], [[2, 2]], no_error_policy="last_step")
    with pytest.raises(ValueError, match="has_final_answer"):
        sgpo_rewards(correct, [[None, 1]], [[2, 2]], no_error_policy="last_step", has_final_answer=[[True]])


# ---------------------------------------------------------------- input checking


def test_invalid_inputs_raise():
    with pytest.raises(ValueError):
        trajectory_score(0, 5)
    with pytest.raises(ValueError):
        trajectory_score(6, 5)
    with pytest.raises(TypeError):
        trajectory_score(True, 5)
    with pytest.raises(TypeError):
        vote_first_error(["FAIL"], 5)
    with pytest.raises(ValueError):
        vote_first_error([3, 6], 5)
    with pytest.raises(ValueError):
        partial_credit(torch.zeros(1), beta=0.0)
    with pytest.raises(ValueError):
        partial_credit(torch.zeros(1), mode="tanh")
    with pytest.raises(ValueError):
        groups_to_judge(torch.zeros(1, 2, dtype=torch.bool), scope="mixed")
    with pytest.raises(ValueError):
        sgpo_rewards(torch.tensor([[0.5, 0.0]]), [[1, 1]], [[2, 2]])
    with pytest.raises(ValueError):
        sgpo_rewards(torch.zeros(1, 2, dtype=torch.bool), [[1]], [[2, 2]])
    with pytest.raises(ValueError):  # an out-of-range verdict of a judged completion is a bug upstream
        sgpo_rewards(torch.zeros(1, 2, dtype=torch.bool), [[1, 3]], [[2, 2]])


def test_integer_correctness_and_empty_batch():
    r = sgpo_rewards(torch.tensor([[1, 0], [0, 0]]), [[None, 1], [1, None]], [[3, 3], [2, 2]])
    assert r[0].tolist() == [1.0, 0.0]
    assert r[1, 0] < r[1, 1]
    assert sgpo_rewards(torch.zeros(0, 4, dtype=torch.bool), [], []).shape == (0, 4)


# ---------------------------------------------------------------- majority vote (docs/methods/sgpo.md §2.10, §11 item 15)

verdicts_for = st.integers(0, 8).flatmap(
    lambda k: st.tuples(
        st.just(k),
        st.lists(st.one_of(st.none(), st.just(NAN), st.integers(1, max(k, 1)) if k else st.none()), max_size=7),
    )
)


def brute_force_vote(votes, k):
    """Independent reading of the rule: enumerate candidate positions 1..K+1 in order, keep the first maximum."""
    positions = [k + 1 if v is None else v for v in votes if not (isinstance(v, float) and math.isnan(v))]
    if not positions:
        return NAN
    best, best_count = None, 0
    for pos in range(1, k + 2):
        if positions.count(pos) > best_count:
            best, best_count = pos, positions.count(pos)
    return None if best == k + 1 else best


def same_verdict(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return a == b


@settings(max_examples=150, deadline=None)
@given(verdicts_for, st.randoms(use_true_random=False))
def test_vote_matches_brute_force_and_ignores_order(case, rnd):
    k, votes = case
    result = vote_first_error(votes, k)
    assert same_verdict(result, brute_force_vote(votes, k))
    shuffled = list(votes)
    rnd.shuffle(shuffled)
    assert same_verdict(vote_first_error(shuffled, k), result)


@settings(max_examples=100, deadline=None)
@given(verdicts_for, st.integers(1, 5))
def test_failed_votes_never_count(case, extra_failures):
    k, votes = case
    valid = [v for v in votes if not (isinstance(v, float) and math.isnan(v))]
    with_failures = votes + [NAN] * extra_failures
    if valid:
        assert same_verdict(vote_first_error(with_failures, k), vote_first_error(valid, k))
    else:
        assert math.isnan(vote_first_error(with_failures, k))


@settings(max_examples=100, deadline=None)
@given(verdicts_for)
def test_none_wins_only_with_strict_plurality(case):
    k, votes = case
    counts = Counter(k + 1 if v is None else v for v in votes if not (isinstance(v, float) and math.isnan(v)))
    if vote_first_error(votes, k) is None:
        assert all(counts[k + 1] > c for pos, c in counts.items() if pos != k + 1)


def test_vote_ties_go_to_the_smallest_position():
    assert vote_first_error([None, 3], 5) == 3
    assert vote_first_error([5, 4, None], 5) == 4
    assert vote_first_error([None, None, 2], 5) is None
    assert math.isnan(vote_first_error([], 5))
    assert math.isnan(vote_first_error([NAN, NAN], 5))


# ---------------------------------------------------------------- properties of rewards (docs/methods/sgpo.md §11)


@st.composite
def batches(draw, max_prompts=4, max_g=6):
    num_prompts, g = draw(st.integers(1, max_prompts)), draw(st.integers(2, max_g))
    correct = [[draw(st.booleans()) if draw(st.booleans()) else False for _ in range(g)] for _ in range(num_prompts)]
    num_steps = [[draw(st.integers(0, 30)) for _ in range(g)] for _ in range(num_prompts)]
    first_error = [
        [draw(st.one_of(st.none(), st.just(NAN), st.integers(1, k))) if k else None for k in row] for row in num_steps
    ]
    return torch.tensor(correct, dtype=torch.bool), first_error, num_steps


params = st.fixed_dictionaries(
    {
        "beta": st.floats(0.01, 1000),
        "gamma": st.floats(-2, 12),
        "mode": st.sampled_from(["sigmoid", "linear"]),
        "scope": st.sampled_from(["all_negative", "all_incorrect"]),
    }
)


@settings(max_examples=150, deadline=None)
@given(batches(), params)
def test_rewards_follow_the_spec_elementwise(batch, kw):
    correct, first_error, num_steps = batch
    r = sgpo_rewards(correct, first_error, num_steps, **kw)
    judged = groups_to_judge(correct, scope=kw["scope"])
    for b, i in itertools.product(range(correct.shape[0]), range(correct.shape[1])):
        value = r[b, i].item()
        if correct[b, i]:
            assert value == 1.0
        elif not judged[b]:
            assert value == 0.0  # plain GRPO reward outside the scope
        else:
            k, v = num_steps[b][i], first_error[b][i]
            if k > 0 and isinstance(v, float):
                assert math.isnan(value)  # judge failure
                continue
            assert 0.0 <= value < 1.0  # strictly below a correct answer's reward, whatever beta, gamma, mode
            rts = trajectory_score(v, k)
            expected = stable_sigmoid(kw["beta"] * (rts - kw["gamma"])) if kw["mode"] == "sigmoid" else rts
            # The rewards are float32: rounding rts and gamma (relative 2^-24 each, a few operations) moves the
            # sigmoid's argument by up to ~beta * (|rts| + |gamma|) * 2^-22, at most beta * (1 + |gamma|) * 2^-22
            # as rts <= 1; the sigmoid's slope is at most 1/4 (beta 155 gave 1.0e-6 off, the old fixed tolerance).
            slack = 0.25 * kw["beta"] * (1.0 + abs(kw["gamma"])) * 2.0**-22 if kw["mode"] == "sigmoid" else 0.0
            # tol: 1e-6 for the float32 sigmoid's own rounding (~4 roundings of a value <= 1, <= 2.4e-7) plus the slack
            # derived above for the rounding of its argument, amplified by beta.
            assert value == pytest.approx(expected, abs=1e-6 + slack)


@settings(max_examples=100, deadline=None)
@given(batches())
def test_groups_with_a_correct_answer_are_exactly_grpo(batch):
    correct, first_error, num_steps = batch
    r = sgpo_rewards(correct, first_error, num_steps)
    has_correct = correct.any(dim=1)
    assert torch.equal(r[has_correct], correct[has_correct].float())
    assert torch.equal(groups_to_judge(correct), ~has_correct)
    assert torch.equal(groups_to_judge(correct, scope="all_incorrect"), ~correct.all(dim=1))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.data())
def test_later_first_error_scores_higher(k, data):
    i = data.draw(st.integers(1, k))
    j = data.draw(st.integers(i, k))
    mode = data.draw(st.sampled_from(["sigmoid", "linear"]))
    ordered = [i, j, None] if i < j else [i, None]
    rts = [trajectory_score(v, k) for v in ordered]
    r = sgpo_rewards(torch.zeros(1, len(ordered), dtype=torch.bool), [ordered], [[k] * len(ordered)], mode=mode)
    assert rts == sorted(rts) and len(set(rts)) == len(rts)
    assert torch.all(r[0, 1:] > r[0, :-1])  # strictly increasing in RTS (docs/methods/sgpo.md §11 items 5, 6)


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.floats(0.1, 20), st.floats(0, 1))
def test_partial_credit_is_strictly_increasing_and_inside_0_1(a, b, beta, gamma):
    lo, hi = sorted((a, b))
    x = torch.tensor([lo, hi], dtype=torch.float64)
    c = partial_credit(x, beta=beta, gamma=gamma)
    assert 0 < c[0] <= c[1] < 1
    if hi - lo > 1e-3:  # below that, float64 cannot resolve the sigmoid's saturated tail
        assert c[0] < c[1]


def test_default_credit_strictly_increasing_on_a_fine_grid():
    c = partial_credit(torch.linspace(0, 1, 100_001, dtype=torch.float64))
    assert torch.all(c[1:] > c[:-1])
    assert c[0] > 0 and c[-1] < 1


def test_default_credit_range_and_huge_beta_stays_below_one():
    c = partial_credit(torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert_close(c, [0.006693, 0.993307])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        top = partial_credit(torch.ones(1, dtype=dtype), beta=1000.0)
        assert top.item() < 1.0 and torch.isfinite(top).all()
    assert torch.isnan(partial_credit(torch.tensor([NAN]))).all()


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["all_negative", "all_incorrect"]))
def test_failures_are_nan_exactly_where_a_judged_verdict_failed(batch, scope):
    correct, first_error, num_steps = batch
    r = sgpo_rewards(correct, first_error, num_steps, scope=scope)
    judged = groups_to_judge(correct, scope=scope)
    expected = [
        [
            bool(judged[b]) and not correct[b, i] and num_steps[b][i] > 0 and isinstance(first_error[b][i], float)
            for i in range(correct.shape[1])
        ]
        for b in range(correct.shape[0])
    ]
    assert torch.isnan(r).tolist() == expected


def test_two_distinct_rts_give_nonzero_advantages():
    r = sgpo_rewards(torch.zeros(1, 4, dtype=torch.bool), [[1, 1, 1, 2]], [[4, 4, 4, 4]])
    adv = reference_advantages(r.tolist())[0]
    assert sum(a != 0 for a in adv) >= 2
    same = sgpo_rewards(torch.zeros(1, 3, dtype=torch.bool), [[2, 3, None]], [[4, 8, 0]])
    assert same[0, 0] == same[0, 1]  # equal RTS (1/4 and 2/8) -> equal rewards; K = 0 is RTS 0, not 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rewards_on_gpu_follow_the_input_device():
    correct = torch.zeros(1, 8, dtype=torch.bool, device="cuda")
    r = sgpo_rewards(correct, [E2_K_ERR], [E2_K])
    assert r.device.type == "cuda"
    assert_close(r.cpu(), [E2_R])


def test_verdict_grid_places_each_verdict_at_its_global_index():
    from grpo_family.algorithms.sgpo import verdict_grid

    verdicts = {1: (2, 3, "", True), 4: (math.nan, 5, "timeout", False), 5: (None, 0, "", False)}
    first_error, num_steps, answered, scored = verdict_grid(verdicts, 2, 3)
    assert first_error[0] == [None, 2, None] and first_error[1][0] is None and math.isnan(first_error[1][1])
    assert first_error[1][2] is None
    assert num_steps == [[0, 3, 0], [0, 5, 0]] and answered == [[False, True, False], [False, False, False]]
    assert scored.tolist() == [[False, True, False], [False, True, True]]


def test_weighted_reward_sum_leaves_unscored_functions_out_and_nan_where_none_scored():
    from grpo_family.algorithms.grpo import weighted_reward_sum

    per_func = torch.tensor([[1.0, 0.5], [math.nan, 0.5], [math.nan, math.nan]])
    rewards = weighted_reward_sum(per_func, torch.tensor([2.0, 1.0]))
    assert rewards[:2].tolist() == [2.5, 0.5] and math.isnan(rewards[2])
