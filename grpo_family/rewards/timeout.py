"""Deadlines for reward computations that may hang, from any thread.

math-verify enforces its own timeouts with ``signal.alarm``, which only works in the main thread of the main
interpreter; TRL calls reward functions from other threads too (async reward functions, rollout workers), where
math-verify raises or, with its timeouts disabled, may hang forever on an input such as ``9^{9^{9^{9}}}``. The
rewards here therefore disable math-verify's timeouts and run the work through a *runner* that enforces a wall-clock
deadline per item in whatever thread calls it. Three backends:

``"process"`` (default, robust)
    A small pool of long-lived worker *subprocesses* (``python -c ...``, a fresh interpreter; never ``fork``, so it
    is safe after CUDA or many threads are started, and needs no ``if __name__ == "__main__"`` guard). Each item is
    sent over a socket; a worker that misses its deadline is killed (SIGKILL) and replaced. Only a killable process
    can stop a computation stuck in C code (big-integer arithmetic holds the GIL), so this is the only backend whose
    deadline always holds. Costs: ~1 s to start a worker (it imports math-verify, not torch: the worker loads
    ``grpo_family.rewards`` without running ``grpo_family/__init__``), ~60 MB per worker, and a pickle round trip
    per item (tens of microseconds). A worker killed on timeout loses its caches (e.g. parsed golds). The deadline
    clock starts when the item reaches a ready worker, and a call's budget runs only while one of its workers is
    ready, so start-up time (a first start or a restart after a kill, however slow the imports) never counts as a
    timeout or eats the budget. A preloaded module may define ``_worker_warm_up()``, run before the worker reports
    ready (lazy set-up such as a parser's tables belongs to start-up). POSIX only.
``"thread"``
    Each item runs in a daemon thread joined with a timeout. Cheap, but a thread cannot be killed: a timed-out
    computation keeps running (and holding CPU) in the background until it ends by itself, and a computation that
    holds the GIL can delay the caller past its deadline. Fallback where subprocesses are unavailable.
``"none"``
    Runs inline without any deadline (debugging, trusted inputs).

Functions sent to the process backend are pickled by reference, so they must be module-level functions of an
importable module; inside the worker, ``import grpo_family`` gives a light stub package (the full public API with
TRL is not loaded), so such functions should import what they need from ``grpo_family.rewards`` only.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import logging
import math
import multiprocessing
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Literal

from ..errors import RewardTimeoutError

__all__ = [
    "BACKENDS",
    "InlineRunner",
    "Outcome",
    "ProcessRunner",
    "RewardTimeoutError",
    "ThreadRunner",
    "get_runner",
    "run_with_timeout",
    "shutdown_runners",
    "with_timeout",
]

logger = logging.getLogger(__name__)

BACKENDS = ("process", "thread", "none")

# Set in worker subprocesses, so modules can skip optional heavy imports there.
WORKER_ENV = "GRPO_FAMILY_REWARD_WORKER"

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])

# Run by ``python -c`` in each worker. It reads the parent's ``sys.path``, package folder and preload list, stubs the
# ``grpo_family`` package with that folder (so ``grpo_family.rewards.*`` is the parent's copy, and nothing of
# ``grpo_family/__init__.py`` runs), then serves ``(function, args)`` requests until EOF or ``None``.
_WORKER_CODE = r"""
import importlib, os, signal, sys, types
from multiprocessing.connection import Connection
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it will close us.
conn = Connection(int(sys.argv[1]))
sys_path, package_dir, preload = conn.recv()
sys.path[:] = [p for p in sys_path if p]
pkg = types.ModuleType("grpo_family")
pkg.__path__ = [package_dir]
pkg.__file__ = os.path.join(package_dir, "__init__.py")
sys.modules["grpo_family"] = pkg
for name in preload:
    warm_up = getattr(importlib.import_module(name), "_worker_warm_up", None)
    if warm_up is not None:  # lazy set-up (a parser's tables) belongs to start-up, not to the first item's deadline
        warm_up()
conn.send(("ready", os.getpid()))
while True:
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        break
    if msg is None:
        break
    try:
        fn, args = msg
        result = ("ok", fn(*args))
    except BaseException as e:  # report every failure; the parent decides
        result = ("error", f"{type(e).__name__}: {e}")
    try:
        conn.send(result)
    except Exception as e:  # unpicklable result
        conn.send(("error", f"cannot send result: {type(e).__name__}: {e}"))
"""


@dataclass(frozen=True)
class Outcome:
    """Result of one item: ``status`` is ``"ok"`` (``value`` holds the return value), ``"timeout"`` (deadline
    missed; ``value`` is None), ``"skipped"`` (never started: the call's ``budget`` ran out first) or ``"error"``
    (the call raised or its worker died; ``value`` is a message)."""

    status: Literal["ok", "timeout", "skipped", "error"]
    value: Any = None


class InlineRunner:
    """No deadline: calls inline. Exceptions become ``Outcome("error", ...)`` like the other backends."""

    backend = "none"

    def map(
        self, fn: Callable, items: Sequence[tuple], timeout: float | None = None, budget: float | None = None
    ) -> list[Outcome]:
        out = []
        end = time.monotonic() + budget if budget is not None else float("inf")
        for args in items:
            if time.monotonic() >= end:
                out.append(Outcome("skipped"))
                continue
            try:
                out.append(Outcome("ok", fn(*args)))
            except Exception as e:  # noqa: BLE001 - reported, not raised, as in the other backends
                out.append(Outcome("error", f"{type(e).__name__}: {e}"))
        return out

    def close(self) -> None:
        pass


class ThreadRunner:
    """Each item in a daemon thread joined with ``timeout``. A timed-out thread is abandoned, not stopped."""

    backend = "thread"

    def map(
        self, fn: Callable, items: Sequence[tuple], timeout: float | None = None, budget: float | None = None
    ) -> list[Outcome]:
        out = []
        end = time.monotonic() + budget if budget is not None else float("inf")
        for args in items:
            left = end - time.monotonic()
            if left <= 0:
                out.append(Outcome("skipped"))
                continue
            box: list[Outcome] = []

            def target(args=args, box=box):
                try:
                    box.append(Outcome("ok", fn(*args)))
                except BaseException as e:  # noqa: BLE001
                    box.append(Outcome("error", f"{type(e).__name__}: {e}"))

            thread = threading.Thread(target=target, daemon=True, name="grpo-family-reward")
            thread.start()
            thread.join(left if timeout is None else min(timeout, left))
            out.append(box[0] if box else Outcome("timeout"))
        return out

    def close(self) -> None:
        pass


class _Worker:
    """One worker subprocess and its end of the socket."""

    def __init__(self, preload: Sequence[str]):
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        env[WORKER_ENV] = "1"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.conn.send((list(sys.path), _PACKAGE_DIR, list(preload)))
        self.ready = False
        self.started = time.monotonic()
        self.job: tuple[int, float] | None = None  # (item index, deadline)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


class ProcessRunner:
    """Pool of ``num_workers`` worker subprocesses with a per-item deadline; see the module docstring.

    ``preload`` lists modules each worker imports before it reports ready (so import time is not charged to the
    first item's deadline). ``startup_timeout`` bounds how long a worker may take to become ready. Thread-safe:
    concurrent ``map`` calls are serialised.
    """

    backend = "process"

    def __init__(self, num_workers: int = 1, *, preload: Sequence[str] = (), startup_timeout: float = 120.0):
        if os.name != "posix":
            raise RuntimeError("the process backend needs a POSIX system; use backend='thread'")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.preload = tuple(preload)
        self.startup_timeout = startup_timeout
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.restarts = 0  # workers replaced after a timeout or a crash

    def _spawn(self) -> _Worker:
        return _Worker(self.preload)

    def map(
        self, fn: Callable, items: Sequence[tuple], timeout: float | None = None, budget: float | None = None
    ) -> list[Outcome]:
        """Run ``fn(*args)`` for every ``args`` in ``items``; each call gets ``timeout`` seconds once started, and
        the whole map ``budget`` seconds of time in which at least one of its workers is ready (so however many
        items time out, the call's working time ends by then; start-up and restarts after a kill are not charged,
        so a slow import never turns answers into skips): items still running at the end are timeouts, items not
        started are ``"skipped"``. Its wall time is at most ``budget`` plus one start-up per wave of kills."""
        if os.getpid() != self._pid:
            raise RuntimeError("a ProcessRunner cannot be used from a forked child; create a new one")
        with self._lock:
            return self._map(fn, list(items), timeout, budget)

    def _map(self, fn: Callable, items: list[tuple], timeout: float | None, budget: float | None) -> list[Outcome]:
        if not items:
            return []
        # Pickle everything first: an unpicklable function fails here, before any worker holds a job.
        payloads = [pickle.dumps((fn, tuple(args)), protocol=pickle.HIGHEST_PROTOCOL) for args in items]
        results: list[Outcome | None] = [None] * len(items)
        want = min(self.num_workers, len(items))
        while len(self._workers) < want:
            self._workers.append(self._spawn())
        workers = self._workers[:want]
        for w in workers:
            if not w.ready:
                w.started = time.monotonic()
        next_item = 0
        # The budget is charged only for time in which a worker of this call is ready: an interval counts when a
        # worker was ready at its start (a kill at its end is charged up to the kill, the restart that follows not).
        spent, ready_since = 0.0, None
        try:
            while True:
                now = time.monotonic()
                if ready_since is not None:
                    spent += now - ready_since
                ready_since = now if any(w.ready for w in workers) else None
                left = float("inf") if budget is None else budget - spent
                if left <= 0:
                    for i, w in enumerate(workers):
                        if w.job is not None:
                            results[w.job[0]] = Outcome("timeout")
                            workers[i] = self._replace(w)
                    return [r if r is not None else Outcome("skipped") for r in results]
                for i, w in enumerate(workers):  # hand out work to idle, ready workers
                    if w.ready and w.job is None and next_item < len(items):
                        try:
                            w.conn.send_bytes(payloads[next_item])
                        except OSError:  # died while idle: replace it, resend later
                            workers[i] = self._replace(w)
                            continue
                        deadline = time.monotonic() + timeout if timeout is not None else float("inf")
                        w.job = (next_item, deadline)
                        next_item += 1
                if next_item >= len(items) and all(w.job is None for w in workers):
                    return results  # type: ignore[return-value]
                busy = [w for w in workers if w.job is not None or not w.ready]
                deadlines = [w.job[1] if w.job is not None else w.started + self.startup_timeout for w in busy]
                call_end = now + left if ready_since is not None else float("inf")
                wait_for = max(0.0, min(*deadlines, call_end) - time.monotonic())
                ready_conns = wait([w.conn for w in busy], timeout=None if wait_for == float("inf") else wait_for)
                for w in busy:
                    i = workers.index(w)
                    if w.conn in ready_conns:
                        try:
                            status, value = w.conn.recv()
                        except (EOFError, OSError):
                            status, value = "died", f"worker process died (exit code {_exit_code(w.proc)})"
                        if not w.ready:
                            if status != "ready":
                                raise RuntimeError(
                                    "a reward worker process failed to start (its stderr is above); "
                                    "use backend='thread' to avoid subprocesses"
                                )
                            w.ready = True
                        elif status == "died":
                            results[w.job[0]] = Outcome("error", value)
                            workers[i] = self._replace(w)
                        else:
                            results[w.job[0]] = Outcome(status, value)
                            w.job = None
                    elif w.job is not None and time.monotonic() >= w.job[1]:
                        results[w.job[0]] = Outcome("timeout")
                        workers[i] = self._replace(w)
                    elif not w.ready and time.monotonic() >= w.started + self.startup_timeout:
                        raise RuntimeError(
                            f"a reward worker process did not start within {self.startup_timeout:.0f} s"
                        )
        except BaseException:
            # Interrupted or failed mid-batch: workers may still hold jobs whose replies would reach the next
            # call, so kill every worker of this batch rather than risk mixing results up.
            for w in workers:
                if w.job is not None or not w.ready:
                    self._drop(w)
            raise

    def _replace(self, w: _Worker) -> _Worker:
        """Kill ``w`` and put a fresh (not yet ready) worker in its place in the pool."""
        w.kill()
        self.restarts += 1
        fresh = self._spawn()
        fresh.started = time.monotonic()
        self._workers[self._workers.index(w)] = fresh
        return fresh

    def _drop(self, w: _Worker) -> None:
        w.kill()
        if w in self._workers:
            self._workers.remove(w)

    def close(self) -> None:
        """Stop the workers (they also exit by themselves when this process ends)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            for w in self._workers:
                w.stop()
            self._workers = []

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]


def _exit_code(proc: subprocess.Popen) -> int | None:
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


_RUNNERS: dict[tuple, Any] = {}
_RUNNERS_LOCK = threading.Lock()


def get_runner(backend: str = "process", num_workers: int = 1, preload: Sequence[str] = ()):
    """A shared runner for ``backend`` (one per process and configuration, created on first use).

    Falls back from ``"process"`` to ``"thread"`` with a warning where subprocess workers are not possible
    (non-POSIX, or inside a daemonic multiprocessing worker such as some data-loader processes).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown timeout backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "process" and (os.name != "posix" or multiprocessing.current_process().daemon):
        warnings.warn(
            "reward timeouts: subprocess workers are unavailable here; falling back to threads "
            "(timed-out computations cannot be stopped)",
            RuntimeWarning,
            stacklevel=2,
        )
        backend = "thread"
    key = (os.getpid(), backend, num_workers, tuple(preload))
    with _RUNNERS_LOCK:
        runner = _RUNNERS.get(key)
        if runner is None:
            if backend == "process":
                runner = ProcessRunner(num_workers, preload=preload)
            elif backend == "thread":
                runner = ThreadRunner()
            else:
                runner = InlineRunner()
            _RUNNERS[key] = runner
        return runner


def run_with_timeout(
    fn: Callable, args: tuple = (), timeout: float | None = 10.0, *, backend: str = "process"
) -> Outcome:
    """Run one ``fn(*args)`` under a deadline with the shared runner for ``backend``."""
    return get_runner(backend).map(fn, [tuple(args)], timeout)[0]


def with_timeout(func: Callable, timeout: float) -> Callable:
    """``func``, a TRL reward function (sync or ``async``), with a wall-clock deadline of ``timeout`` s per call.

    A call that misses the deadline raises :class:`RewardTimeoutError`, which the grpo_family trainers turn into
    ``None`` rewards for that batch plus a metric and a warning, so a reward that never returns (a stuck HTTP call,
    an infinite loop on one completion) cannot stall training. Name and signature are ``func``'s, so TRL logs it
    under the same name and the trainers' dataset-column check still sees its arguments.

    A synchronous ``func`` runs in a daemon thread that is abandoned, not stopped, when it misses the deadline: a
    computation stuck in C code keeps its CPU (and may hold the GIL past the deadline). For that kind of work put
    the computation itself in a killable worker process with :func:`get_runner` as ``math_accuracy`` does. An
    ``async`` ``func`` is cancelled cleanly with :func:`asyncio.wait_for`.
    """
    if not callable(func):
        raise TypeError(f"with_timeout needs a reward function, got {type(func).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (0 < timeout < math.inf):
        raise ValueError(f"with_timeout: timeout must be a positive number of seconds, got {timeout!r}")
    name = getattr(func, "__name__", type(func).__name__)
    message = f"reward function '{name}' did not return within {timeout:g} s"
    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)

    if is_async:

        @functools.wraps(func)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            task = asyncio.ensure_future(func(*args, **kwargs))
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:  # (a TimeoutError raised by func itself is func's own error, not this deadline)
                task.cancel()
                raise RewardTimeoutError(message)
            return task.result()

        timed_async.__name__ = name
        timed_async.reward_deadline = timeout  # the trainers leave a function with its own deadline as it is
        return timed_async

    @functools.wraps(func)
    def timed(*args: Any, **kwargs: Any) -> Any:
        box: list[tuple[bool, Any]] = []

        def target() -> None:
            try:
                box.append((True, func(*args, **kwargs)))
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
                box.append((False, error))

        thread = threading.Thread(target=target, daemon=True, name=f"grpo-family-reward-{name}")
        thread.start()
        thread.join(timeout)
        if not box:
            raise RewardTimeoutError(message)
        ok, value = box[0]
        if not ok:
            raise value
        return value

    timed.__name__ = name
    timed.reward_deadline = timeout
    return timed


def shutdown_runners() -> None:
    """Stop every shared runner's workers (registered with ``atexit``)."""
    with _RUNNERS_LOCK:
        runners = [r for (pid, *_), r in _RUNNERS.items() if pid == os.getpid()]
        _RUNNERS.clear()
    for runner in runners:
        runner.close()


atexit.register(shutdown_runners)
