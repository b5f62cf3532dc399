"""The code sandbox's first process (``grpo_family/rewards/_sandbox_child.py``), run on its own as the sandbox runs it.

``tests/test_code_reward.py`` and ``tests/test_hostile_inputs.py`` test the sandbox as a whole (every layer, hostile
programs); here the child program is checked as a module: what it may import, that importing it runs nothing, and
the protocol with its parent (``sandbox.json`` and the test in, a report line on the status pipe and the judge's
verdict on its own pipe out), with the OS layers off so that it runs the same as root or not, and the codec that
carries the test's calls (:class:`~grpo_family.rewards._plain_values.Wire`).
"""

from __future__ import annotations

import ast
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.rewards import _plain_values, _sandbox_child
from grpo_family.rewards.code import _BOOTSTRAP, _CHILD_PATH

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the code sandbox is Linux-only")


def _imports(path: str) -> tuple[set[str], set[str]]:
    """Top-level module names of ``path``'s absolute imports, and the names of its relative imports."""
    absolute, relative = set(), set()
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            absolute.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            (relative if node.level else absolute).add(node.module.split(".")[0])
    return absolute, relative


def test_the_child_and_its_codec_use_the_standard_library_only():
    """The child must start as fast as a bare interpreter and run under ``-I -S``: no third-party import, and of the
    package only the codec, which imports nothing but the standard library (``collections``, for ``Counter`` and
    the like since issue 30)."""
    absolute, relative = _imports(_CHILD_PATH)
    # The codec is imported relatively as the package's module, by its top-level name where the bootstrap loaded it.
    assert absolute - {"_plain_values"} <= sys.stdlib_module_names, (
        f"non-stdlib imports in the child: {absolute - sys.stdlib_module_names}"
    )
    assert relative == {"_plain_values"}, relative
    codec_absolute, codec_relative = _imports(_plain_values.__file__)
    assert codec_absolute <= sys.stdlib_module_names and codec_relative == set(), (codec_absolute, codec_relative)


def test_the_sandbox_runs_this_file_and_its_codec_is_the_package_codec():
    assert Path(_CHILD_PATH) == Path(_sandbox_child.__file__).resolve()
    assert _sandbox_child.Wire is _plain_values.Wire  # the channel's codec, not a copy


def run_child(tmp_path: Path, program: str, *, test: str | None = None, helpers: tuple = (), guard: bool = True):
    """Run the child as the sandbox does, with the OS layers off; (returncode, stdout, stderr, report
    lines, verdict or None)."""
    status_r, status_w = os.pipe()
    fds = {"status_fd": status_w}
    if test is not None:
        test_r, test_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        fds.update(test_fd=test_r, verdict_fd=verdict_w)
        os.write(test_w, json.dumps({"test": test, "modules": []}).encode())
        os.close(test_w)
    settings = {
        **fds, "helpers": list(helpers), "stubs": [], "syscall_filter": None, "tmpfs_inodes": 64, "max_ptys": 1,
        "os_layers": False, "uid": None, "judge_uid": None, "cpu_s": 10, "memory_mb": 1024, "disk_mb": 8,
        "max_processes": 64, "max_message_bytes": 1 << 20, "python_guard": guard, "allow_subprocesses": False,
        "packages": [],
    }  # fmt: skip
    (tmp_path / "sandbox.json").write_text(json.dumps(settings), encoding="utf-8")
    (tmp_path / "program.py").write_text(program, encoding="utf-8")
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", _BOOTSTRAP, os.path.dirname(_CHILD_PATH)],
            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, pass_fds=tuple(fds.values()),
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        for fd in fds.values():
            os.close(fd)
    with os.fdopen(status_r, encoding="utf-8") as status:
        lines = status.read().splitlines()
    verdict = None
    if test is not None:
        with os.fdopen(verdict_r, encoding="utf-8") as verdicts:
            verdict = json.loads(verdicts.read())
    return proc.returncode, proc.stdout, proc.stderr, lines, verdict


def test_the_judge_runs_the_test_and_only_calls_reach_the_program(tmp_path):
    program = "def f(x):\n    return [x, x * 2.5, {'k': (1, None)}]\nprint('program ran')\n"
    test = "expected = [4, 10.0, {'k': (1, None)}]\nassert f(4) == expected\nassert f(1)[0] == 1\n"
    code, stdout, stderr, lines, verdict = run_child(tmp_path, program, test=test)
    assert code == 0, stderr
    report = json.loads(lines[0])
    assert report["python_guard"] is True and report["namespaces"] == [] and report["uid"] is None
    assert len(lines) == 1  # the report only: the program writes nothing else there
    assert verdict == {"passed": True, "calls": 2, "note": "", "uid": None, "syscall_filter": False}, verdict
    assert stdout == "program ran\n"
    assert not (tmp_path / "sandbox.json").exists()  # the settings are gone before the program runs
    code, _, stderr, _, verdict = run_child(tmp_path, program, test="assert f(4)[0] == 5\n")
    assert verdict["passed"] is False and verdict["calls"] == 1 and verdict["note"].startswith("AssertionError")


def test_the_program_sees_itself_and_the_standard_library_not_the_package(tmp_path):
    """``-I`` keeps the child's directory (grpo_family/rewards, with its own ``code.py``) off ``sys.path``: the
    program's ``import code`` is the standard library's, and its ``argv`` is its own."""
    program = (
        "import sys, code\nprint(sys.argv)\nprint(code.__file__)\nprint(any('grpo_family' in p for p in sys.path))\n"
    )
    code, stdout, stderr, lines, _ = run_child(tmp_path, program)
    assert code == 0, stderr
    argv, code_file, package_on_path = stdout.splitlines()
    assert argv == "['program.py']"
    assert "grpo_family" not in code_file
    assert package_on_path == "False"
    assert len(lines) == 1  # the report only: no probes, no values line


def test_the_guard_blocks_writes_outside_the_run_directory(tmp_path):
    outside = tmp_path.parent / f"outside-{tmp_path.name}.txt"
    program = f"open({str(outside)!r}, 'w').write('x')\n"
    code, _, stderr, _, _ = run_child(tmp_path, program)
    assert code == 1 and "writing outside the run's directory is blocked" in stderr, stderr
    assert not outside.exists()
    code, _, stderr, _, _ = run_child(tmp_path, program, guard=False)  # control: the same program, guard off
    assert code == 0 and outside.exists(), stderr
    outside.unlink()


# ----------------------------------------------------------------------------------------------- the codec

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.builds(lambda e, sign: sign * 3**e, st.integers(0, 12000), st.sampled_from([1, -1]))  # to 5,700 digits
    | st.floats(allow_nan=False)
    | st.complex_numbers(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
_hashable = st.recursive(
    _scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=8
)
_values = st.recursive(
    _scalars | st.binary(max_size=8).map(bytearray),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(_hashable, inner, max_size=3)
        | st.sets(_hashable, max_size=3)
        | st.dictionaries(st.text(max_size=3), st.integers(), max_size=3).map(collections.Counter)
        | st.dictionaries(_hashable, inner, max_size=3).map(collections.OrderedDict)
        | st.lists(inner, max_size=3).map(collections.deque)
    ),
    max_leaves=20,
)


def _same(a, b) -> bool:
    """Equal, of the same exact types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple, collections.deque)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@given(_values)
@settings(max_examples=300, deadline=None)
def test_every_plain_value_crosses_the_wire_unchanged(value):
    sender, receiver = _plain_values.Wire(step=1), _plain_values.Wire(step=-1)
    (received,) = receiver.decode(json.loads(json.dumps(sender.encode([value]))))
    assert _same(received, value)
    assert _same(_plain_values.decode_value(json.loads(json.dumps(_plain_values.encode_value(value)))), value)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["list", "dict", "set", "ref", "id", "int", "float", "tuple", "bytes", "handle", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=15,
)


@given(_json)
@settings(max_examples=500, deadline=None)
def test_decoding_anything_gives_a_value_or_a_value_error(data):
    """What the judge decodes is the program's choice: malformed input is a ValueError, never another exception."""
    try:
        _plain_values.Wire(step=1).decode([data])
    except ValueError:
        pass


def test_identity_and_in_place_changes_cross_the_wire():
    judge, program = _plain_values.Wire(step=1), _plain_values.Wire(step=-1, export=lambda o: {"handle": 1})
    shared = [3, 1, 2]
    matrix = [shared, shared]
    (theirs,) = program.decode(json.loads(json.dumps(judge.encode([matrix]))))
    assert theirs[0] is theirs[1]  # aliasing within a message
    theirs[0].sort()
    cached = {"k": [1]}
    for _ in range(2):  # the same object returned twice: one object on the judge's side
        reply = json.loads(json.dumps(program.encode([theirs, cached])))
        _, returned = judge.decode(reply)
        assert shared == [1, 2, 3] and matrix[0] is matrix[1] is shared  # sorted in place, on our own list
    assert judge.decode(json.loads(json.dumps(program.encode([cached]))))[0] is returned
    assert program.encode([lambda: 1]) == [{"handle": 1}]  # not a plain value: a reference
    with pytest.raises(TypeError):
        judge.encode([lambda: 1])  # the judge has nothing to refer to
    with pytest.raises(ValueError, match="unknown object"):
        judge.decode([{"ref": 999}])
