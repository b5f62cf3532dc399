"""What every benchmark shares, so that each keeps only what it measures: its clocks (:class:`Timer`,
:func:`step_timer`, :func:`rotation`), the machine it ran on (:func:`machine_line`, :func:`load_average`, the
process's memory, the commit), timing runs whose weights must not move (:data:`FROZEN_LEARNING_RATE`,
:func:`weights_digest`, :func:`check_frozen`), and how it writes (:func:`command_line`, :func:`write_report`,
:func:`write_json`, into :data:`RESULTS` by default) and plots (:func:`pyplot`, :func:`save_figure`) its results.

Only the standard library at module level (torch, transformers and matplotlib inside the functions that use them):
``code_sandbox.py`` and ``rewards.py`` import no torch, ``vllm_cpu.py`` runs in the vLLM environment.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # Windows: no children's CPU time, no peak RSS
    resource = None

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


# ---------------------------------------------------------------------------------------------------------- clocks
def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN) if resource is not None else None
    return usage.ru_utime + usage.ru_stime if usage is not None else 0.0


class Timer:
    """Seconds of a stretch of work, from creation to :meth:`stop` (or the end of its ``with`` block); read before
    then, each figure runs on.

    ``wall``: ``time.perf_counter``. ``cpu``: this process, all threads (``time.process_time``): with one torch
    thread it counts the work and hardly moves when other jobs share the machine, as wall time does.
    ``children_cpu``: user + system time of the child processes that ended and were waited for meanwhile
    (``RUSAGE_CHILDREN``). ``sync`` (e.g. ``torch.cuda.synchronize``: CUDA work is asynchronous) runs before the
    clocks are read at both ends; the wall clock is read last at the start and first at the end.
    """

    def __init__(self, sync: Callable[[], object] | None = None):
        self._sync, self._end = sync, None
        if sync is not None:
            sync()
        children, cpu = _children_cpu(), time.process_time()
        self._start = (time.perf_counter(), cpu, children)

    def _now(self) -> tuple[float, float, float]:
        if self._end is not None:
            return self._end
        if self._sync is not None:
            self._sync()
        wall = time.perf_counter()
        return wall, time.process_time(), _children_cpu()

    def stop(self) -> Timer:
        """Freeze the figures (a second call keeps the first end)."""
        self._end = self._now()
        return self

    def __enter__(self) -> Timer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    wall = property(lambda self: self._now()[0] - self._start[0])
    cpu = property(lambda self: self._now()[1] - self._start[1])
    children_cpu = property(lambda self: self._now()[2] - self._start[2])


def step_timer(wall: bool = False, sync: Callable[[], object] | None = None):
    """A ``transformers.TrainerCallback`` whose ``times`` get each optimizer step's seconds (generation, scoring,
    forward, backward and update lie inside a step): this process's CPU time, or its wall time with ``wall``
    (``sync`` as in :class:`Timer`)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self._timer = Timer(sync=sync)

        def on_step_end(self, args, state, control, **kwargs):
            timer = self._timer.stop()
            self.times.append(timer.wall if wall else timer.cpu)

    return StepTimer()


def rotation(names: Sequence[str], rep: int) -> list[str]:
    """The order of interleaved runs in repetition ``rep``: rotated by one each repetition, so that a drift in the
    machine's speed (other jobs starting or ending) hits every run alike."""
    shift = rep % len(names)
    return [*names[shift:], *names[:shift]]


# --------------------------------------------------------------------------------------------- frozen-weight runs
# The learning rate of timing runs, whose methods must do identical work: with unchanged weights every run samples
# the same completions (same lengths, same rewards), and the optimizer step still runs in full. The bounds refuse 0
# (grpo_family/bounds.py: a run that cannot learn is refused before training), so the rate is the positive value
# whose update is below half an ULP of every float32 weight, zero included, i.e. one that rounds to nothing.
# AdamW (TrainingArguments' default, betas (0.9, 0.999)) moves a weight by
#     |dw| = lr * |m_hat_t| / (sqrt(v_hat_t) + eps) <= lr * K,
#     K = (1 - b1) / sqrt(1 - b2) / sqrt(1 - b1**2 / b2) = 7.27 (for every step t),
# from Cauchy-Schwarz on m_t = (1 - b1) sum b1**(t-i) g_i against v_t = (1 - b2) sum b2**(t-i) g_i**2, the bias
# corrections sqrt(1 - b2**t) / (1 - b1**t) at most their limit 1 (eps and the scheduler only shrink it). With
# lr = 1e-48, |dw| <= 7.3e-48 < 2**-150 = 7.0e-46, half the smallest positive float32 (2**-149): w - dw rounds back
# to w for every float32 (and bf16) w, whether the update is computed in float32 or in double (a zero may become
# -0.0, equal in value); weight decay w * lr * wd is further below half an ULP of w. Runs check it with
# weights_digest (another optimizer, or other betas, would show up there).
FROZEN_LEARNING_RATE = 1e-48


def weights_digest(model) -> str:
    """SHA-256 of the values of ``model``'s parameters (names, shapes, dtypes and float32 bytes, -0.0 counted as
    0.0), one tensor at a time on the CPU: equal digests before and after training mean unchanged weights."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.named_parameters():
            values = param.detach().to("cpu", torch.float32) + 0.0  # + 0.0 turns -0.0 into 0.0
            digest.update(f"{name} {tuple(param.shape)} {param.dtype}\n".encode())
            digest.update(values.contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_frozen(before: str, model, what: str) -> None:
    """Raise if ``model``'s weights changed since ``before`` (its :func:`weights_digest`): a timing run at
    :data:`FROZEN_LEARNING_RATE` whose weights moved did not do the same work as the others."""
    if weights_digest(model) != before:
        raise RuntimeError(
            f"{what}: the weights changed at learning rate {FROZEN_LEARNING_RATE:g}, which should leave them "
            "unchanged (benchmarks/harness.py, FROZEN_LEARNING_RATE): the runs no longer sample the same completions"
        )


# ----------------------------------------------------------------------------------------------------- the machine
def machine_line(torch: bool = True) -> str:
    """``'x86_64, 2 CPU cores, torch 2.13.0+cpu'`` (without the torch version when ``torch`` is False): the words
    the reports' "Machine:" lines start with."""
    words = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"
    if torch:
        import torch as _torch

        words += f", torch {_torch.__version__}"
    return words


def load_average() -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages, as ``uptime`` prints them; NaN where the system has none."""
    return os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3


def rss_mib(field: str = "VmRSS") -> float | None:
    """``VmRSS`` (resident size now) or ``VmHWM`` (its peak) of this process in MiB (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current resident size (Linux >= 4.0); False where not permitted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def max_rss_mib() -> float:
    """The peak resident size of this process over its life, MiB (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if resource is not None else math.nan


def git(*args: str, cwd: Path = ROOT) -> str | None:
    """``git args`` in ``cwd``: its output, stripped; None when git fails or is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(ref: str = "HEAD", short: bool = False, cwd: Path = ROOT) -> str | None:
    """The commit ``ref`` names (abbreviated with ``short``); None outside a checkout or for an unknown ref."""
    return git("rev-parse", *(["--short"] if short else []), ref, cwd=cwd) or None


# --------------------------------------------------------------------------------------------------------- results
def command_line(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """``'python benchmarks/<script> <arguments>'``, the command that regenerates a report: the ``argv`` its
    ``main`` was given (``sys.argv[1:]`` when None), quoted as a shell reads them."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["python", f"benchmarks/{Path(script).name}", *([shlex.join(args)] if args else [])])


def write_report(path: str | Path, text: str, echo: bool = True) -> str:
    """Write ``text`` to ``path`` (its folder made if missing) and, with ``echo``, print it; returns the text."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    if echo:
        print(text)
    return text


def write_json(path: str | Path, data: Any, indent: int | None = 1) -> None:
    """Write ``data`` as JSON ending in a newline (its folder made if missing)."""
    write_report(path, json.dumps(data, indent=indent) + "\n", echo=False)


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only: a benchmark machine has no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 100) -> None:
    """Lay ``fig`` out, write it to ``path`` (its folder made if missing) and close it (an open figure stays in
    memory)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
