"""A run's output folder over its lifetime: one run at a time (:class:`OutputFolderLock`), checkpoints that say what
wrote them (:func:`write_run_settings`) so a resume with another method or another batch layout is refused
(:func:`check_resume`), a finished run that is resumed left as it is, and a log history that is always plain JSON
(:class:`PlainLogHistoryMixin`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import PreflightError, RunFinishedError
from .pidlock import PidLock

logger = logging.getLogger(__name__)
T = TypeVar("T")

LOCK_FILE = ".grpo_family.lock"
# Written into a checkpoint once every process has finished writing it: a checkpoint without it was cut short.
COMPLETE_MARKER = "grpo_family_checkpoint_complete"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# Written into every checkpoint: what a resumed run must match.
RUN_SETTINGS_FILE = "grpo_family_run.json"
# Settings that decide which completions form which batch and step (and in which order the prompts come): a run
# resumed with other values would not continue the checkpoint's run (its buffered generations, its sampler position
# and its step counters describe another layout).
LAYOUT_SETTINGS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size",
    "num_generations", "num_iterations", "shuffle_dataset", "seed", "data_seed",
)  # fmt: skip


def latest_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` folder of ``output_dir`` that was written completely, or None.

    Complete means it holds :data:`COMPLETE_MARKER`; folders written before the marker existed (no folder of
    ``output_dir`` has one) count as complete when they hold ``trainer_state.json``, the Trainer's last write. Newer
    incomplete folders (a run killed while saving) are skipped with a warning."""
    if not os.path.isdir(output_dir):
        return None
    found = sorted(
        ((int(m.group(1)), os.path.join(output_dir, name)) for name in os.listdir(output_dir)
         if (m := _CHECKPOINT_RE.match(name)) and os.path.isdir(os.path.join(output_dir, name))),
        reverse=True,
    )  # fmt: skip
    marked = any(os.path.exists(os.path.join(path, COMPLETE_MARKER)) for _, path in found)
    required = COMPLETE_MARKER if marked else "trainer_state.json"
    for _, path in found:
        if os.path.exists(os.path.join(path, required)):
            return path
        logger.warning(
            "Skipping %s: it was not written completely (no %s; the run was probably stopped while saving). Resuming "
            "from the newest complete checkpoint instead; delete the folder to silence this.", path, required
        )  # fmt: skip
    return None


# ---------------------------------------------------------------------------------------------------- the lock
class OutputFolderLock:
    """One run per output folder: the main process holds ``<output_dir>/.grpo_family.lock`` (naming its PID) for the
    whole run; a second run into the same folder is refused naming the first, and a lock whose process is gone is
    taken over. Under several processes only the main one takes it; :meth:`acquire` tells the others its outcome
    (``torch.distributed``), so every process of a refused run stops alike."""

    def __init__(self, output_dir: str | os.PathLike, is_main_process: bool = True):
        self.output_dir = Path(output_dir)
        self.is_main_process = is_main_process
        self.lock = PidLock(self.output_dir / LOCK_FILE)

    def acquire(self) -> None:
        problem = None
        if self.is_main_process:
            holder = self.lock.acquire()
            if holder is not None:
                problem = (
                    f"--output_dir {self.output_dir} is in use by another run: {holder.describe()}. Wait for it to "
                    "finish or stop it, or give another --output_dir (two runs in one folder overwrite each other's "
                    "checkpoints and model)."
                )
        problem = _shared(problem)
        if problem is not None:
            raise PreflightError(problem)

    def release(self) -> None:
        if self.is_main_process:
            self.lock.release()

    def __enter__(self) -> OutputFolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _process_group() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _shared(value: Any) -> Any:
    """The main process's ``value`` on every process (as is without a process group)."""
    import torch.distributed as dist

    if _process_group()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gathered(value: Any) -> list[Any]:
    """Every process's ``value``, in rank order, on every process (``[value]`` without a process group)."""
    import torch.distributed as dist

    if _process_group()[1] == 1:
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def decided_on_main(decide: Callable[[], T]) -> T:
    """``decide()`` run on the main process only; its result, or the error it raised, on every process.

    A decision every process must share (which checkpoint to resume, whether the run settings match) made on each
    process's own disk can differ between nodes: one node stops alone and its peers wait at the next collective. Here
    the main process decides and broadcasts; a :class:`PreflightError` it raised is raised, with its message, by every
    process, and any other error as a :class:`PreflightError` naming it on the others (the main process re-raises the
    original)."""
    rank, _ = _process_group()
    outcome: tuple[str, Any] | None = None
    error: BaseException | None = None
    if rank == 0:
        try:
            outcome = ("value", decide())
        except PreflightError as refused:
            error, outcome = refused, ("refused", refused)
        except Exception as failed:  # noqa: BLE001 - told to the other processes, then re-raised here
            error, outcome = failed, ("failed", f"{type(failed).__name__}: {failed}")
    outcome = _shared(outcome)
    if error is not None:
        raise error
    kind, value = outcome
    if kind == "value":
        return value
    if kind == "refused":
        raise value
    raise PreflightError(f"The main process (rank 0) failed before training: {value}. Its own output names the cause.")


def require_on_every_process(problem: str | None, fix: str) -> None:
    """Every process states its own ``problem`` (None: fine); if any has one, every process raises the same
    :class:`PreflightError` listing each failing rank and its host, then ``fix``."""
    import socket

    problems = _gathered(
        None if problem is None else f"rank {_process_group()[0]} on {socket.gethostname()}: {problem}"
    )
    failed = [p for p in problems if p is not None]
    if failed:
        raise PreflightError("\n  ".join(["Not every process can continue:", *failed]) + f"\n{fix}")


# ---------------------------------------------------------------------------------------------------- resuming
def run_settings(args: Any, method: str, num_processes: int, use_peft: bool | None = None) -> dict[str, Any]:
    """What a checkpoint of this run records and a resumed run must match (``use_peft``: LoRA or full fine-tuning,
    when known: a LoRA checkpoint holds an adapter and its optimizer state, a full one the whole model's)."""
    settings = {
        "method": method,
        "num_processes": num_processes,
        **{k: getattr(args, k, None) for k in LAYOUT_SETTINGS},
    }
    return settings if use_peft is None else {**settings, "use_peft": use_peft}


def write_run_settings(
    folder: str | os.PathLike, args: Any, method: str, num_processes: int, use_peft: bool | None = None
) -> None:
    settings = run_settings(args, method, num_processes, use_peft)
    Path(folder, RUN_SETTINGS_FILE).write_text(json.dumps(settings, indent=1))


def check_resume(
    checkpoint: str | os.PathLike, args: Any, method: str, num_processes: int, use_peft: bool | None = None
) -> None:
    """:func:`_check_resume_settings` decided on the main process and shared (every process refuses alike), then
    every process must hold the checkpoint complete on its own disk (:func:`missing_checkpoint_files`): a node-local
    ``--output_dir`` without ``--save_on_each_node`` holds it on the first node only, and every process stops with
    one message naming the fix."""
    decided_on_main(lambda: _check_resume_settings(checkpoint, args, method, num_processes, use_peft))
    require_checkpoint_everywhere(checkpoint)


def require_checkpoint_everywhere(checkpoint: str | os.PathLike) -> None:
    """Every process stops, with one message naming the fix, unless every process holds ``checkpoint`` complete."""
    require_on_every_process(
        missing_checkpoint_files(checkpoint),
        f"Every process must read {checkpoint} from its own disk: give --output_dir on a disk all nodes share, or "
        f"copy {checkpoint} to the same path on every node (or train with --save_on_each_node, which writes every "
        "checkpoint on every node).",
    )


def missing_checkpoint_files(checkpoint: str | os.PathLike) -> str | None:
    """What this process lacks of ``checkpoint`` (None: it is complete here): the folder, the trainer state or the
    completion marker (written by a process only after the weights, :class:`~grpo_family.runtime.resume.ResumableTrainerMixin`)."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return f"no folder {checkpoint}"
    if not (checkpoint / "trainer_state.json").is_file():
        return f"{checkpoint} has no trainer_state.json"
    marked = (checkpoint / COMPLETE_MARKER).is_file() or not any(
        (folder / COMPLETE_MARKER).is_file() for folder in checkpoint.parent.glob("checkpoint-*")
    )
    if not marked:
        return f"{checkpoint} has no {COMPLETE_MARKER} (it was not written completely)"
    return None


def _check_resume_settings(
    checkpoint: str | os.PathLike, args: Any, method: str, num_processes: int, use_peft: bool | None = None
) -> None:
    """Refuse to resume ``checkpoint`` with another method or another batch layout (:class:`PreflightError` listing
    every difference) and a checkpoint that already reached this run's end (:class:`RunFinishedError`). A checkpoint
    written before run settings were recorded is resumed with a warning."""
    checkpoint = Path(checkpoint)
    saved_file = checkpoint / RUN_SETTINGS_FILE
    if saved_file.is_file():
        saved = json.loads(saved_file.read_text())
        now = run_settings(args, method, num_processes, use_peft)
        # use_peft is compared where both sides know it (checkpoints written before it was recorded lack it).
        differ = [f"{k}: {saved.get(k)!r} in the checkpoint, {now[k]!r} now" for k in now
                  if saved.get(k) != now[k] and not (k == "use_peft" and k not in saved)]  # fmt: skip
        if differ:
            raise PreflightError(
                f"Cannot resume {checkpoint} with these settings; it was written by another run layout:\n  "
                + "\n  ".join(differ)
                + "\nResume with the checkpoint's values, or start a new run in another --output_dir."
            )
    else:
        logger.warning("%s records no run settings (written by an older version): the method and batch layout of "
                       "the resumed run are not checked against it.", checkpoint)  # fmt: skip
    state_file = checkpoint / "trainer_state.json"
    if not state_file.is_file():
        return
    state = json.loads(state_file.read_text())
    step, epoch = state.get("global_step", 0), state.get("epoch") or 0.0
    if args.max_steps is not None and args.max_steps > 0:
        done, of = step >= args.max_steps, f"step {step} of --max_steps {args.max_steps}"
    else:
        done = epoch >= args.num_train_epochs - 1e-9
        of = f"epoch {epoch:g} of --num_train_epochs {args.num_train_epochs:g}"
    if done:
        raise RunFinishedError(
            f"{checkpoint} already reached the end of this run ({of}): there is nothing to resume, and nothing was "
            "changed. To train further, raise --max_steps (or --num_train_epochs)."
        )


def resolve_checkpoint(resume: str | bool | None, output_dir: str) -> str | None:
    """``--resume_from_checkpoint`` as a folder: ``true`` means the newest complete checkpoint of ``output_dir``; a
    folder must exist. Decided on the main process and shared (:func:`decided_on_main`): whether the other processes
    hold the folder too is :func:`check_resume`'s question."""
    if resume in (None, False, "", "false", "False"):
        return None
    return decided_on_main(lambda: _resolve_checkpoint(resume, output_dir))


def _resolve_checkpoint(resume: str | bool, output_dir: str) -> str:
    if resume in (True, "true", "True"):
        found = latest_complete_checkpoint(output_dir)
        if found is None:
            raise PreflightError(
                f"--resume_from_checkpoint true: no complete checkpoint in {output_dir}. Start without it, or pass a "
                "checkpoint folder."
            )
        return found
    if not os.path.isdir(resume):
        raise PreflightError(f"--resume_from_checkpoint {resume}: no such folder. Pass a checkpoint-N folder or true.")
    return str(resume)


# ---------------------------------------------------------------------------------------------------- log history
def plain(value: Any) -> Any:
    """``value`` with numpy and torch scalars (anywhere in lists and dicts) turned into Python numbers, so that
    ``json.dumps`` takes it (a reward or a callback that hands back ``numpy.float32`` used to crash the checkpoint
    write: "Object of type float32 is not JSON serializable")."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


class PlainLogHistoryMixin:
    """Before the trainer state is written (every checkpoint, ``save_state``), its log history is made plain JSON."""

    def _save_checkpoint(self, model, trial) -> None:
        self.state.log_history = plain(self.state.log_history)
        super()._save_checkpoint(model, trial)

    def save_state(self) -> None:
        self.state.log_history = plain(self.state.log_history)
        super().save_state()


def json_ready(value: Any) -> Any:
    """``value`` as strict JSON takes it: :func:`plain`, with NaN and infinities (an unscored result) as None."""
    value = plain(value)
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
