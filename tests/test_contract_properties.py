"""The answer contract holds by construction (issues 29 and 40): hypothesis builds completions, and the verdict
follows.

* The invariant (docs/answer_extraction.md §0, issue 40): a completion built from any set of candidate values, in
  every slot kind, joined by any text, some hidden, repeated or cut off, scores exactly what its one committed value
  earns written alone, and never full marks for two different golds. ``CONTRACT_MAX_EXAMPLES`` sets these two tests'
  example count (default 150; issue 40's acceptance ran them at 10,000).

* Contract-abiding completions in varied formatting (think block or not, reasoning before the slot, every slot
  form, closing punctuation and end-of-turn markup after it) score 1 with the right gold, under every answer reward.
* Adversarial completions score 0 in the strict mode (``mode="strict"``, issue 29's contract) whatever their words: a correct slot followed by any text holding another
  candidate; a second slot (of any form, with the same or another value); the slot wrapped in hiding markup; the
  right value hidden and a wrong one visible; the slot inside reasoning left open. Each also counts as a contract
  violation in the reward's metric.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grpo_family.rewards import MathAccuracyReward, choice_accuracy_reward, qa_exact_match_reward, read_answer
from grpo_family.rewards.contract import ANSWER_SLOTS, CHOICE_SLOTS, MATH_SLOTS, VALUE_SLOTS
from grpo_family.rewards.reasoning_gym import ReasoningGymReward, reasoning_gym_reward
from grpo_family.tasks.arithmetic import arithmetic_reward

MATH = MathAccuracyReward(backend="none")
SETTINGS = settings(max_examples=150, deadline=None)
INVARIANT = settings(max_examples=int(os.environ.get("CONTRACT_MAX_EXAMPLES", "150")), deadline=None)
# The reasoning_gym reward (its verifier is the [realmodel] extra's) joins the number rewards when it is installed.
HAS_REASONING_GYM = importlib.util.find_spec("reasoning_gym") is not None
NUMBER_REWARDS = (MATH, arithmetic_reward) + ((reasoning_gym_reward,) if HAS_REASONING_GYM else ())

# Reasoning prose: words (retraction and hedge words among them: they decide nothing), numbers and punctuation,
# but never an answer slot or hiding markup.
_WORDS = (
    "we count the rows there are apples so then add multiply each group has total wait actually no hmm oops never "
    "mind edit instead rather alternatively maybe not or and if teacher counted I meant correct wrong is final"
).split()
_word = st.one_of(st.sampled_from(_WORDS), st.integers(0, 999).map(str))
_sentence = st.lists(_word, min_size=1, max_size=12).map(" ".join).map(lambda s: s[0].upper() + s[1:])
prose = st.lists(
    st.tuples(_sentence, st.sampled_from([". ", ", ", "; ", "! ", ".\n", "\n\n", ": "])), min_size=1, max_size=5
).map(lambda parts: "".join(s + p for s, p in parts).strip())

END = st.sampled_from(["", ".", "\n", " ", "!", ".\n\n", "<|im_end|>", " </s>", "\n<|eot_id|>", ".<|im_end|>"])
NUMBER_FORMS = [
    "\\boxed{{{v}}}",
    "$\\boxed{{{v}}}$",
    "\\[\\boxed{{{v}}}\\]",
    "\\fbox{{{v}}}",
    "Answer: {v}",
    "**Answer:** {v}",
    "The final answer is {v}",
    "The answer is ${v}$",
    "Final Answer: $\\boxed{{{v}}}$",
    "So the answer is {v}",
    "<answer>{v}</answer>",
    "<answer>\\boxed{{{v}}}</answer>",
    "<answer>\nThe answer is {v}\n</answer>",
]
LETTER_FORMS = NUMBER_FORMS + ["The correct option is {v}", "Answer: ({v})", "\\boxed{{\\text{{({v})}}}}"]
HIDERS = [
    "<!-- {s} -->",
    "<!-- {s}",
    "\\phantom{{{s}}}",
    "~~{s}~~",
    "<details>{s}</details>",
    "<s>{s}</s>",
    '<span style="display:none">{s}</span>',
    "\\color{{white}}{{{s}}}",
    "\\iffalse {s} \\fi",
    "\u200b{s}",
    "{s}\u2060",
    "<del>{s}</del>",
]


@st.composite
def completion(draw, slot: str, *, think: bool | None = None) -> str:
    """A contract-abiding completion whose one slot is ``slot``: optional think block, optional reasoning (its
    own lines) before the slot, closing punctuation or end-of-turn markup after it."""
    text = ""
    if think if think is not None else draw(st.booleans()):
        text += f"<think>{draw(prose)}\n{draw(st.sampled_from(NUMBER_FORMS)).format(v=draw(_word))}</think>"
        text += draw(st.sampled_from(["", "\n", "\n\n"]))
    if draw(st.booleans()):
        text += draw(prose) + "\n"
    return text + slot + draw(END)


def _entry(gold) -> str:
    """A reasoning-gym ``chain_sum`` entry whose answer is ``gold`` (its verifier compares decimal numbers)."""
    return json.dumps({"question": "", "answer": str(gold), "metadata": {"source_dataset": "chain_sum"}})


def _score(reward, completions, gold, mode="train") -> tuple[list, float]:
    metrics: dict[str, float] = {}
    columns = {"answer": [gold] * len(completions)}
    if isinstance(reward, ReasoningGymReward):
        columns["reasoning_gym_entry"] = [_entry(gold)] * len(completions)
    scores = reward(completions, log_metric=metrics.__setitem__, mode=mode, **columns)
    violations = [v for k, v in metrics.items() if k.endswith("/contract_violations")]
    assert len(violations) == 1
    return scores, violations[0]


values = st.integers(-50, 5000)
others = st.integers(-50, 5000)


# ---------------------------------------------------------------------------------- correct: score 1


@SETTINGS
@given(st.data(), values, st.sampled_from(NUMBER_FORMS))
def test_contract_abiding_numbers_score_one(data, n, form):
    text = data.draw(completion(form.format(v=n)))
    # reasoning-gym's verifier reads the slot's text as it is: "$18$" is not its number (the task's decision).
    rewards = NUMBER_REWARDS if "${v}$" not in form else (MATH, arithmetic_reward)
    for reward in rewards:
        scores, violations = _score(reward, [text, [{"role": "assistant", "content": text}]], str(n))
        assert scores == [1.0, 1.0], (reward, text)
        assert violations == 0.0


@SETTINGS
@given(st.data(), st.sampled_from("ABCDE"), st.sampled_from(LETTER_FORMS))
def test_contract_abiding_letters_score_one(data, letter, form):
    text = data.draw(completion(form.format(v=letter)))
    assert _score(choice_accuracy_reward, [text], letter) == ([1.0], 0.0), text


@SETTINGS
@given(st.data(), st.sampled_from(["Paris", "Barack Obama", "Trick or Treat", "1912"]), st.sampled_from(NUMBER_FORMS))
def test_contract_abiding_qa_answers_score_one(data, gold, form):
    text = data.draw(completion(form.format(v=gold)))
    assert _score(qa_exact_match_reward, [text], gold) == ([1.0], 0.0), text


# ------------------------------------------------------------------------------ adversarial: score 0


@SETTINGS
@given(st.data(), values, others, st.sampled_from(NUMBER_FORMS))
def test_text_after_the_slot_with_another_candidate_scores_zero(data, n, m, form):
    assume(m != n)
    after = data.draw(st.sampled_from([" ", "\n", ". ", "\n\n", " (", ", "]))
    tail = data.draw(prose) + data.draw(st.sampled_from([" ", "\n", ": "])) + str(m) + data.draw(END)
    text = data.draw(completion(form.format(v=n))) + after + tail
    for gold in (n, m):
        for reward in NUMBER_REWARDS:
            # (reasoning-gym: an anchor's slot runs to the end of its line, so the tail joined the value, "Answer: 0
            # We. 1", and a value with more numbers than the gold is refused before the task's verifier.)
            violation = 1.0
            assert _score(reward, [text], str(gold), "strict") == ([0.0], violation), (reward, text, gold)
            # Training mode does not read the text after the committed answer: never more than n earns.
            assert _score(reward, [text], str(gold))[0][0] <= float(gold == n), (reward, text, gold)


@pytest.mark.parametrize("text", ["Answer: 0. 0. 1", "Answer: 18. 21", r"\boxed{18. 21}", "The answer is $18. 21$"])
@pytest.mark.parametrize("reward", [MATH, arithmetic_reward], ids=["math", "arithmetic"])
def test_two_numbers_with_a_full_stop_between_are_counted_as_a_violation(text, reward):
    # The property test above found "Answer: 0. 0. 1" once, at random (2c819f6); fixed here so it runs every time.
    for gold in ("0", "1", "18", "21"):
        assert _score(reward, [text], gold, "strict") == ([0.0], 1.0), (text, gold)
        # Training mode: an anchor's value ends with its sentence ("Answer: 0. 0. 1" commits to 0); inside a box or
        # maths the full stop is no sentence's end, and the two numbers are no one value.
        first = text.split(":")[1].split(".")[0].strip() if text.startswith("Answer") else None
        assert _score(reward, [text], gold)[0] == [float(gold == first)], (text, gold)


@SETTINGS
@given(st.data(), values, others, st.sampled_from(NUMBER_FORMS), st.sampled_from(NUMBER_FORMS))
def test_a_second_slot_scores_zero(data, n, m, first, second):
    m = data.draw(st.sampled_from([m, n]))  # even the same value twice is two slots
    joiner = data.draw(st.one_of(st.sampled_from(["\n", " or ", "\n\nAlternatively, ", ", if inclusive: "]), prose))
    text = data.draw(completion(first.format(v=n))) + "\n" + joiner + "\n" + second.format(v=m)
    for gold in {n, m}:
        for reward in NUMBER_REWARDS:
            assert _score(reward, [text], str(gold), "strict") == ([0.0], 1.0), (reward, text, gold)
            # Training mode: the last slot is the committed answer, or, joined to the first by a separator on its
            # line, a list that scores 0.
            assert _score(reward, [text], str(gold))[0][0] <= float(gold == m), (reward, text, gold)


@SETTINGS
@given(st.data(), values, others, st.sampled_from(NUMBER_FORMS), st.sampled_from(HIDERS))
def test_hidden_right_answer_and_visible_wrong_one_score_zero(data, n, m, form, hider):
    assume(m != n)
    hidden = hider.format(s=form.format(v=n))
    visible = data.draw(st.sampled_from(NUMBER_FORMS)).format(v=m)
    order = data.draw(st.booleans())
    slot = f"{hidden}\n{visible}" if order else f"{visible}\n{hidden}"
    text = data.draw(completion(slot))
    for gold in (n, m):
        for reward in NUMBER_REWARDS:
            assert _score(reward, [text], str(gold)) == ([0.0], 1.0), (reward, text, gold)


@SETTINGS
@given(st.data(), values, st.sampled_from(NUMBER_FORMS), st.sampled_from(HIDERS))
def test_a_slot_wrapped_in_hiding_markup_scores_zero(data, n, form, hider):
    text = data.draw(completion(hider.format(s=form.format(v=n))))
    for reward in NUMBER_REWARDS:
        assert _score(reward, [text], str(n)) == ([0.0], 1.0), (reward, text)


@SETTINGS
@given(st.data(), st.sampled_from("ABCDE"), st.sampled_from("ABCDE"), st.sampled_from(LETTER_FORMS))
def test_choice_adversaries_score_zero(data, letter, other, form):
    assume(other != letter)
    slot = form.format(v=letter)
    tail = data.draw(prose) + " " + other
    hidden = data.draw(st.sampled_from(HIDERS)).format(s=slot) + "\n" + form.format(v=other)
    second = slot + "\n" + data.draw(st.sampled_from(LETTER_FORMS)).format(v=data.draw(st.sampled_from("ABCDE")))
    for text in (data.draw(completion(slot)) + "\n" + tail, data.draw(completion(hidden)), second):
        assert _score(choice_accuracy_reward, [text], letter, "strict") == ([0.0], 1.0), text
    assert _score(choice_accuracy_reward, [data.draw(completion(hidden))], letter) == ([0.0], 1.0)


@SETTINGS
@given(st.data(), values, st.sampled_from(NUMBER_FORMS))
def test_a_slot_in_reasoning_left_open_scores_zero(data, n, form):
    text = "<think>" + data.draw(prose) + "\n" + form.format(v=n) + data.draw(END)
    if data.draw(st.booleans()):
        text = f"<think>a</think>{form.format(v=n)}\n<think>{data.draw(prose)}"
    for reward in NUMBER_REWARDS:
        assert _score(reward, [text], str(n)) == ([0.0], 1.0), (reward, text)


@pytest.mark.parametrize("reward", [MATH, choice_accuracy_reward, qa_exact_match_reward, arithmetic_reward,
                                    pytest.param(reasoning_gym_reward, marks=pytest.mark.skipif(
                                        not HAS_REASONING_GYM, reason="reasoning-gym is the [realmodel] extra"))])  # fmt: skip
def test_the_committed_answer_and_the_strict_mode(reward):
    gold = "C" if reward is choice_accuracy_reward else "18"
    first, last = ("A", "C") if reward is choice_accuracy_reward else ("21", "18")
    self_corrected = f"Answer: {first}\nAnswer: {last}"
    trailing = f"Answer: {last}\n\nI hope it is correct."
    hidden = f"<!-- Answer: {last} -->\nAnswer: {first}"
    columns = {"answer": [gold] * 3, "reasoning_gym_entry": [_entry(gold)] * 3}
    assert reward([self_corrected, trailing, hidden], **columns) == [1.0, 1.0, 0.0]
    assert reward([self_corrected, trailing, hidden], **columns, mode="eval") == [1.0, 1.0, 0.0]
    assert reward([self_corrected, trailing, hidden], **columns, mode="strict") == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="mode must be 'train', 'eval' or 'strict'"):
        reward([self_corrected], **columns, mode=["eval"])


def test_eval_mode_uses_math_verify_tolerance_and_training_mode_exact_numbers():
    completions = [r"\boxed{3.1415927}", r"\boxed{0.333333}", r"\boxed{0.5}"]
    golds = [r"\pi", r"\frac{1}{3}", r"\frac{1}{2}"]
    assert MATH(completions, answer=golds) == [0.0, 0.0, 1.0]
    assert MATH(completions, answer=golds, mode="eval") == [1.0, 1.0, 1.0]
    assert MathAccuracyReward(backend="none", mode="eval")(completions, answer=golds) == [1.0, 1.0, 1.0]


def test_every_answer_reward_by_name_is_in_training_mode():
    """examples/train.py, the recipes, the demo and benchmarks/learning.py take rewards by name: training mode."""
    from grpo_family.rewards import get_reward_funcs
    from grpo_family.rewards.contract import AnswerReward

    names = ["math_accuracy", "choice_accuracy", "qa_exact_match", "qa_f1", "reasoning_gym", "arithmetic"]
    funcs = get_reward_funcs(names)
    assert all(isinstance(f, AnswerReward) and f.mode == "train" for f in funcs)


# ------------------------------------------------------------------ the invariant: one committed value


# Every slot kind, and the closing layouts real models write.
SLOT_FORMS = NUMBER_FORMS + [
    "**Final Answer**\n\\[\n\\boxed{{{v}}}\n\\]",
    "**Final Answer**\n$$\n\\boxed{{{v}}}\n$$",
    "### Final Answer\n\\begin{{align*}}\n\\boxed{{{v}}}\n\\end{{align*}}",
    "Therefore, the final answer is: $\\boxed{{{v}}}$. I hope it is correct.",
    "Final Answer: The final answer is ${v}$. I hope it is correct.",
    "The total is **{v}**.",
    "In conclusion, the answer is {v}.",
    "#### {v}",
    "{v}",
    # issue 40's recall rules: a sentence restating the answer after an anchor, a computation in a sentence
    "Final Answer: The largest $n$ is {v}. I hope it is correct.",
    "Here is the solution: {v} * 1 = {v}",
    # a sentence restating a computation holds no value of its own; one stating another value is the later answer
    "{v} + 0 = {v}. This is the result of {v} + 0, which is {v}.",
    "This is {v}.",
]
JOINERS = ["\n", " or ", ", ", "; ", " / ", "\n\nWait, let me reconsider. ", "\nAlternatively, ", " and ", " ", ". "]


@st.composite
def candidate_set(draw, values_strategy, forms) -> tuple[str, list]:
    """A completion built from 1-4 candidate values, each in a slot form, joined by any joining text, some of them
    wrapped in hiding markup, repeated, and the whole maybe cut off; returned with its candidate values."""
    candidates = draw(st.lists(values_strategy, min_size=1, max_size=4))
    if draw(st.booleans()):
        candidates.append(draw(st.sampled_from(candidates)))  # repetition
    pieces = []
    for value in candidates:
        piece = draw(st.sampled_from(forms)).format(v=value)
        if draw(st.integers(0, 5)) == 0:
            piece = draw(st.sampled_from(HIDERS)).format(s=piece)
        pieces.append(piece)
    text = pieces[0]
    for piece in pieces[1:]:
        text += draw(st.one_of(st.sampled_from(JOINERS), prose.map(lambda p: f"\n{p} "))) + piece
    text = draw(completion(text)) if draw(st.booleans()) else text
    if draw(st.integers(0, 4)) == 0:
        text = text[: draw(st.integers(0, len(text)))]  # truncation
    return text, candidates


def _alone(reward, value: str, gold) -> float:
    return _score(reward, [f"<answer>{value}</answer>"], gold)[0][0]


@INVARIANT
@given(candidate_set(st.integers(-50, 5000).map(str), SLOT_FORMS), st.integers(-50, 5000).map(str))
def test_a_completion_scores_what_its_one_committed_value_earns(built, other):
    """No reward compares more than one value a completion wrote: its score is that of its committed value written
    alone (0 when it commits to none), and it earns full marks for at most one of its candidates."""
    text, candidates = built
    golds = sorted(set(candidates) | {other})
    reading = read_answer(text, MATH_SLOTS)
    for reward in NUMBER_REWARDS:
        # each reward's own slots: arithmetic and reasoning-gym (numeric golds here) read as value rewards
        spec_reading = reading if reward is MATH else read_answer(text, VALUE_SLOTS)
        full_marks = []
        for gold in golds:
            (score,), _ = _score(reward, [text], gold)
            expected = 0.0 if spec_reading.value is None else _alone(reward, spec_reading.value, gold)
            assert score == expected, (reward, text, gold, spec_reading)
            if score == 1.0:
                full_marks.append(gold)
        assert len(full_marks) <= 1, (reward, text, full_marks)


@INVARIANT
@given(
    candidate_set(st.sampled_from("ABCDE"), LETTER_FORMS + ["**{v}. Pneumonia**", "The answer is {v}) 42"]),
    candidate_set(st.sampled_from(["Paris", "Lyon", "Trick or Treat", "1912"]), NUMBER_FORMS),
)
def test_choice_and_qa_score_what_their_one_committed_value_earns(letters, answers):
    for (text, _candidates), reward, spec, pool in (
        (letters, choice_accuracy_reward, CHOICE_SLOTS, "ABCDE"),
        (answers, qa_exact_match_reward, ANSWER_SLOTS, ["Paris", "Lyon", "Trick or Treat", "1912"]),
    ):
        reading = read_answer(text, spec)
        full_marks = []
        for gold in pool:
            (score,), _ = _score(reward, [text], gold)
            expected = 0.0 if reading.value is None else _alone(reward, reading.value, gold)
            assert score == expected, (reward, text, gold, reading)
            full_marks += [gold] * (score == 1.0)
        assert len(full_marks) <= 1, (reward, text, full_marks)


# ------------------------------------------------------------- maths spans side by side: two values, not one

SPAN_FORMS = ["${v}$", "$${v}$$", "\\({v}\\)", "\\( {v} \\)", "\\[{v}\\]", "$({v})$", "$\\frac{{{v}}}{{1}}$"]
SPAN_SLOTS = ["Answer: {s}", "The answer is {s}", "The final answer is {s}.", "<answer>{s}</answer>", "{s}"]


@SETTINGS
@given(
    st.data(),
    values,
    others,
    st.sampled_from(SPAN_FORMS),
    st.sampled_from(SPAN_FORMS),
    st.sampled_from(["", " ", "  ", "\t"]),
    st.sampled_from(SPAN_SLOTS),
)
def test_two_maths_spans_side_by_side_score_zero(data, n, m, first, second, gap, slot):
    """``Answer: \\( 9 \\) \\( 8 \\)`` is one slot holding two values (math-verify alone would read the last): a
    contract violation, 0 for either gold, in every mode, like ``Answer: 9 8``."""
    spans = first.format(v=n) + gap + second.format(v=m)
    text = data.draw(completion(slot.format(s=spans)))
    for gold in (n, m):
        for reward in (MATH, arithmetic_reward):
            for mode in ("train", "eval", "strict"):
                assert _score(reward, [text], str(gold), mode) == ([0.0], 1.0), (reward, text, gold, mode)


@pytest.mark.parametrize(
    "text", [r"Answer: \(9\) apples", r"Answer: $9$ cm", r"Answer: $x$ = $9$", r"The answer is $9$.", r"$9$ apples"]
)
def test_one_maths_span_with_text_beside_it_reads_its_value(text):
    # A span's delimiters go once no second span sits beside it: units and a named value read as without them.
    assert _score(MATH, [text], "9") == ([1.0], 0.0), text
    assert _score(MATH, [text], "8") == ([0.0], 0.0), text


# ------------------------------------------------- a true computation states its result, a false one nothing


@SETTINGS
@given(
    st.data(),
    st.integers(0, 999),
    st.integers(0, 999),
    st.sampled_from(["+", "-", "*", "x", "\\times"]),
    st.integers(-3, 3),
    st.sampled_from(
        ["{e}", "Answer: {e}", "\\boxed{{{e}}}", "The answer is ${e}$", "Therefore, {e}.", "Here is the solution: {e}"]
    ),
)
def test_a_computation_scores_its_result_only_when_true(data, a, b, op, error, slot):
    """``2 + 8 = 10`` commits to 10 (SmolLM2's closing line); its operands are no candidates, and a false
    computation (``2 + 8 = 11``) commits to nothing."""
    result = {"+": a + b, "-": a - b}.get(op, a * b) + error
    text = data.draw(completion(slot.format(e=f"{a} {op} {b} = {result}")))
    assume(not text.endswith("!"))  # "= 10!" is a factorial
    # reasoning-gym's verifier reads the slot's text as it is: "$18$" is not its number (the task's decision).
    rewards = NUMBER_REWARDS if "$" not in slot else (MATH, arithmetic_reward)
    for gold in {a, b, result}:
        for reward in rewards:
            (score,), _ = _score(reward, [text], str(gold))
            assert score == float(error == 0 and gold == result), (reward, text, gold)


@SETTINGS
@given(st.data(), values, others, st.sampled_from([" or ", ", not ", " and ", " then ", " ", "/"]))
def test_a_sentence_restating_the_answer_states_its_one_number(data, n, m, joiner):
    """``Final Answer: The volume of $ABCDEFGH$ is 120.`` commits to 120 (issue 40: the anchor marks the sentence,
    the span only names something); a second number anywhere in the sentence leaves it no value, whatever joins
    the two."""
    one = data.draw(completion(f"Final Answer: The volume of $ABCDEFGH$ is {n}."))
    two = data.draw(completion(f"Final Answer: The volume of $ABCDEFGH$ is {n}{joiner}{m}."))
    for gold in {n, m}:
        for reward in NUMBER_REWARDS:
            assert _score(reward, [one], str(gold))[0] == [float(gold == n)], (reward, one, gold)
            assert _score(reward, [two], str(gold))[0] == [0.0], (reward, two, gold)


# ------------------------------------------------ a list of boxes is one answer for a gold of that many values

BOX_FORMS = ["\\boxed{{{v}}}", "$\\boxed{{{v}}}$", "\\(\\boxed{{{v}}}\\)"]
LIST_GAPS = [", ", ",", " and ", ", and ", " \\quad \\text{and} \\quad ", "; "]


@INVARIANT
@given(
    st.data(),
    st.lists(st.integers(-50, 500), min_size=1, max_size=4, unique=True),
    st.lists(st.integers(-50, 500), min_size=2, max_size=5),
    st.sampled_from(BOX_FORMS),
    st.sampled_from(LIST_GAPS),
    st.sampled_from(["train", "eval", "strict"]),
)
def test_a_list_of_boxes_scores_only_as_the_whole_gold(data, gold, listed, form, gap, mode):
    """``\\boxed{2} and \\boxed{3}`` answers the gold ``2, 3`` (the closing layout of solution-set answers), and
    nothing else: a list pays only when its values are the gold's, as many as the gold has, so writing more
    candidates than the gold has values never pays (a one-value gold never reads a list)."""
    text = data.draw(completion(gap.join(form.format(v=v) for v in listed), think=False))
    (score,), _ = _score(MATH, [text], ", ".join(map(str, gold)), mode)
    assert score == float(len(gold) > 1 and sorted(listed) == sorted(gold)), (text, gold)


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{2} or \\boxed{3}",  # alternatives, not a list
        "\\boxed{2}\n\\boxed{3}",  # two lines: two answers
        "1, \\boxed{2}, \\boxed{3}",  # a value joined before the list
        "\\boxed{2} apples or \\boxed{3}",  # words and "or" between the boxes: alternatives
        "\\boxed{2} and 4 or \\boxed{3}",  # a value between the boxes
        "\\boxed{2}, \\boxed{3} <!-- 4 -->",  # hiding markup
    ],
)
def test_boxes_that_are_no_list_do_not_answer_a_list_gold(text):
    for mode in ("train", "eval", "strict"):
        assert _score(MATH, [text], "2, 3", mode)[0] == [0.0], (text, mode)
    assert _score(MATH, [text.replace("\\boxed{2}", "\\boxed{5}")], "5, 3")[0] == [0.0], text


# ------------------------------------------- layouts of the corpus's correct endings, and their wrong twins

IDENTITY = "\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}"  # "\\\\ " (a row break, then a space) stays a row break
DIAGONAL_12 = "\\begin{pmatrix}1 & 0 \\\\ 0 & 2\\end{pmatrix}"


@pytest.mark.parametrize(
    ("text", "right", "wrong"),
    [
        # one maths span in a sentence of words: the span is the value (words hold no second value)
        ("Therefore $x \\geq 5$ is the solution.", "x \\ge 5", "x \\ge 6"),
        (f"The identity matrix is $ {IDENTITY} $.", IDENTITY, DIAGONAL_12),
        ("The sum is $\\frac{1}{2}$.", "\\frac12", "\\frac13"),
        # a comma that cannot group thousands is a decimal comma; one that can is a thousands separator
        ("1000,99", "1000.99", "100099"),
        ("0,111", "0.111", "111"),
        ("\\boxed{12,5}", "12.5", "125"),
        ("\\boxed{1,234}", "1234", "1.234"),
        (f"\\boxed{{{DIAGONAL_12}}}", DIAGONAL_12, IDENTITY),
        # a gold in a LaTeX group is its content: three values
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "{1,2,3}", "{1,2}"),
    ],
)
def test_corpus_layouts_score_by_their_one_value(text, right, wrong):
    assert _score(MATH, [text], right)[0] == [1.0], (text, right)
    assert _score(MATH, [text], wrong)[0] == [0.0], (text, wrong)


@pytest.mark.parametrize(
    "text",
    [
        "Twenty is not $5$.",  # a number word beside the span: two values
        "It is $5$ or 6.",  # a digit beside the span
        "It is $5$ and $6$.",  # two spans
    ],
)
def test_a_span_beside_another_value_is_not_read_as_the_sentences_value(text):
    for gold in ("5", "6"):
        assert _score(MATH, [text], gold)[0] == [0.0], (text, gold)


def test_the_words_around_a_span_in_prose_are_not_read():
    """No list of words decides a score: a negation in the sentence around the one span is not read, as one written
    before a box is not (docs/answer_extraction.md §4); the span is the commitment and a policy gains nothing by
    negating it (the span alone earns the same). Strict mode reads the words and refuses the sentence. A plain
    number in a sentence of words is read the same way (hand-graded cmath-063 is graded 0 and scores 1)."""
    for text in ("The answer is not $18$.", "$18$ is not the answer.", "The answer is not 18.", "18 is not it."):
        assert _score(MATH, [text], "18")[0] == [1.0] == _score(MATH, ["$18$"], "18")[0], text
        assert _score(MATH, [text], "19")[0] == [0.0], text
        assert _score(MATH, [text], "18", "strict")[0] == [0.0], text


def test_a_gsm8k_line_ends_its_value_with_its_sentence():
    """``#### 0. Answer: 0`` (hypothesis at 10,000 examples): the ``####`` value ended at the line's end, so the
    slot held "0. Answer: 0" and scored 0 where the same value written alone scores 1. It is two anchors now: the
    committed (last) one counts, and strict mode sees two slots."""
    assert _score(MATH, ["#### 0. Answer: 0"], "0") == ([1.0], 0.0)
    assert _score(MATH, ["#### 5. Answer: 0"], "5") == ([0.0], 0.0)
    assert _score(MATH, ["#### 0. Answer: 0"], "0", "strict") == ([0.0], 1.0)
