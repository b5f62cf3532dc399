"""Start-up checks for ``examples/train.py``: problems that can be known before the first update fail there, with a
message naming the problem and the fix, instead of a traceback from deep inside a library (or hours later).

Each check is a small function raising :class:`PreflightError`; :func:`load_data` reads a dataset from the Hub, a
local file in any format ``datasets`` reads, or a local directory, checking what it reads on the way.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

# File extension -> the `datasets` builder that reads it.
DATA_BUILDERS = {
    ".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".arrow": "arrow",
    ".txt": "text",
}  # fmt: skip
_TEXT_FORMATS = {".jsonl", ".json", ".csv", ".tsv", ".txt"}


class PreflightError(ValueError):
    """A problem found before training: the message names it and says how to fix it."""


def check_batch_size(args: Any) -> None:
    """Batch sizes of at least 1 (``0`` used to fail in the DataLoader after the first evaluation)."""
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        value = getattr(args, name, 1)
        if value is not None and value < 1:
            raise PreflightError(f"--{name} must be at least 1, got {value}.")


def check_vllm(args: Any) -> None:
    """A vLLM setting this machine cannot run (server mode without CUDA, sleep mode on vLLM's CPU backend)."""
    from .integrations.vllm_cpu import check_vllm_settings

    try:
        check_vllm_settings(args)
    except ValueError as error:
        raise PreflightError(str(error)) from None


def check_model_path(name: str | None, what: str = "--model_name_or_path") -> None:
    """A model given as a local path must exist. Anything written as a path (absolute, ``./``, ``../``, ``~``, or
    with more than one ``/``) is one; ``org/name`` is a Hub id, left to the Hub."""
    if not name or os.path.isdir(os.path.expanduser(name)):
        return
    if _looks_local(name):
        problem = "is a file, not a model directory" if os.path.isfile(name) else "no such directory"
        raise PreflightError(
            f"{what} {name}: {problem}. Give the directory holding config.json and the weights (as written by "
            "save_pretrained), or a Hub id of the form 'org/name'."
        )


def _looks_local(name: str) -> bool:
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or os.path.exists(name)


def check_hub_reachable(push_to_hub: bool, timeout: float = 5.0) -> None:
    """``--push_to_hub`` needs the Hub at the end of the run: check it can be reached now, not after training."""
    if not push_to_hub:
        return
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        raise PreflightError(
            "--push_to_hub needs the Hugging Face Hub, but HF_HUB_OFFLINE is set. Unset it, or drop --push_to_hub "
            "and upload the output directory later (`hf upload`)."
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    _probe(endpoint, timeout, f"--push_to_hub needs the Hugging Face Hub ({endpoint})",
           "Check the network (or HF_ENDPOINT), or drop --push_to_hub and upload the output directory later.")  # fmt: skip


def _probe(url: str, timeout: float, what: str, fix: str) -> None:
    """A TCP connection to ``url``'s host and port, or a :class:`PreflightError` with ``what`` and ``fix``."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            pass
    except OSError as error:
        raise PreflightError(f"{what}, which cannot be reached: {type(error).__name__}: {error}. {fix}") from error


def probe_judge(args: Any, timeout: float = 5.0) -> None:
    """SGPO with an OpenAI-compatible judge: the judge's server must accept a connection at start (a judge that
    refuses every connection would quietly turn SGPO into GRPO)."""
    if getattr(args, "judge_type", None) != "openai" or not getattr(args, "judge_base_url", None):
        return
    _probe(args.judge_base_url, timeout, f"The SGPO judge at {args.judge_base_url}",
           "Start the judge server (e.g. `vllm serve <model>`) or fix --judge_base_url; every judged step would "
           "otherwise fail and SGPO would train as plain GRPO.")  # fmt: skip


def check_quantization(model_args: Any) -> Any:
    """TRL's quantization config for ``--load_in_4bit`` / ``--load_in_8bit``, or a :class:`PreflightError` saying
    why it cannot be honoured here (bitsandbytes missing, no CUDA GPU). None without those flags."""
    if not (getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False)):
        return None
    import torch

    flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
    try:
        importlib.import_module("bitsandbytes")
    except ImportError as error:
        raise PreflightError(
            f"{flag} needs the bitsandbytes package, which is not installed ({error}). `pip install bitsandbytes`, "
            f"or drop {flag}."
        ) from error
    if not torch.cuda.is_available():
        raise PreflightError(f"{flag} quantizes with bitsandbytes, which needs a CUDA GPU; none is available here.")
    from trl import get_quantization_config

    return get_quantization_config(model_args)


def resolve_reward_funcs(names: Sequence[str]) -> list[Callable]:
    """Reward functions by grpo_family name, by TRL's ``trl grpo`` name (``accuracy_reward``,
    ``think_format_reward``, ...) or by dotted import path (``my_pkg.rewards.my_reward``; the current directory is
    importable, as with ``trl grpo``)."""
    from .rewards import REWARD_FUNCS, get_reward_funcs, reward_names

    funcs = []
    for name in names:
        if name in REWARD_FUNCS or name in reward_names():
            funcs.extend(get_reward_funcs([name]))
        elif name in _trl_rewards():
            funcs.append(_trl_rewards()[name])
        elif "." in name:
            module_path, attr = name.rsplit(".", 1)
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            try:
                func = getattr(importlib.import_module(module_path), attr)
            except (ImportError, AttributeError) as error:
                raise PreflightError(
                    f"Reward function {name!r}: cannot import {attr!r} from {module_path!r} "
                    f"({type(error).__name__}: {error}). Check the dotted path; modules are searched on the Python "
                    "path and in the current directory."
                ) from error
            if not callable(func):
                raise PreflightError(f"Reward function {name!r} is a {type(func).__name__}, not a function.")
            funcs.append(func)
        else:
            raise PreflightError(
                f"Unknown reward function {name!r}. Valid names: {', '.join(reward_names())}; TRL's: "
                f"{', '.join(_trl_rewards())}; or a dotted import path such as my_pkg.rewards.my_reward."
            )
    return funcs


@functools.cache
def _trl_rewards() -> dict[str, Callable]:
    """The short names ``trl grpo`` accepts, with its settings."""
    from trl.rewards import (
        accuracy_reward,
        get_soft_overlong_punishment,
        reasoning_accuracy_reward,
        think_format_reward,
    )

    return {
        "accuracy_reward": accuracy_reward,
        "reasoning_accuracy_reward": reasoning_accuracy_reward,
        "think_format_reward": think_format_reward,
        "get_soft_overlong_punishment": get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256),
    }


# ---------------------------------------------------------------------------------------------------- data
def check_text_file(path: str) -> None:
    """A local text data file (JSONL, JSON, CSV, TSV, TXT) that is empty or not UTF-8 fails, naming the file and
    the line (``datasets`` would raise ``StopIteration`` or a ``UnicodeDecodeError`` naming neither)."""
    with open(path, "rb") as f:
        empty = True
        for number, line in enumerate(f, start=1):
            empty = empty and not line.strip()
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise PreflightError(
                    f"{path}, line {number} is not UTF-8: byte 0x{line[error.start]:02x} at column "
                    f"{error.start + 1}. Re-save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`)."
                ) from error
    if empty:
        raise PreflightError(f"{path} is empty: no rows to train on.")


def _data_files(directory: str) -> list[str]:
    return sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(directory)
        for name in names
        if os.path.splitext(name)[1].lower() in DATA_BUILDERS and not name.startswith(".")
    )


def load_data(name: str, config: str | None = None, streaming: bool = False):
    """A ``DatasetDict`` (``IterableDatasetDict`` when streaming) from the Hub, a local data file (a single file is
    the ``train`` split) or a local directory (``config``, when given, is a subdirectory of it; otherwise ignored
    with a warning: configs name Hub builder configurations)."""
    from datasets import load_dataset

    path = os.path.expanduser(name)
    if os.path.isfile(path):
        ext = os.path.splitext(path)[1].lower()
        if ext not in DATA_BUILDERS:
            raise PreflightError(
                f"--dataset_name {name}: unknown data file type {ext!r}. Readable: {', '.join(DATA_BUILDERS)}."
            )
        if ext in _TEXT_FORMATS:
            check_text_file(path)
        if config:
            logger.warning("--dataset_config %r is ignored for the local file %s.", config, name)
        builder = DATA_BUILDERS[ext]
        kwargs = {"delimiter": "\t"} if ext == ".tsv" else {}
        return _load(name, lambda: load_dataset(builder, data_files={"train": path}, streaming=streaming, **kwargs))
    if os.path.isdir(path):
        if config and os.path.isdir(os.path.join(path, config)):
            path = os.path.join(path, config)
        elif config:
            logger.warning(
                "--dataset_config %r is ignored: %s is a local directory without a %r subdirectory.", config, name,
                config,
            )  # fmt: skip
        files = _data_files(path)
        if not files:
            raise PreflightError(f"--dataset_name {name}: no data files ({', '.join(DATA_BUILDERS)}) in {path}.")
        for file in files:
            if os.path.splitext(file)[1].lower() in _TEXT_FORMATS:
                check_text_file(file)
        return _load(name, lambda: load_dataset(path, streaming=streaming))
    if _looks_local(name):  # a path that does not exist: say so, not "Repo id must be in the form ..."
        raise PreflightError(
            f"--dataset_name {name}: no such file or directory. Give a data file ({', '.join(DATA_BUILDERS)}), a "
            "directory of them, or a Hub dataset id of the form 'org/name'."
        )
    return load_dataset(name, name=config, streaming=streaming)


def _load(name: str, load: Callable):
    try:
        return load()
    except PreflightError:
        raise
    except Exception as error:  # noqa: BLE001 - datasets raises many types for unreadable files
        raise PreflightError(
            f"--dataset_name {name}: could not be read ({type(error).__name__}: {error}). Check that every file "
            "holds one format, with the same columns in every row."
        ) from error


def check_split(data: Any, split: str, name: str) -> Any:
    """``data[split]``, which must exist and hold at least one row."""
    if split not in data:
        raise PreflightError(
            f"{name} has no {split!r} split (splits: {', '.join(data)}). Pass --dataset_train_split / "
            "--dataset_test_split, or name the files train.* / test.* in a directory."
        )
    rows = data[split]
    empty = len(rows) == 0 if hasattr(rows, "__len__") else next(iter(rows), None) is None
    if empty:
        raise PreflightError(f"The {split!r} split of {name} has no rows.")
    return rows


def check_gsm8k_markers(rows: Any, preset: str, answer_column: str | None = None, max_examples: int = 5) -> None:
    """GSM8K-style rows (preset ``gsm8k``, given or detected) give their gold after ``####``. Rows without it used
    to be read as free text and scored 0: fail, naming them, when some rows have the marker and others do not, or
    when ``--dataset_preset gsm8k`` is given and rows lack it."""
    column = answer_column or "answer"
    if preset not in ("auto", "gsm8k") or column not in (getattr(rows, "column_names", None) or ()):
        return
    if not hasattr(rows, "__len__"):  # a stream: judge its first rows
        rows = [row for _, row in zip(range(100), rows)]
        answers = [row[column] for row in rows]
    else:
        answers = rows[column]
    marked = [isinstance(a, str) and "####" in a for a in answers]
    if preset == "auto" and not any(marked):
        return  # plain question / answer data
    missing = [i for i, ok in enumerate(marked) if not ok]
    if missing:
        examples = "; ".join(f"row {i}: {answers[i]!r:.60}" for i in missing[:max_examples])
        raise PreflightError(
            f"{len(missing)} of {len(answers)} GSM8K-style rows have no '#### <answer>' in the {column!r} column, so "
            f"they have no gold answer ({examples}). Fix or drop those rows, or pass --dataset_preset qa if the "
            "answers are plain text."
        )
