"""Evaluation datasets: the papers' benchmarks by name or Hub id, local files, the bundled arithmetic task, and
datasets the collator knows by name (``reasoning_gym/<task>``). Every dataset goes through
:func:`grpo_family.collator.prepare_dataset`, so prompts and golds are what training sees.

=================  ===========================  =======  ======================================================
name               Hub id (config)              split    columns (the Hub layout; gold)
=================  ===========================  =======  ======================================================
``aime24``         HuggingFaceH4/aime_2024      train    id, problem, solution, answer, url, year; ``answer``
``aime25``         opencompass/AIME2025         test     question, answer, in configs AIME2025-I and
                   (AIME2025-I + AIME2025-II)            AIME2025-II (concatenated); ``answer``
``amc23``          knoveleng/AMC-23             train    id, url, question, problem, answer (a float64); ``answer``
``math500``        HuggingFaceH4/MATH-500       test     problem, solution, answer, subject, level, unique_id
``gsm8k``          openai/gsm8k (main)          test     question, answer (worked answer ending ``#### N``)
``minerva``        knoveleng/Minerva-Math       train    problem, solution, type, idx; the boxed answer of
                                                         ``solution``
``olympiadbench``  knoveleng/OlympiadBench      train    id, question, solution (list), final_answer (list),
                                                         context, unit, answer_type, error, is_multiple_answer,
                                                         subfield, answer; ``answer``
=================  ===========================  =======  ======================================================

``name=path`` evaluates a local copy of a benchmark (same columns, any file type ``datasets`` reads) under that
benchmark's settings; the tests use this with stand-in files of each layout. A Hub id that is neither in the table
nor cached fails before any model loads, saying how to fetch it.

``reasoning_gym/<task>`` generates the task offline with the ``--dataset_options`` examples/train.py was given,
so its ``test`` split is the run's own held-out set (no training question in it); its rows then go through
``prepare_dataset`` like any other, and the task's own verifier (the ``reasoning_gym`` reward) scores them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from grpo_family.preflight import looks_local

from ..errors import DatasetFormatError, EvalSetupError, PreflightError

__all__ = ["BENCHMARKS", "BUNDLED", "Benchmark", "EvalData", "load_eval_data"]

logger = logging.getLogger(__name__)

BUNDLED = "arithmetic"  # the demo's task: its held-out split, as examples/train.py scores it
BUNDLED_DEFAULT_EXAMPLES = 200


@dataclass(frozen=True)
class Benchmark:
    """A benchmark the papers evaluate on: where it lives on the Hub and how its columns map to prompt and gold."""

    name: str
    title: str
    hub_id: str
    split: str
    columns: tuple[str, ...]
    configs: tuple[str | None, ...] = (None,)
    preset: str = "math"  # the collator preset
    question_column: str | None = None
    answer_column: str | None = None


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("aime24", "AIME 2024", "HuggingFaceH4/aime_2024", "train",
                  ("id", "problem", "solution", "answer", "url", "year")),
        Benchmark("aime25", "AIME 2025", "opencompass/AIME2025", "test", ("question", "answer"),
                  configs=("AIME2025-I", "AIME2025-II"), question_column="question"),
        Benchmark("amc23", "AMC 2023", "knoveleng/AMC-23", "train", ("id", "url", "question", "problem", "answer")),
        Benchmark("math500", "MATH-500", "HuggingFaceH4/MATH-500", "test",
                  ("problem", "solution", "answer", "subject", "level", "unique_id")),
        Benchmark("gsm8k", "GSM8K", "openai/gsm8k", "test", ("question", "answer"), configs=("main",),
                  preset="gsm8k"),
        Benchmark("minerva", "Minerva Math", "knoveleng/Minerva-Math", "train", ("problem", "solution", "type", "idx")),
        Benchmark("olympiadbench", "OlympiadBench", "knoveleng/OlympiadBench", "train",
                  ("id", "question", "solution", "final_answer", "context", "unit", "answer_type", "error",
                   "is_multiple_answer", "subfield", "answer"),
                  question_column="question", answer_column="answer"),
    )
}  # fmt: skip
_BY_HUB_ID = {b.hub_id.lower(): b for b in BENCHMARKS.values()}


@dataclass
class EvalData:
    """A prepared evaluation dataset: ``rows`` has ``prompt`` and the gold column the reward reads."""

    name: str
    source: str
    rows: Any  # datasets.Dataset
    reward: str
    gold_column: str = "answer"
    settings: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def held_out(cls, rows, reward, name: str = "held-out") -> EvalData | None:
        """Rows already prepared for training (``prompt`` plus ``answer`` or ``test_cases``) as an evaluation set
        scored by ``reward``; None for no rows."""
        if rows is None or len(rows) == 0:
            return None
        reward_name = getattr(reward, "__name__", type(reward).__name__)
        return cls(name, "held-out rows", rows, reward_name, gold_column=_gold_column(rows))


def _gold_column(rows) -> str:
    return "test_cases" if "test_cases" in rows.column_names and "answer" not in rows.column_names else "answer"


def _hub_load(hub_id: str, config: str | None, split: str, what: str):
    """One split from the Hub (or its cache); EvalSetupError with the fix when it cannot be had."""
    from datasets import load_dataset

    try:
        return load_dataset(hub_id, name=config, split=split)
    except Exception as error:  # noqa: BLE001 - offline, missing, gated: all end in the same advice
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        fetch = f"load_dataset({hub_id!r}{'' if config is None else f', {config!r}'}, split={split!r})"
        raise EvalSetupError(
            f"{what}: cannot load {hub_id}{'' if config is None else f' ({config})'} split {split!r}"
            f"{' (HF_HUB_OFFLINE is set and it is not in the datasets cache)' if offline else ''}: "
            f"{type(error).__name__}: {str(error)[:300]}. Fetch it once with network "
            f'(python -c "from datasets import load_dataset; {fetch}"), or evaluate a local copy with the same '
            "columns: --dataset <name>=<file>."
        ) from error


def _local_rows(path: str, what: str):
    """Rows of a local data file or directory (its only split, or ``test``, else ``train``)."""
    from grpo_family.preflight import load_data

    try:
        data = load_data(path)
    except PreflightError as error:
        raise EvalSetupError(f"{what}: {error}") from error
    for split in ("test", "train"):
        if split in data:
            return data[split]
    return data[next(iter(data))]


def _bundled(limit: int | None, difficulty: str):
    from grpo_family.tasks import make_arithmetic_dataset

    return make_arithmetic_dataset("eval", limit or BUNDLED_DEFAULT_EXAMPLES, seed=0, difficulty=difficulty)


def _named(name: str, split: str | None, limit: int | None, options: dict | str | None):
    """``reasoning_gym/<task>``: the held-out (``test``) split examples/train.py holds out for the same
    ``--dataset_options`` (its first ``limit`` problems, default 200), or ``split``."""
    from grpo_family.preflight import load_reasoning_gym

    try:
        splits = load_reasoning_gym(name, options, eval_size=limit or BUNDLED_DEFAULT_EXAMPLES)
    except PreflightError as error:
        raise EvalSetupError(str(error)) from None
    split = split or "test"
    if split not in splits:
        raise EvalSetupError(f"Dataset {name!r} has no split {split!r} (splits: {', '.join(splits)}).")
    return splits[split]


def _check_golds(data: EvalData) -> None:
    """A dataset whose golds are all missing cannot be scored: refuse it now, naming the column flag."""
    rows = data.rows
    column = data.gold_column
    if column not in rows.column_names:
        raise EvalSetupError(
            f"Dataset {data.name!r} ({data.source}) has no gold column {column!r} after preparation (columns: "
            f"{rows.column_names}). Name the column holding the answers with --answer_column."
        )
    golds = rows[column]
    missing = sum(g is None or (isinstance(g, str) and not g.strip()) for g in golds)
    if missing == len(golds):
        raise EvalSetupError(
            f"Dataset {data.name!r} ({data.source}): none of its {len(golds)} rows has a gold answer in {column!r}. "
            "Name the column holding the answers with --answer_column (or --dataset_preset), or evaluate a dataset "
            "with answers."
        )
    if missing:
        logger.warning("%s: %d of %d rows have no gold answer; they are reported as unscored.", data.name, missing,
                       len(golds))  # fmt: skip


def load_eval_data(
    given: str,
    *,
    limit: int | None = None,
    split: str | None = None,
    config: str | None = None,
    reward: str | None = None,
    difficulty: str = "default",
    dataset_options: dict | str | None = None,
    **columns: Any,
) -> EvalData:
    """The dataset ``given`` names, prepared by the collator, with the reward that scores it.

    ``given``: a benchmark name or Hub id of :data:`BENCHMARKS`, ``name=path`` (a local copy of a benchmark),
    ``arithmetic`` (the bundled task's held-out split), a collator-known name (``reasoning_gym/<task>``), a local
    data file or directory, or another Hub dataset id (``split`` default ``test``). ``columns`` are
    :func:`~grpo_family.collator.prepare_dataset`'s options (``preset``, ``question_column``, ``answer_column``,
    ``system_prompt``, ``user_instruction``, ...; None values ignored), which win over a benchmark's. ``limit`` keeps
    the first rows. ``dataset_options``: a reasoning-gym task's size, seed and options, as examples/train.py's
    ``--dataset_options`` (the same options give the same held-out problems). Raises :class:`EvalSetupError` for an
    unknown name, an unloadable source or no golds at all.
    """
    from grpo_family.collator import prepare_dataset

    options = {key: value for key, value in columns.items() if value is not None}
    benchmark, local = None, None
    name, _, path = given.partition("=")
    if path:
        benchmark = BENCHMARKS.get(name)
        if benchmark is None:
            raise EvalSetupError(
                f"--dataset {given}: {name!r} is not a benchmark ({', '.join(BENCHMARKS)}); "
                "give a plain path to evaluate a local file with the collator's detection."
            )
        local = path
    else:
        benchmark = BENCHMARKS.get(given) or _BY_HUB_ID.get(given.lower())
    default_reward = "math_accuracy"
    if benchmark is not None:
        name = benchmark.name
        if local is not None:
            raw, source = _local_rows(local, f"--dataset {given}"), f"{local} (layout of {benchmark.hub_id})"
        else:
            from datasets import concatenate_datasets

            parts = [
                _hub_load(benchmark.hub_id, cfg, split or benchmark.split, f"Benchmark {name}")
                for cfg in ((config,) if config else benchmark.configs)
            ]
            raw, source = concatenate_datasets(parts) if len(parts) > 1 else parts[0], benchmark.hub_id
        options = {
            "preset": benchmark.preset,
            "question_column": benchmark.question_column,
            "answer_column": benchmark.answer_column,
            **options,
        }
        options = {key: value for key, value in options.items() if value is not None}
    elif given == BUNDLED:
        raw, source, default_reward = _bundled(limit, difficulty), "grpo_family.tasks (held-out split)", "arithmetic"
        options = {"preset": "prompt", **options}
    elif given.startswith("reasoning_gym/"):  # generated offline, scored by the task's own verifier
        raw, default_reward = _named(given, split, limit, dataset_options), "reasoning_gym"
        source = "grpo_family.tasks.reasoning_gym_splits (the split examples/train.py holds out)"
    elif os.path.exists(os.path.expanduser(given)) or looks_local(given):
        raw, source = _local_rows(given, f"--dataset {given}"), given
    elif "/" in given:
        raw, source = _hub_load(given, config, split or "test", f"--dataset {given}"), given
    else:
        raise EvalSetupError(
            f"Unknown dataset {given!r}. Give a benchmark ({', '.join(BENCHMARKS)}), {BUNDLED!r} (the bundled task), "
            "a local data file or directory, a Hub dataset id (org/name), or reasoning_gym/<task>."
        )
    if limit is not None:
        raw = raw.select(range(min(limit, len(raw))))
    try:
        rows = prepare_dataset(raw, **options)
    except DatasetFormatError as error:
        raise EvalSetupError(f"Dataset {given!r}: {error}") from error
    data = EvalData(
        name=name if benchmark is not None else given,
        source=source,
        rows=rows,
        reward=reward or default_reward,
        gold_column="test_cases"
        if "test_cases" in rows.column_names and "answer" not in rows.column_names
        else "answer",
        settings={"given": given, "limit": limit, "split": split, "config": config, **options},
    )
    _check_golds(data)
    return data
