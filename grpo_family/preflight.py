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
import re
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse

from .errors import PreflightError

logger = logging.getLogger(__name__)

# File extension -> the `datasets` builder that reads it.
DATA_BUILDERS = {
    ".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".arrow": "arrow",
    ".txt": "text",
}  # fmt: skip
_TEXT_FORMATS = {".jsonl", ".json", ".csv", ".tsv", ".txt"}


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
    if not name:
        return
    if os.path.isdir(os.path.expanduser(name)):
        check_model_folder(os.path.expanduser(name), what)
        return
    if looks_local(name):
        problem = "is a file, not a model directory" if os.path.isfile(name) else "no such directory"
        raise PreflightError(
            f"{what} {name}: {problem}. Give the directory holding config.json and the weights (as written by "
            "save_pretrained), or a Hub id of the form 'org/name'."
        )


# Files one of which every tokenizer transformers can load from a folder holds.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")  # fmt: skip


def check_model_folder(folder: str, what: str = "--model_name_or_path") -> None:
    """A local model folder must hold a model and its tokenizer: a PEFT adapter folder (``adapter_config.json``, no
    ``config.json``) used to fail with "Should have a model_type key", and a folder without tokenizer files loaded a
    one-token tokenizer whose error spoke of the chat template."""
    names = set(os.listdir(folder))
    if "adapter_config.json" in names and "config.json" not in names:
        import json

        try:
            with open(os.path.join(folder, "adapter_config.json")) as f:
                base = json.load(f).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            base = None
        base_text = f"its base model is {base!r}" if base else "its adapter_config.json names no base model"
        raise PreflightError(
            f"{what} {folder} holds a PEFT adapter (adapter_config.json), not a model: {base_text}. Pass the base model "
            f"as {what} (and --use_peft to train a new adapter), or merge the adapter into it first: "
            "`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder).merge_and_unload()"
            ".save_pretrained(out)` with the tokenizer saved to `out` too, then pass `out`."
        )
    if "config.json" in names and not names & set(TOKENIZER_FILES):
        raise PreflightError(
            f"{what} {folder} holds a model but no tokenizer (none of {', '.join(TOKENIZER_FILES)}). Save the tokenizer "
            "the model was trained with into the folder: `AutoTokenizer.from_pretrained(<its source>)"
            f".save_pretrained('{folder}')`."
        )


def looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a local path (absolute, ``./``, ``~``, two slashes or more, or existing) rather
    than a Hub id ``org/name``: a missing path is then named as one."""
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


def load_data(
    name: str, config: str | None = None, streaming: bool = False, options: dict | str | None = None,
    eval_size: int = 200,
):  # fmt: skip
    """A ``DatasetDict`` (``IterableDatasetDict`` when streaming) from the Hub, a local data file (a single file is
    the ``train`` split), a local directory (``config``, when given, is a subdirectory of it; otherwise ignored
    with a warning: configs name Hub builder configurations) or a reasoning-gym task, ``reasoning_gym/<task>``:
    ``options`` (a dict, or its JSON) gives the number of training problems (``size``, default 2000), the
    generator's ``seed`` (default 0) and the task's own options; the ``test`` split holds ``eval_size`` problems
    that no training problem repeats (:func:`grpo_family.tasks.reasoning_gym.reasoning_gym_splits`)."""
    from datasets import load_dataset

    from .tasks.reasoning_gym import task_name

    if task_name(name) is not None:
        return load_reasoning_gym(name, options, eval_size)
    if options:
        raise PreflightError(f"--dataset_options applies to reasoning_gym/<task> datasets only, not {name}.")
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
    if looks_local(name):  # a path that does not exist: say so, not "Repo id must be in the form ..."
        raise PreflightError(
            f"--dataset_name {name}: no such file or directory. Give a data file ({', '.join(DATA_BUILDERS)}), a "
            "directory of them, or a Hub dataset id of the form 'org/name'."
        )
    return load_dataset(name, name=config, streaming=streaming)


def load_reasoning_gym(name: str, options: dict | str | None, eval_size: int):
    """The train/test ``DatasetDict`` of ``reasoning_gym/<task>``; a missing package, an unknown task or option
    fails here with the fix."""
    import json

    from .tasks.reasoning_gym import install_hint, reasoning_gym_splits, task_name

    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError as error:
            raise PreflightError(f"--dataset_options is not JSON ({error}): {options!r}") from None
    options = dict(options or {})
    try:
        return reasoning_gym_splits(task_name(name), eval_size=eval_size, **options)
    except ImportError:
        raise PreflightError(f"--dataset_name {name} needs the reasoning-gym package: {install_hint()}.") from None
    except (TypeError, ValueError) as error:
        raise PreflightError(f"--dataset_name {name}: {error}") from None


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


def check_enough_rows(dataset: Any, args: Any, name: str = "training set") -> None:
    """A training set smaller than one generation batch's prompts trains 0 steps (TRL's sampler yields whole
    generation batches only) and used to end with exit code 0: refuse it, with the arithmetic."""
    if dataset is None or not hasattr(dataset, "__len__") or not getattr(args, "generation_batch_size", None):
        return
    prompts = args.generation_batch_size // args.num_generations
    if len(dataset) >= prompts:
        return
    raise PreflightError(
        f"The {name} has {len(dataset)} row(s), fewer than the {prompts} prompts of one generation batch "
        f"(generation_batch_size {args.generation_batch_size} = per_device_train_batch_size "
        f"{args.per_device_train_batch_size} x {args.world_size} process(es) x steps_per_generation "
        f"{args.steps_per_generation}, over num_generations {args.num_generations}), so training would take no step. "
        "Add rows, or lower --per_device_train_batch_size (or --steps_per_generation / --gradient_accumulation_steps)."
    )


def check_gold_values(rows: Any, reward_funcs: Sequence[Any], column: str, max_examples: int = 5) -> None:
    """Gold answers a reward cannot take as they are: ``math_accuracy`` reads one answer per row, so a list-valued
    gold (``["48", "49"]``) was read as the interval [48, 49] and correct answers scored 0 with no warning. Fails
    naming the rows and the column, and the rewards that do take a list of accepted answers."""
    from .rewards import MathAccuracyReward

    names = [getattr(f, "__name__", type(f).__name__) for f in reward_funcs if isinstance(f, MathAccuracyReward)]
    if not names or "answer" not in (getattr(rows, "column_names", None) or ()):
        return
    golds = rows["answer"] if hasattr(rows, "__len__") else [row["answer"] for _, row in zip(range(1000), rows)]
    bad = [(i, g) for i, g in enumerate(golds) if isinstance(g, list | tuple | dict | set)]  # None: check_golds
    if bad:
        examples = "; ".join(f"row {i}: {g!r:.60}" for i, g in bad[:max_examples])
        raise PreflightError(
            f"{len(bad)} of {len(golds)} gold answers in the column {column!r} are not one answer ({examples}), but "
            f"{', '.join(names)} reads one answer per row (a list would be read as an interval). Give one answer per "
            "row (a string or a number), or use qa_exact_match / qa_f1, which accept a list of accepted answers."
        )


def check_gold_answers(rows: Any, reward_funcs: Sequence[Any], column: str, max_unreadable: float) -> None:
    """Every gold answer read once as each reward will (:func:`grpo_family.rewards.check_golds`, which warns per
    reward); more than ``max_unreadable`` of them unreadable fails, naming the reward, the column and the rows."""
    from .rewards import check_golds

    check_gold_values(rows, reward_funcs, column)
    for name, (bad, total, examples) in check_golds(rows, reward_funcs, max_unreadable=1.0).items():
        if total and bad / total > max_unreadable:
            shown = "; ".join(f"row {i}: {g!r:.60}" for i, g in examples)
            raise PreflightError(
                f"{name} cannot read {bad} of {total} gold answers in the column {column!r} (more than "
                f"--max_unreadable_golds {max_unreadable:g}; {shown}). Check the answer column mapping "
                "(--answer_column / --dataset_preset) or the reward functions chosen."
            )


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


def split_module_names(names: Any) -> Any:
    """``--lora_target_modules`` as names: a comma-separated string (``"q_proj, v_proj"`` in a YAML recipe) or list
    items holding commas are split; PEFT would take ``"q_proj, v_proj"`` as one module name. A single plain name
    (``--lora_target_modules q_proj``, which TRL's ModelConfig turns into the string ``"q_proj"``) becomes a list
    again: PEFT reads a string as a regular expression over full module names, which ``q_proj`` never matches."""
    if names is None:
        return None
    items = [names] if isinstance(names, str) else list(names)
    if isinstance(names, str) and names != "all-linear" and re.fullmatch(r"[\w.]+", names):
        return [names]
    if not any("," in item for item in items):
        return names
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def check_lora_target_modules(model_path: str, names: Sequence[str] | str | None, **config_kwargs: Any) -> None:
    """Every ``--lora_target_modules`` name must match a module of the model, as PEFT matches a list of names (the
    module's full name or its last components); an unmatched name used to train with the other names only. The
    modules come from the model's config built on the meta device (no weights load). ``all-linear`` passes."""
    if not names or isinstance(names, str) or "all-linear" in names:
        return  # a single string is PEFT's regular expression: PEFT itself refuses one that matches nothing
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, **config_kwargs)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(
            config, trust_remote_code=config_kwargs.get("trust_remote_code", False)
        )
    modules = [name for name, _ in model.named_modules() if name]
    unmatched = [n for n in names if not any(m == n or m.endswith("." + n) for m in modules)]
    if unmatched:
        leaves = sorted({m.rsplit(".", 1)[-1] for m, mod in model.named_modules() if type(mod).__name__ == "Linear"})
        raise PreflightError(
            f"--lora_target_modules: {', '.join(map(repr, unmatched))} match no module of {model_path}. Its linear "
            f"layers: {', '.join(leaves)} (or 'all-linear')."
        )


def check_judge_model(args: Any) -> None:
    """SGPO's ``--judge_type transformers`` loads ``--judge_model`` after the policy: a path that does not exist, or
    (offline) a Hub id not in the cache, fails now instead (it was an ``HFValidationError`` after the policy loaded)."""
    if getattr(args, "judge_type", None) != "transformers" or not getattr(args, "judge_model", None):
        return
    name = args.judge_model
    check_model_path(name, "--judge_model")
    if os.path.isdir(os.path.expanduser(name)) or os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("1", "true"):
        return
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a repo id either (huggingface_hub's HFValidationError is a ValueError)
        cached = None
    if not isinstance(cached, str):
        raise PreflightError(
            f"--judge_model {name}: not a local model directory, and not in the Hub cache while offline "
            "(HF_HUB_OFFLINE=1). Give the directory of a saved model, or download it first."
        )
