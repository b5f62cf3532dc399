"""Multiple-choice accuracy (RiddleSense, MedQA, MMLU-style data): 1.0 if the chosen letter is the gold letter.

The model's letter is looked for, in this order, in: the last ``<answer>...</answer>`` block (else the text after
``</think>``); its last ``\\boxed{...}``; the whole ``<answer>`` block; the last anchored phrase ("the answer is
(C)", "Answer: C", "correct option is C"); a bare letter (``"C"``, ``"(C)"``, ``"C."``) as the whole region. Letters
are upper case, except that a region which is a single letter may be lower case. ``"C. Pneumonia"`` counts as C.

An answer with no extractable letter scores **0.0** (the model did not answer). A gold that is missing or is not a
single letter of ``letters`` scores **None** (cannot score). Gold integers are refused (0- or 1-based is ambiguous):
:func:`grpo_family.collator.prepare_dataset` turns index golds into letters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from .extract import answer_region, completion_text, last_boxed

__all__ = ["ChoiceAccuracyReward", "choice_accuracy_reward", "extract_choice", "gold_letter"]

DEFAULT_LETTERS = "ABCDE"

# LaTeX/markdown wrappers around a letter: \text{C}, \mathrm{C}, **C**, $C$.
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_LEADING_WORDS = re.compile(r"^(?:(?:the\s+)?(?:final\s+|correct\s+)?(?:answer|option|choice)\s*(?:is|:)?\s*)+", re.I)


def _clean(s: str) -> str:
    s = _WRAPPERS.sub(r"\1", s)
    s = s.replace("**", "").replace("$", "").replace("`", "").strip()
    s = _LEADING_WORDS.sub("", s).strip()
    s = re.sub(r"^[:\-]\s*", "", s)
    return s


def _letter_of(region: str, letters: str) -> str | None:
    """The letter a short answer region names: ``"C"``, ``"(C)"``, ``"C."``, ``"C) text"``, ``"C. text"``."""
    s = _clean(region)
    # Patterns here never put two unbounded whitespace runs next to each other: a completion with a long run of
    # spaces would otherwise make the regex backtrack quadratically (or worse) before failing.
    if re.fullmatch(r"[\(\[]?\s*[A-Za-z](?:\s*[\)\]])?\s*[.:]?", s):
        letter = re.search(r"[A-Za-z]", s).group(0).upper()
        return letter if letter in letters else None
    m = re.match(r"[\(\[]?\s*([A-Z])(?:\s*[\)\]][\s.:]*|\s*[.:]\s+|\s*$)", s)
    if m and m.group(1) in letters:
        return m.group(1)
    return None


def _anchored(region: str, letters: str) -> str | None:
    pattern = re.compile(
        r"(?i:answer|option|choice)(?:\s*(?i:is|:|=))?(?:\s*(?i:option|choice))?(?:\s*[:\-])?"
        r"[\*\$\s]*(?:\\text\s*\{\s*)?(?:[\(\[]\s*)?([" + re.escape(letters) + r"])(?![A-Za-z0-9])"
    )
    matches = list(pattern.finditer(region))
    return matches[-1].group(1) if matches else None


def extract_choice(text: str, letters: str = DEFAULT_LETTERS) -> str | None:
    """The option letter a completion text commits to, or None (see the module docstring for the order)."""
    region, explicit = answer_region(text)
    boxed = last_boxed(region)
    if boxed is not None:
        return _letter_of(boxed, letters)
    if explicit:
        return _letter_of(region, letters) or _anchored(region, letters)
    return _anchored(region, letters) or _letter_of(region, letters)


def gold_letter(gold: Any, letters: str = DEFAULT_LETTERS) -> str | None:
    """The gold option letter (``"C"``, ``"c"``, ``"(C)"``, ``"C. text"``), or None if it is not one."""
    if not isinstance(gold, str) or not gold.strip():
        return None
    return _letter_of(gold, letters)


class ChoiceAccuracyReward:
    """TRL reward function: multiple-choice accuracy, 1.0 / 0.0 / None, gold letters in the ``answer`` column.

    ``letters`` is the set of valid option letters (default ``"ABCDE"``; e.g. ``"ABCDEFGHIJ"`` for ten options).
    Logs ``choice/unparseable_gold`` and ``choice/unparseable_answer`` (fractions of the call) via ``log_metric``.
    """

    def __init__(self, letters: str = DEFAULT_LETTERS, *, name: str = "choice_accuracy"):
        letters = "".join(dict.fromkeys(letters.upper()))
        if not letters or not letters.isalpha():
            raise ValueError(f"letters must be a non-empty string of letters, got {letters!r}")
        self.letters = letters
        self.__name__ = name
        self.counts: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"ChoiceAccuracyReward(letters={self.letters!r})"

    def __call__(
        self,
        completions: list,
        answer: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        if answer is None:
            raise ValueError(f"{self.__name__} needs the gold option letters in an 'answer' dataset column")
        if len(answer) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(answer)} gold answers")
        rewards: list[float | None] = []
        batch: Counter[str] = Counter()
        for completion, gold in zip(completions, answer):
            g = gold_letter(gold, self.letters)
            if g is None:
                batch["unparseable_gold"] += 1
                rewards.append(None)
                continue
            pred = extract_choice(completion_text(completion), self.letters)
            if pred is None:
                batch["unparseable_answer"] += 1
            rewards.append(float(pred == g))
        batch["total"] = len(completions)
        self.counts.update(batch)
        if log_metric is not None and completions:
            for key in ("unparseable_gold", "unparseable_answer"):
                log_metric(f"choice/{key}", batch[key] / len(completions))
        return rewards


choice_accuracy_reward = ChoiceAccuracyReward()
