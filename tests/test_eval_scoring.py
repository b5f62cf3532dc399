"""Evaluation scoring: every reward call goes through the guard, so misbehaving rewards leave rows unscored (counted
and reported) instead of ending the evaluation; the mode argument; the per-problem records and metrics of
evaluate_data on fixed samples, worked by hand; math-verify's verdict beside ours."""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
from __future__ import annotations

import asyncio
import sys
import time

import numpy as np
import pytest

from grpo_family.eval.core import evaluate_data
from grpo_family.eval.data import load_eval_data
from grpo_family.eval.generation import Generation, Sample
from grpo_family.eval.presets import Decoding
from grpo_family.eval.scoring import extract_answer, score_samples
from grpo_family.rewards import with_timeout
from grpo_family.tasks import arithmetic_reward

PROMPTS = [[{"role": "user", "content": f"Compute {i}+{i}."}] for i in range(4)]
ROWS = {"prompt": PROMPTS, "answer": [str(2 * i) for i in range(4)]}
TEXTS = [[f"Answer: {2 * i}", "Answer: 99"] for i in range(4)]  # sample 0 right, sample 1 wrong, per problem


def right(completions, answer, **kwargs):
    return arithmetic_reward(completions, answer)


def raises_on_problem_2(completions, answer, **kwargs):
    if "4" in answer:
        raise RuntimeError("cannot read gold 4")
    return arithmetic_reward(completions, answer)


def strings_on_problem_1(completions, answer, **kwargs):
    return ["1.0" if a == "2" else r for a, r in zip(answer, arithmetic_reward(completions, answer))]


def numpy_values(completions, answer, **kwargs):
    return np.asarray(arithmetic_reward(completions, answer), dtype=np.float32)


def none_on_problem_3(completions, answer, **kwargs):
    return [None if a == "6" else r for a, r in zip(answer, arithmetic_reward(completions, answer))]


async def async_reward(completions, answer, **kwargs):
    await asyncio.sleep(0)
    return arithmetic_reward(completions, answer)


def exits(completions, answer, **kwargs):
    sys.exit(0)


def wrong_count(completions, answer, **kwargs):
    return [1.0] * (len(completions) + 1)


def sleeps(completions, answer, **kwargs):
    time.sleep(5)
    return [1.0] * len(completions)


def with_mode(completions, answer, mode="train", **kwargs):
    return [1.0 if mode == "eval" else 0.0] * len(completions)


EXPECTED = [1.0, 0.0] * 4


@pytest.mark.parametrize(
    "reward, expected, unscored",
    [
        (right, EXPECTED, 0),
        (raises_on_problem_2, [1.0, 0.0, 1.0, 0.0, None, None, 1.0, 0.0], 2),  # retried row by row
        (strings_on_problem_1, [1.0, 0.0, None, None, 1.0, 0.0, 1.0, 0.0], 2),
        (numpy_values, EXPECTED, 0),
        (none_on_problem_3, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, None, None], 2),
        (async_reward, EXPECTED, 0),
        (exits, [None] * 8, 8),
        (wrong_count, [None] * 8, 8),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_misbehaving_rewards_leave_rows_unscored_and_the_evaluation_goes_on(reward, expected, unscored):
    scores = score_samples(reward, ROWS, TEXTS)
    assert scores.values == expected and scores.unscored == unscored
    assert all(v is None or type(v) is float for v in scores.values)  # plain floats, numpy included
    assert bool(scores.errors) == (reward not in (right, numpy_values, none_on_problem_3, async_reward))
    if reward is exits:
        assert "sys.exit(0)" in scores.errors[0]["reason"]


def test_a_reward_past_its_deadline_is_unscored_not_waited_for():
    start = time.perf_counter()
    scores = score_samples(sleeps, ROWS, TEXTS, timeout=0.5)
    assert scores.values == [None] * 8 and "did not return within 0.5 s" in scores.errors[0]["reason"]
    assert time.perf_counter() - start < 4
    # A reward with its own deadline keeps it.
    assert score_samples(with_timeout(sleeps, 0.3), ROWS, TEXTS, timeout=None).unscored == 8


def test_keyboard_interrupt_still_stops_the_evaluation():
    def interrupted(completions, **kwargs):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score_samples(interrupted, ROWS, TEXTS, timeout=None)


def test_the_mode_reaches_a_reward_that_takes_it():
    scores = score_samples(with_mode, ROWS, TEXTS, mode="eval")
    assert scores.values == [1.0] * 8 and scores.mode_applied
    assert score_samples(with_mode, ROWS, TEXTS, mode="train").values == [0.0] * 8
    plain = score_samples(right, ROWS, TEXTS, mode="eval")
    assert plain.mode == "eval" and not plain.mode_applied
    with pytest.raises(ValueError, match="scoring mode"):
        score_samples(right, ROWS, TEXTS, mode="lenient")


def test_rewards_receive_completions_in_trls_format():
    seen = {}

    def spy(completions, prompts, answer, **kwargs):
        seen.update(completion=completions[0], prompt=prompts[0], n=len(completions), answers=answer)
        return [0.0] * len(completions)

    score_samples(spy, ROWS, TEXTS)
    assert seen["completion"] == [{"role": "assistant", "content": "Answer: 0"}]  # conversational prompt
    assert seen["prompt"] == PROMPTS[0] and seen["n"] == 8 and seen["answers"][:4] == ["0", "0", "2", "2"]


class FixedBackend:
    """Returns fixed samples, as a backend would: lets the metrics be worked out by hand."""

    name = "fixed"

    def __init__(self, texts):
        self.texts, self.calls = texts, []

    def generate(self, prompts, decoding, *, seed=0):
        self.calls.append((len(prompts), decoding, seed))
        samples = [[Sample(t, len(t), t.endswith("...")) for t in row] for row in self.texts]
        return Generation(samples, decoding.max_new_tokens, 0.5, self.name)


def test_evaluate_data_records_and_metrics_worked_by_hand():
    data = load_eval_data("arithmetic", limit=3)  # golds: see below
    golds = data.rows["answer"]
    texts = [
        [f"Answer: {golds[0]}", f"Answer: {golds[0]}", "Answer: 1", "Answer: 1"],  # 2 of 4; tie 2-2 -> gold first
        ["Answer: 1", "Answer: 1", f"Answer: {golds[1]}", "no answer..."],  # 1 of 4; majority "1" wrong
        ["no answer...", "no answer...", "no answer...", "no answer..."],  # 0 of 4, nothing to vote on
    ]
    decoding = Decoding(temperature=1.0, num_samples=4, max_new_tokens=40)
    backend = FixedBackend(texts)
    result = evaluate_data(backend, data, decoding, arithmetic_reward, headline=("pass@2",), seed=7, math_verify=True)
    assert backend.calls == [(3, decoding, 7)]
    first, second, third = result.problems
    assert first["metrics"] == pytest.approx(
        {"pass@1": 0.5, "pass@2": 5 / 6, "pass@4": 1.0, "avg@4": 0.5, "maj@4": 1.0}
    )
    assert second["metrics"]["pass@2"] == 0.5 and second["metrics"]["maj@4"] == 0.0
    assert third["metrics"]["pass@4"] == 0.0 and third["answers"] == [None] * 4
    summary = result.summary
    assert summary["pass@1"] == pytest.approx((0.5 + 0.25 + 0) / 3)
    assert summary["pass@2"] == pytest.approx((5 / 6 + 0.5 + 0) / 3)
    assert summary["maj@4"] == pytest.approx(1 / 3)
    assert summary["truncation_rate"] == pytest.approx(5 / 12) and summary["samples"] == 12
    assert first["answers"] == [golds[0], golds[0], "1", "1"] and first["correct"] == [True, True, False, False]
    assert first["math_verify"] == first["correct"]  # math-verify agrees on plain integers
    assert summary["math_verify_agreement"] == 1.0
    assert set(first) >= {"prompt", "gold", "samples", "answers", "scores", "correct", "num_tokens", "truncated"}


def test_answers_are_read_as_each_reward_reads_them():
    assert extract_answer("arithmetic_reward", "7*3=21\nAnswer: 21") == "21"
    assert extract_answer("math_accuracy", "so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert extract_answer("math_accuracy", "no answer here at all, sorry") is None
    assert extract_answer("choice_accuracy", "<answer>C</answer>") == "C"
    assert extract_answer("qa_exact_match", "Answer: The  Eiffel Tower") == "eiffel tower"


def test_the_answer_rewards_take_the_mode_and_maj_votes_on_the_same_reading():
    """The project's answer rewards receive score_samples' mode: eval forgives a self-correction (the last slot)
    and text after the slot, as training mode does; the opt-in strict mode scores both 0 (docs/answer_extraction.md §7); extract_answer reads in
    the same mode, so maj@k never votes for an answer the reward did not read."""
    from grpo_family.rewards import MathAccuracyReward, choice_accuracy_reward, qa_exact_match_reward

    math_reward = MathAccuracyReward(backend="none")
    cases = [  # (reward, name, gold, text whose right answer only eval mode reads)
        (arithmetic_reward, "arithmetic_reward", "4", "2+2=5\nAnswer: 5\nAnswer: 4"),
        (math_reward, "math_accuracy", "\\frac{1}{2}", "\\boxed{\\frac{1}{2}} I hope it is correct"),
        (choice_accuracy_reward, "choice_accuracy", "C", "Answer: B\nAnswer: C"),
        (qa_exact_match_reward, "qa_exact_match", "Paris", "Answer: Paris\nI hope it is correct."),
    ]
    for reward, name, gold, text in cases:
        rows = {"prompt": [PROMPTS[0]], "answer": [gold]}
        lenient = score_samples(reward, rows, [[text]], mode="eval")
        strict = score_samples(reward, rows, [[text]], mode="strict")
        assert score_samples(reward, rows, [[text]], mode="train").values == [1.0], name  # the committed answer
        assert lenient.mode_applied and strict.mode_applied, name
        assert (lenient.values, strict.values) == ([1.0], [0.0]), name
        assert extract_answer(name, text, "eval", gold) is not None, name
        assert extract_answer(name, text, "strict", gold) is None, name
