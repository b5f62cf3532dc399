"""Math accuracy reward: 1.0 if the model's final answer equals the gold answer under math-verify, else 0.0.

What is compared
    *Model answer*: the final answer of the one extraction policy (:func:`grpo_family.rewards.extract.final_answer`,
    written down in ``docs/answer_extraction.md``): only text after ``</think>``; the last ``<answer>`` block, in
    it (or in the whole final region) the last ``\\boxed{}`` / ``\\fbox{}`` (boxes joined by "and" or "," are one
    answer with several parts); without a box, the span after the last anchor ("the final answer is", "Answer:")
    to the end of its sentence; without an anchor, a completion that is nothing but a short expression ("42").
    A hedge scores 0.0, never its first candidate: "or" / "either" / "maybe" in the answer (``\\text{}`` included,
    which math-verify would drop), boxes joined by "or", a retraction after the answer ("just kidding", "wait",
    "actually"), or a relation between two numeric values (``\\boxed{21 = 18}``, ``18 \\approx 21``; ``x = 5``
    is an answer). ``\\$`` is a dollar sign (money), not a maths delimiter, in answers and golds alike.
    *Gold*: a reference solution's boxed answer (:func:`grpo_family.rewards.extract.solution_gold`: boxes joined
    by "and" / "," become a tuple, an ambiguous solution is refused), else the text after GSM8K's ``####``, else
    the whole string (``"42"``, ``"\\frac{1}{2}"``, ``"$x^2+1$"``, ``"\\$18.90"``). Numbers are read as text;
    NaN is no gold. Gold strings are parsed once per process (LRU cache). Equivalence is math-verify's ``verify``.

``None`` versus ``0.0``
    ``None`` means "cannot score" (TRL turns it into NaN and leaves the completion out of the advantage
    statistics): the gold is missing, NaN or unparseable, an internal error, or the call's budget ran out before
    the item was started. A model answer that cannot be found or parsed, or is a hedge, scores **0.0**.

Cost: parser bombs cannot escape or stall
    An answer that would make the parser or sympy run for ages (a parser bomb: braces nested deeper than 24, a
    numeric power tower such as ``9^{9^{9^{9}}}``, an exponent or factorial argument of 6 or more digits, more than
    1000 characters) is refused by a cheap pre-check before math-verify sees it; whatever slips through runs in a
    killable worker under a per-item deadline (``timeout``). Both score ``timeout_reward``, **default 0.0 (wrong)**,
    so a policy gains nothing by producing them; set it to None to leave them unscored. The whole call has a budget
    (``call_budget``, default 1.5 x ``timeout``) that bombs cannot multiply: items still running when it ends
    are timeouts, items not yet started score None. Several workers (``num_workers``, default up to 4) score in
    parallel.

Timeouts
    math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are disabled and every
    (answer, gold) pair runs under :mod:`grpo_family.rewards.timeout`'s deadline instead, which works in any
    thread (default backend: killable worker subprocess).

Metrics
    When TRL passes ``log_metric`` the reward logs, per call, the fraction of completions with an unparseable or
    missing gold (``math/unparseable_gold``), an unreadable model answer (``math/unparseable_answer``), a hedged
    answer (``math/hedged``), a parser bomb refused by the pre-check or past the deadline (``math/timeouts``), an
    item left unstarted by the call budget (``math/over_budget``) and an internal error (``math/errors``). Running
    totals are kept in ``.counts``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from .extract import _TEXT_MACRO, completion_text, final_answer, solution_gold
from .timeout import BACKENDS, get_runner

__all__ = [
    "MathAccuracyReward",
    "math_accuracy_reward",
    "math_answer_span",
    "parse_answer",
    "parse_gold",
    "score_math",
    "too_expensive",
]


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeouts are off; they are off on purpose (see module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())

# A bare expression (a gold string, a box's or an <answer> block's content) is wrapped in $...$ and parsed with
# anchor-free extraction; an anchored span ("the answer is 18 apples") through math-verify's anchors, so words
# after the number are not read as maths. Boxes are found by the extraction policy before math-verify sees the text.
_BARE_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_ANCHORED_CONFIG = (
    LatexExtractionConfig(boxed_match_priority=-1, try_extract_without_anchor=False),
    ExprExtractionConfig(try_extract_without_anchor=False),
)

_GOLD_CACHE_SIZE = 65536

# Result statuses of :func:`score_math`.
OK, BAD_GOLD, BAD_ANSWER, HEDGED, TOO_EXPENSIVE = (
    "ok",
    "unparseable_gold",
    "unparseable_answer",
    "hedged",
    "timeouts",
)

# Parser-bomb pre-check limits (see too_expensive).
_MAX_ANSWER_CHARS = 1000
_MAX_BRACE_DEPTH = 24
_BIG_NUMBER_ARGUMENT = re.compile(r"\^\s*\{?\s*\d{6,}|\d{6,}\s*!|!\s*\)\s*!")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_RELATION = re.compile(r"=|\\approx\b|\\simeq\b|\\neq?\b|≈")
# A lone expression standing as the whole completion ("42", "$\frac{1}{2}$"): no word of two or more letters.
_WORD = re.compile(r"[A-Za-z]{2,}")


def _money(expr: str) -> str:
    r"""``\$`` is a dollar sign: dropped, so ``\$1,234.50`` reads as 1234.50. A lone unescaped ``$`` right before a
    number (an odd count: no closing delimiter) is a dollar sign too."""
    expr = expr.replace("\\$", "")
    if expr.count("$") % 2 == 1:
        expr = re.sub(r"\$(?=\s*\d)", "", expr, count=1)
    return expr


def _numeric_relation(span: str) -> bool:
    r"""A relation between two numeric values (``21 = 18``, ``18 \approx 21``, ``18 + 1 = 19``): two candidates,
    one of which math-verify would silently pick. ``x = 5`` and ``a + b = 7`` name what the number is."""
    sides = _RELATION.split(_TEXT_MACRO.sub(" ", span))
    if len(sides) < 2:
        return False
    numeric = 0
    for side in sides:
        bare = _LATEX_COMMAND.sub(" ", side)
        if re.search(r"\d", bare) and not re.search(r"[A-Za-z]", bare):
            numeric += 1
    return numeric >= 2


def _tower(span: str) -> bool:
    """A numeric power tower (an exponent that has an exponent, no variable in it): ``9^{9^{9^{9}}}``,
    ``10^10^10``. Evaluating it exactly takes sympy forever; ``e^{x^2}`` is symbolic and cheap."""
    for m in re.finditer(r"\^", span):
        i = m.end()
        while i < len(span) and span[i] == " ":
            i += 1
        if i < len(span) and span[i] == "{":
            depth, j = 0, i
            while j < len(span):
                depth += {"{": 1, "}": -1}.get(span[j], 0)
                if depth == 0:
                    break
                j += 1
            argument, after = span[i : j + 1], span[j + 1 :]
        else:
            token = re.match(r"-?[\d.]+|\\?[A-Za-z]+", span[i:])
            argument = token.group(0) if token else ""
            after = span[i + len(argument) :]
        nested = "^" in argument or after.lstrip().startswith("^")
        if nested and not re.search(r"[A-Za-z]", _LATEX_COMMAND.sub(" ", argument)):
            return True
    return False


def too_expensive(answer: str) -> str:
    """Why a math answer is a parser bomb (checked before math-verify sees it), or ``""``. Cheap: linear in the
    answer, and the answer is bounded first."""
    if len(answer) > _MAX_ANSWER_CHARS:
        return f"longer than {_MAX_ANSWER_CHARS} characters"
    depth = deepest = 0
    for ch in answer:
        if ch == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == "}":
            depth -= 1
    if deepest > _MAX_BRACE_DEPTH:
        return f"braces nested deeper than {_MAX_BRACE_DEPTH}"
    if _BIG_NUMBER_ARGUMENT.search(answer):
        return "an exponent or factorial of 6 or more digits"
    if _tower(answer):
        return "a numeric power tower"
    return ""


def _parse_bare(expr: str) -> list:
    expr = _money(expr).strip()
    if not expr:
        return []
    text = expr if ("$" in expr or "\\(" in expr or "\\[" in expr) else f"${expr}$"
    parsed = parse(text, extraction_config=_BARE_CONFIG, extraction_mode="first_match", parsing_timeout=None)
    if not parsed and text is not expr:
        parsed = parse(expr, extraction_config=_BARE_CONFIG, extraction_mode="first_match", parsing_timeout=None)
    return parsed


def _parse_span(span: str, source: str) -> list:
    if source == "anchor":
        text = f"The final answer is {_money(span)}"
        parsed = parse(text, extraction_config=_ANCHORED_CONFIG, extraction_mode="first_match", parsing_timeout=None)
        return parsed or _parse_bare(span)
    return _parse_bare(span)


def _gold_text(gold: Any) -> str | None:
    """The gold as text; None for a missing, empty or NaN gold (a NaN float, as pandas gives a missing value)."""
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, float) and not math.isfinite(gold):
        return None
    text = gold if isinstance(gold, str) else str(gold)
    return text if text.strip() and text.strip().lower() not in ("nan", "none") else None


@functools.lru_cache(maxsize=_GOLD_CACHE_SIZE)
def _parse_gold_cached(gold: str) -> tuple:
    if "\\boxed" in gold or "\\fbox" in gold:
        boxed, _ = solution_gold(gold)
        return tuple(_parse_bare(boxed)) if boxed is not None and not too_expensive(boxed) else ()
    if "####" in gold:  # GSM8K: reasoning, then "#### 42"
        gold = gold.rsplit("####", 1)[1].replace(",", "")
    return () if too_expensive(gold) else tuple(_parse_bare(gold))


def parse_gold(gold: Any) -> list:
    """math-verify parse of a gold answer (see module docstring); ``[]`` when missing, NaN or unparseable. Cached."""
    text = _gold_text(gold)
    return [] if text is None else list(_parse_gold_cached(text))


def math_answer_span(text: str) -> tuple[str, str | None, str]:
    """``(status, span, source)``: the final answer span of a completion under the extraction policy, or why there
    is none (status ``BAD_ANSWER``, ``HEDGED`` or ``TOO_EXPENSIVE``; ``OK`` with the span otherwise)."""
    found = final_answer(text)
    if found.text is None:
        return BAD_ANSWER, None, found.source
    span = found.text
    if found.source == "whole":  # no box, tag or anchor: only a lone short expression is an answer
        if "\n" in span.strip() or _WORD.search(_LATEX_COMMAND.sub(" ", _TEXT_MACRO.sub(" ", span))):
            return BAD_ANSWER, None, found.source
        if len(span) > 200 or "\\boxed" in span or "\\fbox" in span:
            return BAD_ANSWER, None, found.source
    if found.is_hedged() or _numeric_relation(span):
        return HEDGED, None, found.source
    if too_expensive(span):
        return TOO_EXPENSIVE, None, found.source
    return OK, span, found.source


def parse_answer(text: str) -> list:
    """math-verify parse of the model's final answer in a completion text; ``[]`` when there is none, it is a
    hedge, or it is a parser bomb."""
    status, span, source = math_answer_span(text)
    return _parse_span(span, source) if status == OK else []


def _score_span(span: str, source: str, gold: Any) -> tuple[str, float | None]:
    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return BAD_GOLD, None
    answer_parsed = _parse_span(span, source)
    if not answer_parsed:
        return BAD_ANSWER, 0.0
    return OK, float(verify(gold_parsed, answer_parsed, timeout_seconds=None))


def _worker_warm_up() -> None:
    """Run by a reward worker before it reports ready (:mod:`grpo_family.rewards.timeout`): math-verify builds its
    LaTeX parser on first use (0.1-0.5 s), which belongs to the worker's start-up, not to an answer's deadline."""
    verify(_parse_bare("1"), _parse_span("1", "anchor"), timeout_seconds=None)


def score_math(text: str, gold: Any, timeout_reward: float | None = 0.0) -> tuple[str, float | None]:
    """``(status, reward)`` for one completion text: ``(OK, 1.0 | 0.0)``, ``(BAD_GOLD, None)``,
    ``(BAD_ANSWER, 0.0)``, ``(HEDGED, 0.0)`` or ``(TOO_EXPENSIVE, timeout_reward)``. No deadline here; the reward
    runs the parsing through a timeout runner."""
    if _gold_text(gold) is None:
        return BAD_GOLD, None
    status, span, source = math_answer_span(text)
    if status == TOO_EXPENSIVE:
        return status, timeout_reward
    if status != OK:
        return (BAD_GOLD, None) if not parse_gold(gold) else (status, 0.0)
    return _score_span(span, source, gold)


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class MathAccuracyReward:
    """TRL reward function: math-verify accuracy, 1.0 / 0.0 / None. See the module docstring.

    Args:
        timeout: seconds allowed per completion (gold parse + answer parse + verify); None disables the deadline.
        backend: ``"process"`` (default; killable worker subprocess), ``"thread"`` or ``"none"``; see
            :mod:`grpo_family.rewards.timeout`.
        num_workers: worker subprocesses per training process (``"process"`` backend); default
            ``min(4, cpu_count)``.
        timeout_reward: reward of a parser bomb (refused by the pre-check or past the deadline); default 0.0, a
            wrong answer, so that producing one never pays. None leaves such completions unscored.
        call_budget: seconds for the whole call, however many completions are bombs (default 1.5 x ``timeout``;
            None: no budget). Items running when it ends are timeouts; items not started score None.
        name: the function name TRL logs the reward under.

    Called as ``reward(completions, answer=[...])`` (or ``solution=[...]`` when there is no ``answer`` column: a
    reference solution whose boxed answer is the gold). Instances are picklable (the worker pool is a per-process
    shared object, not part of the instance).
    """

    def __init__(
        self,
        *,
        timeout: float | None = 10.0,
        backend: str = "process",
        num_workers: int | None = None,
        timeout_reward: float | None = 0.0,
        call_budget: float | None = -1.0,
        name: str = "math_accuracy",
    ):
        if backend not in BACKENDS:
            raise ValueError(f"unknown timeout backend {backend!r}; valid: {', '.join(BACKENDS)}")
        self.timeout = timeout
        self.backend = backend
        self.num_workers = _default_workers() if num_workers is None else num_workers
        self.timeout_reward = timeout_reward
        # -1 is "the default": 1.5 x timeout, so one bomb per worker plus normal answers fit, four bombs do not
        # make four timeouts.
        if call_budget is not None and call_budget < 0:
            call_budget = None if timeout is None else 1.5 * timeout
        self.call_budget = call_budget
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
        rewards: list[float | None] = [None] * len(completions)
        batch: Counter[str] = Counter()
        jobs, job_rows = [], []
        # Extraction, hedges and the bomb pre-check are cheap and run here; only parsing goes to the workers.
        for row, (completion, gold) in enumerate(zip(completions, golds)):
            if _gold_text(gold) is None:
                batch[BAD_GOLD] += 1
                continue
            status, span, source = math_answer_span(completion_text(completion))
            if status == OK:
                jobs.append((span, source, gold))
                job_rows.append(row)
            elif status == TOO_EXPENSIVE:
                batch[TOO_EXPENSIVE] += 1
                rewards[row] = self.timeout_reward
            else:  # no answer or a hedge: wrong, provided the gold itself can be scored
                jobs.append(("", "none", gold))
                job_rows.append(row)
                batch[status] += 1
        runner = get_runner(self.backend, self.num_workers, preload=(__name__,))
        outcomes = runner.map(_score_span, jobs, self.timeout, budget=self.call_budget)
        for row, (span, _, _), outcome in zip(job_rows, jobs, outcomes):
            if outcome.status == "ok":
                status, reward = outcome.value
                if span == "":  # the answer was already judged wrong; only the gold's status counts here
                    reward = None if status == BAD_GOLD else 0.0
                    if status == BAD_GOLD:
                        batch[BAD_GOLD] += 1
                elif status != OK:
                    batch[status] += 1
            elif outcome.status == "timeout":
                batch[TOO_EXPENSIVE] += 1
                reward = self.timeout_reward
            elif outcome.status == "skipped":
                batch["over_budget"] += 1
                reward = None
            else:
                batch["errors"] += 1
                reward = None
            rewards[row] = reward

        batch["total"] = len(completions)
        self.counts.update(batch)
        if log_metric is not None and completions:
            n = len(completions)
            for key in (BAD_GOLD, BAD_ANSWER, HEDGED, TOO_EXPENSIVE, "over_budget", "errors"):
                log_metric(f"math/{key}", batch[key] / n)
        return rewards


math_accuracy_reward = MathAccuracyReward()
