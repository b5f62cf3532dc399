"""Open-domain QA rewards (HotpotQA, NQ, SQuAD style): exact match and token F1 after SQuAD normalisation.

Normalisation (the SQuAD / HotpotQA evaluation scripts): lower case, drop punctuation, drop the articles
"a", "an", "the", collapse whitespace. Token F1 is the harmonic mean of token precision and recall (token counts as
multisets). As in HotpotQA's script, when either side normalises to "yes", "no" or "noanswer" and the two differ,
F1 is 0.

The prediction is the text of the completion's one answer slot under the answer contract
(``docs/answer_extraction.md``, :mod:`grpo_family.rewards.contract`): the final region after ``</think>``, no hiding
markup, exactly one slot (an ``<answer>`` tag, a box, an anchor line ``Answer: ...`` / ``The answer is ...``, or a
one-line final region) and nothing after it; text macros are unwrapped and Markdown emphasis removed. A completion
that breaks the contract, or whose slot is empty, scores 0.0 under both metrics and is counted in
``<name>/contract_violations``. The slot must hold the answer alone; a slot that holds more ("Paris or Lyon",
"Paris, the capital of France") is compared as it is and is wrong (the reward cannot tell it from a wrong answer).

The gold may be a string, a number (compared as its text: ``1912``, ``3.5``), a list of aliases (the best alias
counts), or a SQuAD ``answers`` dict with a ``text`` list. A missing, empty or NaN gold scores None (cannot score);
an empty prediction scores 0.0.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Any

from .contract import ANSWER_SLOTS, AnswerReward, read_answer
from .values import list_separators, strip_wrappers, unwrap_text_macros

__all__ = [
    "QAReward",
    "exact_match_score",
    "extract_qa_answer",
    "f1_score",
    "gold_aliases",
    "normalize_answer",
    "qa_exact_match_reward",
    "qa_f1_reward",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_SPECIAL = {"yes", "no", "noanswer"}


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, gold: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 between the normalised strings (HotpotQA rule for yes/no/noanswer)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    if not pred_tokens or not ref_tokens:
        return float(pred_tokens == ref_tokens)
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def extract_qa_answer(text: str, mode: str = "train") -> str:
    """The predicted answer string of a completion (see the module docstring); ``""`` when the completion breaks
    the answer contract."""
    reading = read_answer(text, ANSWER_SLOTS, mode)
    if reading.value is None:
        return ""
    return " ".join(strip_wrappers(unwrap_text_macros(reading.value)).replace("**", "").split())


def _alias_text(alias: Any) -> str | None:
    if alias is None or isinstance(alias, bool):
        return None
    if isinstance(alias, float):
        if not math.isfinite(alias):
            return None  # NaN: pandas' missing value
        return str(int(alias)) if alias.is_integer() else str(alias)
    text = str(alias)
    return text if text.strip() else None


def gold_aliases(gold: Any) -> list[str]:
    """The non-empty gold strings: a string, a number, a list of aliases, or a SQuAD ``{"text": [...]}`` dict."""
    if isinstance(gold, dict):
        gold = gold.get("text", gold.get("aliases"))
    if not isinstance(gold, list | tuple | set):
        gold = [gold]
    return [text for g in gold if (text := _alias_text(g)) is not None]


class QAReward(AnswerReward):
    """TRL reward function: ``metric`` ``"em"`` (exact match) or ``"f1"`` against the ``answer`` column,
    maximised over aliases. ``mode``: ``"train"`` (default, the answer contract) or ``"eval"`` (the last slot
    counts, text after it is ignored); a call's ``mode=`` overrides it. Logs ``<name>/contract_violations`` and
    ``qa/unparseable_gold`` via ``log_metric``."""

    def __init__(self, metric: str = "em", *, mode: str = "train", name: str | None = None):
        if metric not in ("em", "f1"):
            raise ValueError(f"unknown QA metric {metric!r}; valid: em, f1")
        super().__init__(mode, name or ("qa_exact_match" if metric == "em" else "qa_f1"))
        self.metric = metric

    def __repr__(self) -> str:
        return f"QAReward({self.metric!r}, mode={self.mode!r})"

    gold_metric = "qa/unparseable_gold"

    def _gold(self, gold: Any) -> list[str] | None:
        return [a for a in gold_aliases(gold) if normalize_answer(a)] or None

    def _score(self, text: str, gold: list[str], mode: str) -> tuple[float, bool]:
        pred = extract_qa_answer(text, mode)
        if not normalize_answer(pred):
            return 0.0, True
        if list_separators(pred) > max(list_separators(alias) for alias in gold):
            return 0.0, True  # a list of answers ("Paris or London"): token F1 would pay each of them
        score = exact_match_score if self.metric == "em" else f1_score
        return max(score(pred, alias) for alias in gold), False


qa_exact_match_reward = QAReward("em")
qa_f1_reward = QAReward("f1")
