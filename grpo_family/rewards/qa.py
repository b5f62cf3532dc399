"""Open-domain QA rewards (HotpotQA, NQ, SQuAD style): exact match and token F1 after SQuAD normalisation.

Normalisation (the SQuAD / HotpotQA evaluation scripts): lower case, drop punctuation, drop the articles
"a", "an", "the", collapse whitespace. Token F1 is the harmonic mean of token precision and recall (token counts as
multisets). As in HotpotQA's script, when either side normalises to "yes", "no" or "noanswer" and the two differ,
F1 is 0.

The prediction is the last ``<answer>...</answer>`` block, else the last ``\\boxed{}`` after any ``</think>``, else
the text after the last "answer is" / "Answer:" up to the end of its line, else the whole text after ``</think>``.
The gold may be a string, a list of aliases (the best alias counts), or a SQuAD ``answers`` dict with a ``text``
list. A missing or empty gold scores None (cannot score); an empty prediction scores 0.0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable
from typing import Any

from .extract import answer_region, completion_text, last_boxed

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
_ANCHOR = re.compile(r"(?i:answer\s*(?:is|:))(?:\s*:)?\s*(.+)")  # no two adjacent \s*: linear on long whitespace
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


def extract_qa_answer(text: str) -> str:
    """The predicted answer string of a completion (see the module docstring); may be ``""``."""
    region, explicit = answer_region(text)
    if explicit:
        return region
    boxed = last_boxed(region)
    if boxed is not None:
        return re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", boxed)
    anchored = list(_ANCHOR.finditer(region))
    if anchored:
        return anchored[-1].group(1).strip()
    return region.strip()


def gold_aliases(gold: Any) -> list[str]:
    """The non-empty gold strings: a string, a list of aliases, or a SQuAD ``{"text": [...]}`` dict."""
    if isinstance(gold, dict):
        gold = gold.get("text", gold.get("aliases"))
    if gold is None:
        return []
    if isinstance(gold, str):
        gold = [gold]
    return [str(g) for g in gold if g is not None and str(g).strip()]


class QAReward:
    """TRL reward function: ``metric`` ``"em"`` (exact match) or ``"f1"`` against the ``answer`` column,
    maximised over aliases. Logs ``qa/unparseable_gold`` and ``qa/empty_answer`` via ``log_metric``."""

    def __init__(self, metric: str = "em", *, name: str | None = None):
        if metric not in ("em", "f1"):
            raise ValueError(f"unknown QA metric {metric!r}; valid: em, f1")
        self.metric = metric
        self.__name__ = name or ("qa_exact_match" if metric == "em" else "qa_f1")
        self.counts: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"QAReward({self.metric!r})"

    def __call__(
        self,
        completions: list,
        answer: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        if answer is None:
            raise ValueError(f"{self.__name__} needs the gold answers in an 'answer' dataset column")
        if len(answer) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(answer)} gold answers")
        score = exact_match_score if self.metric == "em" else f1_score
        rewards: list[float | None] = []
        batch: Counter[str] = Counter()
        for completion, gold in zip(completions, answer):
            aliases = [a for a in gold_aliases(gold) if normalize_answer(a)]
            if not aliases:
                batch["unparseable_gold"] += 1
                rewards.append(None)
                continue
            pred = extract_qa_answer(completion_text(completion))
            if not normalize_answer(pred):
                batch["empty_answer"] += 1
                rewards.append(0.0)
                continue
            rewards.append(max(score(pred, alias) for alias in aliases))
        batch["total"] = len(completions)
        self.counts.update(batch)
        if log_metric is not None and completions:
            for key in ("unparseable_gold", "empty_answer"):
                log_metric(f"qa/{key}", batch[key] / len(completions))
        return rewards


qa_exact_match_reward = QAReward("em")
qa_f1_reward = QAReward("f1")
