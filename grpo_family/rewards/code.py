"""Code-execution reward: run the model's program against test cases in a sandboxed subprocess.

``code_tests`` (:class:`CodeTestsReward`) extracts a program from each completion, runs it once per test case in a
fresh sandboxed interpreter and returns the **fraction of test cases passed** (0.0 .. 1.0).

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
    or a list of such strings. In a string, every top-level ``assert`` is one test case and is run together with
    the non-assert statements above it (imports, helpers); a string without a top-level assert (HumanEval's
    ``def check(candidate): ...`` followed by ``check(f)``) is one test case. A list of strings gives one test
    case per string. HumanEval's ``check(candidate)`` body counts as top-level asserts.

    *How an assert test is graded* (:func:`plan_assert_test`): the program's interpreter is the program's to
    tamper with (builtins, frames, file descriptors, ``exit``), so it never sees an assert. It runs the program,
    then only the test statements the test's calls need (imports, inputs), evaluates those calls (``f(x)``: the
    *probes*) and sends their values back as plain builtin data (``_plain_values``). The verdict is reached outside
    it: in this process for a comparison with a literal (``f(1) == [2, 3]``, ``not f(0)``, ``f(2) is True``), else in
    a separate sandboxed *judge* interpreter that never ran a program (one per reward call), on the decoded values.
    So an ``__eq__`` that is always true, a patched ``compile``, a forged status line or an early exit cannot pass
    a wrong program, and expected values written in the asserts are never in its reach (ones kept in setup
    variables that the calls do not need are not sent either). A value that is not a plain builtin (a custom
    object, a generator) fails its test. An assert that cannot be graded this way (inside a loop or branch, a
    call using a comprehension's or lambda's variable, setup statements that call the program) is left out of
    the row; a row with none left scores None.

``None`` versus ``0.0``
    ``None`` (cannot score; TRL leaves the completion out of the advantage statistics) when the row has no usable
    test cases (missing, empty or malformed ``test_cases``; APPS call-based ``fn_name`` tests are not supported) or
    when the sandbox itself failed to start (our failure, not the model's). Everything the program does wrong —
    syntax error, exception, wrong output, timeout, memory or output limit — fails that test case.

The sandbox (:class:`Sandbox`), in layers; each run reports which layers were actually applied
    * A fresh interpreter: ``python -I -S -B -X utf8`` running :mod:`grpo_family.rewards._sandbox_child` by path
      (isolated mode, no ``site``: the standard library only, no user site-packages, no ``PYTHON*`` variables),
      started with ``subprocess`` (no ``preexec_fn``, so it is safe from the reward's worker threads), in a new
      session, with a **minimal environment** (``PATH``, ``LANG``, and ``HOME`` / ``TMPDIR`` set to the run's
      directory: nothing inherited, so ``HF_TOKEN``, ``OPENAI_API_KEY`` and the like are not visible) and a **fresh temporary directory** as cwd, removed afterwards (also on timeout).
    * **Resource limits** (``setrlimit`` in the child, before the program runs): ``RLIMIT_CPU`` (about the wall
      timeout), ``RLIMIT_AS`` (``memory_mb``, per process), ``RLIMIT_FSIZE`` (``disk_mb``), ``RLIMIT_NOFILE``,
      ``RLIMIT_CORE`` 0 and ``RLIMIT_NPROC`` (``max_processes``; see below), plus ``PR_SET_NO_NEW_PRIVS`` (set-uid
      programs gain nothing).
    * A **wall-clock timeout** (``timeout_s``, counted from when the program starts: the sandbox's own start-up is
      not charged; one that does not start within 30 s is a sandbox failure) after which everything the run started
      is killed, and **capped output**: stdout and stderr are read incrementally and the run is killed as soon as
      either exceeds ``max_output_bytes``, so a huge output never reaches our memory.
    * When running **as root with namespaces available** (a privileged container or a training node; the case tested
      here): new network, mount, PID, IPC and UTS namespaces. *Network*: the new network namespace has only a
      down loopback, so every connection fails, 127.0.0.1 included. *PID*: the program runs under a small init
      process of ours that dies with its parent (``PR_SET_PDEATHSIG``), and the kernel kills every process of a
      PID namespace when its init dies, so nothing (not even a ``setsid()``-ed grandchild) outlives the run; a fresh
      ``/proc`` shows only the sandbox's own processes. *Mounts* (private, never propagated to the host): the whole
      filesystem is remounted read-only (``mount_setattr(AT_RECURSIVE)``, Linux >= 5.12), ``/tmp`` is a fresh
      size-limited ``tmpfs`` (``disk_mb``) holding the run's directory, and a directory others cannot enter on the
      way to the interpreter's standard library (e.g. ``/root`` for a pyenv install) is covered by an empty
      ``tmpfs`` with only the standard library bound back read-only — which also hides the rest of it (tokens in
      ``~/.cache/huggingface``, ``~/.netrc``). Then the program **drops root** to a fresh, otherwise unused uid/gid
      (random, >= 2^20), so ``RLIMIT_NPROC`` counts only its own processes and threads and is enforced, and it
      cannot signal or ``ptrace`` anything of ours.
    * A **seccomp filter** (``syscall_filter``, unprivileged, every mode; built by libseccomp through
      ``pyseccomp`` and loaded after ``PR_SET_NO_NEW_PRIVS``, just before the program runs): ``EPERM`` for creating
      or entering namespaces (``unshare``, ``setns``, ``clone`` with a namespace flag; ``clone3`` says ``ENOSYS``),
      mounts, ``bpf``, ``perf_event_open``, ``io_uring_*``, keyrings, ``ptrace`` and ``process_vm_*``,
      ``userfaultfd``, kernel modules, and memory ``RLIMIT_AS`` does not count (``memfd_create``, System V
      ``shmget``/``shmat``); ``socket`` for anything but ``AF_UNIX``; ``execve`` unless ``allow_subprocesses``
      (so a child interpreter without the audit hook cannot be started). With the mount namespace, ``/tmp`` and
      the run's directory are also limited to 1024 inodes (``nr_inodes``) and the run gets its own ``devpts``
      instance with at most 4 ptys.
    * A **Python-level guard** (``python_guard``, an audit hook installed before the program runs): blocks
      socket creation, process creation (``os.fork``, ``os.system``, ``subprocess``, ``os.exec*``,
      ``os.posix_spawn``) and signals to other processes (unless ``allow_subprocesses``), ``ctypes``, and file writes / renames / deletions /
      mkdirs outside the run's directory. This is a tripwire, not a boundary: CPython's audit hooks can be bypassed
      by determined code. It is the only network and write protection where namespaces are unavailable.

What it does **not** protect against (it is a process-level sandbox, not a security boundary)
    Kernel exploits and container escapes (the program shares our kernel); side channels (timing, cache);
    reading world-readable files (the dataset, checkpoints, other users' world-readable files — a reward-hacking
    route if expected outputs are readable); ``/proc``-visible host information without a PID namespace; CPU and
    memory pressure on the machine: there is no cgroup, so a run may hold up to ``max_processes * memory_mb``
    (address space per process) plus ``disk_mb`` of tmpfs (twice when ``tmp_root`` is outside ``/tmp``) plus
    small kernel buffers (pipes, at most 256 descriptors per process); with the syscall filter off or unavailable,
    memfd and System V shared memory are not bounded. **As root without
    namespaces** (e.g. Docker's default capabilities: no ``CAP_SYS_ADMIN``) there is no network or filesystem
    isolation beyond the Python guard, the program can read ``/proc/<our pid>/environ`` (our launch environment),
    a ``setsid()``-ed child escapes the final kill, and ``RLIMIT_NPROC`` is not enforced for root; the uid is still dropped when
    the standard library is readable by it (then ``RLIMIT_NPROC`` holds). **As a non-root user** nothing can be
    dropped: ``RLIMIT_NPROC`` is set to the user's current task count plus ``max_processes`` (it counts all of the
    user's processes), other processes of the user can be signalled, and a ``setsid()``-ed child can outlive the
    run (a sleeping one indefinitely; a busy one until its CPU limit). Without the mount namespace there is no
    pty or inode limit. ``isolation="minimal"`` keeps only the environment, the directory, the rlimits, the
    syscall filter and the audit hook — the hook can be bypassed (its closure cells through ``gc``, writes through
    ``dir_fd``, hard links, ``fchmod``), so it refuses to run unless ``outer_sandbox=True`` declares a real outer
    sandbox. For untrusted code in production run the scorer inside a real sandbox (a container
    with no network and a read-only root, gVisor, nsjail, firejail) or a remote execution service; see the README.
    ``isolation="strict"`` refuses to run unless the namespaces, the uid drop and the syscall filter are in place.

Parallelism and cost
    Test cases run in a thread pool (``max_workers`` subprocesses at once). Each run costs a Python start-up (tens
    of milliseconds). Once a program has a syntax error, or (``skip_after_timeout``, default on) has timed out on a
    test case, its test cases not yet started are counted as failed without running them.

Metrics
    When TRL passes ``log_metric`` the reward logs, per call, the fraction of completions with no usable test
    cases (``code/no_tests``), a syntax error (``code/syntax_errors``, decided here from the program's text), at least one timeout (``code/timeouts``),
    output over the cap (``code/output_overflow``) and a sandbox failure (``code/sandbox_errors``). Running totals
    are kept in ``.counts``.

Standard library only (no torch, TRL or math-verify), like the rest of :mod:`grpo_family.rewards`. Linux only.
"""

from __future__ import annotations

import ast
import builtins
import errno
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

from . import _plain_values
from ._plain_values import decode_value
from .extract import completion_text

__all__ = [
    "CodeTestsReward",
    "RunResult",
    "Sandbox",
    "TestCase",
    "code_tests_reward",
    "extract_code",
    "parse_test_cases",
]

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("auto", "strict", "minimal")

# ------------------------------------------------------------------------------------------------ extraction

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
_PYTHON_LABELS = {"python", "py", "python3"}


def extract_code(text: str) -> str:
    """The program in a completion text: the last closed ```` ```python ```` (``py``, ``python3``) block, else the
    last closed unlabelled fenced block, else the whole text."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    for wanted in (lambda label: label in _PYTHON_LABELS, lambda label: label == ""):
        chosen = [body for label, body in blocks if wanted(label)]
        if chosen:
            return chosen[-1]
    return text


# ------------------------------------------------------------------------------------------------ test cases


@dataclass(frozen=True)
class TestCase:
    """One test case: ``stdin`` fed to the program and the ``expected`` stdout, or (assert style) ``test_code``
    run after the program in its namespace."""

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
    """Split a string of Python into one test case per top-level ``assert`` (with the statements above it)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    if not tree.body:
        return None
    if not any(isinstance(node, ast.Assert) for node in tree.body):
        return [TestCase(test_code=source)]
    setup: list[str] = []
    cases = []
    for node in tree.body:
        segment = ast.get_source_segment(source, node) or ast.unparse(node)
        if isinstance(node, ast.Assert):
            cases.append(TestCase(test_code="\n".join([*setup, segment]) + "\n"))
        else:
            setup.append(segment)
    return cases


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


# ------------------------------------------------------------------------------------------------ assert tests

_BUILTIN_NAMES = frozenset(dir(builtins))


@dataclass(frozen=True)
class AssertPlan:
    """How one assert-style test case is graded without trusting the program's interpreter.

    The program's interpreter runs the program, then ``program_setup`` (the test's statements the probes need:
    imports, inputs), then evaluates each of ``probes`` (the test's calls into the program, e.g. ``f(x)``) and
    returns their values as plain data. It never sees the asserts, so it never sees an expected value. Each of
    ``checks`` is an assert's condition with the probes replaced by ``_probe_<i>``; the trusted side evaluates them
    on the returned plain values: in this process when a check is a comparison with a literal (``fast``), else in
    a fresh sandboxed interpreter that never ran the program (the judge), after ``judge_setup``.
    """

    program_setup: str
    probes: tuple[str, ...]
    judge_setup: str
    checks: tuple[str, ...]
    fast: tuple[tuple | None, ...]


def _bound_names(statements: Sequence[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _loaded_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


class _RenameName(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


class _ExtractProbes(ast.NodeTransformer):
    """Replace every call into the program (and every bare program name) by ``_probe_<i>``."""

    def __init__(self, program_names: set[str], probes: list[str]):
        self.program_names, self.probes = program_names, probes

    def _probe(self, node: ast.expr) -> ast.Name:
        source = ast.unparse(node)
        if source not in self.probes:
            self.probes.append(source)
        return ast.copy_location(ast.Name(f"_probe_{self.probes.index(source)}", ast.Load()), node)

    def visit_Call(self, node: ast.Call) -> ast.expr:
        if _loaded_names(node.func) & self.program_names:
            return self._probe(node)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self._probe(node) if node.id in self.program_names else node


def _fast_check(check: ast.expr) -> tuple | None:
    """A check this process can decide on a plain value: ``("eq"|"ne", i, literal)``, ``("truthy"|"falsy", i)``,
    ``("is"|"is not", i, None|True|False)``; None for any other shape (left to the judge)."""

    def probe_index(node: ast.expr) -> int | None:
        if isinstance(node, ast.Name) and re.fullmatch(r"_probe_\d+", node.id):
            return int(node.id[len("_probe_") :])
        return None

    def literal(node: ast.expr) -> tuple[bool, Any]:
        try:
            return True, ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False, None

    if probe_index(check) is not None:
        return ("truthy", probe_index(check))
    if isinstance(check, ast.UnaryOp) and isinstance(check.op, ast.Not) and probe_index(check.operand) is not None:
        return ("falsy", probe_index(check.operand))
    if isinstance(check, ast.Compare) and len(check.ops) == 1:
        op, left, right = check.ops[0], check.left, check.comparators[0]
        if probe_index(left) is None:
            left, right = right, left
        index = probe_index(left)
        if index is None:
            return None
        is_literal, value = literal(right)
        if not is_literal:
            return None
        if isinstance(op, (ast.Eq, ast.NotEq)):
            return ("eq" if isinstance(op, ast.Eq) else "ne", index, value)
        if isinstance(op, (ast.Is, ast.IsNot)) and (value is None or value is True or value is False):
            return ("is" if isinstance(op, ast.Is) else "is not", index, value)
    return None


def plan_assert_test(source: str) -> AssertPlan | None:
    """The :class:`AssertPlan` of one assert-style test case, or None when it cannot be graded outside the
    program's interpreter: no assert at the top level (HumanEval's ``check`` body counts as top level), an assert
    nested in a loop or branch, a program call that uses a comprehension's or lambda's variable, or a setup
    statement that calls into the program."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    statements = list(tree.body)
    # HumanEval: ``def check(candidate): <asserts>`` then ``check(entry_point)``: the asserts, candidate renamed.
    check_def = next((n for n in statements if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    check_calls = [
        n
        for n in statements
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
        and n.value.func.id == "check" and len(n.value.args) == 1 and isinstance(n.value.args[0], ast.Name)
    ]  # fmt: skip
    if check_def is not None and check_calls and len(check_def.args.args) == 1:
        rename = _RenameName(check_def.args.args[0].arg, check_calls[0].value.args[0].id)
        rest = [n for n in statements if n is not check_def and n not in check_calls]
        statements = rest + [rename.visit(n) for n in check_def.body]
    asserts = [n for n in statements if isinstance(n, ast.Assert)]
    setup = [n for n in statements if not isinstance(n, ast.Assert)]
    if not asserts or any(isinstance(n, ast.Assert) for s in setup for n in ast.walk(s)):
        return None
    setup_names = _bound_names(setup)
    local_names = _bound_names(asserts)  # comprehension, lambda and walrus variables
    program_names = set().union(*(_loaded_names(a.test) for a in asserts)) - setup_names - _BUILTIN_NAMES - local_names
    # Setup may not use the program: its results would be computed where the program can tamper with them.
    if any(_loaded_names(s) - _bound_names([s]) - setup_names - _BUILTIN_NAMES for s in setup):
        return None
    probes: list[str] = []
    extract = _ExtractProbes(program_names, probes)
    checks = [extract.visit(a.test) for a in asserts]
    if any(_loaded_names(ast.parse(p, mode="eval")) & local_names for p in probes):
        return None
    # The program's interpreter gets only the setup statements the probes need (transitively), so an expected
    # value kept in a setup variable stays out of its reach.
    needed = set().union(*(_loaded_names(ast.parse(p, mode="eval")) for p in probes)) if probes else set()
    chosen: list[ast.stmt] = []
    changed = True
    while changed:
        changed = False
        for statement in setup:
            if statement not in chosen and _bound_names([statement]) & needed:
                chosen.append(statement)
                needed |= _loaded_names(statement)
                changed = True
    program_setup = "\n".join(ast.unparse(s) for s in setup if s in chosen)
    return AssertPlan(
        program_setup=program_setup,
        probes=tuple(probes),
        judge_setup="\n".join(ast.unparse(s) for s in setup),
        checks=tuple(ast.unparse(c) for c in checks),
        fast=tuple(_fast_check(c) for c in checks),
    )


def _fast_verdict(fast: tuple, values: list) -> bool:
    kind, value = fast[0], values[fast[1]]
    if kind == "truthy":
        return bool(value)
    if kind == "falsy":
        return not value
    if kind == "eq":
        return value == fast[2]
    if kind == "ne":
        return value != fast[2]
    return (value is fast[2]) == (kind == "is")


# ------------------------------------------------------------------------------------------------ the sandbox

# The sandbox's first process, run by path (``python -I -S -B -X utf8 <file>``): a module of its own, standard
# library only, so that it starts as fast as a bare interpreter (see its docstring).
_CHILD_PATH = str(Path(__file__).resolve().with_name("_sandbox_child.py"))

_STATUS_CAP = 1 << 16
_CODEC_SOURCE = Path(_plain_values.__file__).read_text(encoding="utf-8")
_TMPFS_INODES = 1024  # files and directories the program may create in its private /tmp
_MAX_PTYS = 4  # ptys one run may open (its own devpts instance)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (libseccomp matches one masked value per rule)
_CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_AF_UNIX = 1
# Kernel interfaces a program has no use for and that widen what it can reach: namespaces and mounts, eBPF,
# perf, io_uring, keyrings, other processes' memory, userfaultfd, kernel modules, and memory that RLIMIT_AS does
# not count (memfd, System V shared memory). Each fails with EPERM.
_DENIED_SYSCALLS = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf", "perf_event_open", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "ptrace", "process_vm_readv",
    "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp", "userfaultfd", "memfd_create", "memfd_secret",
    "shmget", "shmat", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "name_to_handle_at", "open_by_handle_at", "iopl", "ioperm",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "fanotify_init", "lookup_dcookie", "vhangup",
    "uselib", "personality",
)  # fmt: skip


@functools.lru_cache(maxsize=4)
def syscall_filter_program(allow_subprocesses: bool) -> tuple[bytes | None, str]:
    """The seccomp BPF program the sandbox loads before the program runs (built by libseccomp through
    ``pyseccomp``), and a note (why it is unavailable, or the syscalls this libseccomp does not know)."""
    try:
        import pyseccomp
    except Exception as e:  # not installed, or libseccomp missing (pyseccomp loads it when imported)
        return None, f"no syscall filter: pyseccomp / libseccomp unavailable ({type(e).__name__}: {e})"
    try:
        program_filter = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        unknown = []
        deny = pyseccomp.ERRNO(errno.EPERM)
        for name in _DENIED_SYSCALLS + (() if allow_subprocesses else ("execve", "execveat")):
            try:
                program_filter.add_rule(deny, name)
            except Exception:
                unknown.append(name)  # not a syscall of this architecture, or too new for this libseccomp
        # clone with a namespace flag; clone3 keeps its flags in memory where a filter cannot read them, so it
        # reports ENOSYS and the C library falls back to clone.
        for flag in _CLONE_NAMESPACE_FLAGS:
            program_filter.add_rule(deny, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
        program_filter.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
        # Only Unix sockets: no network without a network namespace either.
        program_filter.add_rule(pyseccomp.ERRNO(errno.EACCES), "socket", pyseccomp.Arg(0, pyseccomp.NE, _AF_UNIX))
        with tempfile.TemporaryFile() as exported:
            program_filter.export_bpf(exported)
            exported.seek(0)
            program = exported.read()
    except Exception as e:
        return None, f"no syscall filter: libseccomp failed ({type(e).__name__}: {e})"
    return program, f"syscalls unknown to libseccomp here: {', '.join(unknown)}" if unknown else ""


_STARTUP_TIMEOUT_S = 30.0  # for the sandbox to get ready (not charged to the program's timeout_s)


@dataclass
class RunResult:
    """What one sandboxed run did. ``stdout`` / ``stderr`` are decoded (invalid UTF-8 replaced) and at most
    ``max_output_bytes`` long; ``completed`` is True when the program finished without an exception or ``exit()``
    and, for a run with probes, reported their values; ``values`` (probe runs) holds one ``("value", v)`` with a
    plain builtin ``v`` or ``("error", exception name)`` per probe, None when the program never got that far or
    sent something malformed; ``syntax_error`` is decided here, before running, from the program's text;
    ``isolation`` is the child's report of the layers it applied (empty when it never got that far); ``error`` is
    set when the sandbox itself failed (not the program)."""

    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    output_overflow: bool = False
    completed: bool = False
    syntax_error: bool = False
    values: list | None = None
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
            (:meth:`check` raises unless namespaces, the uid drop and the syscall filter are in place) or
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
    ):
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {isolation!r}")
        if isolation == "minimal" and not outer_sandbox:
            raise ValueError(
                "isolation='minimal' runs untrusted code without namespaces or a uid drop: its remaining layers (rlimits, "
                "the syscall filter, the Python audit hook) leave writes anywhere as this user, reading our "
                "environment through /proc and processes that outlive the run open to the program. Use it only "
                "inside a real sandbox (gVisor, a VM, nsjail, a disposable container) and say so with "
                "outer_sandbox=True; otherwise use isolation='auto' or 'strict'."
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

    def __repr__(self) -> str:
        return (
            f"Sandbox(timeout_s={self.timeout_s}, memory_mb={self.memory_mb}, max_processes={self.max_processes}, "
            f"isolation={self.isolation!r}, syscall_filter={self.syscall_filter}, python_guard={self.python_guard})"
        )

    def _settings(self, status_fd: int, setup: str, probes: Sequence[str] | None) -> dict:
        os_layers = self.isolation != "minimal"
        bpf = syscall_filter_program(self.allow_subprocesses)[0] if self.syscall_filter else None
        return {
            "status_fd": status_fd,
            "setup": setup,
            "probes": None if probes is None else list(probes),
            "syscall_filter": None if bpf is None else bpf.hex(),
            "tmpfs_inodes": _TMPFS_INODES,
            "max_ptys": _MAX_PTYS,
            "os_layers": os_layers,
            "uid": _pick_sandbox_uid() if os_layers and os.geteuid() == 0 else None,
            "cpu_s": math.ceil(self.timeout_s) + 1,
            "memory_mb": self.memory_mb,
            "disk_mb": self.disk_mb,
            "max_processes": self.max_processes,
            "python_guard": self.python_guard,
            "allow_subprocesses": self.allow_subprocesses,
        }

    def run(self, program: str, stdin: str = "", *, setup: str = "", probes: Sequence[str] | None = None) -> RunResult:
        """Run ``program`` with ``stdin`` in a fresh sandbox; with ``probes`` (expressions), then run ``setup`` in
        its namespace and report the probes' values as plain data (``RunResult.values``)."""
        if sys.platform != "linux":
            raise RuntimeError("the code-execution sandbox needs Linux")
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
        status_r = status_w = -1
        proc = None
        try:
            status_r, status_w = os.pipe()
            with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(program)
            with open(os.path.join(workdir, "sandbox.json"), "w", encoding="utf-8") as f:
                json.dump(self._settings(status_w, setup, probes), f)
            stdin_path = os.path.join(workdir, "stdin.txt")
            with open(stdin_path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(stdin)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
            with open(stdin_path, "rb") as stdin_file:
                proc = subprocess.Popen(
                    [self.python, "-I", "-S", "-B", "-X", "utf8", _CHILD_PATH],
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(status_w,),
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            os.close(status_w)
            status_w = -1
            self._collect(proc, status_r, start, probes is not None, result)
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
            for fd in (status_r, status_w):
                if fd >= 0:
                    os.close(fd)
            _remove_tree(workdir)
            result.duration_s = time.monotonic() - start
        if probes is None:
            result.completed = result.returncode == 0 and not result.timed_out and not result.output_overflow
        if self.syscall_filter and result.isolation and not result.isolation.get("syscall_filter"):
            result.isolation.setdefault("notes", []).append(syscall_filter_program(self.allow_subprocesses)[1])
        if proc is not None and not result.isolation and not result.timed_out and result.error is None:
            # The child died before it could run the program: our failure, not the program's.
            result.error = f"the sandbox failed to start: {result.stderr.strip()[-500:] or 'no output'}"
        return result

    def _collect(self, proc: subprocess.Popen, status_r: int, start: float, probing: bool, result: RunResult) -> None:
        """Read stdout, stderr and the status pipe until the child exits (or the deadline / output cap)."""
        buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), status_r: bytearray()}
        caps = {proc.stdout.fileno(): self.max_output_bytes, proc.stderr.fileno(): self.max_output_bytes}
        status_cap = caps[status_r] = _STATUS_CAP + self.max_output_bytes  # the report, then the probes' values
        # Start-up (interpreter, namespaces, mounts) is not charged to the program: its clock starts when the child
        # reports that it is about to run it (the status pipe's first line).
        deadline = start + _STARTUP_TIMEOUT_S
        program_started = False
        exited_at = None
        with selectors.DefaultSelector() as selector:
            for fd in buffers:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if now >= deadline:
                    if exited_at is None and program_started:
                        result.timed_out = True
                    elif exited_at is None:
                        result.error = f"the sandbox did not start within {_STARTUP_TIMEOUT_S:.0f} s"
                    break
                for key, _ in selector.select(min(deadline - now, 0.05)):
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fd)
                        continue
                    buf = buffers[key.fd]
                    buf += data
                    if len(buf) > caps[key.fd]:
                        del buf[caps[key.fd] :]
                        if key.fd != status_r:
                            result.output_overflow = True
                        selector.unregister(key.fd)
                if not program_started and b"\n" in buffers[status_r]:
                    program_started = True
                    if exited_at is None:
                        deadline = time.monotonic() + self.timeout_s
                if result.output_overflow:
                    break
                if exited_at is None and _exited(proc.pid):
                    # Give stragglers holding our pipes a moment, then stop reading (they are killed next).
                    exited_at = time.monotonic()
                    deadline = min(deadline, exited_at + 0.5)
        # The status pipe may hold lines not read yet (we stopped on another pipe's overflow or the deadline).
        while len(buffers[status_r]) < status_cap and select.select([status_r], [], [], 0)[0]:
            data = os.read(status_r, 65536)
            if not data:
                break
            buffers[status_r] += data
        result.stdout = buffers[proc.stdout.fileno()].decode("utf-8", errors="replace")
        result.stderr = buffers[proc.stderr.fileno()].decode("utf-8", errors="replace")
        lines = bytes(buffers[status_r]).decode("utf-8", errors="replace").splitlines()
        if lines:
            try:
                result.isolation = json.loads(lines[0])
            except ValueError:
                result.isolation = {}
        # Lines after the report come from the harness or from the program itself (it can reach the pipe): they
        # can only claim values for the probes, as the program's own return values could.
        if probing:
            reported = [line for line in lines[1:] if line.startswith("values ")]
            if reported:
                result.values = _decode_probe_values(reported[-1][len("values ") :])
            result.completed = result.values is not None

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
                "isolation='auto' and an outer sandbox (see the README)."
            )
        return result.isolation


def _decode_probe_values(text: str) -> list | None:
    """The probes' values sent by the sandbox: a list of ``("value", plain value)`` / ``("error", name)``; None
    when malformed."""
    try:
        data = json.loads(text)
        if type(data) is not list:
            return None
        values = []
        for item in data:
            if type(item) is not list or len(item) != 2 or item[0] not in ("value", "error"):
                return None
            if item[0] == "error":
                values.append(("error", str(item[1])[:100]))
            else:
                values.append(("value", decode_value(item[1])))
        return values
    except (ValueError, RecursionError):
        return None


def missing_layers(report: dict, sandbox: Sandbox) -> list[str]:
    """Human-readable list of the layers a run's isolation report lacks (empty for the full set)."""
    if sandbox.isolation == "minimal":
        return []
    missing = []
    for ns, what in (("net", "network namespace (no network)"), ("pid", "PID namespace"), ("mnt", "mount namespace")):
        if ns not in report.get("namespaces", []):
            missing.append(what)
    if "mnt" in report.get("namespaces", []) and not report.get("readonly_root"):
        missing.append("read-only root filesystem")
    if report.get("uid") is None:
        missing.append("uid drop (RLIMIT_NPROC not enforced as root)" if report.get("euid") == 0 else "uid drop")
    if sandbox.syscall_filter and not report.get("syscall_filter"):
        missing.append(
            "seccomp syscall filter ("
            + (syscall_filter_program(sandbox.allow_subprocesses)[1] or "could not be loaded")
            + ")"
        )
    return missing


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
        max_workers: test cases run at once (each is a subprocess); default ``min(4, cpu count)``.
        max_tests: use at most this many test cases per row (the first ones); None for all.
        skip_after_timeout: once a program times out on a test case, count its not-yet-started ones as failed.
        name: the function name TRL logs the reward under.

    Called as ``reward(completions, test_cases=[...])``. Instances are picklable.
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
                    "CAP_SYS_ADMIN). Run untrusted code inside a container or another outer sandbox (see the README).",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def __call__(
        self,
        completions: list,
        test_cases: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        if test_cases is None:
            raise ValueError(
                f"{self.__name__} needs the test cases in a 'test_cases' dataset column (a list of "
                "{'input': ..., 'output': ...} or a string of assert statements per row); rename your column"
            )
        if len(test_cases) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(test_cases)} test_cases rows")
        suites = [parse_test_cases(value) for value in test_cases]
        plans: dict[str, AssertPlan | None] = {}
        for i, suite in enumerate(suites):
            if suite and suite[0].test_code is not None:
                for case in suite:
                    if case.test_code not in plans:
                        plans[case.test_code] = plan_assert_test(case.test_code)
                # An assert test that cannot be graded outside the program's interpreter is left out.
                suites[i] = [case for case in suite if plans[case.test_code] is not None] or None
        if self.max_tests is not None:
            suites = [s[: self.max_tests] if s else s for s in suites]
        programs = [extract_code(completion_text(c)) for c in completions]
        if any(suites):
            self._check_once()

        results: list[list[RunResult | None]] = [[None] * len(s) if s else [] for s in suites]
        stop = [False] * len(completions)  # the program cannot pass any more test cases (syntax error, timeout)
        stop_lock = threading.Lock()

        def run_one(i: int, j: int) -> None:
            with stop_lock:
                if stop[i]:
                    return
            case = suites[i][j]
            if case.test_code is None:
                result = self.sandbox.run(programs[i], case.stdin)
            else:
                plan = plans[case.test_code]
                result = self.sandbox.run(programs[i], case.stdin, setup=plan.program_setup, probes=plan.probes)
            results[i][j] = result
            if result.syntax_error or (result.timed_out and self.skip_after_timeout):
                with stop_lock:
                    stop[i] = True

        jobs = [(i, j) for i, suite in enumerate(suites) if suite for j in range(len(suite))]
        if jobs:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs)), thread_name_prefix="code") as pool:
                for future in [pool.submit(run_one, i, j) for i, j in jobs]:
                    future.result()

        passed, judge_errors = self._verdicts(suites, results, plans)
        rewards: list[float | None] = []
        batch: Counter[str] = Counter()
        for i, (suite, runs) in enumerate(zip(suites, results)):
            if not suite:
                batch["no_tests"] += 1
                rewards.append(None)
                continue
            done = [r for r in runs if r is not None]
            if any(r.error is not None for r in done) or i in judge_errors:
                batch["sandbox_errors"] += 1
                rewards.append(None)
                continue
            batch["syntax_errors"] += any(r.syntax_error for r in done)
            batch["timeouts"] += any(r.timed_out for r in done)
            batch["output_overflow"] += any(r.output_overflow for r in done)
            rewards.append(sum(passed[i]) / len(suite))

        batch["total"] = len(completions)
        self.counts.update(batch)
        if log_metric is not None and completions:
            for key in ("no_tests", "syntax_errors", "timeouts", "output_overflow", "sandbox_errors"):
                log_metric(f"code/{key}", batch[key] / len(completions))
        return rewards

    def _verdicts(self, suites: list, results: list, plans: dict) -> tuple[list[list[bool]], set[int]]:
        """Pass/fail of every test case, decided here on plain data (and by the judge for checks that are not a
        comparison with a literal); also the rows whose judge run failed (cannot score)."""
        passed: list[list[bool]] = [[False] * len(suite) if suite else [] for suite in suites]
        judge_items, judge_cases = [], []
        for i, suite in enumerate(suites):
            for j, case in enumerate(suite or ()):
                result = results[i][j]
                if result is None:
                    continue
                if case.test_code is None:
                    passed[i][j] = _passed(case, result)
                    continue
                plan = plans[case.test_code]
                values = _probe_values(result, plan)
                if values is None:
                    continue
                fast = [f for f in plan.fast if f is not None]
                passed[i][j] = all(_fast_verdict(f, values) for f in fast)
                slow = [check for check, f in zip(plan.checks, plan.fast) if f is None]
                if passed[i][j] and slow:
                    try:
                        encoded = [_plain_values.encode_value(v) for v in values]
                    except (TypeError, ValueError):
                        passed[i][j] = False
                        continue
                    judge_items.append({"setup": plan.judge_setup, "checks": slow, "values": encoded})
                    judge_cases.append((i, j))
        if not judge_items:
            return passed, set()
        result = self.sandbox.run(_CODEC_SOURCE + _JUDGE_MAIN, json.dumps(judge_items))
        lines = [line for line in result.stdout.splitlines() if line.startswith("verdicts ")]
        verdicts = None
        if result.error is None and not result.timed_out and lines:
            try:
                verdicts = json.loads(lines[-1][len("verdicts ") :])
            except ValueError:
                verdicts = None
        if type(verdicts) is not list or len(verdicts) != len(judge_items):
            logger.warning("the code reward's judge run failed: %s", result.error or result.stderr[-500:])
            return passed, {i for i, _ in judge_cases}
        for (i, j), verdict in zip(judge_cases, verdicts):
            passed[i][j] = verdict is True
        return passed, set()


def _passed(case: TestCase, result: RunResult) -> bool:
    """Stdin/stdout cases: exit status 0 and the same output."""
    if result.timed_out or result.output_overflow or result.error is not None:
        return False
    return result.returncode == 0 and normalize_output(result.stdout) == normalize_output(case.expected or "")


def _probe_values(result: RunResult, plan: AssertPlan) -> list | None:
    """The plain values of an assert test's probes, None when the test fails whatever its checks say (timeout,
    output cap, no or malformed values, a probe that raised)."""
    if result.timed_out or result.output_overflow or result.error is not None or result.values is None:
        return None
    if len(result.values) != len(plan.probes) or any(kind != "value" for kind, _ in result.values):
        return None
    return [value for _, value in result.values]


# The judge: a fresh sandboxed interpreter that never ran any program. It gets, on stdin, the test's own setup,
# the checks that are not a plain comparison with a literal, and the probes' plain values, and prints its verdicts.
_JUDGE_MAIN = r"""
import json, sys

verdicts = []
for item in json.loads(sys.stdin.read()):
    try:
        namespace = {"__name__": "__test__"}
        exec(item["setup"], namespace)
        for index, value in enumerate(item["values"]):
            namespace[f"_probe_{index}"] = decode_value(value)
        verdicts.append(all(bool(eval(check, namespace)) for check in item["checks"]))
    except BaseException:
        verdicts.append(False)
sys.stdout.flush()
print("verdicts " + json.dumps(verdicts))
"""


code_tests_reward = CodeTestsReward()
