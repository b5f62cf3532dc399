"""reasoning-gym tasks as datasets: ``--dataset_name reasoning_gym/<task>`` (``pip install -e ".[realmodel]"``).

reasoning-gym (https://github.com/open-thought/reasoning-gym) generates about 100 kinds of problems offline, each
with its own verifier (``score_answer``). :func:`reasoning_gym_splits` turns one task into a ``DatasetDict`` with a
``train`` and a ``test`` split that never share a problem: the test problems are generated at indices after the
training ones, and any whose question text equals a training question is skipped (small tasks repeat questions).
Each row keeps the whole reasoning-gym entry (question, answer, metadata) as JSON in the ``reasoning_gym_entry``
column, which the ``reasoning_gym`` reward (:mod:`grpo_family.rewards.reasoning_gym`) hands back to the task's own
``score_answer``; the collator's ``reasoning_gym`` preset turns the rows into prompts with a system prompt that states
the answer format, and keeps the gold in ``answer`` so the project's answer rewards score the same rows.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

__all__ = ["DATASET_PREFIX", "ENTRY_COLUMN", "install_hint", "reasoning_gym_splits", "task_name"]

DATASET_PREFIX = "reasoning_gym/"
ENTRY_COLUMN = "reasoning_gym_entry"
_INSTALL = 'pip install -e ".[realmodel]" (or `pip install reasoning-gym`)'
# Options that are not the task's own: how many problems, and the seed of the generator.
SPLIT_OPTIONS = ("size", "seed")


def task_name(dataset_name: str) -> str | None:
    """``chain_sum`` for ``reasoning_gym/chain_sum``; None for any other dataset name."""
    if isinstance(dataset_name, str) and dataset_name.startswith(DATASET_PREFIX):
        return dataset_name[len(DATASET_PREFIX) :]
    return None


def install_hint() -> str:
    return _INSTALL


def _import_reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(f"reasoning-gym datasets need the reasoning-gym package: {_INSTALL}.") from error
    return reasoning_gym


def _task_classes(task: str):
    _import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise ValueError(f"Unknown reasoning-gym task {task!r}. Tasks: {', '.join(sorted(DATASETS))}.")
    return DATASETS[task]


def _create(task: str, size: int, seed: int, options: dict[str, Any]):
    dataset_cls, config_cls = _task_classes(task)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        own = sorted(fields - set(SPLIT_OPTIONS))
        raise ValueError(
            f"reasoning-gym task {task!r} has no option {', '.join(map(repr, unknown))}. Its options: "
            f"{', '.join(own)} (plus size and seed)."
        )
    _check_option_types(task, config_cls, options)
    config = config_cls(size=size, seed=seed, **options)
    if hasattr(config, "validate"):
        try:
            config.validate()
        except AssertionError as error:  # reasoning-gym validates with asserts
            raise ValueError(f"reasoning-gym task {task!r}, options {options}: {error or 'invalid options'}") from None
    return dataset_cls(config=config)


def _check_option_types(task: str, config_cls: type, options: dict[str, Any]) -> None:
    """An option of another type than its default (``"max_terms": "two"``) is named here; reasoning-gym would fail
    later on a comparison that names no option (``'>=' not supported ...``)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls) if f.default is not dataclasses.MISSING}
    wrong = []
    for name, value in options.items():
        default = defaults.get(name)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, (int, float)):  # an int option takes an int; a float option any number
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = number and (isinstance(value, int) or isinstance(default, float))
        elif isinstance(default, str):
            ok = isinstance(value, str)
        else:
            continue  # None or a container default: reasoning-gym's validate() checks it
        if not ok:
            wrong.append(
                f"{name} must be of type {type(default).__name__} like its default {default!r}, got {value!r}"
            )
    if wrong:
        raise ValueError(f"reasoning-gym task {task!r}: " + "; ".join(wrong) + ".")


def _row(entry: dict[str, Any], task: str) -> dict[str, Any]:
    try:
        stored = json.dumps(entry)
    except TypeError as error:
        raise ValueError(f"reasoning-gym task {task!r}: an entry cannot be stored as JSON ({error}).") from None
    answer = entry.get("answer")
    return {"question": entry["question"], "answer": None if answer is None else str(answer), ENTRY_COLUMN: stored}


def reasoning_gym_splits(task: str, *, size: int = 2000, eval_size: int = 200, seed: int = 0, **options: Any):
    """``DatasetDict(train=..., test=...)`` of the reasoning-gym task ``task``: ``size`` training problems and up to
    ``eval_size`` held-out problems, none of which repeats a training question, generated from ``seed`` with the
    task's own ``options`` (fields of its config class, e.g. ``min_terms`` / ``max_terms`` for ``chain_sum``).

    Columns: ``question``, ``answer`` (the gold, as text) and ``reasoning_gym_entry`` (the entry as JSON). Raises
    ValueError for an unknown task or option (listing the valid ones), ImportError when reasoning-gym is missing.
    """
    from datasets import Dataset, DatasetDict

    if size < 1 or eval_size < 0:
        raise ValueError(
            f"reasoning-gym task {task!r}: size must be >= 1 and eval_size >= 0, got {size}, {eval_size}."
        )
    # Held-out candidates come after the training indices; 10x spare covers tasks that repeat questions.
    pool = size + 10 * max(eval_size, 1)
    data = _create(task, pool, seed, options)
    train = [data[i] for i in range(size)]
    seen = {entry["question"] for entry in train}
    test = []
    for i in range(size, pool):
        if len(test) == eval_size:
            break
        entry = data[i]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            test.append(entry)
    if eval_size and not test:
        raise ValueError(
            f"reasoning-gym task {task!r}: every candidate held-out problem repeats a training question (the task's "
            f"options allow too few distinct problems for size={size}); lower size or widen the options."
        )
    rows = {"train": [_row(e, task) for e in train], "test": [_row(e, task) for e in test]}
    _check_stored_entries(task, data, rows["train"][:20])
    return DatasetDict({split: Dataset.from_list(part) for split, part in rows.items() if part})


def _check_stored_entries(task: str, data, rows: list[dict[str, Any]]) -> None:
    """The task's verifier must accept the gold answer on the entry as stored (JSON turns tuples into lists, ...):
    otherwise every completion would score 0 and the run could not learn."""
    for row in rows:
        entry = json.loads(row[ENTRY_COLUMN])
        if row["answer"] is not None and data.score_answer(row["answer"], entry) < 1.0:
            raise ValueError(
                f"reasoning-gym task {task!r}: its verifier does not give the gold answer full marks on the stored "
                f"entry ({row['question'][:80]!r} -> {row['answer']!r}), so it cannot be trained on here."
            )
