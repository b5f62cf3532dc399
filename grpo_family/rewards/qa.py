"""Open-domain QA rewards (HotpotQA, NQ, SQuAD style): exact match and token F1 after SQuAD normalisation.

Normalisation (the SQuAD / HotpotQA evaluation scripts): lower case, drop punctuation, drop the articles
"a", "an", "the", collapse whitespace. Token F1 is the harmonic mean of token precision and recall (token counts as
multisets). As in HotpotQA's script, when either side normalises to "yes", "no" or "noanswer" and the two differ,
F1 is 0.

The prediction is the final answer of the one extraction policy (:func:`grpo_family.rewards.extract.final_answer`,
``docs/answer_extraction.md``): only text after ``</think>``; the last ``<answer>`` block; in it (or the whole
final region) the last ``\\boxed{}`` (``\\text{}`` unwrapped); else the span after the last "answer is" /
"Answer:" to the end of its sentence (inside an ``<answer>`` block too: ``<answer>The answer is Paris</answer>`` is
"Paris"); else the whole region. A hedge scores 0.0 under both metrics: "or" / "either" / "maybe" in the answer
(unless the gold itself has the word: "Trick or Treat"), two ``<answer>`` blocks joined by "or", or a retraction
after the answer ("Just kidding, it is London.").

The gold may be a string, a number (compared as its text: ``1912``, ``3.5``), a list of aliases (the best alias
counts), or a SQuAD ``answers`` dict with a ``text`` list. A missing, empty or NaN gold scores None (cannot score);
an empty prediction scores 0.0.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable
from typing import Any

from .extract import completion_text, final_answer

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


def extract_qa_answer(text: str, gold_words: Any = ()) -> str:
    """The predicted answer string of a completion (see the module docstring); ``""`` when there is none or it is
    a hedge. ``gold_words``: words of the gold, which are no hedge ("or" in "Trick or Treat")."""
    found = final_answer(text)
    if found.text is None or found.is_hedged(gold_words):
        return ""
    if found.source == "box":
        return re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", found.text)
    return found.text


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
            gold_words = {w for a in aliases for w in re.findall(r"\w+", a.lower())}
            pred = extract_qa_answer(completion_text(completion), gold_words)
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
