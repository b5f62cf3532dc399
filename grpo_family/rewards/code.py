"""Code-execution reward: run the model's program against test cases in a sandboxed subprocess.

``code_tests`` (:class:`CodeTestsReward`) extracts a program from each completion, runs it once per test case in a
fresh sandboxed interpreter and returns the **fraction of test cases passed** (0.0 .. 1.0). ``docs/code_sandbox.md``
has the whole account: formats, how a test is judged, the sandbox's layers and the threat model (what holds, what is
bounded, what is out of scope).

What is run
    The program is the last fenced code block labelled ``python`` / ``py`` / ``python3`` (closed with a fence); if
    there is none, the last closed unlabelled fenced block; if there is none, the whole completion text. A program
    that does not compile fails every test (0.0), as does an empty one.

Test cases: the ``test_cases`` dataset column, one value per row, in either of two forms
    *stdin/stdout* (competitive programming: APPS, CodeContests, TACO): a list of ``{"input": str, "output": str}``
    (or ``{"inputs": [...], "outputs": [...]}``, APPS/TACO's ``input_output``; a JSON string of either is parsed).
    The program reads ``input`` on stdin; it passes when it exits with status 0 and its stdout equals ``output``
    exactly, except that ``\\r\\n`` counts as ``\\n``, trailing ASCII spaces / tabs / ``\\r`` on a line and trailing
    blank lines are ignored (:func:`normalize_output`; no other whitespace, e.g. NBSP or ``\\x0b``, is forgiven).

    *assert statements* (MBPP, HumanEval style): a string of Python (``"assert f(1) == 2\\nassert f(2) == 3"``),
    or a list of such strings. In a string, every top-level ``assert`` is one test case, run after every statement
    above it; the asserts above it run too, as expressions whose outcome is not this case's, so a list an earlier
    call sorted in place is sorted for a later assert, as in plain Python. A string without a top-level assert
    (HumanEval's ``def check(candidate): ...`` then ``check(f)``) is one test case; a list of strings gives one
    test case per string.

    *How an assert test is judged.* Never in the program's interpreter, which is the program's to tamper with: a
    second sandboxed process, the *judge*, runs the test as ordinary Python and writes its verdict on a pipe the
    program never holds. A name in the test means what the test, the prompt's helpers (:func:`prompt_helpers`, from
    the ``prompts`` TRL passes), the builtins or a standard module imported by the judge make it mean; only a name
    none of them defines is the program's, and it stands in the judge for the program's object: calling it (or
    reading an attribute) is a round trip to the program's process, arguments and results as plain data
    (:class:`~grpo_family.rewards._plain_values.Wire`: builtin values by value, with their identity and in-place
    changes; anything else as an opaque reference that equals only itself). Every call is its own call, test setup
    and expected values never leave the judge, and comparisons are plain Python's on builtin values.

``None`` versus ``0.0``
    ``None`` (cannot score; TRL leaves the completion out of the advantage statistics) when the row has no usable
    test cases (missing, empty or malformed ``test_cases``; APPS call-based ``fn_name`` tests are not supported) or
    when the sandbox itself failed to start (our failure, not the model's). Everything the program does wrong —
    syntax error, exception, wrong output, timeout, memory or output limit, a judge left without a verdict —
    fails that test case.

The sandbox (:class:`Sandbox`), in layers; each run reports which layers were actually applied
    * A fresh interpreter (``python -I -S -B -X utf8``, standard library only unless ``packages`` lists some: then
      exactly what each listed distribution installed in site-packages, read-only, on the program's ``sys.path``)
      started with a **minimal environment** (``PATH``, ``LANG``, ``HOME`` / ``TMPDIR`` set to the run's directory;
      with ``packages``, one BLAS / OpenMP thread) in a **fresh temporary directory**, removed afterwards.
    * **Resource limits** per process: ``RLIMIT_CPU``, ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_FSIZE``
      (``disk_mb``), ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` 0, ``RLIMIT_MSGQUEUE`` 0, ``RLIMIT_NPROC``
      (``max_processes``) and ``PR_SET_NO_NEW_PRIVS``; a **wall-clock timeout** (``timeout_s``, from when the
      program starts) that kills the whole run; **capped reading** of everything the run sends back (stdout and
      stderr at ``max_output_bytes``, the report and the verdict at a few kB).
    * As **root with namespaces** (``CAP_SYS_ADMIN``): new network, mount, PID, IPC and UTS namespaces, and a
      **private filesystem view** (``pivot_root``): a tree holding only the interpreter's read-only files (its
      binary, loader, shared libraries and standard library; the listed ``packages`` in ``/packages``), a private
      size- and inode-limited ``/tmp``, ``/dev`` with a few devices and a devpts of its own (4 ptys), and the PID
      namespace's ``/proc``. Host sockets, FIFOs, checkouts and datasets do not exist in it. The program and the
      judge each drop to a fresh uid of their own.
    * A **seccomp filter** (every mode, built by libseccomp through ``pyseccomp``), an allow-list of what a test
      program needs (``_ALLOWED_SYSCALLS``, with ``fcntl`` and ``madvise`` limited by argument): everything else
      (locks, page-cache advice and probes, AIO and ``io_uring``, ``setsid``, namespaces, mounts, IPC, sockets,
      ``execve`` unless ``allow_subprocesses``, ...) fails.
    * A **Python-level guard** (an audit hook; a tripwire, not a boundary) against sockets, process creation,
      signals to other processes, ``ctypes`` and writes outside the run's directory.

    Without namespaces (not root, or no ``CAP_SYS_ADMIN``) the host's files, sockets and FIFOs stay reachable and
    the judge shares the program's uid (it is non-dumpable, so ``/proc`` gives the program nothing of it, but the
    program may signal it: its test then fails). ``isolation="auto"`` warns once about every missing layer,
    ``"strict"`` refuses to run without them, ``"minimal"`` requires ``outer_sandbox=True``. It is a process-level
    sandbox on your kernel, not a security boundary; see ``docs/code_sandbox.md``.

Parallelism and cost
    Test cases run in a thread pool, one task per prompt (``max_workers`` prompts at once): one prompt's
    completions run one after the other, so siblings share nothing at the same time. Each run is reduced to
    booleans where it is collected (the stdout compared there), so the batch's output is never held. Each run costs a Python start-up (tens
    of milliseconds); an assert test's judge is a fork of it. Once a program has a syntax error, or
    (``skip_after_timeout``, default on) has timed out on a test case, its test cases not yet started are counted as
    failed without running them.

Metrics
    When TRL passes ``log_metric`` the reward logs, per call, the fraction of completions with no usable test
    cases (``code/no_tests``), a syntax error (``code/syntax_errors``, decided here from the program's text), at
    least one timeout (``code/timeouts``), output over the cap (``code/output_overflow``) and a sandbox failure
    (``code/sandbox_errors``). Running totals are kept in ``.counts``.

Standard library only (no torch, TRL or math-verify), like the rest of :mod:`grpo_family.rewards`. Linux only.
"""

from __future__ import annotations

import ast
import errno
import fcntl
import functools
import json
import logging
import math
import os
import re
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .extract import completion_text

__all__ = [
    "CodeTestsReward",
    "RunResult",
    "Sandbox",
    "TestCase",
    "code_tests_reward",
    "extract_code",
    "parse_test_cases",
    "prompt_helpers",
]

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("auto", "strict", "minimal")

# ------------------------------------------------------------------------------------------------ extraction

# A fence line, found by patterns without nested or adjacent overlapping repeats, so that each scan is linear in
# the text (the single pattern before issue 42 backtracked quadratically on an unclosed fence with a long label):
# an opening is a line starting with optional spaces/tabs, three backticks, optional spaces/tabs and a label; a
# closing is a line of exactly that without a label.
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)", re.MULTILINE)
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)
_PYTHON_LABELS = {"python", "py", "python3"}
# Characters of a completion scanned for fences, at most: far beyond any generated completion, and a bound on what
# one text can cost the trainer.
_MAX_SCANNED = 1 << 20


def _fenced_blocks(text: str):
    """``(label, body)`` of each closed fenced block in the first ``_MAX_SCANNED`` characters of ``text``, in
    order, by a line scanner: each opening fence line (followed by a newline) is closed by the next closing fence
    line; an opening never closed ends the scan (no later one can be closed either)."""
    scanned = text[:_MAX_SCANNED]
    pos = 0
    while pos <= len(scanned):
        opening = _FENCE_OPEN.search(scanned, pos)
        if opening is None:
            return
        newline = scanned.find("\n", opening.end())
        if newline < 0:
            return
        closing = _FENCE_CLOSE.search(scanned, newline + 1)
        if closing is None:
            return
        yield opening.group(1).lower(), scanned[newline + 1 : closing.start()]
        pos = closing.end() + 1


def extract_code(text: str) -> str:
    """The program in a completion text: the last closed ```` ```python ```` (``py``, ``python3``) block, else the
    last closed unlabelled fenced block, else the whole text (fences are looked for in its first
    ``_MAX_SCANNED`` characters)."""
    last_python = last_plain = None
    for label, body in _fenced_blocks(text):
        if label in _PYTHON_LABELS:
            last_python = body
        elif label == "":
            last_plain = body
    if last_python is not None:
        return last_python
    return last_plain if last_plain is not None else text


# ------------------------------------------------------------------------------------------------ test cases


@dataclass(frozen=True)
class TestCase:
    """One test case: ``stdin`` fed to the program and the ``expected`` stdout, or (assert style) ``test_code``, the
    Python the judge runs against the program."""

    __test__ = False  # not a pytest test class

    stdin: str = ""
    expected: str | None = None
    test_code: str | None = None


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n"  # a list of lines
    return None


def _io_cases(inputs: Sequence, outputs: Sequence) -> list[TestCase] | None:
    if len(inputs) != len(outputs):
        return None
    cases = []
    for stdin, expected in zip(inputs, outputs):
        stdin, expected = _text(stdin), _text(expected)
        if stdin is None or expected is None:
            return None
        cases.append(TestCase(stdin=stdin, expected=expected))
    return cases


def _assert_cases(source: str) -> list[TestCase] | None:
    """Split a string of Python into one test case per top-level ``assert``: the statements above it, with the
    asserts among them run as expressions whose outcome is not this case's (their calls still happen, so what they
    change is what plain Python's later asserts see), then the assert itself."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not tree.body:
        return None
    if not any(isinstance(node, ast.Assert) for node in tree.body):
        return [TestCase(test_code=source)]
    before: list[str] = []
    cases = []
    for node in tree.body:
        segment = ast.get_source_segment(source, node) or ast.unparse(node)
        if isinstance(node, ast.Assert):
            cases.append(TestCase(test_code="\n".join([*before, segment]) + "\n"))
            before.append(ast.unparse(_outcome_ignored(node.test)))
        else:
            before.append(segment)
    return cases


def _outcome_ignored(expression: ast.expr) -> ast.stmt:
    """``try: <expression>`` / ``except Exception: pass``."""
    handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None, body=[ast.Pass()])
    return ast.fix_missing_locations(ast.Try(body=[ast.Expr(expression)], handlers=[handler], orelse=[], finalbody=[]))


def parse_test_cases(value: Any) -> list[TestCase] | None:
    """The test cases of one row (see the module docstring for the formats); None when there are none usable."""
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped:
            return None
        if stripped[0] in "[{":
            try:
                value = json.loads(stripped)
            except ValueError:
                return None
        else:
            return _assert_cases(value)
    if isinstance(value, dict):
        if "fn_name" in value:
            return None  # APPS call-based tests: not supported
        if "inputs" in value and "outputs" in value:
            if not isinstance(value["inputs"], (list, tuple)) or not isinstance(value["outputs"], (list, tuple)):
                return None
            return _io_cases(value["inputs"], value["outputs"]) or None
        if "input" in value and "output" in value:
            return _io_cases([value["input"]], [value["output"]])
        return None
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, dict) and "input" in v and "output" in v for v in value):
            return _io_cases([v["input"] for v in value], [v["output"] for v in value])
        if all(isinstance(v, str) for v in value):
            cases = []
            for source in value:
                if not source.strip():
                    continue
                try:
                    ast.parse(source)
                except (SyntaxError, ValueError):
                    return None
                cases.append(TestCase(test_code=source))
            return cases or None
    return None


def normalize_output(text: str) -> str:
    """Output as compared: ``\\r\\n`` read as ``\\n``, trailing ASCII spaces, tabs and carriage returns stripped from
    every line, trailing blank lines dropped. Nothing else is forgiven: other whitespace (``\\x0b``, ``\\x0c``,
    ``\\x85``, no-break and ideographic spaces, line and paragraph separators) counts like any other character."""
    lines = [line.rstrip(" \t\r") for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _normalized(data: bytes) -> bytes:
    """:func:`normalize_output` on bytes (every character it forgives is ASCII, so UTF-8 text compares the same;
    invalid UTF-8 is compared as it is, never decoded)."""
    lines = [line.rstrip(b" \t\r") for line in data.replace(b"\r\n", b"\n").split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return b"\n".join(lines)


# ------------------------------------------------------------------------------------------------ the prompt's helpers


def _last_user_text(prompt: Any) -> str:
    """The text of a prompt: the whole string, or its last user message (text parts joined)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        content = users[-1].get("content") if users else None
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _is_stub(node: ast.stmt) -> bool:
    """A function whose body is only a docstring, ``pass``, ``...`` or ``raise NotImplementedError``, or a class
    whose statements all are such (or stub methods)."""

    def empty(statement: ast.stmt) -> bool:
        if isinstance(statement, ast.Pass):
            return True
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            return isinstance(statement.value.value, str) or statement.value.value is Ellipsis
        if isinstance(statement, ast.Raise) and statement.exc is not None:
            raised = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
            return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"
        return False

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return all(empty(s) for s in node.body)
    if isinstance(node, ast.ClassDef):
        return all(empty(s) or _is_stub(s) for s in node.body)
    return False


_HELPER_STATEMENTS = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef,
                      ast.ClassDef)  # fmt: skip


def prompt_helpers(prompt: Any) -> tuple[str, tuple[str, ...]]:
    """The helpers a prompt gives its tests, and its stubs: ``(source, stub names)``.

    The prompt's code is the fenced Python blocks of its last user message (``python`` / ``py`` / ``python3`` or
    unlabelled) that parse, else the whole message when it parses (HumanEval's prompt is code). Its top-level
    imports, assignments, and functions and classes with a body are the *helpers*: the judge defines them before
    the test, so a name the test uses means the prompt's definition whatever the program defines (HumanEval/38's
    ``encode_cyclic``); the program's namespace gets them too, before the program runs (HumanEval runs prompt +
    completion). A function whose body is only a docstring, ``pass``, ``...`` or ``raise NotImplementedError`` (a
    class made of such) is a *stub*: the program's to define, even where its name is a builtin's or a standard
    module's. A prompt that shows a full implementation of the function under test makes it a helper, so every
    program passes that row's tests: give such rows a stub.
    """
    text = _last_user_text(prompt)
    blocks = [body for label, body in _fenced_blocks(text) if label in _PYTHON_LABELS or label == ""]
    helpers: list[str] = []
    stubs: list[str] = []
    for source in blocks or [text]:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        for node in tree.body:
            if _is_stub(node):
                stubs.append(node.name)
            elif isinstance(node, _HELPER_STATEMENTS):
                helpers.append(ast.get_source_segment(source, node) or ast.unparse(node))
    return "\n\n".join(helpers), tuple(stubs)


# ------------------------------------------------------------------------------------------------ the sandbox

# The sandbox's first process: a module of its own, standard library only, so that it starts as fast as a bare
# interpreter (see its docstring). ``python -I -S -B -X utf8 -c _BOOTSTRAP <rewards dir>`` loads it and its codec
# through the interpreter's own source loader, which reads their cached bytecode when it is fresh (compiling them
# on every run cost ~10 ms of CPU); the directory itself never goes on ``sys.path``.
_CHILD_PATH = str(Path(__file__).resolve().with_name("_sandbox_child.py"))
_CODEC_PATH = str(Path(__file__).resolve().with_name("_plain_values.py"))
_BOOTSTRAP = """import sys
loader = sys.modules["_frozen_importlib_external"].SourceFileLoader
def load(name):
    path = sys.argv[1] + "/" + name + ".py"
    module = sys.modules[name] = type(sys)(name)
    module.__file__ = path
    exec(loader(name, path).get_code(name), module.__dict__)
    return module
load("_plain_values")
load("_sandbox_child").main()
"""


@functools.lru_cache(maxsize=4096)
def _module_names(*sources: str) -> list[str]:
    """The names the test and the prompt's helpers use only as ``name.attribute``: modules they rely on (MBPP's
    ``math.isclose``, where the test never imports ``math``). The judge never asks the program for these: a
    standard module of that name, else a NameError, so a program's fake ``math`` or ``numpy`` cannot answer. A
    standard module's name used otherwise (called: a function under test named ``calendar``) is left to the
    program."""
    as_base, bare = set(), set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        bases = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (as_base if id(node) in bases and isinstance(node.ctx, ast.Load) else bare).add(node.id)
    return sorted(as_base - bare)


@functools.lru_cache(maxsize=1024)
def _statements(source: str) -> list[str]:
    """The sources of ``source``'s top-level statements (the child runs them one by one and needs no ``ast``)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    return [ast.get_source_segment(source, node) or ast.unparse(node) for node in tree.body]


@functools.cache
def _write_bytecode() -> None:
    """Cache the child's and the codec's bytecode where the child's loader looks (best effort: a read-only
    install just compiles them on every run)."""
    import py_compile

    for path in (_CHILD_PATH, _CODEC_PATH):
        try:
            py_compile.compile(path, doraise=True)
        except (OSError, py_compile.PyCompileError):
            pass


# What is read back from a run, at most (bytes): the child's report of its layers, the judge's verdict. Stdout and
# stderr are capped at max_output_bytes; nothing else the run writes reaches this process.
_REPORT_CAP = 1 << 14
_VERDICT_CAP = 1 << 12
_STDERR_TAIL = 1 << 12  # of stderr, only the last bytes are kept (its length still counts against the cap)
# A message between the judge and the program, at most (bytes; the judge's own memory limit and the deadline bound it
# too): a call's arguments come back with its result, so a 1 MB list argument is 2 MB of reply.
_MESSAGE_CAP = 1 << 24
_TMPFS_INODES = 1024  # files and directories the program may create in its private /tmp
_MAX_PTYS = 4  # ptys one run may open (its own devpts instance)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: a clone with any of them is refused.
_CLONE_NAMESPACE_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
# The syscall filter is an allow-list: what CPython's start-up, the standard library and the child need once the
# filter is loaded, found by running test programs (stdin/stdout, an assert test's judge, threads, fork,
# multiprocessing, sqlite, tempfile, hashlib, ...) under `strace -f` and keeping the calls made after
# PR_SET_SECCOMP, plus their plain siblings (read -> readv, stat -> statx, ...). Everything else fails with
# EPERM, by construction: locks (flock, fcntl's lock commands), page-cache advice and probes (fadvise64,
# readahead, mincore, madvise's WILLNEED / COLD / PAGEOUT, preadv2 / pwritev2 and their RWF flags), AIO and
# io_uring, setsid / setpgid (a scheduler group of one's own), namespaces, mounts, keyrings, bpf, perf, ptrace,
# System V and POSIX IPC, memfd, inotify, timers, chown, mknod, xattrs writes, and whatever the kernel adds later.
# Importing and using a listed native package (numpy with OpenBLAS: its .so files mapped, sched_getaffinity, a thread
# pool, traced the same way) needs nothing more; OpenBLAS's mbind (a NUMA placement hint for its buffers) stays
# refused, and OpenBLAS goes on without it.
_ALLOWED_SYSCALLS = (
    # files: read, write, metadata, directories (within the run's view: read-only binds and its own tmpfs)
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "open", "openat", "openat2",
    "creat", "close", "close_range", "lseek", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs",
    "access", "faccessat", "faccessat2", "readlink", "readlinkat", "getdents", "getdents64", "getcwd", "chdir",
    "fchdir", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "link",
    "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "truncate", "ftruncate", "fallocate",
    "utimensat", "umask", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    "sendfile", "copy_file_range", "dup", "dup2", "dup3", "pipe", "pipe2", "ioctl",
    # waiting on descriptors
    "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2",
    # memory (RLIMIT_AS counts it)
    "brk", "mmap", "munmap", "mremap", "mprotect", "msync",
    # processes and threads
    "fork", "vfork", "wait4", "waitid", "exit", "exit_group", "getpid", "getppid", "gettid", "getuid", "geteuid",
    "getgid", "getegid", "getgroups", "getresuid", "getresgid", "getpgrp", "getpgid", "getsid", "kill", "tkill",
    "tgkill", "set_tid_address", "set_robust_list", "get_robust_list", "rseq", "futex", "arch_prctl", "prctl",
    "capget", "sched_yield", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "getpriority", "getrlimit", "prlimit64", "getrusage",
    "times", "restart_syscall",
    # signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "rt_sigsuspend",
    "sigaltstack", "pause", "alarm", "getitimer", "setitimer",
    # time, randomness, the machine
    "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time", "getrandom", "uname",
    "sysinfo", "getcpu",
)  # fmt: skip
# fcntl commands CPython and the standard library use: F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL,
# F_DUPFD_CLOEXEC, F_GETPIPE_SZ (no lock command: F_GETLK / F_SETLK / F_SETLKW / F_OFD_*).
_ALLOWED_FCNTL = (0, 1, 2, 3, 4, 1030, 1032)
# madvise advice that touches only this process's own mappings: NORMAL, RANDOM, SEQUENTIAL, DONTNEED, FREE,
# DONTFORK, DOFORK, HUGEPAGE, NOHUGEPAGE, DONTDUMP, DODUMP (not WILLNEED, COLD, PAGEOUT, POPULATE_*: those read
# or evict the shared page cache).
_ALLOWED_MADVISE = (0, 1, 2, 4, 8, 10, 11, 14, 15, 16, 17)
# Flushing calls succeed without doing anything (the run's files are on tmpfs; the rest is read-only and shared).
_NO_OP_SYSCALLS = ("sync", "syncfs", "fsync", "fdatasync", "sync_file_range")


@functools.lru_cache(maxsize=4)
def syscall_filter_program(allow_subprocesses: bool) -> tuple[bytes | None, str]:
    """The seccomp BPF program the sandbox loads before the program runs (built by libseccomp through
    ``pyseccomp``): the allow-list above, everything else EPERM (sockets EACCES, ``clone3`` ENOSYS so that the C
    library falls back to ``clone``, whose flags a filter can read); and a note (why it is unavailable, or the
    allowed syscalls this libseccomp does not know)."""
    try:
        import pyseccomp
    except Exception as e:  # not installed, or libseccomp missing (pyseccomp loads it when imported)
        return None, f"no syscall filter: pyseccomp / libseccomp unavailable ({type(e).__name__}: {e})"
    try:
        program_filter = pyseccomp.SyscallFilter(pyseccomp.ERRNO(errno.EPERM))
        unknown = []
        allow = pyseccomp.ALLOW
        for name in _ALLOWED_SYSCALLS + (("execve", "execveat") if allow_subprocesses else ()):
            try:
                program_filter.add_rule(allow, name)
            except Exception:
                unknown.append(name)  # not a syscall of this architecture, or too new for this libseccomp
        for name in _NO_OP_SYSCALLS:
            program_filter.add_rule(pyseccomp.ERRNO(0), name)
        program_filter.add_rule(allow, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, _CLONE_NAMESPACE_MASK, 0))
        for command in _ALLOWED_FCNTL:
            program_filter.add_rule(allow, "fcntl", pyseccomp.Arg(1, pyseccomp.EQ, command))
        for advice in _ALLOWED_MADVISE:
            program_filter.add_rule(allow, "madvise", pyseccomp.Arg(2, pyseccomp.EQ, advice))
        program_filter.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
        # No sockets at all: no network without a network namespace either.
        program_filter.add_rule(pyseccomp.ERRNO(errno.EACCES), "socket")
        program_filter.add_rule(pyseccomp.ERRNO(errno.EACCES), "socketpair")
        with tempfile.TemporaryFile() as exported:
            program_filter.export_bpf(exported)
            exported.seek(0)
            program = exported.read()
    except Exception as e:
        return None, f"no syscall filter: libseccomp failed ({type(e).__name__}: {e})"
    return program, f"syscalls unknown to libseccomp here: {', '.join(unknown)}" if unknown else ""


_STARTUP_TIMEOUT_S = 30.0  # for the sandbox to get ready (not charged to the program's timeout_s)

_PACKAGES_PATH = str(Path(__file__).resolve().with_name("_sandbox_packages.py"))
# With listed packages, native libraries that start a thread pool per core (OpenBLAS, OpenMP, MKL, numexpr) start
# none: a pool per core would meet RLIMIT_NPROC (max_processes) and multiply RLIMIT_AS's per-thread buffers on a
# large machine, failing the import for reasons that are not the program's.
_ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "NUMEXPR_NUM_THREADS")}  # fmt: skip


def _package_paths(names: list[str], python: str) -> tuple[str, ...]:
    """What the sandbox exposes for the listed ``packages`` (:mod:`._sandbox_packages`), as ``python`` has them:
    asked in this process when ``python`` is this interpreter, else by running the resolver with ``python``.
    Raises ValueError for a name it lacks, with the fix."""
    if python == sys.executable:
        from ._sandbox_packages import package_paths

        return tuple(package_paths(names, python))
    try:
        done = subprocess.run(
            [python, "-I", "-B", _PACKAGES_PATH, *names], capture_output=True, text=True, timeout=120, check=True
        )
        answer = json.loads(done.stdout.splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        raise ValueError(f"packages: cannot ask {python} which packages it has ({type(e).__name__}: {e})") from None
    if "error" in answer:
        raise ValueError(answer["error"])
    return tuple(answer["paths"])


@dataclass
class RunResult:
    """What one sandboxed run did. ``stdout`` is decoded (invalid UTF-8 replaced) and at most ``max_output_bytes``
    long (empty when the run was given ``expected``: ``output_matches`` then says whether it matched); ``stderr`` is
    the last ``_STDERR_TAIL`` bytes of it, decoded; ``completed`` is True when the program finished without an
    exception or ``exit()`` (stdin/stdout runs) or the judge reached a verdict (test runs); ``verdict`` (test runs) is the judge's: True
    when the test passed, False when it failed, None when no verdict arrived; ``judge`` is the judge's report
    (``calls``: how many calls into the program the test made, ``note``: why it failed); ``syntax_error`` is decided
    here, before running, from the program's text; ``isolation`` is the child's report of the layers it applied
    (empty when it never got that far); ``error`` is set when the sandbox itself failed (not the program)."""

    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    output_overflow: bool = False
    completed: bool = False
    syntax_error: bool = False
    verdict: bool | None = None
    output_matches: bool | None = None
    judge: dict = field(default_factory=dict)
    duration_s: float = 0.0
    isolation: dict = field(default_factory=dict)
    error: str | None = None


def _mapped_ids(path: str) -> list[tuple[int, int]]:
    """``[(first, last)]`` ids usable in our user namespace (``/proc/self/uid_map`` inside ranges)."""
    ranges = []
    try:
        with open(path) as f:
            for line in f:
                inside, _, count = (int(x) for x in line.split())
                ranges.append((inside, inside + count - 1))
    except (OSError, ValueError):
        pass
    return ranges


_UID_LOW, _UID_HIGH = 1 << 20, (1 << 31) - 2
_NOBODY = 65534


def _pick_sandbox_uid() -> int | None:
    """A fresh uid (= gid) for one run: random in [2^20, 2^31) when mapped (so each run's RLIMIT_NPROC counts only
    its own processes), else ``nobody`` when mapped, else None."""
    uids, gids = _mapped_ids("/proc/self/uid_map"), _mapped_ids("/proc/self/gid_map")

    def mapped(i: int) -> bool:
        return any(a <= i <= b for a, b in uids) and any(a <= i <= b for a, b in gids)

    if mapped(_UID_LOW) and mapped(_UID_HIGH):
        return _UID_LOW + secrets.randbelow(_UID_HIGH - _UID_LOW)
    return _NOBODY if mapped(_NOBODY) else None


class Sandbox:
    """Runs Python programs in a sandboxed subprocess; see the module docstring for the layers.

    Args:
        timeout_s: wall-clock seconds the program may run (start-up not included); ``RLIMIT_CPU`` is this rounded
            up, plus one second.
        memory_mb: address-space limit per process (``RLIMIT_AS``).
        max_processes: processes and threads the program may have at once (``RLIMIT_NPROC``; see the docstring for
            when it is enforced).
        max_output_bytes: cap on stdout and on stderr; a run that writes more is killed.
        disk_mb: largest file (``RLIMIT_FSIZE``) and size of the private ``/tmp`` tmpfs.
        isolation: ``"auto"`` (every layer this machine allows, a warning listing the missing ones), ``"strict"``
            (:meth:`check` raises unless the namespaces, the private filesystem view, the uid drop and the syscall
            filter are in place) or
            ``"minimal"`` (no namespaces and no uid drop: environment, temporary directory, rlimits, timeout, output
            cap, syscall filter and Python guard only), refused unless ``outer_sandbox=True``.
        outer_sandbox: declare that the whole process already runs inside a real sandbox (gVisor, a VM, nsjail, a
            disposable container without credentials); required by ``isolation="minimal"``, whose own layers do not
            contain untrusted code.
        syscall_filter: load the seccomp filter (see the docstring); off only to test the other layers alone.
        python_guard: install the audit-hook guard (see the docstring).
        allow_subprocesses: let the guard allow process creation (still bounded by ``max_processes``).
        python: interpreter to run (default: this one).
        tmp_root: where run directories are created (default: :func:`tempfile.gettempdir`).
        packages: installed packages the program may import besides the standard library: distribution names
            (``"numpy"``, ``"PyYAML"``) or their import names (``"yaml"``), checked here against ``python``
            (ValueError for one it lacks). For each, exactly what that distribution installed directly in its
            site-packages directory (``numpy/``, ``numpy.libs/``, its ``.dist-info``) is shown read-only in one
            directory on the program's ``sys.path`` (after the standard library's), and nothing else of
            site-packages; dependencies are not followed (list them too). The judge's ``sys.path`` stays the
            standard library's. A listed package's code runs with the program's limits and layers, but a native
            extension is C code the audit hook does not see, driven by the program's inputs: each one enlarges the
            attack surface (see ``docs/code_sandbox.md``, "Listed packages"); list only what the task needs.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_processes: int = 8,
        max_output_bytes: int = 1 << 20,
        disk_mb: int = 64,
        isolation: Literal["auto", "strict", "minimal"] = "auto",
        outer_sandbox: bool = False,
        syscall_filter: bool = True,
        python_guard: bool = True,
        allow_subprocesses: bool = False,
        python: str | None = None,
        tmp_root: str | None = None,
        packages: Sequence[str] = (),
    ):
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {isolation!r}")
        if isolation == "minimal" and not outer_sandbox:
            raise ValueError(
                "isolation='minimal' runs untrusted code without namespaces or a uid drop: its remaining layers "
                "(rlimits, the syscall filter, the Python audit hook) leave writes anywhere as this user, reading our "
                "environment through /proc, processes that outlive the run and (as root) the judge's verdict open to "
                "the program. Use it only inside a real sandbox (gVisor, a VM, nsjail, a disposable container) and "
                "say so with outer_sandbox=True; otherwise use isolation='auto' or 'strict'."
            )
        for name, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("max_processes", max_processes),
                            ("max_output_bytes", max_output_bytes), ("disk_mb", disk_mb)):  # fmt: skip
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_processes = int(max_processes)
        self.max_output_bytes = int(max_output_bytes)
        self.disk_mb = int(disk_mb)
        self.isolation = isolation
        self.outer_sandbox = outer_sandbox
        self.syscall_filter = syscall_filter
        self.python_guard = python_guard
        self.allow_subprocesses = allow_subprocesses
        self.python = python or sys.executable
        self.tmp_root = tmp_root
        if isinstance(packages, str):
            raise ValueError(f"packages must be a sequence of names, got the string {packages!r}")
        self.packages = tuple(packages)
        # Decided here, once, before any run (and any training): every run binds exactly these paths.
        self.package_paths = _package_paths(list(self.packages), self.python) if self.packages else ()

    def __repr__(self) -> str:
        listed = f", packages={self.packages!r}" if self.packages else ""
        return (
            f"Sandbox(timeout_s={self.timeout_s}, memory_mb={self.memory_mb}, max_processes={self.max_processes}, "
            f"isolation={self.isolation!r}, syscall_filter={self.syscall_filter}, python_guard={self.python_guard}"
            f"{listed})"
        )

    def _settings(self, fds: dict[str, int], helpers: str, stubs: Sequence[str]) -> dict:
        os_layers = self.isolation != "minimal"
        bpf = syscall_filter_program(self.allow_subprocesses)[0] if self.syscall_filter else None
        uid = judge_uid = None
        if os_layers and os.geteuid() == 0:
            uid = judge_uid = _pick_sandbox_uid()
            while uid is not None and uid != _NOBODY and judge_uid == uid:
                judge_uid = _pick_sandbox_uid()
        return {
            **{f"{name}_fd": fd for name, fd in fds.items()},
            "helpers": _statements(helpers),
            "stubs": list(stubs),
            "syscall_filter": None if bpf is None else bpf.hex(),
            "tmpfs_inodes": _TMPFS_INODES,
            "max_ptys": _MAX_PTYS,
            "os_layers": os_layers,
            "uid": uid,
            "judge_uid": judge_uid,
            "cpu_s": math.ceil(self.timeout_s) + 1,
            "memory_mb": self.memory_mb,
            "disk_mb": self.disk_mb,
            "max_processes": self.max_processes,
            "max_message_bytes": max(_MESSAGE_CAP, self.max_output_bytes),
            "python_guard": self.python_guard,
            "allow_subprocesses": self.allow_subprocesses,
            "packages": list(self.package_paths),
        }

    def run(
        self,
        program: str,
        stdin: str = "",
        *,
        test: str | None = None,
        helpers: str = "",
        stubs: Sequence[str] = (),
        expected: str | None = None,
    ) -> RunResult:
        """Run ``program`` with ``stdin`` in a fresh sandbox. With ``test`` (Python source), the judge runs it
        against the program (after ``helpers``, the prompt's; ``stubs`` are names the program defines) and
        ``RunResult.verdict`` is its verdict (see the module docstring). With ``expected``, the program's stdout is
        compared with it here, as bytes (:func:`normalize_output`'s rules), into ``RunResult.output_matches``, and
        is not kept (``stdout`` stays empty): what the reward needs is a boolean."""
        if sys.platform != "linux":
            raise RuntimeError("the code-execution sandbox needs Linux")
        _write_bytecode()
        start = time.monotonic()
        result = RunResult()
        try:  # decided here from the text, so nothing the program prints can claim or hide a syntax error
            compile(program, "program.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as e:
            result.syntax_error = True
            result.returncode = 1
            result.stderr = f"{type(e).__name__}: {e}"
            return result
        try:
            workdir = tempfile.mkdtemp(prefix="grpo_code_", dir=self.tmp_root)
        except OSError as e:
            result.error = f"cannot create a temporary directory: {e}"
            return result
        ours: dict[str, int] = {}  # our ends of the run's pipes
        theirs: dict[str, int] = {}  # the child's ends, closed here once it has them
        proc = None
        try:
            ours["status"], theirs["status"] = os.pipe()
            if test is not None:
                theirs["test"], ours["test"] = os.pipe()  # the test, for the judge only
                ours["verdict"], theirs["verdict"] = os.pipe()
                fcntl.fcntl(ours["test"], fcntl.F_SETFL, os.O_NONBLOCK)
            with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(program)
            with open(os.path.join(workdir, "sandbox.json"), "w", encoding="utf-8") as f:
                json.dump(self._settings(theirs, helpers, stubs), f)
            stdin_path = os.path.join(workdir, "stdin.txt")
            with open(stdin_path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(stdin)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
            if self.package_paths:
                env.update(_ONE_THREAD)
            with open(stdin_path, "rb") as stdin_file:
                proc = subprocess.Popen(
                    [self.python, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOTSTRAP, os.path.dirname(_CHILD_PATH)],
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=tuple(theirs.values()),
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            for fd in theirs.values():
                os.close(fd)
            theirs.clear()
            job = None
            if test is not None:
                modules = _module_names(test, helpers)
                job = json.dumps({"test": test, "modules": modules}).encode("utf-8", "surrogatepass")
            self._collect(proc, ours, start, job, result, expected)
        except OSError as e:
            result.error = f"cannot run the sandbox: {e}"
        finally:
            if proc is not None:
                if "pid" in result.isolation.get("namespaces", ()) and not _exited(proc.pid):
                    # Ask our process outside the PID namespace to kill its init and to exit once the
                    # namespace is empty, so that nothing of the run outlives this call.
                    os.kill(proc.pid, signal.SIGTERM)  # not proc.send_signal: that may reap it
                    end = time.monotonic() + 5.0
                    while not _exited(proc.pid) and time.monotonic() < end:
                        time.sleep(0.005)
                _kill_group(proc)
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                proc.wait()
                if result.returncode is None and not result.timed_out and not result.output_overflow:
                    result.returncode = proc.returncode
            for fd in [*ours.values(), *theirs.values()]:
                os.close(fd)
            _remove_tree(workdir)
            result.duration_s = time.monotonic() - start
        if test is None:
            result.completed = result.returncode == 0 and not result.timed_out and not result.output_overflow
        else:
            result.completed = result.verdict is not None
        if self.syscall_filter and result.isolation and not result.isolation.get("syscall_filter"):
            result.isolation.setdefault("notes", []).append(syscall_filter_program(self.allow_subprocesses)[1])
        if proc is not None and not result.isolation and not result.timed_out and result.error is None:
            # The child died before it could run the program: our failure, not the program's.
            result.error = f"the sandbox failed to start: {result.stderr.strip()[-500:] or 'no output'}"
        return result

    def _collect(self, proc: subprocess.Popen, ours: dict[str, int], start: float, job: bytes | None,
                 result: RunResult, expected: str | None = None) -> None:  # fmt: skip
        """Read stdout, stderr, the report and the verdict, each up to its cap, and write the test to the judge,
        until the child exits (or the deadline / output cap). Nothing read is decoded beyond its cap."""
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        caps = {out: self.max_output_bytes, err: self.max_output_bytes, ours["status"]: _REPORT_CAP}
        if "verdict" in ours:
            caps[ours["verdict"]] = _VERDICT_CAP
        buffers = {fd: bytearray() for fd in caps}
        pending = memoryview(job) if job is not None else None
        # Start-up (interpreter, namespaces, mounts) is not charged to the program: its clock starts when the child
        # reports that it is about to run it (the status pipe's first line).
        deadline = start + _STARTUP_TIMEOUT_S
        program_started = False
        cpu_at_start, next_cpu_check = 0.0, 0.0
        exited_at = None
        stderr_bytes = 0
        with selectors.DefaultSelector() as selector:
            for fd in buffers:
                selector.register(fd, selectors.EVENT_READ)
            if pending is not None:
                selector.register(ours["test"], selectors.EVENT_WRITE)
            while any(key.events & selectors.EVENT_READ for key in selector.get_map().values()):
                now = time.monotonic()
                if program_started and exited_at is None and now >= next_cpu_check:
                    next_cpu_check = now + _CPU_CHECK_S
                    if _tree_cpu_s(proc.pid) - cpu_at_start >= self.timeout_s:
                        deadline = now
                if now >= deadline:
                    if exited_at is None and program_started:
                        result.timed_out = True
                    elif exited_at is None:
                        result.error = f"the sandbox did not start within {_STARTUP_TIMEOUT_S:.0f} s"
                    break
                for key, _ in selector.select(min(deadline - now, 0.05)):
                    if key.fd == ours.get("test"):
                        try:
                            pending = pending[os.write(key.fd, pending[: 1 << 16]) :]
                        except BlockingIOError:
                            continue
                        except OSError:  # the judge is gone
                            pending = pending[:0]
                        if not pending:
                            selector.unregister(key.fd)
                            os.close(ours.pop("test"))
                        continue
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fd)
                        continue
                    buf = buffers[key.fd]
                    buf += data
                    if key.fd == err:  # stderr: counted to its cap, only a short tail kept
                        stderr_bytes += len(data)
                        del buf[:-_STDERR_TAIL]
                    if len(buf) > caps[key.fd] or (key.fd == err and stderr_bytes > caps[err]):
                        del buf[caps[key.fd] :]
                        if key.fd in (out, err):
                            result.output_overflow = True
                        selector.unregister(key.fd)
                if not program_started and b"\n" in buffers[ours["status"]]:
                    program_started = True
                    if exited_at is None:
                        deadline = time.monotonic() + self.timeout_s * _WALL_CAP
                        cpu_at_start = _tree_cpu_s(proc.pid)
                if result.output_overflow:
                    break
                if exited_at is None and _exited(proc.pid):
                    # Give stragglers holding our pipes a moment, then stop reading (they are killed next).
                    exited_at = time.monotonic()
                    deadline = min(deadline, exited_at + 0.5)
        # The report and the verdict may hold lines not read yet (we stopped on another pipe's overflow or the
        # deadline).
        for name in ("status", "verdict"):
            fd = ours.get(name)
            while fd is not None and len(buffers[fd]) < caps[fd] and select.select([fd], [], [], 0)[0]:
                data = os.read(fd, caps[fd])
                if not data:
                    break
                buffers[fd] += data
        if expected is None:
            result.stdout = buffers[out].decode("utf-8", errors="replace")
        else:
            result.output_matches = _normalized(bytes(buffers[out])) == _normalized(
                expected.encode("utf-8", "surrogatepass")
            )
        buffers[out] = bytearray()
        result.stderr = buffers[err].decode("utf-8", errors="replace")
        result.isolation = _first_json_line(buffers[ours["status"]], caps[ours["status"]]) or {}
        if "verdict" in ours:
            verdict = _first_json_line(buffers[ours["verdict"]], caps[ours["verdict"]])
            if verdict is not None and type(verdict.get("passed")) is bool and type(verdict.get("calls")) is int:
                result.verdict = verdict["passed"]
                result.judge = {"calls": verdict["calls"], "note": str(verdict.get("note", ""))[:500]}

    def check(self) -> dict:
        """Run an empty program and return the isolation report (what this machine allows). Raises RuntimeError
        when the sandbox cannot start, or, with ``isolation="strict"``, when a layer is missing."""
        result = self.run("")
        if result.error is not None or result.returncode != 0:
            raise RuntimeError(f"the code sandbox does not work here: {result.error or result.stderr[-500:]}")
        missing = missing_layers(result.isolation, self)
        if self.isolation == "strict" and missing:
            raise RuntimeError(
                "isolation='strict' but the code sandbox lacks: " + "; ".join(missing) + ". Run as root with "
                "CAP_SYS_ADMIN (e.g. a container started with --cap-add SYS_ADMIN, or a VM), or use "
                "isolation='auto' and an outer sandbox (see docs/code_sandbox.md)."
            )
        return result.isolation


def _first_json_line(data: bytearray, cap: int) -> dict | None:
    """The first line of ``data`` (at most ``cap`` bytes) as a JSON object, or None."""
    line = bytes(data[:cap]).split(b"\n", 1)[0]
    try:
        value = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return value if type(value) is dict else None


def missing_layers(report: dict, sandbox: Sandbox) -> list[str]:
    """Human-readable list of the layers a run's isolation report lacks (empty for the full set)."""
    if sandbox.isolation == "minimal":
        return []
    missing = []
    namespaces = report.get("namespaces", [])
    for ns, what in (("net", "network namespace (no network)"), ("pid", "PID namespace"), ("ipc", "IPC namespace")):
        if ns not in namespaces:
            missing.append(what)
    if not report.get("private_root"):
        missing.append(
            "private filesystem view (host files, sockets and FIFOs stay reachable"
            + (", read-only" if report.get("readonly_root") else "")
            + ("; no mount namespace)" if "mnt" not in namespaces else ")")
        )
    if report.get("uid") is None:
        missing.append(
            "uid drop (RLIMIT_NPROC not enforced as root; a root program can rewrite the judge's memory)"
            if report.get("euid") == 0
            else "uid drop (the judge shares the program's uid)"
        )
    if sandbox.syscall_filter and not report.get("syscall_filter"):
        missing.append(
            "seccomp syscall filter ("
            + (syscall_filter_program(sandbox.allow_subprocesses)[1] or "could not be loaded")
            + ")"
        )
    return missing


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The deadline is on the run's CPU time (timeout_s, every process of it together, checked every _CPU_CHECK_S), with
# a wall-clock cap of _WALL_CAP x timeout_s: a program starved by other runs on a busy machine is not failed for
# it, and a program that sleeps or blocks is still stopped.
_WALL_CAP = 3.0
_CPU_CHECK_S = 0.1


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and every process below it (``/proc/<pid>/task/<tid>/children``), including the
    children they have reaped (``cutime``/``cstime``; the run's init reaps every orphan); 0 where unreadable."""
    ticks, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                    stack.extend(int(child) for child in f.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return ticks / _CLOCK_TICKS


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited, without reaping it (its pid, our process-group id, stays reserved)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group (the child is a session leader; not yet reaped, so the id is still ours)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)
    if os.path.exists(path):
        logger.warning("could not remove the sandbox directory %s", path)


# ------------------------------------------------------------------------------------------------ the reward

_WARNED: set[tuple] = set()
_WARN_LOCK = threading.Lock()


class CodeTestsReward:
    """TRL reward function: fraction of test cases the completion's program passes (see the module docstring).

    Args:
        timeout_s, memory_mb, max_processes, max_output_bytes, disk_mb, isolation, outer_sandbox, syscall_filter,
        python_guard, allow_subprocesses, python, tmp_root: the :class:`Sandbox` settings.
        packages: installed packages the program may import besides the standard library (``("numpy",)``),
            checked at construction (ValueError for one ``python`` lacks); only what each listed distribution
            installed in site-packages is exposed, to the program only (not the judge). Their code runs with the
            program's limits, but native extensions enlarge the attack surface: see :class:`Sandbox`.
        max_workers: test cases run at once (each is a subprocess); default ``min(4, cpu count)``.
        max_tests: use at most this many test cases per row (the first ones); None for all.
        skip_after_timeout: once a program times out on a test case, count its not-yet-started ones as failed.
        name: the function name TRL logs the reward under.

    Called as ``reward(completions, test_cases=[...], prompts=[...])`` (TRL passes ``prompts``; an assert test's
    judge takes the prompt's helpers and stubs from it, see :func:`prompt_helpers`). Instances are picklable.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_processes: int = 8,
        max_output_bytes: int = 1 << 20,
        disk_mb: int = 64,
        max_workers: int | None = None,
        max_tests: int | None = None,
        skip_after_timeout: bool = True,
        isolation: Literal["auto", "strict", "minimal"] = "auto",
        outer_sandbox: bool = False,
        syscall_filter: bool = True,
        python_guard: bool = True,
        allow_subprocesses: bool = False,
        python: str | None = None,
        tmp_root: str | None = None,
        packages: Sequence[str] = (),
        name: str = "code_tests",
    ):
        self.sandbox = Sandbox(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_output_bytes=max_output_bytes,
            disk_mb=disk_mb,
            isolation=isolation,
            outer_sandbox=outer_sandbox,
            syscall_filter=syscall_filter,
            python_guard=python_guard,
            allow_subprocesses=allow_subprocesses,
            python=python,
            tmp_root=tmp_root,
            packages=packages,
        )
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if max_tests is not None and max_tests < 1:
            raise ValueError(f"max_tests must be >= 1 or None, got {max_tests}")
        self.max_workers = max_workers or min(4, os.cpu_count() or 1)
        self.max_tests = max_tests
        self.skip_after_timeout = skip_after_timeout
        self.__name__ = name
        self.counts: Counter[str] = Counter()
        self._checked = False

    def __repr__(self) -> str:
        return f"CodeTestsReward(name={self.__name__!r}, {self.sandbox!r}, max_workers={self.max_workers})"

    def _check_once(self) -> None:
        """Probe the sandbox once per instance: strict mode raises, auto mode warns (once per process)."""
        if self._checked:
            return
        report = self.sandbox.check()
        self._checked = True
        missing = missing_layers(report, self.sandbox)
        key = (self.sandbox.isolation, tuple(missing))
        with _WARN_LOCK:
            if missing and key not in _WARNED:
                _WARNED.add(key)
                warnings.warn(
                    f"{self.__name__}: the code sandbox runs without: {'; '.join(missing)} (not root, or no "
                    "CAP_SYS_ADMIN). Run untrusted code inside a container or another outer sandbox (see "
                    "docs/code_sandbox.md).",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def __call__(
        self,
        completions: list,
        test_cases: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        prompts: list | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        if test_cases is None:
            raise ValueError(
                f"{self.__name__} needs the test cases in a 'test_cases' dataset column (a list of "
                "{'input': ..., 'output': ...} or a string of assert statements per row); rename your column"
            )
        if len(test_cases) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(test_cases)} test_cases rows")
        if prompts is not None and len(prompts) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(prompts)} prompts")
        suites = [parse_test_cases(value) for value in test_cases]
        if self.max_tests is not None:
            suites = [s[: self.max_tests] if s else s for s in suites]
        programs = [extract_code(completion_text(c)) for c in completions]
        helpers: list[tuple[str, tuple[str, ...]]] = [("", ())] * len(completions)
        if prompts is not None:
            by_text: dict[str, tuple[str, tuple[str, ...]]] = {}
            for i, (prompt, suite) in enumerate(zip(prompts, suites)):
                if suite and suite[0].test_code is not None:
                    text = _last_user_text(prompt)
                    if text not in by_text:
                        by_text[text] = prompt_helpers(text)
                    helpers[i] = by_text[text]
        if any(suites):
            self._check_once()

        # What is kept of each run: whether it passed and the flags the metrics count, never its output.
        outcomes: list[list[_Outcome | None]] = [[None] * len(s) if s else [] for s in suites]

        def run_prompt(members: list[int]) -> None:
            """Every run of one prompt's completions, one after the other: siblings never run at the same time, so
            nothing they share (locks, the page cache, the CPU) carries a bit from one to another."""
            for i in members:
                for j, case in enumerate(suites[i]):
                    if case.test_code is None:
                        result = self.sandbox.run(programs[i], case.stdin, expected=case.expected)
                    else:
                        source, stubs = helpers[i]
                        result = self.sandbox.run(programs[i], test=case.test_code, helpers=source, stubs=stubs)
                    outcomes[i][j] = _Outcome.of(case, result)
                    if result.syntax_error or (result.timed_out and self.skip_after_timeout):
                        break

        groups: dict[str, list[int]] = {}
        for i, suite in enumerate(suites):
            if suite:  # siblings: the same prompt (else, without prompts, the same row of tests)
                key = repr(prompts[i]) if prompts is not None else repr(test_cases[i])
                groups.setdefault(key, []).append(i)
        if groups:
            workers = min(self.max_workers, len(groups))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code") as pool:
                for future in [pool.submit(run_prompt, members) for members in groups.values()]:
                    future.result()

        rewards: list[float | None] = []
        batch: Counter[str] = Counter()
        for suite, runs in zip(suites, outcomes):
            if not suite:
                batch["no_tests"] += 1
                rewards.append(None)
                continue
            done = [r for r in runs if r is not None]
            if any(r.error for r in done):
                batch["sandbox_errors"] += 1
                rewards.append(None)
                continue
            batch["syntax_errors"] += any(r.syntax_error for r in done)
            batch["timeouts"] += any(r.timed_out for r in done)
            batch["output_overflow"] += any(r.output_overflow for r in done)
            rewards.append(sum(r.passed for r in done) / len(suite))

        batch["total"] = len(completions)
        self.counts.update(batch)
        if log_metric is not None and completions:
            for key in ("no_tests", "syntax_errors", "timeouts", "output_overflow", "sandbox_errors"):
                log_metric(f"code/{key}", batch[key] / len(completions))
        return rewards


@dataclass(frozen=True)
class _Outcome:
    """What the reward keeps of one run: booleans (the output was compared where the run was collected)."""

    passed: bool
    syntax_error: bool
    timed_out: bool
    output_overflow: bool
    error: bool

    @classmethod
    def of(cls, case: TestCase, result: RunResult) -> _Outcome:
        failed = result.timed_out or result.output_overflow or result.error is not None
        if case.test_code is not None:
            passed = not failed and result.verdict is True
        else:
            passed = not failed and result.returncode == 0 and result.output_matches is True
        return cls(passed, result.syntax_error, result.timed_out, result.output_overflow, result.error is not None)


code_tests_reward = CodeTestsReward()
