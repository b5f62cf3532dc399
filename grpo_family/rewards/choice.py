"""Multiple-choice accuracy (RiddleSense, MedQA, MMLU-style data): 1.0 if the chosen letter is the gold letter.

The answer span is the final answer of the one extraction policy (:func:`grpo_family.rewards.extract.final_answer`,
``docs/answer_extraction.md``): only text after ``</think>``; the last ``<answer>`` block; in it (or the whole
final region) the last ``\\boxed{...}``; else the span after the last anchor ("the answer is (C)", "Answer: C",
"correct option is C"); else the whole region, which counts when it is a bare letter (``"C"``, ``"(C)"``,
``"C. Pneumonia"``) or names one in a sentence ("D is the answer.", "Option B is correct."). The span must start
with the letter (``"C, since A and B are wrong"`` is C). A letter alone (``"(b)"``, ``"c"``, ``"Answer: c"``) may be
lower case; a letter followed by words must be upper case ("the answer is a bit unclear" names no option).

A hedge scores **0.0**, never its first letter: two letters joined by "or" / "and" / "," / "/" ("A or B",
"Answer: B, C", "(B) and (D)"), two options copied ("B. Paris C. Lyon"), boxes joined by "or", hedge words, or a
retraction after the answer ("The answer is B. Wait, no, it is D."). An answer with no extractable letter scores
**0.0** (the model did not answer). A gold that is missing or is not a
single letter of ``letters`` scores **None** (cannot score). Gold integers are refused (0- or 1-based is ambiguous):
:func:`grpo_family.collator.prepare_dataset` turns index golds into letters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from .extract import completion_text, final_answer

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


# "the answer is", "Answer:", "the correct option is", "choice:"; the span after it must start with the letter.
_CHOICE_ANCHOR = re.compile(r"(?i:\b(?:answer|option|choice))(?:\s*(?i:is|:|=))+")
# A second letter right after the first, joined by or / and / , / & / slash: "A or B", "B, C", "(B) and (D)".
_SECOND_LETTER = re.compile(
    r"\s*(?:(?i:,|/|&|\bor\b|\band\b|\bmaybe\b|\bperhaps\b|\bpossibly\b|\beither\b)\s*)+(?:[\(\[]\s*)?([A-Z])(?![A-Za-z])"
)
# A second option copied after the first ("B. Paris C. Lyon"): a letter marker followed by more text.
_SECOND_OPTION = re.compile(r"(?:^|\s)[\(\[]?([A-Z])[.)\]]\s+\S")
# The letter named in a sentence: "D is the answer", "Option B is correct", "(C) is the right choice".
_IN_SENTENCE = re.compile(
    r"(?:^|[\s(])(?i:(?:option|choice)\s+)?[\(\[]?([A-Z])[\)\]]?\s+is\s+(?i:the\s+)?"
    r"(?i:(?:correct|right|best)\s*)?(?i:answer|option|choice|correct|right)\b"
)


def _letter_of(region: str, letters: str, *, anchored: bool = False) -> str | None:
    """The letter a short answer span starts with: ``"C"``, ``"(C)"``, ``"C."``, ``"C) text"``, ``"C. text"``,
    ``"C, since ..."``, ``"C is correct"`` and, after an anchor, ``"E because ..."``; None when there is none or
    the span names a second option. (Without an anchor "A cat" is an article, not an option.)"""
    s = _clean(region)
    # Patterns here never put two unbounded whitespace runs next to each other: a completion with a long run of
    # spaces would otherwise make the regex backtrack quadratically (or worse) before failing.
    if re.fullmatch(r"[\(\[]?\s*[A-Za-z](?:\s*[\)\]])?\s*[.:]?", s):
        letter = re.search(r"[A-Za-z]", s).group(0).upper()
        return letter if letter in letters else None
    m = re.match(r"[\(\[]?\s*([A-Z])(?:\s*[\)\]][\s.:]*|\s*[.:](?=\s)|(?=,)|\s*$|\s+(?=is\b|would\b|seems\b))", s)
    if m is None and anchored:
        m = re.match(r"[\(\[]?\s*([A-Z])\s+(?=[a-z])", s)
    if not (m and m.group(1) in letters):
        return None
    rest = s[m.end() :]
    second = _SECOND_LETTER.match(s, m.end())
    if second and second.group(1) in letters:
        return None  # "A or B", "B, C", "(B) and (D)": two candidates
    if any(o.group(1) in letters for o in _SECOND_OPTION.finditer(rest)):
        return None  # "B. Paris C. Lyon": two options copied
    return m.group(1)


def _letter_in_sentence(region: str, letters: str) -> str | None:
    """ "D is the answer.": the letter, provided it is the only option letter the text names at all ("A is wrong and
    B is right" names two)."""
    cleaned = _clean(region)
    named = {m.group(1) for m in re.finditer(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])", cleaned) if m.group(1) in letters}
    matches = [m.group(1) for m in _IN_SENTENCE.finditer(cleaned) if m.group(1) in letters]
    return matches[-1] if matches and named == {matches[-1]} else None


def extract_choice(text: str, letters: str = DEFAULT_LETTERS) -> str | None:
    """The option letter a completion text commits to, or None (see the module docstring for the policy)."""
    found = final_answer(text, _CHOICE_ANCHOR)
    # Hedge words alone do not make a hedge here (an option's text may say "salt or pepper"): a second letter does.
    if found.text is None or found.hedge:
        return None
    if found.source == "whole":
        return _letter_of(found.text, letters) or _letter_in_sentence(found.text, letters)
    return _letter_of(found.text, letters, anchored=True)


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
