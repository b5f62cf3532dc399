"""A lock file that names the process holding it, so a lock left by a dead process is known at once by its PID (not
guessed from its age) and a live holder can be named in the message.

:class:`PidLock` is used for the output folder of a run (:mod:`grpo_family.runtime.run_folder`) and for caches built once by
one of several processes (:mod:`grpo_family.runtime.cache`, the warm start of the tiny model). The lock file holds JSON: the
holder's PID, its start time (``/proc/<pid>/stat``, so a reused PID is not mistaken for the holder), the host and
the command. Taking and releasing it happen under a short ``flock`` on the file, which only serialises those two
steps; nothing is held across the run but the file's content.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: ``pid`` on ``host`` (started at ``start``, in clock ticks after boot), since ``since``."""

    pid: int
    host: str
    start: int | None
    since: float
    command: str

    @classmethod
    def me(cls) -> Holder:
        return cls(
            os.getpid(), socket.gethostname(), process_start(os.getpid()), time.time(), " ".join(sys.argv)[:300]
        )

    def alive(self) -> bool | None:
        """Whether the holder still runs: True / False on this host, None on another host (cannot tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: it exists
            pass
        start = process_start(self.pid)
        return self.start is None or start is None or start == self.start

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"process {self.pid} on {self.host} (since {when}: {self.command})"


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks after boot (Linux), or None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: count fields after its last ')'
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


class PidLock:
    """A lock at ``path`` held by one process at a time; a holder that is no longer running releases nothing, and
    the next :meth:`acquire` takes its place."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.held = False

    @contextlib.contextmanager
    def _exclusive(self):
        """The lock file, created if needed, open and ``flock``-ed (waiting while another process takes or releases
        it); retried if that file was replaced meanwhile."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:  # removed by a releasing holder while we waited
                    same = False
                if same:
                    yield fd
                    return
            finally:
                os.close(fd)  # also releases the flock

    @staticmethod
    def _read(fd: int) -> Holder | None:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 1 << 16)
        if not data.strip():
            return None
        try:
            return Holder(**json.loads(data))
        except (ValueError, TypeError):  # not ours (an older lock format): nobody we can name
            return None

    def holder(self) -> Holder | None:
        """The live (or unverifiable) holder, or None."""
        if not self.path.exists():
            return None
        with self._exclusive() as fd:
            holder = self._read(fd)
        return holder if holder is not None and holder.alive() is not False else None

    def acquire(self) -> Holder | None:
        """Take the lock; returns None when this process holds it now (also when it already did), or the live holder
        otherwise. A holder that died (its PID is gone, or is another process now) is replaced at once; one on another
        host counts as live (its PID cannot be checked here)."""
        with self._exclusive() as fd:
            holder = self._read(fd)
            if holder is not None and holder.pid != os.getpid() and holder.alive() is not False:
                return holder
            me = json.dumps(asdict(Holder.me())).encode()
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, me)
            os.fsync(fd)
        self.held = True
        return None

    def release(self) -> None:
        """Give the lock up (the file is removed) if this process holds it."""
        if not self.held:
            return
        with contextlib.suppress(FileNotFoundError), self._exclusive() as fd:
            holder = self._read(fd)
            if holder is not None and holder.pid == os.getpid():
                os.unlink(self.path)
        self.held = False
