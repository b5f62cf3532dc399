"""The evaluation metrics (grpo_family.eval.metrics) against brute force and worked numbers."""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.eval.metrics import (
    BOOTSTRAP_RESAMPLES,
    avg_at_n,
    maj_at_k,
    majority_answer,
    paired_bootstrap,
    pass_at_k,
    problem_metrics,
)


def brute_force_pass_at_k(flags: list[bool], k: int) -> float:
    """The share of all size-k subsets of the samples that hold at least one correct sample."""
    subsets = list(itertools.combinations(flags, k))
    return sum(any(s) for s in subsets) / len(subsets)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 11).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_enumeration_of_every_subset(nck):
    n, c, k = nck
    flags = [True] * c + [False] * (n - c)
    # tol: a product of at most 11 float64 factors in (0, 1] against a share of subsets: 12 x 2^-52 < 1e-14.
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(flags, k), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_the_binomial_formula_and_is_monotone(nck):
    n, c, k = nck
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # exact integers, then one division
    # tol: a product of at most 400 float64 factors in (0, 1]: 400 x 2^-52 ~ 9e-14 relative; 1e-9 is far above.
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-9)
    assert 0.0 <= pass_at_k(n, c, k) <= 1.0
    if k < n:
        # tol: as above, two such products each within 400 x 2^-52 < 1e-13.
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the share of correct samples


def test_pass_at_k_worked_numbers_and_limits():
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)  # 1 - C(7,2)/C(10,2)
    assert pass_at_k(32, 0, 8) == 0.0
    assert pass_at_k(32, 25, 8) == 1.0  # n - c < k: every 8-subset holds a correct sample
    # Stable where the binomials are astronomically large (C(10000, 5000) has ~3000 digits).
    value = pass_at_k(10_000, 3, 5_000)
    # tol: 5000 float64 factors multiplied: 5000 x 2^-52 ~ 1.1e-12 relative to 1 - value ~ 0.125, i.e. ~1e-13 of it.
    assert value == pytest.approx(1 - (5000 * 4999 * 4998) / (10000 * 9999 * 9998), rel=1e-12)
    for bad in ((4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_avg_and_majority_with_documented_tie_break():
    assert avg_at_n([True, False, False, True]) == 0.5
    # 2-2 tie between "5" and "7": the answer seen first ("5", sample 0) wins; samples without an answer do not vote.
    assert majority_answer(["5", None, "7", "7", "5"]) == ("5", 0)
    assert majority_answer([None, "7", "5", "7"]) == ("7", 1)
    assert majority_answer([None, None]) == (None, -1)
    flags = [False, None, True, True, False]
    assert maj_at_k(["5", None, "7", "7", "5"], flags, 5) == 0.0  # "5" wins the tie and is wrong
    assert maj_at_k(["5", None, "7", "7", "5"], flags, 4) == 1.0  # first 4: "7" twice
    assert maj_at_k([None, None], [None, None], 2) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from("abc")), min_size=1, max_size=12))
def test_majority_answer_is_a_most_frequent_one_seen_first(answers):
    answer, index = majority_answer(answers)
    counts = {a: answers.count(a) for a in answers if a is not None}
    if not counts:
        assert (answer, index) == (None, -1)
        return
    assert counts[answer] == max(counts.values()) and answers[index] == answer
    assert all(counts[a] < counts[answer] for a in answers[:index] if a is not None)


def test_problem_metrics_leave_unscored_samples_out():
    scores = [1.0, None, 0.0, 1.0]
    answers = ["4", None, "5", "4"]
    out = problem_metrics(scores, answers, ks=[1, 2, 3, 4], maj_ks=[4])
    assert out["pass@1"] == pytest.approx(2 / 3)  # 3 scored samples, 2 correct
    assert out["pass@3"] == 1.0 and "pass@4" not in out  # only 3 scored samples
    assert out["avg@4"] == pytest.approx(2 / 3) and out["maj@4"] == 1.0
    assert problem_metrics([None, None], [None, None], ks=[1]) == {}
    assert problem_metrics([0.9, 0.5], ["x", "y"], ks=[1], threshold=0.8)["pass@1"] == 0.5  # threshold


def test_paired_bootstrap_is_exact_on_degenerate_cases_and_reproducible():
    a = [random.Random(1).random() for _ in range(50)]
    same = paired_bootstrap(a, a)
    assert (same["diff"], same["low"], same["high"]) == (0.0, 0.0, 0.0) and same["resamples"] == BOOTSTRAP_RESAMPLES
    shifted = paired_bootstrap(a, [x + 0.25 for x in a])
    assert shifted["diff"] == pytest.approx(0.25) and shifted["low"] == pytest.approx(0.25)
    assert shifted["high"] == pytest.approx(0.25)
    assert paired_bootstrap(a, a[::-1]) == paired_bootstrap(a, a[::-1])  # fixed seed
    with pytest.raises(ValueError):
        paired_bootstrap(a, a[:-1])


def test_paired_bootstrap_interval_matches_the_normal_approximation():
    """B beats A on 50 of 100 problems by 1, ties elsewhere: the mean difference 0.5 has standard error
    sqrt(0.25 / 100) = 0.05, so the 95 % interval is about 0.5 +- 0.098."""
    a, b = [0.0] * 100, [1.0] * 50 + [0.0] * 50
    out = paired_bootstrap(a, b)
    assert out["diff"] == 0.5
    # tol: resampling, not rounding: the bootstrap's interval ends scatter ~0.005 around the normal
    # approximation's at its fixed seed and 1000 resamples; 0.02 is 4 times that and fails a width off by 20%.
    assert out["low"] == pytest.approx(0.5 - 1.96 * 0.05, abs=0.02)
    assert out["high"] == pytest.approx(0.5 + 1.96 * 0.05, abs=0.02)  # tol: as above


def test_standard_error_over_problems_worked_and_against_statistics():
    """Worked: greedy 0/1 values with p = 1/2 over 4 problems: sqrt(p (1 - p) / (P - 1)) = sqrt(1/12). pass@k values:
    the statistics module's sample standard deviation over sqrt(P). Fewer than 2 problems: no standard error."""
    import statistics

    from grpo_family.eval.metrics import pass_at_k, standard_error

    assert math.isclose(
        standard_error([1.0, 0.0, 1.0, 0.0]), math.sqrt(1 / 12), rel_tol=4 * 2**-52
    )  # tol: a few float64 roundings (sqrt, division)
    p, count = 0.3, 10
    flags = [1.0] * 3 + [0.0] * 7
    assert math.isclose(
        standard_error(flags), math.sqrt(p * (1 - p) / (count - 1)), rel_tol=8 * 2**-52
    )  # tol: float64 sums of 10 terms, then sqrt
    values = [pass_at_k(8, c, 4) for c in (0, 1, 2, 5, 8)]
    expected = statistics.stdev(values) / math.sqrt(len(values))
    assert math.isclose(
        standard_error(values), expected, rel_tol=16 * 2**-52
    )  # tol: two summation orders of 5 float64 terms, sqrt, division
    assert standard_error([0.5]) is None and standard_error([]) is None
    assert standard_error([1.0, 1.0, 1.0]) == 0.0
