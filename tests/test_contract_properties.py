"""The answer contract holds by construction (issue 29): hypothesis builds completions, and the verdict follows.

* Contract-abiding completions in varied formatting (think block or not, reasoning before the slot, every slot
  form, closing punctuation and end-of-turn markup after it) score 1 with the right gold, under every answer reward.
* Adversarial completions score 0 whatever their words: a correct slot followed by any text holding another
  candidate; a second slot (of any form, with the same or another value); the slot wrapped in hiding markup; the
  right value hidden and a wrong one visible; the slot inside reasoning left open. Each also counts as a contract
  violation in the reward's metric.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grpo_family.rewards import MathAccuracyReward, choice_accuracy_reward, qa_exact_match_reward
from grpo_family.rewards.reasoning_gym import ReasoningGymReward, extract_reasoning_gym_answer, reasoning_gym_reward
from grpo_family.tasks.arithmetic import arithmetic_reward

MATH = MathAccuracyReward(backend="none")
SETTINGS = settings(max_examples=150, deadline=None)
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


def _score(reward, completions, gold) -> tuple[list, float]:
    metrics: dict[str, float] = {}
    columns = {"answer": [gold] * len(completions)}
    if isinstance(reward, ReasoningGymReward):
        columns["reasoning_gym_entry"] = [_entry(gold)] * len(completions)
    scores = reward(completions, log_metric=metrics.__setitem__, **columns)
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
            violation = 1.0
            if reward is reasoning_gym_reward and (value := extract_reasoning_gym_answer(text)) is not None:
                # An anchor line's slot runs to the end of its line: the tail joined the value ("Answer: 0 We. 1"),
                # and the task's verifier, judging the whole value, finds no number equal to the gold in it.
                assert str(m) in value, (text, value)
                violation = 0.0
            assert _score(reward, [text], str(gold)) == ([0.0], violation), (reward, text, gold)


@pytest.mark.parametrize("text", ["Answer: 0. 0. 1", "Answer: 18. 21", r"\boxed{18. 21}", "The answer is $18. 21$"])
@pytest.mark.parametrize("reward", [MATH, arithmetic_reward], ids=["math", "arithmetic"])
def test_two_numbers_with_a_full_stop_between_are_counted_as_a_violation(text, reward):
    # The property test above found "Answer: 0. 0. 1" once, at random (2c819f6); fixed here so it runs every time.
    for gold in ("0", "1", "18", "21"):
        assert _score(reward, [text], gold) == ([0.0], 1.0), (text, gold)


@SETTINGS
@given(st.data(), values, others, st.sampled_from(NUMBER_FORMS), st.sampled_from(NUMBER_FORMS))
def test_a_second_slot_scores_zero(data, n, m, first, second):
    m = data.draw(st.sampled_from([m, n]))  # even the same value twice is two slots
    joiner = data.draw(st.one_of(st.sampled_from(["\n", " or ", "\n\nAlternatively, ", ", if inclusive: "]), prose))
    text = data.draw(completion(first.format(v=n))) + "\n" + joiner + "\n" + second.format(v=m)
    for gold in {n, m}:
        for reward in NUMBER_REWARDS:
            assert _score(reward, [text], str(gold)) == ([0.0], 1.0), (reward, text, gold)


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
        assert _score(choice_accuracy_reward, [text], letter) == ([0.0], 1.0), text


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
def test_eval_mode_is_lenient_only_where_documented(reward):
    gold = "C" if reward is choice_accuracy_reward else "18"
    first, last = ("A", "C") if reward is choice_accuracy_reward else ("21", "18")
    self_corrected = f"Answer: {first}\nAnswer: {last}"
    trailing = f"Answer: {last}\n\nI hope it is correct."
    hidden = f"<!-- Answer: {last} -->\nAnswer: {first}"
    columns = {"answer": [gold] * 3, "reasoning_gym_entry": [_entry(gold)] * 3}
    assert reward([self_corrected, trailing, hidden], **columns) == [0.0, 0.0, 0.0]
    assert reward([self_corrected, trailing, hidden], **columns, mode="eval") == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="mode must be 'train' or 'eval'"):
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
