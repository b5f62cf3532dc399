"""Math accuracy reward: 1.0 if the model's final answer equals the gold answer under math-verify, else 0.0.

What is compared
    *Model answer*: the one value of the completion's one answer slot under the training-mode answer contract
    (``docs/answer_extraction.md``, :mod:`grpo_family.rewards.contract`): the final region after ``</think>``, no
    hiding markup, exactly one slot (a box, an ``<answer>`` tag, an anchor line such as ``Answer: 18`` or GSM8K's
    ``#### 18``, or a one-line final region; for a gold of k > 1 values also a list of k boxes on one line,
    :func:`grpo_family.rewards.contract.read_box_list`), nothing but closing punctuation after it, and one value in it
    (:func:`grpo_family.rewards.values.read_math_value`: number words and scale words read, units after a number
    dropped for a numeric gold, ``x = 5`` and ``5 = x`` named values, an inequality in one variable a set; any
    other word, a relation between two values, or more values than the gold has breaks the contract). A completion
    that breaks the contract scores 0.0 and is counted in ``math_accuracy/contract_violations``.
    *Gold*: a reference solution's boxed answer (:func:`grpo_family.rewards.extract.solution_gold`: boxes joined
    by "and" / "," become a tuple, an ambiguous solution is refused), else the text after GSM8K's ``####``, else
    the whole string (``"42"``, ``"\\frac{1}{2}"``, ``"$x^2+1$"``, ``"\\$18.90"``). Numbers are read as text;
    NaN is no gold. Gold strings are parsed once per process (LRU cache).
    *Equivalence*: math-verify's ``verify``, with numbers exact in training mode: every decimal is read as the exact
    rational it writes before comparing (``3.1415927`` is not ``\\pi``, ``0.5`` is ``\\frac12``; a decimal printed to
    machine precision, 15 significant digits or more, is the value within one unit of its last digit:
    :func:`machine_precision_equal`). In evaluation mode (``mode="eval"``) math-verify's own 6-decimal tolerance
    applies, the last of several slots counts and text after it is ignored.

``None`` versus ``0.0``
    ``None`` means "cannot score" (TRL turns it into NaN and leaves the completion out of the advantage
    statistics): the gold is missing, NaN or unparseable, an internal error, or the call's budget ran out before
    the item was started. A completion that breaks the answer contract (no slot, two slots, text after the slot,
    a slot that holds no one value or one math-verify cannot parse) scores **0.0**.

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
    When TRL passes ``log_metric`` the reward logs, per call, the fraction of completions that broke the answer
    contract (``<name>/contract_violations``, ``math_accuracy/contract_violations`` by default), with an
    unparseable or missing gold (``math/unparseable_gold``), a parser bomb refused by the pre-check or past the
    deadline (``math/timeouts``), an item left unstarted by the call budget (``math/over_budget``) and an internal
    error (``math/errors``). Running totals are kept in ``.counts``.
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

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, LatexNormalizationConfig, parse, verify

from .contract import MATH_SLOTS, AnswerReward, Reading, read_answer, read_box_list
from .extract import completion_text, solution_gold
from .timeout import BACKENDS, get_runner
from .values import GoldShape, currency_signs_dropped, normalise_gold, read_math_value

__all__ = [
    "MathAccuracyReward",
    "exact_numbers",
    "gold_text",
    "machine_precision_equal",
    "math_accuracy_reward",
    "math_answer",
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

# A value (a gold, a slot's value) is wrapped in $...$ and parsed with anchor-free extraction: the contract has
# already found the one value, so math-verify never searches a text for an answer. math-verify's unit removal is
# off: it drops trailing words and letters it takes for units ("2ab" parses as 2, "18 more" as 18); units are
# dropped by grpo_family.rewards.values instead, from a list of units, after a number, for a numeric gold.
_BARE_CONFIG = (
    LatexExtractionConfig(
        normalization_config=LatexNormalizationConfig(
            basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False
        )
    ),
    ExprExtractionConfig(),
)

_GOLD_CACHE_SIZE = 65536

# Result statuses of :func:`score_math`.
OK, BAD_GOLD, CONTRACT, TOO_EXPENSIVE = ("ok", "unparseable_gold", "contract_violations", "timeouts")

# Parser-bomb pre-check limits (see too_expensive).
_MAX_ANSWER_CHARS = 1000
_MAX_BRACE_DEPTH = 24
_BIG_NUMBER_ARGUMENT = re.compile(r"\^\s*\{?\s*\d{6,}|\d{6,}\s*!|!\s*\)\s*!")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")


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
    expr = currency_signs_dropped(expr).strip()  # \$1,234.50 reads as 1234.50
    if not expr:
        return []
    text = expr if ("$" in expr or "\\(" in expr or "\\[" in expr) else f"${expr}$"
    parsed = parse(text, extraction_config=_BARE_CONFIG, extraction_mode="first_match", parsing_timeout=None)
    if not parsed and text is not expr:
        parsed = parse(expr, extraction_config=_BARE_CONFIG, extraction_mode="first_match", parsing_timeout=None)
    return parsed


def _gold_text(gold: Any) -> str | None:
    """The gold as text; None for a missing, empty or NaN gold (a NaN float, as pandas gives a missing value)."""
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, float) and not math.isfinite(gold):
        return None
    text = gold if isinstance(gold, str) else str(gold)
    return text if text.strip() and text.strip().lower() not in ("nan", "none") else None


@functools.lru_cache(maxsize=_GOLD_CACHE_SIZE)
def _gold_value(gold: str) -> str | None:
    """The value a gold string states: a reference solution's boxed answer, GSM8K's number after ``####``, or the
    string itself; None for an ambiguous solution or a parser bomb."""
    if "\\boxed" in gold or "\\fbox" in gold:
        gold = solution_gold(gold)[0]
        if gold is None:
            return None
    elif "####" in gold:  # GSM8K: reasoning, then "#### 42"
        gold = gold.rsplit("####", 1)[1].replace(",", "")
    return None if too_expensive(gold) else normalise_gold(gold)


def gold_text(gold: Any) -> str | None:
    """The text of the value a gold states (see :func:`parse_gold`), or None when there is none."""
    text = _gold_text(gold)
    return None if text is None else _gold_value(text)


@functools.lru_cache(maxsize=_GOLD_CACHE_SIZE)
def _parse_gold_cached(gold: str) -> tuple:
    value = _gold_value(gold)
    return () if value is None else tuple(_parse_bare(value))


def parse_gold(gold: Any) -> list:
    """math-verify parse of a gold answer (see module docstring); ``[]`` when missing, NaN or unparseable. Cached."""
    text = _gold_text(gold)
    return [] if text is None else list(_parse_gold_cached(text))


def exact_numbers(parsed: list) -> list:
    """``parsed`` (math-verify's parse: sympy expressions and strings) with every float replaced by the exact
    rational its digits write (``3.1415927`` -> ``31415927/10000000``), so that math-verify's numeric tolerance
    cannot make a rounded decimal equal an irrational or a repeating gold."""
    out = []
    for item in parsed:
        if isinstance(item, sympy.Basic) and item.atoms(sympy.Float):
            item = item.xreplace({f: sympy.Rational(str(f)) for f in item.atoms(sympy.Float)})
        out.append(item)
    return out


def math_answer(text: str, gold: Any, mode: str = "train") -> tuple[str, str | None, bool]:
    """``(status, value, as_set)``: the one value a completion's answer slot holds, as LaTeX for math-verify
    (status ``OK``), or why there is none (``CONTRACT`` with the broken rule as ``value``; ``TOO_EXPENSIVE``).
    ``as_set``: an inequality in one variable, compared with an interval gold as a set."""
    shape = GoldShape(gold_text(gold) or "")
    listed = read_box_list(text, MATH_SLOTS, mode) if shape.parts > 1 else None
    if listed is not None and len(listed) == shape.parts:  # "\\boxed{2} and \\boxed{3}" for the gold "2, 3"
        reading = Reading(", ".join(listed), "box")
    else:
        reading = read_answer(text, MATH_SLOTS, mode)
    if reading.value is None:
        return CONTRACT, reading.violation, False
    if too_expensive(reading.value):  # before any further reading: every step below is then on a bounded text
        return TOO_EXPENSIVE, None, False
    latex, violation, as_set = read_math_value(reading.value, shape, prose=mode != "strict")
    if latex is None:
        return CONTRACT, violation, False
    if too_expensive(latex):
        return TOO_EXPENSIVE, None, False
    return OK, latex, as_set


def parse_answer(text: str, gold: Any = "", mode: str = "train") -> list:
    """math-verify parse of the one value a completion's answer slot holds; ``[]`` when the completion breaks the
    answer contract or the value is a parser bomb. ``gold`` decides how many values the slot may hold and whether
    units may follow a number."""
    status, value, _ = math_answer(text, gold, mode)
    return _parse_bare(value) if status == OK else []


# A decimal printed to machine precision: at least DBL_DIG (15) significant digits, the decimal digits a double
# always keeps. Such a decimal is a computed value (``print(1/12)``), not a rounding guess: ``0.333333`` and
# ``3.1415927`` stay unequal to 1/3 and pi (docs/answer_extraction.md §6).
MACHINE_DIGITS = 15
_DECIMAL = re.compile(r"(-?)(\d+)\.(\d+)")


def machine_precision_equal(value: str, gold_parsed: list) -> bool:
    """Whether ``value`` is a decimal of at least :data:`MACHINE_DIGITS` significant digits within one unit of its
    last digit of the gold's real number (``0.0833333333333333`` for ``\\frac{1}{12}``, rounded or cut off): the
    gold at the precision the decimal is printed to. One value against one gold; the tolerance, under 1e-14 of the
    value, separates no two answers a task would tell apart."""
    m = _DECIMAL.fullmatch(value.strip().replace("−", "-"))
    if m is None or len((m.group(2) + m.group(3)).lstrip("0")) < MACHINE_DIGITS:
        return False
    answer = sympy.Rational(value.strip().replace("−", "-"))
    unit = sympy.Rational(1, 10 ** len(m.group(3)))  # one unit in the last printed place
    for gold in gold_parsed:
        if isinstance(gold, sympy.Expr) and gold.is_number and gold.is_real:
            if sympy.N(abs(answer - gold), 60) <= unit:
                return True
    return False


def _score_value(value: str, gold: Any, as_set: bool = False, exact: bool = True) -> tuple[str, float | None]:
    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return BAD_GOLD, None
    answer_parsed = _parse_bare(value)
    if not answer_parsed:
        return CONTRACT, 0.0  # the slot's value is no maths math-verify can read
    if exact:
        gold_parsed, answer_parsed = exact_numbers(gold_parsed), exact_numbers(answer_parsed)
    correct = verify(
        gold_parsed,
        answer_parsed,
        numeric_precision=50 if exact else 15,
        allow_set_relation_comp=as_set,
        timeout_seconds=None,
    )
    if not correct and exact:
        correct = machine_precision_equal(value, gold_parsed)
    return OK, float(correct)


def _worker_warm_up() -> None:
    """Run by a reward worker before it reports ready (:mod:`grpo_family.rewards.timeout`): math-verify builds its
    LaTeX parser on first use (0.1-0.5 s), which belongs to the worker's start-up, not to an answer's deadline. One
    whole scoring (contract, value reading, parse, verify) warms every lazy table an answer uses."""
    score_math("\\boxed{1}", "1")


def score_math(
    text: str, gold: Any, timeout_reward: float | None = 0.0, mode: str = "train"
) -> tuple[str, float | None]:
    """``(status, reward)`` for one completion text: ``(OK, 1.0 | 0.0)``, ``(BAD_GOLD, None)``,
    ``(CONTRACT, 0.0)`` or ``(TOO_EXPENSIVE, timeout_reward)``. No deadline here; the reward runs the parsing
    through a timeout runner."""
    if _gold_text(gold) is None or not parse_gold(gold):
        return BAD_GOLD, None
    status, value, as_set = math_answer(text, gold, mode)
    if status == TOO_EXPENSIVE:
        return status, timeout_reward
    if status != OK:
        return status, 0.0
    return _score_value(value, gold, as_set, exact=mode != "eval")


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class MathAccuracyReward(AnswerReward):
    """TRL reward function: math-verify accuracy under the answer contract, 1.0 / 0.0 / None. See the module
    docstring.

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
        mode: ``"train"`` (default: the answer contract, exact numbers) or ``"eval"`` (the last slot counts, text
            after it is ignored, math-verify's numeric tolerance); a call's ``mode=`` overrides it.
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
        mode: str = "train",
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
        super().__init__(mode, name)

    def __repr__(self) -> str:
        return (
            f"MathAccuracyReward(name={self.__name__!r}, mode={self.mode!r}, timeout={self.timeout}, "
            f"backend={self.backend!r})"
        )

    def __call__(
        self,
        completions: list,
        answer: list | None = None,
        solution: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        mode: str | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        mode = self._call_mode(mode)
        golds = answer if answer is not None else solution
        self._check_golds(
            completions,
            golds,
            "the gold answers in an 'answer' (or 'solution') dataset column; prepare the dataset with "
            "grpo_family.collator.prepare_dataset or rename the column",
        )
        rewards: list[float | None] = [None] * len(completions)
        batch: Counter[str] = Counter()
        jobs, job_rows = [], []
        # The contract and the bomb pre-check are cheap and run here; only parsing goes to the workers.
        for row, (completion, gold) in enumerate(zip(completions, golds)):
            if _gold_text(gold) is None:
                batch[BAD_GOLD] += 1
                continue
            status, value, as_set = math_answer(completion_text(completion), gold, mode)
            if status == OK:
                jobs.append((value, gold, as_set, mode != "eval"))
                job_rows.append(row)
            elif status == TOO_EXPENSIVE:
                batch[TOO_EXPENSIVE] += 1
                rewards[row] = self.timeout_reward
            else:  # the contract is broken: wrong, provided the gold itself can be scored
                jobs.append(("", gold, False, True))
                job_rows.append(row)
        runner = get_runner(self.backend, self.num_workers, preload=(__name__,))
        outcomes = runner.map(_score_value, jobs, self.timeout, budget=self.call_budget)
        for row, (value, _, _, _), outcome in zip(job_rows, jobs, outcomes):
            if outcome.status == "ok":
                status, reward = outcome.value
                if value == "" and status != BAD_GOLD:  # the contract was broken before any parsing
                    status, reward = CONTRACT, 0.0
                if status != OK:
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

        keys = (BAD_GOLD, TOO_EXPENSIVE, "over_budget", "errors")
        self._report(batch, len(completions), log_metric, {f"math/{key}": key for key in keys})
        return rewards


math_accuracy_reward = MathAccuracyReward()
