"""How ``examples/train.py`` is started: its ``--config`` YAML read strictly, flags that do not apply to the chosen path
refused, the log level, a multi-process launch that would train as independent processes, and a trainer that never
outlives its launcher.

Each check raises :class:`~grpo_family.preflight.PreflightError` naming the problem and the fix, before anything
loads.
"""

from __future__ import annotations

import difflib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable
from typing import Any

from .errors import PreflightError

logger = logging.getLogger(__name__)

# Flags that only mean something with a model and a dataset of one's own (the embedded default trains the bundled
# tiny model on the bundled task with its own reward), and flags that only mean something on the embedded default.
REAL_PATH_ONLY = (
    "reward_funcs", "reward_model_name_or_path", "max_unreadable_golds", "dataset_preset", "question_column",
    "answer_column", "solution_column", "options_column", "system_prompt", "user_instruction", "dataset_filters",
    "dataset_options", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming", "datasets",
    "streaming", "test_split_size", "model_revision", "attn_implementation", "dtype", "trust_remote_code", "model_init_kwargs",
    "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage",
)  # fmt: skip
EMBEDDED_ONLY = ("task_difficulty",)


# ---------------------------------------------------------------------------------------------------- --config YAML
def load_config_file(path: str) -> dict[str, Any]:
    """The ``--config`` YAML as a mapping; a file that is not one, or that gives a key twice (PyYAML would keep the
    last value in silence), is a :class:`PreflightError` naming the file, the key and the lines."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise PreflightError(
                    f"{path}: the key {key!r} is given twice (lines {seen[key]} and {line}); YAML would use the last "
                    "value in silence. Keep one."
                )
            seen[key] = line
        return loader.construct_mapping(node)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        with open(path) as f:
            config = yaml.load(f, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except OSError as error:
        raise PreflightError(f"--config {path}: cannot be read ({error}).") from error
    except yaml.YAMLError as error:
        raise PreflightError(f"--config {path} is not valid YAML: {error}") from error
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise PreflightError(
            f"--config {path} holds a {type(config).__name__}, not a mapping of flag names to values (e.g. "
            "`learning_rate: 1.0e-6` on its own line)."
        )
    return config


def check_config_keys(config: dict[str, Any], known: Iterable[str], path: str) -> None:
    """Every key of the ``--config`` YAML must be a flag (``env`` sets environment variables, as in ``trl``)."""
    known = {*known, "env", "method"}
    unknown = [key for key in config if key not in known]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), known, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise PreflightError(
            f"--config {path}: unknown key(s) {', '.join(hints)}. Every key must be a flag of examples/train.py "
            "(`python examples/train.py --help` lists them)."
        )


def given_flags(argv: Iterable[str], config: dict[str, Any] | None = None) -> set[str]:
    """The flag names given on the command line (``--name value``, ``--name=value``) or as ``--config`` keys."""
    names = {arg[2:].split("=", 1)[0].replace("-", "_") for arg in argv if arg.startswith("--") and len(arg) > 2}
    return names | set(config or ())


def check_flags_apply(given: set[str], embedded: bool) -> None:
    """Flags that have no effect on the chosen path are refused (they used to be ignored in silence)."""
    if embedded:
        moot = sorted(given & set(REAL_PATH_ONLY))
        if moot:
            flags = ", ".join(f"--{name}" for name in moot)
            raise PreflightError(
                f"{flags} only appl{'ies' if len(moot) == 1 else 'y'} with a model and a dataset of your own; without --model_name_or_path and "
                "--dataset_name, examples/train.py trains the bundled tiny model on the bundled arithmetic task with "
                f"its own reward, so they would be ignored. Drop {flags}, or give --model_name_or_path and "
                "--dataset_name."
            )
    else:
        moot = sorted(given & set(EMBEDDED_ONLY))
        if moot:
            flags = ", ".join(f"--{name}" for name in moot)
            raise PreflightError(
                f"{flags} only appl{'ies' if len(moot) == 1 else 'y'} to the embedded default (no model or dataset "
                f"given): the bundled task is not used here. Drop {flags}."
            )


def has_accelerator() -> bool:
    """A GPU (or another torch accelerator: MPS, XPU, ...) is available."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator.is_available()) if accelerator is not None else torch.cuda.is_available()


def check_precision(args: Any) -> None:
    """``--fp16`` needs an accelerator: on a CPU it used to be ignored in silence."""
    wanted = [name for name in ("fp16", "fp16_full_eval") if getattr(args, name, False)]
    if wanted and (getattr(args, "use_cpu", False) or not has_accelerator()):
        flags = " and ".join(f"--{name}" for name in wanted)
        where = "--use_cpu is set" if has_accelerator() else "this machine has no GPU"
        raise PreflightError(
            f"{flags} asks for float16 mixed precision, which needs a GPU, but {where}: it would be ignored. Drop "
            f"{flags} (CPU training runs in float32)."
        )


def log_level(value: str | None) -> int:
    """The ``LOGLEVEL`` environment variable as a logging level: a name in any case (``debug``, ``INFO``) or a
    number; unset means WARNING."""
    if value is None or not value.strip():
        return logging.WARNING
    text = value.strip()
    if text.isdigit():
        return int(text)
    level = logging.getLevelNamesMapping().get(text.upper())
    if level is None:
        names = ", ".join(n for n in logging.getLevelNamesMapping() if n not in ("WARN", "FATAL", "NOTSET"))
        raise PreflightError(f"LOGLEVEL={value!r} is not a logging level; use one of {names} (any case) or a number.")
    return level


# ---------------------------------------------------------------------------------------------------- processes
def check_distributed_launch(args: Any) -> None:
    """A launch that started several processes (``WORLD_SIZE`` > 1) whose training arguments see only one: each
    would train alone on the whole data and all would write the same output folder. This happens on a machine
    without a GPU when the launcher's config is a multi-GPU one (``accelerate_configs/cpu_2proc.yaml``) and the
    training arguments do not say CPU."""
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched <= 1 or args.world_size > 1:
        return
    raise PreflightError(
        f"This run was launched as {launched} processes (WORLD_SIZE={launched}), but the training arguments see one "
        "process, so each would train on its own and all would write the same output folder. On a machine without "
        "a GPU pass --use_cpu true (the processes then train together over gloo); with GPUs, check that each process "
        "sees one (CUDA_VISIBLE_DEVICES)."
    )


def launched_by_a_launcher() -> bool:
    """Started by ``accelerate launch``, ``torchrun`` or DeepSpeed's launcher (they set these variables)."""
    return any(os.environ.get(name) for name in ("TORCHELASTIC_RUN_ID", "ACCELERATE_MIXED_PRECISION", "LOCAL_RANK"))


def stop_with_launcher(poll_seconds: float = 1.0) -> bool:
    """Make this process stop (SIGTERM) when the launcher that started it dies, so a trainer never outlives it (a
    killed ``accelerate launch`` used to leave ``train.py`` running, and a resumed run then raced it).

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, delivered by the kernel when the parent dies; elsewhere a daemon
    thread that watches for the parent to change. Only under a launcher (:func:`launched_by_a_launcher`): a script
    started from a shell with ``nohup`` must survive its shell. Returns whether the watch is on."""
    if not launched_by_a_launcher() or os.name != "posix":
        return False
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the launcher died before the request took effect
                os.kill(os.getpid(), signal.SIGTERM)
            return True

    def watch() -> None:
        import time

        while os.getppid() == parent:
            time.sleep(poll_seconds)
        logger.error("The launcher (pid %d) is gone: stopping.", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="grpo_family-launcher-watch", daemon=True).start()
    return True
