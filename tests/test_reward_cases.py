"""The hand-graded cases (tests/reward_cases.py) through our rewards; parser bombs; golds that cannot be lost.

Issue 21: a policy must not find a false positive in the answer rewards, nor escape negative reward with a parser
bomb, and no gold may drop out of training without a word.
"""

from __future__ import annotations

import logging
import math

import pytest

from grpo_family.collator import prepare_dataset
from grpo_family.rewards import (
    MathAccuracyReward,
    check_golds,
    choice_accuracy_reward,
    final_answer,
    qa_exact_match_reward,
    qa_f1_reward,
    solution_gold,
)
from grpo_family.rewards.timeout import get_runner
from grpo_family.tasks.arithmetic import arithmetic_reward, extract_answer
from tests.reward_cases import ALL_CASES, Case

# Cases where the policy is stricter than a human grader; never a false positive. Each says why.
KNOWN_MISSES = {
    # A plain-text answer with no anchor ("the answer is") and more than the expression: the policy does not guess
    # which number in free text is the answer, since a policy could then be rewarded for listing numbers.
    "math-048": "no anchor in free text",
}

# Every class of input issue 21 lists must be among the cases.
REQUIRED_CLASSES = {
    "math_accuracy": {
        "hedge",
        "retraction",
        "think_draft",
        "mv_hedge",
        "dollar",
        "plain",
        "answer_tag",
        "fbox",
        "self_correction",
        "truncated",
        "multi_box_gold",
        "bad_gold",
    },
    "choice_accuracy": {"hedge", "retraction", "lowercase", "in_sentence", "think_draft"},
    "qa_exact_match": {"anchor_in_tag", "numeric_gold", "bad_gold", "hedge", "retraction", "think_draft"},
    "arithmetic": {"not_integer", "empty", "self_correction", "think_draft", "hedge", "retraction"},
}

_MATH = MathAccuracyReward(backend="none")  # inline: the cases are small; the deadline has tests of its own
_FUNCS = {
    "math_accuracy": _MATH,
    "choice_accuracy": choice_accuracy_reward,
    "qa_exact_match": qa_exact_match_reward,
    "arithmetic": arithmetic_reward,
}


def _score(case: Case) -> float | None:
    return _FUNCS[case.reward]([case.completion], answer=[case.gold])[0]


def test_the_suite_is_large_and_covers_every_class():
    assert len(ALL_CASES) >= 150
    assert len({c.id for c in ALL_CASES}) == len(ALL_CASES)
    for reward, classes in REQUIRED_CLASSES.items():
        present = {c.cls for c in ALL_CASES if c.reward == reward}
        assert classes <= present, f"{reward} lacks {classes - present}"


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_hand_graded_case(case):
    got = _score(case)
    if case.grade != 1:
        assert got != 1.0, f"false positive: {case}"
    if case.id in KNOWN_MISSES:
        assert got != case.grade, f"{case.id} now agrees: remove it from KNOWN_MISSES"
        return
    assert got == case.grade


def test_qa_f1_gives_hedges_and_retractions_nothing():
    completions = ["<answer>Paris or London</answer>", "The answer is Paris. Just kidding, it is London."]
    assert qa_f1_reward(completions, answer=["Paris", "Paris"]) == [0.0, 0.0]


def test_final_answer_policy_in_brief():
    assert final_answer(r"<think><answer>18</answer></think>\boxed{21}").text == "21"
    assert final_answer("<think>unfinished \\boxed{3}").text is None
    assert final_answer(r"\boxed{2} and \boxed{3}").text == "2, 3"
    assert final_answer(r"\boxed{2} or \boxed{3}").is_hedged()
    assert final_answer("<answer>Trick or Treat</answer>").is_hedged()
    assert not final_answer("<answer>Trick or Treat</answer>").is_hedged({"trick", "or", "treat"})


# ------------------------------------------------------------------------------------------------ arithmetic


def test_arithmetic_refuses_a_length_mismatch_and_reads_only_integers():
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        arithmetic_reward(["Answer: 1", "Answer: 2"], answer=["1"])
    for text in ("Answer: 18.5", "Answer: 18,000", "Answer: 18/2", "Answer: 18e3", "Answer: 18 + 1 = 19"):
        assert extract_answer(text) is None, text
    assert extract_answer("2*9=18\nAnswer: 18") == 18


# ---------------------------------------------------------------------------------------------- parser bombs

BOMBS = [
    r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    r"The answer is \boxed{9^{9^{9^{9}}}}",
    "The final answer is 10^10^10^10",
    r"\boxed{100000000!}",
]


def test_sixteen_completions_with_four_parser_bombs_spend_no_deadline():
    """The pre-check refuses all four bombs before a worker sees them: no deadline is spent (no worker killed), so
    the call costs what the twelve ordinary answers cost, whatever the machine's speed."""
    timeout = 3.0
    reward = MathAccuracyReward(timeout=timeout)
    runner = get_runner("process", reward.num_workers, preload=("grpo_family.rewards.math",))
    runner.map(abs, [(1,)] * 4, 60)
    restarts = runner.restarts
    completions = [rf"\boxed{{{n}}}" for n in range(12)] + BOMBS
    golds = [str(n) for n in range(12)] + ["1"] * 4
    metrics: dict[str, float] = {}
    out = reward(completions, answer=golds, log_metric=metrics.__setitem__)
    assert runner.restarts == restarts  # no bomb reached a worker's deadline
    assert out[:12] == [1.0] * 12
    assert out[12:] == [0.0] * 4  # the documented timeout_reward: a bomb is a wrong answer
    assert metrics["math/timeouts"] == pytest.approx(4 / 16)
    assert reward.counts["timeouts"] == 4


def test_bombs_the_pre_check_misses_cannot_multiply_the_call_budget():
    """Answers that pass the pre-check but never finish (only the worker deadline stops them): four of them with
    one worker would take four deadlines plus restarts; the call budget (1.5 x timeout) ends the call instead. The
    bound is counted, not timed: at most ceil(budget / timeout) deadlines are spent (workers killed)."""
    timeout = 2.0
    reward = MathAccuracyReward(timeout=timeout, num_workers=1)
    runner = get_runner("process", 1, preload=("grpo_family.rewards.math",))
    runner.map(abs, [(1,)], 60)
    restarts = runner.restarts
    slow = r"\boxed{(9^{99999})^{99999}}"
    completions = [rf"\boxed{{{n}}}" for n in range(12)] + [slow] * 4
    out = reward(completions, answer=[str(n) for n in range(12)] + ["1"] * 4)
    assert 1 <= runner.restarts - restarts <= math.ceil(reward.call_budget / timeout)  # 2 of 4
    assert out[:12] == [1.0] * 12
    # Each bomb timed out (0.0) or was never started because the budget was spent (None); never 1.0.
    assert out[12] == 0.0 and set(out[13:]) <= {0.0, None} and None in out[13:]
    assert reward.counts["timeouts"] + reward.counts["over_budget"] == 4


# ------------------------------------------------------------------------------------------------------ golds


def test_solution_golds_keep_every_box_or_say_why_not():
    assert solution_gold(r"The roots are $\boxed{2}$ and $\boxed{3}$.") == ("2, 3", "")
    assert solution_gold(r"So $x = \boxed{2}, \boxed{3}$.") == ("2, 3", "")
    assert solution_gold(r"We get $\boxed{7}$.")[0] == "7"
    assert solution_gold(r"First $a=\boxed{4}$. Then, after more work, $b = \boxed{5}$.")[0] is None
    assert solution_gold(r"We find $\boxed{4}$ for the first part, so the answer is 9.")[0] is None
    assert solution_gold(r"Either $\boxed{2}$ or $\boxed{3}$.")[0] is None


def test_math_preset_keeps_multi_box_golds_and_reports_ambiguous_rows(caplog):
    from datasets import Dataset

    rows = Dataset.from_dict(
        {
            "problem": ["Solve x^2-5x+6=0.", "Find b.", "Cost?"],
            "solution": [
                r"The roots are $\boxed{2}$ and $\boxed{3}$.",
                r"We find $\boxed{4}$ for the first part, so the answer is 9.",
                r"It costs $\boxed{\$18.90}$.",
            ],
        }
    )
    with caplog.at_level(logging.WARNING):
        prepared = prepare_dataset(rows, preset="math")
    assert prepared["answer"] == ["2, 3", None, r"\$18.90"]
    assert "an unboxed final answer after the last box" in caplog.text
    scores = MathAccuracyReward(backend="none")(
        [r"\boxed{3, 2}", r"\boxed{9}", r"\boxed{18.90}"], answer=prepared["answer"]
    )
    assert scores == [1.0, None, 1.0]


def test_check_golds_reports_count_and_examples_and_fails_fast(caplog):
    golds = ["42", r"\$18.90", math.nan, "", "7"]
    with caplog.at_level(logging.WARNING):
        report = check_golds(golds, [MathAccuracyReward(backend="none"), qa_exact_match_reward])
    count, total, examples = report["math_accuracy"]
    assert (count, total) == (2, 5) and [i for i, _ in examples] == [2, 3]
    assert report["qa_exact_match"][0] == 2
    assert "math_accuracy cannot read 2 of 5 gold answers" in caplog.text
    with pytest.raises(ValueError, match="cannot read 3 of 3"):
        check_golds(["x", "y", "z"], [choice_accuracy_reward])
    assert check_golds(["1", "2"], [arithmetic_reward])["arithmetic"][0] == 0
