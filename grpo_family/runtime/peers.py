"""A process that fails during training tells the others, so no peer waits in a collective for ``ddp_timeout``.

When one process of a multi-process run raises (a bug, a reward model out of memory, a full disk), its peers go on
to their next collective and wait there for it: under NCCL until ``ddp_timeout`` (30 minutes by default), under gloo
until the failed process exits and its sockets close (and a launcher that catches the error may keep it alive). The
message they finally print names a timeout or a reset connection, not the error.

:class:`PeerFailureMixin` wraps ``train()`` on every process of a run of more than one process:

* an exception leaving ``train()`` is recorded in the run's rendezvous store (the key-value store every process
  already reaches; the first failure is kept) before it is raised;
* a daemon thread polls that key every ``POLL_S`` seconds; when another process failed and this one is still in
  ``train()`` ``GRACE_S`` seconds later (time to fail on its own, with its own message, when every process meets the
  same error), it logs which rank failed, on which host, with which error, and ends this process with exit code 1.
  Nothing is saved on the way out: a checkpoint being written is left without its completion marker, and resuming
  never picks it (:func:`grpo_family.runtime.run_folder.latest_complete_checkpoint`).

A process killed outright (SIGKILL, a lost machine) records nothing; its peers learn it from the backend (gloo: a
closed connection within seconds; NCCL: its watchdog).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import sys
import threading
from typing import Any

import torch.distributed as dist

logger = logging.getLogger(__name__)

POLL_S = 1.0  # how often each process reads the store: a check of one key, a few hundred bytes on the network
GRACE_S = 10.0  # a peer's failure seen, this process gets this long to leave train() by itself before it is ended
_KEY_PREFIX = "grpo_family/failed/"
# Every process calls train() the same number of times, in the same order: the n-th call of each shares a key, so a
# failure caught by the caller (a test, a sweep) is not read by the next train() of the same processes.
_train_calls = itertools.count()


def _run_store() -> Any | None:
    """The default process group's store when more than one process runs, else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    # Private: torch has no public getter for the default group's store (the one init_process_group was given).
    return dist.distributed_c10d._get_default_store()


def failure_record(error: BaseException) -> str:
    """What a failed process tells the others: its rank, host and error (one line)."""
    text = f"{type(error).__name__}: {error}".splitlines()[0][:500] if str(error) else type(error).__name__
    return json.dumps({"rank": dist.get_rank(), "host": socket.gethostname(), "error": text})


def describe_failure(record: str) -> str:
    failed = json.loads(record)
    return f"rank {failed['rank']} (on {failed['host']}) failed during training: {failed['error']}"


class _FailureWatch:
    """The polling thread of one train() call."""

    def __init__(self, store: Any, key: str):
        self.store, self.key = store, key
        self.left = threading.Event()  # set when this process leaves train()
        self.thread = threading.Thread(target=self._watch, name="grpo_family-peer-failure-watch", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        try:
            while not self.left.wait(POLL_S):
                if self.store.check([self.key]):
                    record = self.store.get(self.key).decode()
                    if json.loads(record)["rank"] == dist.get_rank() or self.left.wait(GRACE_S):
                        return
                    message = f"{describe_failure(record)}. This process (rank {dist.get_rank()}) stops too."
                    logger.error(message)
                    print(f"grpo_family: {message}", file=sys.stderr, flush=True)
                    os._exit(1)  # the main thread waits in a collective, where no exception reaches it
        except Exception as error:  # noqa: BLE001 - the store went away (its host ended): the backend tells the rest
            logger.debug("peer failure watch stopped: %s", error)

    def announce(self, error: BaseException) -> None:
        """Record ``error`` for the others (unless a peer failed first), and say so if one did."""
        try:
            ours = failure_record(error)
            kept = self.store.compare_set(self.key, "", ours).decode()
            if kept != ours:  # the first failure was another process's: likely the cause of this one
                logger.error("%s (before this process's own error)", describe_failure(kept))
        except Exception as store_error:  # noqa: BLE001 - the original error matters, not this one
            logger.debug("could not record the failure for the other processes: %s", store_error)

    def stop(self) -> None:
        """End the polling before train() returns: the thread is joined and the store let go, so no thread of ours
        is inside a store call, or keeps the store alive, when the process group is destroyed and the process exits
        (a store outliving ``destroy_process_group`` is torn down at interpreter exit, where a C++ thread it still
        owns aborts the process: "terminate called without an active exception", exit code -6, seen after a
        finished run)."""
        self.left.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=POLL_S + 30.0)  # at most one store call in flight: a local round trip
        self.store = None


class PeerFailureMixin:
    """``train()`` on each process of a multi-process run tells the others when it fails and stops when another
    failed (see the module's docstring); with one process it is transformers' ``train()`` unchanged."""

    def train(self, *args: Any, **kwargs: Any):
        call = next(_train_calls)
        store = _run_store()
        if store is None:
            return super().train(*args, **kwargs)
        watch = _FailureWatch(store, f"{_KEY_PREFIX}{call}")
        try:
            return super().train(*args, **kwargs)
        except BaseException as error:
            watch.announce(error)
            raise
        finally:
            watch.stop()
