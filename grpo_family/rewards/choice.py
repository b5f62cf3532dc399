"""Multiple-choice accuracy (RiddleSense, MedQA, MMLU-style data): 1.0 if the chosen letter is the gold letter.

The answer is read under the answer contract (``docs/answer_extraction.md``, :mod:`grpo_family.rewards.contract`):
the final region after ``</think>``, no hiding markup, exactly one answer slot (a box, an ``<answer>`` tag, an anchor
line: ``Answer: C``, ``The correct option is C``, or a one-line final region) and nothing after it. The slot holds
exactly one letter among the options and nothing else (:func:`letter_of`): the letter alone (``C``, ``(C)``,
``[C]``, ``C.``, ``C)``, ``**C**``, ``\\text{C}``; alone it may be lower case), ``Option C``, or ``C is correct`` /
``C is the (correct) answer``. Anything else in the slot — a second letter, the option's text, an explanation, a
word before the letter — breaks the contract: 0.0, counted in ``choice_accuracy/contract_violations``. A gold that
is missing or is not a single letter of ``letters`` scores **None** (cannot score). Gold integers are refused (0- or
1-based is ambiguous): :func:`grpo_family.collator.prepare_dataset` turns index golds into letters.
"""

from __future__ import annotations

import re
from typing import Any

from .contract import CHOICE_SLOTS, AnswerReward, read_answer
from .values import strip_wrappers, unwrap_text_macros

__all__ = ["ChoiceAccuracyReward", "choice_accuracy_reward", "extract_choice", "gold_letter", "letter_of"]

DEFAULT_LETTERS = "ABCDE"

_MARKED = r"[(\[]?\s*(?P<letter>[A-Za-z])\s*[)\]]?"
# The forms a slot may hold: the letter alone (optionally closed by "." ":" ")"), "Option C", "C is correct".
_LETTER_FORMS = (
    re.compile(rf"{_MARKED}\s*[.:)]?"),
    re.compile(rf"(?i:option|choice)\s+{_MARKED}\s*[.:]?"),
    re.compile(
        rf"(?:(?i:option|choice)\s+)?{_MARKED}\s+is\s+(?i:(?:the\s+)?(?:(?:correct|right|best)\b\s*)"
        r"(?:answer|option|choice)?|the\s+answer)\s*[.!]?"
    ),
)


# A letter marked as an option's label, then the option's text: "C. Pneumonia", "(B) 42", "B) 42".
_WITH_TEXT = re.compile(
    r"(?:(?i:option|choice)\s+)?[(\[]?\s*(?P<letter>[A-Z])\s*(?:[)\]]\s*[.:]?|[.:])\s+(?P<text>\S.*)"
)
# Another option letter in the option's text: a marked label ("(D)", "D)", "D:"), "option D", or one joined by a
# separator ("or D", "/ D").
_ANOTHER_LETTER = re.compile(
    r"(?<![A-Za-z])[(\[]\s*[A-Z]\s*[)\]]|(?<![A-Za-z(\[])[A-Z]\s*[):](?!\w)|(?<![A-Za-z.])[A-Z]\.(?=\s)|(?i:option|choice)\s+[A-Z]\b|"
    r"(?:[,;/|]|\b(?:or|and)\b)\s*[(\[]?[A-Z](?![A-Za-z])"
)


def letter_of(value: str, letters: str = DEFAULT_LETTERS, *, option_text: bool = True) -> tuple[str | None, str]:
    """``(letter, "")`` when a slot's text holds exactly one option letter in one of the contract's forms, else
    ``(None, why)``. ``option_text``: the letter may be followed by its option's text (``C. Pneumonia``,
    ``B) 42``), provided that text marks no other letter (the strict contract refuses any text)."""
    text = strip_wrappers(unwrap_text_macros(value))
    text = " ".join(text.replace("**", "").replace("$", "").split())
    if option_text and (m := _WITH_TEXT.fullmatch(text)) is not None:
        letter = m.group("letter")
        if _ANOTHER_LETTER.search(m.group("text")):
            return None, f"another option letter after {letter!r}: {value.strip()[:40]!r}"
        if letter not in letters:
            return None, f"a letter outside the options {letters}: {letter!r}"
        return letter, ""
    for form in _LETTER_FORMS:
        m = form.fullmatch(text)
        if m is not None:
            letter = m.group("letter").upper()
            if letter not in letters:
                return None, f"a letter outside the options {letters}: {letter!r}"
            return letter, ""
    return None, f"not one option letter alone: {value.strip()[:40]!r}"


def extract_choice(text: str, letters: str = DEFAULT_LETTERS, mode: str = "train") -> str | None:
    """The option letter a completion text commits to under the answer contract, or None."""
    reading = read_answer(text, CHOICE_SLOTS, mode)
    return None if reading.value is None else letter_of(reading.value, letters, option_text=mode != "strict")[0]


def gold_letter(gold: Any, letters: str = DEFAULT_LETTERS) -> str | None:
    """The gold option letter (``"C"``, ``"c"``, ``"(C)"``, ``"C. text"``), or None if it is not one."""
    if not isinstance(gold, str) or not gold.strip():
        return None
    m = re.fullmatch(r"\s*[(\[]?\s*([A-Za-z])\s*[)\]]?\s*(?:[.:)]\s*(?:\S.*)?)?", gold, re.S)
    if m is None:
        return None
    letter = m.group(1).upper()
    return letter if letter in letters else None


class ChoiceAccuracyReward(AnswerReward):
    """TRL reward function: multiple-choice accuracy, 1.0 / 0.0 / None, gold letters in the ``answer`` column.

    ``letters`` is the set of valid option letters (default ``"ABCDE"``; e.g. ``"ABCDEFGHIJ"`` for ten options).
    ``mode``: ``"train"`` (default, the answer contract) or ``"eval"`` (the last slot counts, text after it is
    ignored); a call's ``mode=`` overrides it. Logs ``choice_accuracy/contract_violations`` and
    ``choice/unparseable_gold`` (fractions of the call) via ``log_metric``.
    """

    def __init__(self, letters: str = DEFAULT_LETTERS, *, mode: str = "train", name: str = "choice_accuracy"):
        letters = "".join(dict.fromkeys(letters.upper()))
        if not letters or not letters.isalpha():
            raise ValueError(f"letters must be a non-empty string of letters, got {letters!r}")
        super().__init__(mode, name)
        self.letters = letters

    def __repr__(self) -> str:
        return f"ChoiceAccuracyReward(letters={self.letters!r}, mode={self.mode!r})"

    gold_column = "the gold option letters in an 'answer' dataset column"
    gold_metric = "choice/unparseable_gold"

    def _gold(self, gold: Any) -> str | None:
        return gold_letter(gold, self.letters)

    def _score(self, text: str, gold: str, mode: str) -> tuple[float, bool]:
        pred = extract_choice(text, self.letters, mode)
        return float(pred == gold), pred is None


choice_accuracy_reward = ChoiceAccuracyReward()
