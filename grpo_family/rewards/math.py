"""Math accuracy reward: 1.0 if the model's final answer equals the gold answer under math-verify, else 0.0.

What is compared
    *Model answer*: the last complete ``<answer>...</answer>`` block if any, else the text after ``</think>`` (the
    whole completion when there is none). In that region the last ``\\boxed{...}`` (nested braces kept) is the
    answer; without a box, an ``<answer>`` block is parsed as a whole and a free-text region only through an anchor
    ("the final answer is ...", "Answer: ..."), as TRL and open-r1 do, so a number merely mentioned while reasoning
    is never taken for the answer. *Gold*: the last ``\\boxed{}`` of the gold text if it has one (a reference
    solution), else the text after GSM8K's ``####``, else the whole string (``"42"``, ``"\\frac{1}{2}"``,
    ``"$x^2+1$"``). Gold strings are parsed once per process (LRU cache keyed by the string). Equivalence is
    math-verify's ``verify`` (numeric, symbolic, sets, intervals, ``\\frac{1}{2}`` == ``0.5``).

``None`` versus ``0.0``
    ``None`` means "cannot score" (TRL turns it into NaN and leaves the completion out of the advantage
    statistics): the gold is missing or unparseable, or scoring ran past its deadline (``timeout_reward``, default
    None; set it to 0.0 to punish answers too expensive to check). A model answer that cannot be found or parsed
    scores **0.0**: failing to give a readable answer is a wrong answer by the model, not a failure of ours.

Timeouts
    math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are disabled and every
    (completion, gold) pair runs under :mod:`grpo_family.rewards.timeout`'s deadline instead, which works in any
    thread (default backend: killable worker subprocess).

Metrics
    When TRL passes ``log_metric`` the reward logs, per call, the fraction of completions with an unparseable or
    missing gold (``math/unparseable_gold``), an unreadable model answer (``math/unparseable_answer``), a missed
    deadline (``math/timeouts``) and an internal error (``math/errors``). Running totals are kept in ``.counts``.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from .extract import answer_region, completion_text, last_boxed
from .timeout import BACKENDS, get_runner

__all__ = ["MathAccuracyReward", "math_accuracy_reward", "parse_answer", "parse_gold", "score_math"]


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeouts are off; they are off on purpose (see module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())

# A bare expression (a gold string, a box's or an <answer> block's content) is wrapped in $...$ and parsed with
# anchor-free extraction; free text only through anchors ("final answer is", "Answer:"). Boxes are found by
# ``last_boxed`` (last box, nested braces) before math-verify sees the text, so its own box matching is off there.
_BARE_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_ANCHORED_CONFIG = (
    LatexExtractionConfig(boxed_match_priority=-1, try_extract_without_anchor=False),
    ExprExtractionConfig(try_extract_without_anchor=False),
)

_GOLD_CACHE_SIZE = 65536

# Result statuses of :func:`score_math`.
OK, BAD_GOLD, BAD_ANSWER = "ok", "unparseable_gold", "unparseable_answer"


def _parse_bare(expr: str) -> list:
    expr = expr.strip()
    if not expr:
        return []
    text = expr if ("$" in expr or "\\(" in expr or "\\[" in expr) else f"${expr}$"
    parsed = parse(text, extraction_config=_BARE_CONFIG, extraction_mode="first_match", parsing_timeout=None)
    if not parsed and text is not expr:
        parsed = parse(expr, extraction_config=_BARE_CONFIG, extraction_mode="first_match", parsing_timeout=None)
    return parsed


@functools.lru_cache(maxsize=_GOLD_CACHE_SIZE)
def _parse_gold_cached(gold: str) -> tuple:
    boxed = last_boxed(gold)
    if boxed is not None:
        return tuple(_parse_bare(boxed))
    if "####" in gold:  # GSM8K: reasoning, then "#### 42"
        return tuple(_parse_bare(gold.rsplit("####", 1)[1].replace(",", "")))
    return tuple(_parse_bare(gold))


def parse_gold(gold: Any) -> list:
    """math-verify parse of a gold answer (see module docstring); ``[]`` when missing or unparseable. Cached."""
    if gold is None:
        return []
    if not isinstance(gold, str):
        gold = str(gold)
    if not gold.strip():
        return []
    return list(_parse_gold_cached(gold))


def parse_answer(text: str) -> list:
    """math-verify parse of the model's final answer in a completion text; ``[]`` when there is none."""
    region, explicit = answer_region(text)
    boxed = last_boxed(region)
    if boxed is not None:
        return _parse_bare(boxed)
    if explicit:
        return _parse_bare(region)
    if not region.strip() or "\\boxed" in region or "\\fbox" in region:
        return []  # an unfinished box (cut off mid-answer) is no answer
    return parse(region, extraction_config=_ANCHORED_CONFIG, extraction_mode="first_match", parsing_timeout=None)


def score_math(text: str, gold: Any) -> tuple[str, float | None]:
    """``(status, reward)`` for one completion text: ``(OK, 1.0 | 0.0)``, ``(BAD_GOLD, None)`` or
    ``(BAD_ANSWER, 0.0)``. No deadline here; callers run it through a timeout runner."""
    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return BAD_GOLD, None
    answer_parsed = parse_answer(text)
    if not answer_parsed:
        return BAD_ANSWER, 0.0
    return OK, float(verify(gold_parsed, answer_parsed, timeout_seconds=None))


class MathAccuracyReward:
    """TRL reward function: math-verify accuracy, 1.0 / 0.0 / None. See the module docstring.

    Args:
        timeout: seconds allowed per completion (gold parse + answer parse + verify); None disables the deadline.
        backend: ``"process"`` (default; killable worker subprocess), ``"thread"`` or ``"none"``; see
            :mod:`grpo_family.rewards.timeout`.
        num_workers: worker subprocesses per training process (``"process"`` backend).
        timeout_reward: reward of a completion whose scoring missed the deadline (default None: cannot score).
        name: the function name TRL logs the reward under.

    Called as ``reward(completions, answer=[...])`` (or ``solution=[...]`` when there is no ``answer`` column: a
    reference solution whose last ``\\boxed{}`` is the gold). Instances are picklable (the worker pool is a
    per-process shared object, not part of the instance).
    """

    def __init__(
        self,
        *,
        timeout: float | None = 10.0,
        backend: str = "process",
        num_workers: int = 1,
        timeout_reward: float | None = None,
        name: str = "math_accuracy",
    ):
        if backend not in BACKENDS:
            raise ValueError(f"unknown timeout backend {backend!r}; valid: {', '.join(BACKENDS)}")
        self.timeout = timeout
        self.backend = backend
        self.num_workers = num_workers
        self.timeout_reward = timeout_reward
        self.__name__ = name
        self.counts: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"MathAccuracyReward(name={self.__name__!r}, timeout={self.timeout}, backend={self.backend!r})"

    def __call__(
        self,
        completions: list,
        answer: list | None = None,
        solution: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        golds = answer if answer is not None else solution
        if golds is None:
            raise ValueError(
                f"{self.__name__} needs the gold answers in an 'answer' (or 'solution') dataset column; prepare "
                "the dataset with grpo_family.collator.prepare_dataset or rename the column"
            )
        if len(golds) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(golds)} gold answers")
        texts = [completion_text(c) for c in completions]
        runner = get_runner(self.backend, self.num_workers, preload=(__name__,))
        outcomes = runner.map(score_math, list(zip(texts, golds)), self.timeout)

        rewards: list[float | None] = []
        batch: Counter[str] = Counter()
        for outcome in outcomes:
            if outcome.status == "ok":
                status, reward = outcome.value
                if status != OK:
                    batch[status] += 1
            elif outcome.status == "timeout":
                batch["timeouts"] += 1
                reward = self.timeout_reward
            else:
                batch["errors"] += 1
                reward = None
            rewards.append(reward)

        batch["total"] = len(completions)
        self.counts.update(batch)
        if log_metric is not None and completions:
            n = len(completions)
            for key in (BAD_GOLD, BAD_ANSWER, "timeouts", "errors"):
                log_metric(f"math/{key}", batch[key] / n)
        return rewards


math_accuracy_reward = MathAccuracyReward()
