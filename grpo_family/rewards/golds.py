"""Fail-fast check of the gold answers a dataset gives its reward functions: no gold is lost without a word.

A gold the reward cannot read scores None ("cannot score") for every completion, so its row silently drops out of
training. :func:`check_golds` reads every gold once, before training, the way each reward will, and reports the
count and a few examples per reward; it raises when so many are unreadable that the dataset is surely mis-mapped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from .choice import ChoiceAccuracyReward, gold_letter
from .math import MathAccuracyReward, parse_gold
from .qa import QAReward, gold_aliases, normalize_answer
from .timeout import get_runner
from .values import integer_value

__all__ = ["GoldReport", "check_golds"]

logger = logging.getLogger(__name__)


class GoldReport(dict):
    """``{reward name: (unreadable count, total, [up to max_examples (row, gold) pairs])}``."""


def _math_gold_ok(gold: Any) -> bool:
    return bool(parse_gold(gold))


def _arithmetic_gold_ok(gold: Any) -> bool:
    return not isinstance(gold, bool) and integer_value(str(gold).strip()) is not None


def _checker(func: Any):
    """``(name, per-gold check, column)`` for the rewards that read an ``answer`` gold; None for the others."""
    name = getattr(func, "__name__", type(func).__name__)
    if isinstance(func, MathAccuracyReward):
        return name, "math", func
    if isinstance(func, ChoiceAccuracyReward):
        return name, lambda g: gold_letter(g, func.letters) is not None, func
    if isinstance(func, QAReward):
        return name, lambda g: any(normalize_answer(a) for a in gold_aliases(g)), func
    if name in ("arithmetic", "arithmetic_reward"):  # the bundled task's function, registered as "arithmetic"
        return "arithmetic", _arithmetic_gold_ok, func
    return None


def check_golds(
    dataset_or_golds: Any,
    reward_funcs: Iterable[Any],
    *,
    max_examples: int = 5,
    max_unreadable: float = 0.5,
) -> GoldReport:
    """Read every gold of ``dataset_or_golds`` (a prepared dataset with an ``answer`` column, or ``solution`` for
    math when there is none, or a list of golds) as each of ``reward_funcs`` will, log a warning per reward with
    the count of golds it cannot read and up to ``max_examples`` of them, and return the report.

    Raises ValueError when more than ``max_unreadable`` (a fraction) of the golds are unreadable for some reward:
    the column is surely mis-mapped, and training would learn nothing from those rows. Rewards that do not read an
    ``answer`` gold (format, code tests, custom functions) are skipped. Math golds are parsed under the reward's
    own deadline, so a pathological gold cannot hang the check.
    """
    report = GoldReport()
    for func in reward_funcs:
        found = _checker(func)
        if found is None:
            continue
        name, check, reward = found
        golds = _golds_for(dataset_or_golds, name)
        if golds is None:
            continue
        if check == "math":
            runner = get_runner(reward.backend, reward.num_workers, preload=("grpo_family.rewards.math",))
            outcomes = runner.map(_math_gold_ok, [(g,) for g in golds], reward.timeout)
            readable = [o.status == "ok" and o.value for o in outcomes]
        else:
            readable = [check(g) for g in golds]
        bad = [(i, g) for i, (g, ok) in enumerate(zip(golds, readable)) if not ok]
        report[name] = (len(bad), len(golds), bad[:max_examples])
        if bad:
            examples = ", ".join(f"row {i}: {g!r:.80}" for i, g in bad[:max_examples])
            logger.warning(
                "%s cannot read %d of %d gold answers; those rows score None (no training signal). Examples: %s",
                name,
                len(bad),
                len(golds),
                examples,
            )
        if golds and len(bad) / len(golds) > max_unreadable:
            raise ValueError(
                f"{name} cannot read {len(bad)} of {len(golds)} gold answers (more than {max_unreadable:.0%}); "
                f"examples: {[g for _, g in bad[:max_examples]]!r}. Check the answer column mapping "
                "(--answer_column / --dataset_preset) or the reward functions chosen."
            )
    return report


def _golds_for(data: Any, name: str) -> Sequence | None:
    columns = getattr(data, "column_names", None)
    if columns is None:
        return list(data)
    if "answer" in columns:
        return list(data["answer"])
    if name.startswith("math") and "solution" in columns:
        return list(data["solution"])
    return None
