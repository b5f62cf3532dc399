"""The ``reasoning_gym`` reward: each reasoning-gym task's own verifier, on the final answer of a completion.

Rows come from ``--dataset_name reasoning_gym/<task>`` (:mod:`grpo_family.tasks.reasoning_gym`): the column
``reasoning_gym_entry`` holds the task's entry (question, answer, metadata) as JSON, and the task's
``score_answer(answer, entry)`` scores it. The answer is read under the project's one extraction policy
(:func:`grpo_family.rewards.extract.final_answer`): the last ``<answer>`` block, box or "the answer is" span after any
reasoning, else the whole reply after any reasoning; a completion that commits to no answer, or hedges (two
candidates, a retraction), scores 0. The reward is 1 when the task's score is full marks, else 0, so an unmarked
reply scores only when it is the answer and nothing else. ``ReasoningGymReward(partial_credit=True)`` passes the
task's own partial credit through instead, and then reads only a marked answer (tag, box or "the answer is"):
reasoning-gym's default verifier gives ``len(gold) / len(answer)`` to any answer containing the gold, which a policy
could farm with a reply that lists candidates. A row without an entry scores None (cannot score).

reasoning-gym is imported on first use (``pip install -e ".[realmodel]"``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from .extract import completion_text, final_answer

__all__ = ["ReasoningGymReward", "reasoning_gym_reward"]

# Where a marked answer comes from; "whole" is the whole reply (no tag, box or anchor).
_MARKED = ("tag", "box", "anchor")


@functools.cache
def _scorer(task: str) -> Callable[[str, dict], float]:
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(
            'The reasoning_gym reward needs the reasoning-gym package: pip install -e ".[realmodel]"'
        ) from error
    return reasoning_gym.get_score_answer_fn(task)


def extract_reasoning_gym_answer(completion: Any, marked_only: bool = False) -> str | None:
    """The answer a completion commits to (see the module docstring), or None; ``marked_only``: only an answer in
    tags, a box or after "the answer is"."""
    found = final_answer(completion_text(completion))
    if found.text is None or found.is_hedged() or (marked_only and found.source not in _MARKED):
        return None
    return found.text


class ReasoningGymReward:
    """Scores completions with the task's own ``score_answer`` on the row's ``reasoning_gym_entry``."""

    def __init__(self, partial_credit: bool = False):
        self.partial_credit = partial_credit
        self.__name__ = "reasoning_gym" if not partial_credit else "reasoning_gym_partial"

    def __call__(self, completions: list, reasoning_gym_entry: list, **kwargs: Any) -> list[float | None]:
        scores: list[float | None] = []
        for completion, stored in zip(completions, reasoning_gym_entry, strict=True):
            if not stored:
                scores.append(None)
                continue
            entry = json.loads(stored) if isinstance(stored, str) else stored
            answer = extract_reasoning_gym_answer(completion, marked_only=self.partial_credit)
            if answer is None:
                scores.append(0.0)
                continue
            score = float(_scorer(entry["metadata"]["source_dataset"])(answer, entry))
            scores.append(score if self.partial_credit else float(score >= 1.0))
        return scores


reasoning_gym_reward = ReasoningGymReward()
