"""Format rewards: 1.0 when a completion has the requested layout, else 0.0 (never None: any text has a format).

* ``think_answer_format``: ``<think>...</think>`` then ``<answer>...</answer>`` and nothing else, each tag exactly
  once, both blocks non-empty (the R1-style layout of the reasoning system prompt in :mod:`grpo_family.collator`).
* ``boxed_format``: ``<think>...</think>`` then text with a complete, non-empty ``\\boxed{...}`` after the think
  block (the boxed system prompt).

Chat templates that open the think block in the prompt (DeepSeek-R1-Distill, Qwen3 thinking) produce completions
without the opening ``<think>``; select ``think_prefilled_answer_format`` / ``think_prefilled_boxed_format`` by name
for those (the same checks with the ``<think>`` put back), or build one with
``make_format_reward(..., think_prefilled=True)``.
Whitespace around the blocks is allowed. A block is empty when the answer contract's test says it shows nothing
(:func:`grpo_family.rewards.contract.is_blank`: only whitespace once invisible characters are removed, or hiding
markup such as ``\\boxed{\\phantom{42}}``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .contract import is_blank
from .extract import completion_text, last_boxed

__all__ = [
    "FormatReward",
    "boxed_format_reward",
    "has_boxed_format",
    "has_think_answer_format",
    "make_format_reward",
    "think_answer_format_reward",
    "think_prefilled_answer_format_reward",
    "think_prefilled_boxed_format_reward",
]

STYLES = ("think_answer", "think_boxed")

_THINK_ANSWER = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_THINK_THEN_REST = re.compile(r"\s*<think>(.*?)</think>(.*)", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _tag_counts(text: str) -> dict[str, int]:
    return {tag: text.count(tag) for tag in _TAGS}


def has_think_answer_format(text: str, *, think_prefilled: bool = False) -> bool:
    """``<think>reasoning</think><answer>answer</answer>`` with every tag once and non-empty blocks."""
    if think_prefilled:
        text = "<think>" + text
    counts = _tag_counts(text)
    if any(n != 1 for n in counts.values()):
        return False
    m = _THINK_ANSWER.fullmatch(text)
    return bool(m and not is_blank(m.group(1)) and not is_blank(m.group(2)))


def has_boxed_format(text: str, *, think_prefilled: bool = False) -> bool:
    """``<think>reasoning</think>`` (tags once, non-empty) followed by text holding a complete ``\\boxed{}``."""
    if think_prefilled:
        text = "<think>" + text
    counts = _tag_counts(text)
    if counts["<think>"] != 1 or counts["</think>"] != 1:
        return False
    m = _THINK_THEN_REST.fullmatch(text)
    box = last_boxed(m.group(2)) if m else None
    return bool(m and not is_blank(m.group(1)) and box is not None and not is_blank(box))


class FormatReward:
    """TRL reward function: 1.0 if a completion has the ``style`` layout (``"think_answer"`` or
    ``"think_boxed"``), else 0.0. Picklable."""

    def __init__(self, style: str = "think_answer", *, think_prefilled: bool = False, name: str | None = None):
        if style not in STYLES:
            raise ValueError(f"unknown format style {style!r}; valid: {', '.join(STYLES)}")
        self.style = style
        self.think_prefilled = think_prefilled
        default = "think_answer_format" if style == "think_answer" else "boxed_format"
        if think_prefilled:
            default = "think_prefilled_answer_format" if style == "think_answer" else "think_prefilled_boxed_format"
        self.__name__ = name or default

    def __repr__(self) -> str:
        return f"FormatReward({self.style!r}, think_prefilled={self.think_prefilled})"

    def __call__(self, completions: list, **kwargs: Any) -> list[float]:
        check: Callable[..., bool] = has_think_answer_format if self.style == "think_answer" else has_boxed_format
        return [float(check(completion_text(c), think_prefilled=self.think_prefilled)) for c in completions]


def make_format_reward(style: str = "think_answer", *, think_prefilled: bool = False) -> FormatReward:
    """A format reward for ``style``; ``think_prefilled=True`` when the chat template opens ``<think>`` itself."""
    return FormatReward(style, think_prefilled=think_prefilled)


think_answer_format_reward = FormatReward("think_answer")
boxed_format_reward = FormatReward("think_boxed")
think_prefilled_answer_format_reward = FormatReward("think_answer", think_prefilled=True)
think_prefilled_boxed_format_reward = FormatReward("think_boxed", think_prefilled=True)
