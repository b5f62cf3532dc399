"""The hand-graded cases through our rewards; parser bombs; golds that cannot be lost.

``tests/reward_cases.py`` (issue 21) and ``tests/reward_cases_contract.py`` (issue 29, graded and committed before
the answer contract's code ran on them): in training mode every case scores ``Case.expected`` (0 where the case
breaks the answer contract, else its hand grade), so there is no false positive and a false negative only where the
case breaks the documented contract; the ``<reward>/contract_violations`` metric counts exactly the cases annotated
as breaking it. Issue 21: a policy must not escape negative reward with a parser bomb, and no gold may drop out of
training without a word.
"""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
from __future__ import annotations

import logging
import math
import subprocess
import sys

import pytest

from grpo_family.collator import prepare_dataset
from grpo_family.rewards import (
    MathAccuracyReward,
    check_golds,
    choice_accuracy_reward,
    completion_text,
    extract_qa_answer,
    qa_exact_match_reward,
    qa_f1_reward,
    read_answer,
    solution_gold,
)
from grpo_family.rewards.contract import ANSWER_SLOTS, CHOICE_SLOTS, MATH_SLOTS, VALUE_SLOTS
from grpo_family.rewards.timeout import get_runner
from grpo_family.tasks.arithmetic import arithmetic_reward, extract_answer
from tests.reward_cases import ALL_CASES, Case
from tests.reward_cases_contract import ALL_CONTRACT_CASES

# Every class of input issue 21 lists, and every mechanism issue 29 lists, must be among the cases.
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
REQUIRED_MECHANISMS = {
    "math_accuracy": {
        "retraction",
        "two_slots",
        "hedge",
        "hidden",
        "negated_anchor",
        "mv_scale",
        "mv_tolerance",
        "mv_relation",
        "number_words",
        "relation",
        "inequality",
        "text_macro",
        "ordinary_words",
        "think",
        "tag",
        "multi_turn",
        "parts",
        "format",
    },
    "choice_accuracy": {"letter_trap", "negated_anchor", "retraction", "two_slots", "hidden", "multi_turn", "format"},
    "qa_exact_match": {"retraction", "tag", "hidden", "hedge", "negated_anchor", "multi_turn", "parts", "format"},
    "arithmetic": {"retraction", "two_slots", "hidden", "multi_turn", "parts", "think", "value", "format"},
}

_MATH = MathAccuracyReward(backend="none")  # inline: the cases are small; the deadline has tests of its own
_FUNCS = {
    "math_accuracy": _MATH,
    "choice_accuracy": choice_accuracy_reward,
    "qa_exact_match": qa_exact_match_reward,
    "arithmetic": arithmetic_reward,
}


def _score(case: Case, **kwargs) -> tuple[float | None, dict[str, float]]:
    metrics: dict[str, float] = {}
    score = _FUNCS[case.reward]([case.completion], answer=[case.gold], log_metric=metrics.__setitem__, **kwargs)[0]
    return score, metrics


def test_the_suites_are_large_and_cover_every_class():
    assert len(ALL_CASES) >= 150 and len(ALL_CONTRACT_CASES) >= 200
    ids = [c.id for c in ALL_CASES + ALL_CONTRACT_CASES]
    assert len(set(ids)) == len(ids)
    for cases, required in ((ALL_CASES, REQUIRED_CLASSES), (ALL_CONTRACT_CASES, REQUIRED_MECHANISMS)):
        for reward, classes in required.items():
            present = {c.cls for c in cases if c.reward == reward}
            assert classes <= present, f"{reward} lacks {classes - present}"
    breaks = {c.breaks for c in ALL_CASES + ALL_CONTRACT_CASES}
    assert breaks == {"", "think", "hiding", "slots", "tag", "box", "after", "value"}
    # Contract-abiding correct answers in many formats, and correct answers that break the contract, are both here.
    assert sum(c.grade == 1 and not c.breaks for c in ALL_CONTRACT_CASES) >= 100
    assert sum(c.grade == 1 and bool(c.breaks) for c in ALL_CONTRACT_CASES) >= 30


# The value reading changed for every mode in issue 40 (item 4): a noun after a number is the noun it counts, so
# these graded-1 cases that the old contract refused ("value") now score their grade in strict mode too.
STRICT_VALUE_RULE_CHANGES = {"cmath-122", "carith-030", "math-028", "arith-014"}
# (math-028 and arith-014, "18 + 1 = 19" for the gold 18: a true computation states its result, 19, so they now
# keep the contract and score their grade, 0, as a wrong value.)


@pytest.mark.parametrize("case", ALL_CASES + ALL_CONTRACT_CASES, ids=lambda c: c.id)
def test_hand_graded_case_in_strict_mode(case):
    """The strict contract (exactly one slot, nothing after it: the training mode of issue 29) is kept, opt-in, as
    ``mode="strict"``: every case scores ``Case.expected`` as it did."""
    got, metrics = _score(case, mode="strict")
    if case.grade != 1:
        assert got != 1.0, f"false positive: {case}"
    expected = float(case.grade) if case.id in STRICT_VALUE_RULE_CHANGES else case.expected
    assert got == expected, f"{case.id}: got {got}, expected {expected} (breaks {case.breaks!r})"
    violation = metrics[f"{_FUNCS[case.reward].__name__}/contract_violations"]
    if case.grade is None:
        assert violation == 0.0  # an unreadable gold is not scored, so no contract is read
    elif case.id in STRICT_VALUE_RULE_CHANGES:
        assert violation == 0.0
    elif case.reward == "qa_exact_match" and _qa_list(case):
        assert got == 0.0 and violation == 1.0  # a list of answers in the slot (issue 40): now counted
    elif (
        case.reward == "qa_exact_match"
        and case.breaks == "value"
        and extract_qa_answer(completion_text(case.completion), mode="strict")
    ):
        assert violation == 0.0  # QA cannot tell a slot holding more than the answer from a wrong answer
    else:
        assert violation == float(bool(case.breaks)), f"{case.id}: violation metric {violation}"


def _qa_list(case) -> bool:
    from grpo_family.rewards.qa import gold_aliases
    from grpo_family.rewards.values import list_separators

    pred = extract_qa_answer(completion_text(case.completion), mode="strict")
    aliases = gold_aliases(case.gold)
    return bool(pred) and bool(aliases) and list_separators(pred) > max(map(list_separators, aliases))


# Training mode reads the committed answer: the last slot of the final region, text after it unread
# (docs/answer_extraction.md §4-5). Cases graded before that rule whose training-mode score differs from their
# grade, each with the reason. Grades are unchanged; every one of them compares exactly one value (the invariant
# test below), so none is a value a policy could gain from by writing several.
READ_PAST_THE_GRADE = {
    # graded 0 (withdrawn or hedged in words after the answer), scored by the answer they commit to: no list of
    # retraction words decides a score, and the text-after rule cost recall on "I hope it is correct."
    **dict.fromkeys(
        "math-003 math-008 math-009 choice-008 qa-013 qa-014 arith-021 cmath-001 cmath-002 cmath-003 cmath-004 "
        "cmath-005 cmath-006 cmath-010 cmath-011 cmath-012 cmath-025 cchoice-027 cchoice-028 cqa-001 cqa-002 "
        "cqa-003 carith-001 carith-002 carith-003 carith-005".split(),
        "text after the final slot is not read",
    ),
    # graded 0 (negated in words), scored by the one number of the committed sentence: its words are not read, as
    # those around one maths span or one box are not ("The answer is not $18$." and "The answer isn't
    # $\\boxed{18}$." scored 1 already), and the negation rule cost recall on real endings (issue 40)
    **dict.fromkeys(
        "cmath-062 cmath-063 cmath-064 cmath-065 cmath-066 carith-016".split(),
        "the words of a committed sentence are not read",
    ),
    # graded 0 (two answers), scored by the last one: a self-correction counts
    **dict.fromkeys("cmath-022 cmath-132 cqa-007 carith-007".split(), "the last slot is the committed answer"),
}
# Graded 1, scored 0 in training mode: the rule each breaks there.
BREAKS_IN_TRAINING_MODE = {
    **dict.fromkeys(
        "carith-014 carith-015 cchoice-036 cchoice-037 cmath-044 cmath-046 cmath-050 cmath-051 cmath-052 cmath-061 "
        "cqa-011 cqa-012 cqa-013".split(),
        "hiding markup",
    ),
    **dict.fromkeys(["cmath-126"], "a <think> in the final region"),
    **dict.fromkeys(["cmath-133"], "a stray </answer>"),
    **dict.fromkeys(
        "carith-004 carith-008 cmath-007 cmath-021 cqa-004".split(), "the last slot (or text after it) is not it"
    ),
    **dict.fromkeys(["cmath-020"], "two slots joined by a separator in one sentence"),
    **dict.fromkeys(
        "carith-028 cchoice-002 cchoice-008 cchoice-010 cchoice-012 cchoice-019 cchoice-021 cchoice-022 "
        "choice-016 cmath-039 cmath-123 cmath-185 cqa-037 cqa-038".split(),
        "the slot holds no one value of the reward's kind",
    ),
}


@pytest.mark.parametrize("case", ALL_CASES + ALL_CONTRACT_CASES, ids=lambda c: c.id)
def test_hand_graded_case_in_training_mode(case):
    got, _ = _score(case)
    if case.grade is None:
        assert got is None
    elif case.id in READ_PAST_THE_GRADE:
        assert case.grade != 1 and got == 1.0, case
    elif case.id in BREAKS_IN_TRAINING_MODE:
        assert case.grade == 1 and got == 0.0, case
    else:
        assert got == float(case.grade), f"{case.id}: got {got}, graded {case.grade}"


@pytest.mark.parametrize("case", ALL_CASES + ALL_CONTRACT_CASES, ids=lambda c: c.id)
def test_every_case_scores_what_its_one_committed_value_earns(case):
    """The invariant (docs/answer_extraction.md §0): a completion scores exactly what the one value the contract
    reads from it earns written alone; a completion with no committed value scores 0."""
    if case.grade is None:
        return
    got, _ = _score(case)
    text = completion_text(case.completion)
    spec = {"choice_accuracy": CHOICE_SLOTS, "math_accuracy": MATH_SLOTS, "arithmetic": VALUE_SLOTS}.get(
        case.reward, ANSWER_SLOTS
    )
    reading = read_answer(text, spec)
    if reading.value is None:
        assert got == 0.0
        return
    alone = _FUNCS[case.reward]([f"<answer>{reading.value}</answer>"], answer=[case.gold])[0]
    assert got == alone, (case.id, reading.value)


def test_qa_f1_gives_contract_breaks_nothing():
    completions = ["<answer>Paris</answer> or <answer>London</answer>", "Answer: Paris or London"]
    assert qa_f1_reward(completions, answer=["Paris", "Paris"]) == [0.0, 0.0]


def test_read_answer_in_brief():
    assert read_answer(r"<think><answer>18</answer></think>\boxed{21}").value == "21"
    assert read_answer("<think>unfinished \\boxed{3}").violation.startswith("reasoning left open")
    assert read_answer(r"\boxed{2} and \boxed{3}").violation.startswith("two answer slots joined by a separator")
    assert read_answer(r"\boxed{2} and \boxed{3}", mode="strict").violation == "2 answer slots (box, box)"
    assert read_answer("Answer: 2\nWait, let me reconsider. Answer: 3").value == "3"
    assert read_answer("<answer>Trick or Treat</answer>").value == "Trick or Treat"
    assert read_answer(r"\boxed{18}. I hope it helps.", mode="strict").violation.startswith(
        "text after the answer slot"
    )
    assert read_answer(r"\boxed{18}. I hope it helps.").value == "18"


# ------------------------------------------------------------------------------------------------ arithmetic


def test_arithmetic_refuses_a_length_mismatch_and_reads_only_integers():
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        arithmetic_reward(["Answer: 1", "Answer: 2"], answer=["1"])
    for text in ("Answer: 18.5", "Answer: 18/2", "Answer: 18e3", "Answer: 18 + 1 = 20", "Answer: 18 18"):
        assert extract_answer(text) is None, text
    assert extract_answer("Answer: 18 + 1 = 19") == 19  # a true computation states its result
    assert extract_answer("2*9=18\nAnswer: 18") == 18
    # One number in the contract's sense: thousands separators, number words and scale words are read.
    assert [extract_answer(f"Answer: {n}") for n in ("18,000", "eighteen", "18 thousand", "18.")] == [
        18000,
        18,
        18000,
        18,
    ]


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


# ------------------------------------------------------------------------------ issue 40: fixed layouts and holes

# (reward, completion, gold): the closing layouts real models write, each scoring 1 in training mode.
LAYOUTS = [
    ("math_accuracy", "Reasoning.\n\n**Final Answer**\n\\[\n\\boxed{1250}\n\\]", "1250"),
    ("math_accuracy", "**Final Answer**\n$$\n\\boxed{1250}\n$$", "1250"),
    ("math_accuracy", "**Final Answer**\n\\begin{align*}\n\\boxed{1250}\n\\end{align*}", "1250"),
    ("math_accuracy", "Therefore, the final answer is: $\\boxed{\\frac{1}{2}}$. I hope it is correct.", "\\frac12"),
    ("math_accuracy", "Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}"),
    ("math_accuracy", "So, the total cost is **$42**.", "42"),
    ("math_accuracy", "The total is **42**.", "42"),
    ("math_accuracy", "In conclusion, the answer is 42.", "42"),
    ("math_accuracy", "The answer is 12.5 percent.", "12.5"),
    ("math_accuracy", "\\boxed{18 apples}", "18"),
    ("math_accuracy", "\\boxed{0.\\overline{3}}", "\\frac{1}{3}"),
    ("math_accuracy", "\\boxed{\\begin{bmatrix}1\\\\2\\end{bmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("math_accuracy", "\\boxed{10,\\!000}", "10000"),
    ("math_accuracy", "Answer: 21\nWait, let me reconsider. Answer: 18", "18"),
    ("choice_accuracy", "<answer>C. Pneumonia</answer>", "C"),
    ("choice_accuracy", "**C. Pneumonia**", "C"),
    ("choice_accuracy", "The answer is B) 42", "B"),
    ("choice_accuracy", "Answer: A\nHmm, the second symptom rules it out.\nWait, let me reconsider. Answer: C", "C"),
    ("arithmetic", "Answer: 18\nJust to be sure: 3 x 6 = 18. Answer: 18", "18"),
]
# (reward, completion, gold): correct endings the recall rules of issue 40 credit (docs/answer_extraction.md §4
# and §6), with the corpus record each comes from; every one compares one value (nearest shotguns: RECALL_HOLES).
RECALL_LAYOUTS = [
    # an anchor followed by a sentence of its own: its one number (spans in it only name something)
    ("math_accuracy", "Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "$120$"),  # mv-all-657
    ("math_accuracy", "Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "$3$"),  # 728
    ("math_accuracy", "Final Answer: The maximum number of points in the domain of $f(x)$ is 19.", "$19$"),  # 734
    ("math_accuracy", "Final Answer: The largest $n$ is 34.", "$34$"),  # mv-all-746
    ("math_accuracy", "**Final Answer**\nThe position error increases by 100%.", "$100%$"),
    ("arithmetic", "Final Answer: The product is 15.", "15"),
    # an anchor after a display block's close, in a paragraph written on one line
    (
        "math_accuracy",
        "So \\begin{align*} x &= 1. \\end{align*} Final Answer: The final answer is "
        "$\\frac{10\\sqrt{10.5}}{27}$. I hope it is correct.",
        "$\\frac{5\\sqrt{42}}{27}$",
    ),  # mv-all-689
    # a sentence of words around one true computation states its result
    ("arithmetic", "Here is the solution: 3 * 6 = 18", "18"),  # smollm2-s0-017
    ("math_accuracy", "Here is the solution: 3 * 6 = 18", "18"),
    # the last sentence that holds a value is a value reward's unmarked answer
    ("arithmetic", "To find 7 - 2, subtract 2 from 7. So, we simply count down. Therefore, 7 - 2 = 5.", "5"),  # s1-001
    (
        "arithmetic",
        "2 * 8 = 16\n\nWhen giving a final answer, include the entire input in the result.",
        "16",
    ),  # s0-015
    ("arithmetic", "10 - 6 = 4\n\nThis is a well-known operation. It is a simple example of subtracting.", "4"),
    # a later sentence that only restates a true computation (its operands, its result) holds no value of its own:
    # SmolLM2-135M-Instruct's own pass@8 samples of the real-model runs (outputs/realmodel-learn-*/eval-pass)
    ("arithmetic", "8 + 8 = 16. This is the result of 8 + 8, which is 16.", "16"),
    ("arithmetic", "7 + 1 = 8. This is the result of 7 + 1, which is an example of an algebraic operation.", "8"),
    ("arithmetic", "0 - 0 = 0. This is 0. You've found the additive identity.", "0"),
    ("arithmetic", "5 - 6 = -1. This is 5 - 6 being -1.", "-1"),
    ("math_accuracy", "8 + 10 = 18\n\nThe result of 8 + 10 is 18.", "18"),
    # ... and an anchor's value that only restates it commits to its result
    ("arithmetic", "7 * 2 = 14\n\nThe answer is exactly 14.", "14"),  # smollm2-s0-013 (reasoning_gym there)
    ("arithmetic", "2 + 9 = 11. The answer is 2 + 9.", "11"),
    # the computation's operands named in order beside its result restate it
    ("arithmetic", "2 + 9 = 11\n\nThe answer is indeed 11, which is the addition of 2 and 9.", "11"),  # smollm2-s1-063
    ("arithmetic", "5 - 6 = -1. The answer is -1, the difference of 5 and 6.", "-1"),
    ("math_accuracy", "18. I hope it is correct.", "18"),
    # a committed sentence of words states its one number (its words are not read, as around one span or box)
    ("math_accuracy", "Therefore, the probability that Alice wins the game is 2/3. <|im_start|>user", "$2/3$"),
    ("math_accuracy", "Therefore, the minimum error in the measurement of the position increases by 100%.", "$100%$"),
    ("arithmetic", "So, you are left with only 7 in your answer.", "7"),  # smollm2-s1-003 (reasoning_gym there)
    ("math_accuracy", "Soucis : 2,74 $ a..", "2.74"),  # mv-all-72: a decimal comma and a dollar sign after it
    ("math_accuracy", "The cost is 2,74 €.", "2.74"),
    ("math_accuracy", "I think it's 18.", "18"),  # hand-graded math-048
    ("arithmetic", "7 + 1 = 8. This is 9.", "9"),  # the later sentence is the committed answer
    # ... also after joined lines: a capitalised word after a number starts a sentence
    (
        "math_accuracy",
        "P(A) = (1/2) * (4/3) P(A) = 2/3 Therefore, the probability that Alice wins the game is 2/3.",
        "$2/3$",
    ),  # mv-all-621
    # boxes of a list for a gold of as many values, a label of words around the separator between them
    ("math_accuracy", "$$\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}$$", "$$(3, 3), (1, 1)$$"),
    ("math_accuracy", "(a) \\boxed{3}, (b) \\boxed{5}", "3, 5"),
    # maths spans that only name something are words beside the span that holds the value
    ("math_accuracy", "So, the ordered pair $(x, y)$ that solves the system is $(7, 6)$.", "$(7,6)$"),
    # a capitalised word after a maths span's close starts a sentence whose full stop was left out
    (
        "math_accuracy",
        "$y = 8.8 - 0.4(7)$ $y = 8.8 - 2.8 = 6$ So, the ordered pair $(x, y)$ that solves the system is $(7, 6)$.",
        "$(7,6)$",
    ),  # mv-all-633
    # words and a colon label the value after them
    (
        "math_accuracy",
        "Here is a zero matrix: $ \\begin{pmatrix}0 & 0 \\\\0 & 0\\end{pmatrix} $",
        "$\\begin{bmatrix}0 & 0 \\\\0 & 0\\end{bmatrix}$",
    ),  # mv-all-488
    (
        "math_accuracy",
        "Special matrix: $ \\left[\\begin{array}{cc}1 & 2 \\\\3 & 4\\end{array}\\right] $",
        "$\\begin{pmatrix}1 & 2 \\\\3 & 4\\end{pmatrix}$",
    ),  # mv-all-494 (and an array in brackets, below)
]
# (reward, completion, gold): the value equivalences of issue 40 (docs/answer_extraction.md §6), in every mode.
EQUIVALENT_VALUES = [
    # a currency sign after the number, or another currency's sign, is no second value
    ("math_accuracy", "Answer: 2,74 $", "2.74"),
    ("math_accuracy", "Answer: 2,74 €", "2.74"),
    ("math_accuracy", "The total is \\boxed{€1,000.99}.", "1000.99"),
    ("math_accuracy", "Answer: 1000,99 £", "1000.99"),
    # an array between stretched brackets is a matrix of that bracket style
    (
        "math_accuracy",
        "$\\left[\\begin{array}{cc}1 & 2 \\\\3 & 4\\end{array}\\right]$",
        "\\begin{pmatrix}1 & 2 \\\\3 & 4\\end{pmatrix}",
    ),
    (
        "math_accuracy",
        "$\\left(\\begin{array}{c}1 \\\\2\\end{array}\\right)$",
        "\\begin{bmatrix}1 \\\\2\\end{bmatrix}",
    ),
    # a tuple of names names the tuple; a repeated value is one value; spacing is no separator
    ("math_accuracy", "$$\\boxed{(x, y) = (5, 8) \\quad \\text{and} \\quad (8, 5)}$$", "$$(5, 8), (8, 5)$$"),  # ot-54
    ("math_accuracy", "$\\boxed{(3, 37, 3, 13), (3, 17, 3, 7), (3,17,3,7)}$", "$(3,17,3,7),(3,37,3,13)$"),  # numina-9
    ("math_accuracy", "$\\boxed{-10,-8,4}$", "\\boxed{a=4,\\,-8,\\,-10}"),  # mv-numina_cases-116
    # solutions as groups of named values are tuples, in golds and answers
    ("math_accuracy", "$(5,2),(7,2)$", "$p=5,q=2;p=7,q=2$"),  # mv-numina_cases-54
    ("math_accuracy", "p=7, q=2; p=5, q=2", "$p=5,q=2;p=7,q=2$"),
    (
        "math_accuracy",
        "$p=5,q=2;p=7,q=2$",
        "\\boxed{ p = 5, q = 2 \\quad \\text{and} \\quad p = 7, q = 2}",
    ),  # le-math-1105
    # a decimal printed to machine precision (15 significant digits or more) is the value it prints
    ("math_accuracy", "$0.0833333333333333$", "$\\frac{1}{12}$"),  # le-math-692
    ("math_accuracy", "\\boxed{0.6666666666666666}", "\\frac{2}{3}"),
]
# (reward, completion, gold): the nearest shotgun or near miss of each recall rule, scoring 0 in training mode.
RECALL_HOLES = [
    *[("math_accuracy", "Final Answer: The volume of $ABCDEFGH$ is 120 or 121.", g) for g in ("120", "121")],
    *[("math_accuracy", "Final Answer: The largest $n$ is 34, not 35.", g) for g in ("34", "35")],
    *[("arithmetic", "Final Answer: It is not 18, it is 21.", g) for g in ("18", "21")],
    ("math_accuracy", "Final Answer: The volume of $5 \\times 24$ is 120.", "120"),  # a span with a value: two values
    ("math_accuracy", "Final Answer: The largest one is 34.", "34"),  # a number word: two values
    *[("math_accuracy", "Therefore, the probability is 2/3, not 1/3.", g) for g in ("2/3", "1/3")],
    *[("math_accuracy", "So, you are left with 7 apples and 2 pears.", g) for g in ("7", "2")],
    ("math_accuracy", "So, you are left with 7 apples, or seven.", "7"),  # a number word is a second value
    ("math_accuracy", "The volume of $5 \\times 24$ is 120.", "120"),  # a span with a value: two values
    ("math_accuracy", "P(A) = 2/3 Therefore it is 1/3 Then", "2/3"),  # the last sentence states 1/3
    *[("math_accuracy", "\\boxed{3} \\text{ for (a) or } \\boxed{5}", g) for g in ("3, 5", "3")],  # 5: the last
    ("math_accuracy", "\\boxed{3} \\text{ for part 1 and } \\boxed{5}", "3, 5"),  # a digit in the label: a value
    *[("arithmetic", "Here is the solution: 3 * 6 = 18 or 19", g) for g in ("18", "19")],
    *[("arithmetic", "Therefore, 3 * 6 = 18, not 20.", g) for g in ("18", "20")],
    *[("arithmetic", "Therefore, 3 * 6 = 19.", g) for g in ("18", "19")],  # a false computation states nothing
    ("arithmetic", "Therefore, 3 * 6 = 18.", "6"),  # an operand is no candidate
    ("arithmetic", "18.\n21.", "18"),  # the last sentence that holds a value: 21
    # a sentence after a computation that holds another number is the later answer, whatever the gold
    *[("arithmetic", "5 - 6 = -1. This is 1 less than -2.", g) for g in ("-1", "1", "-2")],  # smollm2 sample
    *[("arithmetic", "1 + 9 = 10. So, 1 + 10 equals 11, which is wrong.", g) for g in ("10", "11")],  # smollm2
    ("arithmetic", "7 + 1 = 8. This is 9.", "8"),
    ("arithmetic", "7 + 1 = 8. This is -8.", "8"),  # a signed operand or result is another value
    *[("arithmetic", "7 + 1 = 8. This is 8, or nine.", g) for g in ("8", "9")],  # a number word is a value
    ("arithmetic", "7 + 1 = 9. This is 7 + 1.", "8"),  # a false computation is nothing to restate
    # operands beside the result restate only in their order, and only beside the result
    *[("arithmetic", "2 + 9 = 11\n\nThe answer is 11, the addition of 9 and 2.", g) for g in ("11", "9")],
    *[("arithmetic", "2 + 9 = 11\n\nThe answer is 2 and 9.", g) for g in ("11", "9")],
    *[("arithmetic", "2 + 9 = 11\n\nThe answer is 12, the addition of 2 and 9.", g) for g in ("11", "12")],
    *[("arithmetic", "2 + 9 = 11\n\nThe answer is 11, the addition of 2 and 9 and 9.", g) for g in ("11", "9")],
    *[("math_accuracy", "Answer: 2,74 $ or 3 €", g) for g in ("2.74", "3")],
    # an operand alone is another value, not a restatement of the expression
    *[("arithmetic", "3 + 5 = 8.\n\n3 is the answer to the question of 3 + 3.", g) for g in ("8", "3")],  # smollm2
    *[("arithmetic", "2 + 9 = 11\n\nThe answer is 2.", g) for g in ("11", "9")],
    # an anchor cut off before its value restates nothing: the anchor before it is not skipped over
    ("arithmetic", "7 + 1 = 8.\nThe answer is 9.\n\nWhat do I add to 7 to get 8? The answer is", "8"),
    *[("math_accuracy", "So the pair $(x, y)$ is $(7, 6)$ or $(6, 7)$.", g) for g in ("(7,6)", "(6,7)")],
    *[("math_accuracy", "$y = 6$ So the pair $(x, y)$ is $(7, 6)$ or $(6, 7)$.", g) for g in ("(7,6)", "(6,7)")],
    *[("math_accuracy", "So $x = 7$ So it is $7$ $8$", g) for g in ("7", "8")],
    ("math_accuracy", "\\boxed{(x, y) = (5, 8) \\text{ or } (8, 5)}", "(5, 8)"),
    ("math_accuracy", "\\boxed{(1, 2), (3, 4), (5, 6)}", "(1, 2), (3, 4)"),  # three distinct values for two
    ("math_accuracy", "$(5,2),(7,2),(3,2)$", "$p=5,q=2;p=7,q=2$"),
    ("math_accuracy", "Here is a zero matrix: $0$ or $1$", "0"),
    ("math_accuracy", "$0.083333333333333$", "\\frac{1}{12}"),  # 14 significant digits: a rounding
    ("math_accuracy", "$0.0833333333333343$", "\\frac{1}{12}"),  # 15 digits, off by more than the last one
    ("math_accuracy", "\\boxed{3.14159265358979}", "\\frac{22}{7}"),
    # an array whose brackets do not pair is no matrix of one style
    (
        "math_accuracy",
        "$\\left(\\begin{array}{c}1 \\\\2\\end{array}\\right]$",
        "\\begin{bmatrix}1 \\\\2\\end{bmatrix}",
    ),
]
# (reward, completion, gold): each false-positive class of issue 40, scoring 0 in training mode.
HOLES = [
    ("math_accuracy", "Answer: 40 or \\boxed{42}", "42"),
    ("math_accuracy", "<answer>40 or \\boxed{42}</answer>", "42"),
    ("math_accuracy", "\\boxed{40} or \\boxed{42}", "42"),
    ("math_accuracy", "\\boxed{y = 3x + 1 = 2x + 3}", "y = 3x + 1"),
    ("math_accuracy", "\\boxed{x \\approx 5}", "x = 5"),
    *[("math_accuracy", f"\\boxed{{x {r} 5}}", "5") for r in "≅≃≒≡"],
    ("math_accuracy", "\\boxed{40}\n<dialog>\\boxed{42}</dialog>", "42"),
    ("math_accuracy", "\\boxed{40}\n<noembed>\\boxed{42}</noembed>", "42"),
    ("math_accuracy", "\\boxed{40}\n<datalist>\\boxed{42}</datalist>", "42"),
    ("math_accuracy", '[\\boxed{40}](https://example.org "\\boxed{42}")', "42"),
    ("qa_exact_match", "Answer: Paris or London", "Paris"),
]


@pytest.mark.parametrize(("reward", "text", "gold"), LAYOUTS, ids=[f"layout-{i}" for i in range(len(LAYOUTS))])
def test_closing_layouts_real_models_write_score_one(reward, text, gold):
    assert _FUNCS[reward]([text], answer=[gold]) == [1.0], text


@pytest.mark.parametrize(("reward", "text", "gold"), HOLES, ids=[f"hole-{i}" for i in range(len(HOLES))])
def test_false_positive_classes_score_zero(reward, text, gold):
    assert _FUNCS[reward]([text], answer=[gold]) == [0.0], text


@pytest.mark.parametrize(
    ("reward", "text", "gold"), RECALL_LAYOUTS, ids=[f"recall-{i}" for i in range(len(RECALL_LAYOUTS))]
)
def test_recall_rules_credit_the_one_value_real_endings_commit_to(reward, text, gold):
    assert _FUNCS[reward]([text], answer=[gold]) == [1.0], text
    assert _FUNCS[reward]([text], answer=[gold], mode="strict") == [0.0], text  # strict mode: none of these rules


def test_a_hostile_label_between_two_boxes_is_read_in_linear_time():
    """The label of words a list of boxes may hold between them (``for part (a) and``) is matched without
    backtracking: a first version split a run of letters into words every way, 2^n tries for n letters (0.7 s at 22
    letters, so years at 60). Each hostile gap below holds 3,000 letters; the reading must finish at all, in a child
    process given a minute (it takes milliseconds)."""
    code = (
        "from grpo_family.rewards.contract import read_box_list, MATH_SLOTS\n"
        "for gap in ('a' * 3000 + '!', 'ab ' * 1000 + '1', '(a) ' * 750 + 'or'):\n"
        "    assert read_box_list('\\\\boxed{1} ' + gap + ' \\\\boxed{2}', MATH_SLOTS) is None, gap[-5:]\n"
        "assert read_box_list('\\\\boxed{1} ' + 'ab ' * 1000 + 'and \\\\boxed{2}', MATH_SLOTS) == ['1', '2']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("reward", "text", "gold"), EQUIVALENT_VALUES, ids=[f"equivalent-{i}" for i in range(len(EQUIVALENT_VALUES))]
)
def test_equivalent_values_score_one_in_every_mode(reward, text, gold):
    for mode in ("train", "eval", "strict"):
        assert _FUNCS[reward]([text], answer=[gold], mode=mode) == [1.0], (text, mode)


@pytest.mark.parametrize(
    ("reward", "text", "gold"), RECALL_HOLES, ids=[f"recall-hole-{i}" for i in range(len(RECALL_HOLES))]
)
def test_recall_rules_pay_no_shotgun(reward, text, gold):
    assert _FUNCS[reward]([text], answer=[gold]) == [0.0], (text, gold)


def test_format_rewards_count_invisible_and_phantom_blocks_as_empty():
    from grpo_family.rewards import boxed_format_reward, think_answer_format_reward

    assert think_answer_format_reward(
        ["<think>a</think><answer>\u200b</answer>", "<think>a</think><answer>4</answer>"]
    ) == [0.0, 1.0]
    assert boxed_format_reward(["<think>a</think>\\boxed{\\phantom{42}}", "<think>a</think>\\boxed{42}"]) == [0.0, 1.0]


def test_golds_that_state_a_value_in_words_units_or_groups_are_read_as_that_value():
    """Issue 44 item 5: the gold is read by the reader the answers are read by."""
    golds = ["48 apples", "12 students", "twelve", "1 234", "12.5%"]
    assert check_golds(golds, [_MATH])["math_accuracy"][0] == 0
    assert (
        _MATH([r"\boxed{48}", "Answer: 12", r"\boxed{12}", r"\boxed{1234}", r"\boxed{12.5}"], answer=golds)
        == [1.0] * 5
    )
    assert _MATH([r"\boxed{47}"], answer=["48 apples"]) == [0.0]
