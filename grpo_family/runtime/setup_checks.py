"""Checks of a trainer's datasets and reward functions made at init, before any generation."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

# Keyword arguments TRL passes to every reward function that do not come from dataset columns.
_TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
# A reward written per sample, ``(prompt, completion)``: TRL passes the whole batch under the plural names.
_PER_SAMPLE_NAMES = {"prompt": "prompts", "completion": "completions", "completion_id": "completion_ids"}


def _blank_content(content: Any) -> bool:
    if content is None:
        return True
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):  # content parts: an image (or any non-text part) is content
        return all(
            isinstance(part, dict) and part.get("type", "text") == "text" and not str(part.get("text") or "").strip()
            for part in content
        )
    return False


def is_empty_prompt(prompt: Any) -> bool:
    """Whether a ``prompt`` column entry asks nothing: a blank string, or a message list whose user messages (all
    messages when there is no user message) have no text and no image. Other types are not judged (False)."""
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        messages = [m for m in prompt if isinstance(m, dict)]
        users = [m for m in messages if m.get("role") == "user"]
        return all(_blank_content(m.get("content")) for m in users or messages)
    return False


def check_prompts(train_dataset: Any, eval_dataset: Any) -> None:
    """Fail at start on rows with an empty prompt (see :func:`is_empty_prompt`).

    TRL would generate from a chat template with no question in it, or from zero tokens, which crashes
    ``generate`` whenever a whole batch is empty: a random crash hours into a run. Streamed datasets cannot be
    scanned up front and are not checked.
    """
    named = [("training set", train_dataset)]
    if isinstance(eval_dataset, dict):
        named += [(f"evaluation set {key!r}", value) for key, value in eval_dataset.items()]
    elif eval_dataset is not None:
        named.append(("evaluation set", eval_dataset))
    for name, dataset in named:
        if "prompt" not in (getattr(dataset, "column_names", None) or ()) or not hasattr(dataset, "_fingerprint"):
            continue
        empty = [i for i, prompt in enumerate(dataset["prompt"]) if is_empty_prompt(prompt)]
        if empty:
            shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
            raise ValueError(
                f"{len(empty)} of {len(dataset)} rows of the {name} have an empty prompt (no question text; rows "
                f"{shown}). Drop them before training: `dataset = dataset.filter(lambda row: not "
                "is_empty_prompt(row['prompt']))` with `from grpo_family.runtime.setup_checks import is_empty_prompt`, "
                "or point the collator's question_column= at the column that holds the questions."
            )


def check_reward_columns(dataset: Any, reward_funcs: Iterable[Any], reward_func_names: Iterable[str]) -> None:
    """Fail at start if a reward function needs a column the training set does not have."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        return
    for func, name in zip(reward_funcs, reward_func_names):
        if isinstance(func, torch.nn.Module):
            continue
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        for param in params:
            required = param.default is inspect.Parameter.empty and param.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                inspect.Parameter.KEYWORD_ONLY,
            )
            if required and param.name in _PER_SAMPLE_NAMES and param.name not in columns:
                raise ValueError(
                    f"Reward function '{name}' takes '{param.name}', but TRL calls a reward once per batch, by "
                    f"keyword: '{_PER_SAMPLE_NAMES[param.name]}' (a list, one item per completion), the other batch "
                    "lists (prompts, completions, completion_ids) and each dataset column as a list, plus "
                    f"**kwargs. Write it as `def {getattr(func, '__name__', 'reward')}(prompts, completions, "
                    "**kwargs)` returning one float (or None) per completion."
                )
            if required and param.name not in _TRL_REWARD_KWARGS and param.name not in columns:
                raise ValueError(
                    f"Reward function '{name}' needs the dataset column '{param.name}', but the training set "
                    f"has only {sorted(columns)}. Rename or map a column to '{param.name}' (for example "
                    f"`dataset.rename_column('<your column>', '{param.name}')`, or the collator's "
                    "answer_column=/question_column= options)."
                )
