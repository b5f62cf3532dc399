"""The ``reasoning_gym`` reward: each reasoning-gym task's own verifier, on the answer slot of a completion.

Rows come from ``--dataset_name reasoning_gym/<task>`` (:mod:`grpo_family.tasks.reasoning_gym`): the column
``reasoning_gym_entry`` holds the task's entry (question, answer, metadata) as JSON, and the task's
``score_answer(answer, entry)`` scores it.

The answer is read under the answer contract of every answer reward (``docs/answer_extraction.md``,
:func:`grpo_family.rewards.contract.read_answer`): the final region after ``</think>``, no hiding markup, exactly
one answer slot (an ``<answer>`` tag, as the preset's system prompt asks, a box, an ``Answer: ...`` line, or a
final region of one line: the bare reply) and nothing after it. A completion that breaks it scores 0.0 and is
counted in ``reasoning_gym/contract_violations``. The slot's text goes to the verifier as it is (a grid over several
lines inside the tag, ``$\\dfrac{1}{2}$``, a sentence with its full stop): what it means is the task's to decide.

The verifier sees exactly the one value the contract read: a slot holding more numbers or more list separators
(``,`` ``;`` ``/`` "or" "and") than the task's gold answer is a list of values, which reasoning-gym's verifiers
would compare more than one of (``gsm_symbolic`` reads the first number of ``31 or 40``, ``chain_sum`` strips the
comma of ``30,37``, ``fraction_simplification`` reads a prefix): it breaks the contract (0.0, counted).

A task whose gold is one number is read as the value rewards read theirs (:data:`VALUE_SLOTS`: the last sentence
that holds a value, a sentence restating the answer after an anchor), and a true computation in the slot, alone or
in a sentence of words, reaches the verifier as its result (``Here is the solution: 3 * 6 = 18`` -> ``18``).

The reward is 1 when the task's score is full marks, else 0, so a slot that lists candidates earns nothing.
``ReasoningGymReward(partial_credit=True)`` (``reasoning_gym_partial``) passes the task's own partial credit through
instead, and then accepts only a marked slot (tag, box or anchor line; a bare reply breaks its contract):
reasoning-gym's default verifier gives ``len(gold) / len(answer)`` to any answer containing the gold, which a policy
could farm with a reply that lists candidates. A row without an entry scores None (cannot score). ``mode="eval"`` is
the contract's lenient evaluation reading (the last slot counts, text after it is ignored).

reasoning-gym is imported on first use (``pip install -e ".[realmodel]"``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from .contract import ANSWER_SLOTS, VALUE_SLOTS, AnswerReward, read_answer
from .extract import completion_text
from .values import count_numbers, equation_result, list_separators, sentence_result

__all__ = ["ReasoningGymReward", "extract_reasoning_gym_answer", "reasoning_gym_reward"]

# The slots a partial-credit reward accepts: a marked answer, never the bare reply.
_MARKED = ("tag", "box", "anchor", "bold")


@functools.cache
def _scorer(task: str) -> Callable[[str, dict], float]:
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(
            'The reasoning_gym reward needs the reasoning-gym package: pip install -e ".[realmodel]"'
        ) from error
    return reasoning_gym.get_score_answer_fn(task)


def _one_number(gold: Any) -> bool:
    """Whether a task's gold answer is one number (``"42"``, ``"-3.5"``; not ``"x = 2"``): the task is then read as
    a value reward reads its answers (:data:`~grpo_family.rewards.contract.VALUE_SLOTS`, a computation's result).
    ``gold``: the answer, or the task's entry (a dict or its JSON) whose answer it is."""
    if isinstance(gold, str) and gold.lstrip().startswith("{"):
        try:
            gold = json.loads(gold)
        except ValueError:
            pass
    if isinstance(gold, dict):
        gold = gold.get("answer", "")
    text = "" if gold is None else str(gold)
    return count_numbers(text) == 1 and "=" not in text


def extract_reasoning_gym_answer(
    completion: Any, marked_only: bool = False, mode: str = "train", gold: Any = None
) -> str | None:
    """The text of a completion's one answer slot under the answer contract, or None when it breaks the contract;
    ``marked_only``: a bare reply (no tag, box or anchor line) is no answer. ``gold`` (the task's answer or entry):
    a gold of one number reads the slots of a value reward (:data:`VALUE_SLOTS`)."""
    spec = VALUE_SLOTS if _one_number(gold) else ANSWER_SLOTS
    reading = read_answer(completion_text(completion), spec, mode)
    if reading.value is None or (marked_only and reading.kind not in _MARKED):
        return None
    return reading.value


class ReasoningGymReward(AnswerReward):
    """TRL reward function: the task's own ``score_answer`` on the answer slot, against the row's
    ``reasoning_gym_entry``; 1.0 / 0.0 / None (binary), or the task's partial credit with ``partial_credit=True``.
    ``mode``: ``"train"`` (default, the answer contract) or ``"eval"``; a call's ``mode=`` overrides it. Logs
    ``<name>/contract_violations`` and ``reasoning_gym/unparseable_gold`` via ``log_metric``."""

    gold_key = "reasoning_gym_entry"
    gold_column = "the task entries in a 'reasoning_gym_entry' column (--dataset_name reasoning_gym/<task>)"
    gold_metric = "reasoning_gym/unparseable_gold"

    def __init__(self, partial_credit: bool = False, *, mode: str = "train", name: str | None = None):
        super().__init__(mode, name or ("reasoning_gym_partial" if partial_credit else "reasoning_gym"))
        self.partial_credit = partial_credit

    def __repr__(self) -> str:
        return f"ReasoningGymReward(partial_credit={self.partial_credit}, mode={self.mode!r})"

    def _gold(self, stored: Any) -> dict | None:
        if not stored:
            return None
        return json.loads(stored) if isinstance(stored, str) else stored

    def _score(self, text: str, entry: dict, mode: str) -> tuple[float, bool]:
        gold = str(entry.get("answer", ""))
        answer = extract_reasoning_gym_answer(text, marked_only=self.partial_credit, mode=mode, gold=gold)
        if answer is None:
            return 0.0, True
        if _one_number(gold):  # "2 + 8 = 10" and, in the committed modes, "Therefore, 2 + 8 = 10." state 10
            answer = equation_result(answer) or (mode != "strict" and sentence_result(answer)) or answer
        if count_numbers(answer) > count_numbers(gold) or list_separators(answer) > list_separators(gold):
            # More than one value of the gold's kind: the task's verifier would compare more than one of them
            # (gsm_symbolic reads the first number of "31 or 40", chain_sum strips commas from "30,37").
            return 0.0, True
        score = float(_scorer(entry["metadata"]["source_dataset"])(answer, entry))
        return (score if self.partial_credit else float(score >= 1.0)), False


reasoning_gym_reward = ReasoningGymReward()
