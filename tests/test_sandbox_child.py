"""The code sandbox's first process (``grpo_family/rewards/_sandbox_child.py``), run on its own by path.

``tests/test_code_reward.py`` and ``tests/test_hostile_inputs.py`` test the sandbox as a whole (every layer, hostile
programs); here the child program is checked as a module: what it may import, that importing it runs nothing, and
the protocol with its parent (``sandbox.json`` in, a report line and the probes' values out on the status pipe),
with the OS layers off so that it runs the same as root or not.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_family.rewards import _plain_values, _sandbox_child
from grpo_family.rewards.code import _CHILD_PATH

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
    package only the codec, which imports nothing."""
    absolute, relative = _imports(_CHILD_PATH)
    assert absolute <= sys.stdlib_module_names, (
        f"non-stdlib imports in the child: {absolute - sys.stdlib_module_names}"
    )
    assert relative == {"_plain_values"}, relative
    assert _imports(_plain_values.__file__) == (set(), set())


def test_the_sandbox_runs_this_file_and_its_codec_is_the_package_codec():
    assert Path(_CHILD_PATH) == Path(_sandbox_child.__file__).resolve()
    assert _sandbox_child.encode_value is _plain_values.encode_value  # main()'s codec, not a copy


def run_child(tmp_path: Path, program: str, *, probes: list[str] | None = None, setup: str = "", guard: bool = True):
    """Run the child by path, as the sandbox does, with the OS layers off; (returncode, stdout, stderr, status lines)."""
    status_r, status_w = os.pipe()
    settings = {
        "status_fd": status_w, "setup": setup, "probes": probes, "syscall_filter": None, "tmpfs_inodes": 64,
        "max_ptys": 1, "os_layers": False, "uid": None, "cpu_s": 10, "memory_mb": 1024, "disk_mb": 8,
        "max_processes": 64, "python_guard": guard, "allow_subprocesses": False,
    }  # fmt: skip
    (tmp_path / "sandbox.json").write_text(json.dumps(settings), encoding="utf-8")
    (tmp_path / "program.py").write_text(program, encoding="utf-8")
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-B", "-X", "utf8", _CHILD_PATH],
            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, pass_fds=(status_w,),
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        os.close(status_w)
    with os.fdopen(status_r, encoding="utf-8") as status:
        lines = status.read().splitlines()
    return proc.returncode, proc.stdout, proc.stderr, lines


def test_the_child_runs_the_program_and_reports_only_the_probe_values(tmp_path):
    program = "def f(x):\n    return [x, x * 2.5, {'k': (1, None)}]\n"
    code, stdout, stderr, lines = run_child(tmp_path, program, probes=["f(n)", "g()"], setup="n = 4\nexpected = 99")
    assert code == 0, stderr
    report = json.loads(lines[0])
    assert report["python_guard"] is True and report["namespaces"] == [] and report["uid"] is None
    assert lines[1].startswith("values ")
    values = json.loads(lines[1][len("values ") :])
    assert values[1] == ["error", "NameError"]
    assert values[0][0] == "value" and _plain_values.decode_value(values[0][1]) == [4, 10.0, {"k": (1, None)}]
    assert not (tmp_path / "sandbox.json").exists()  # the settings are gone before the program runs


def test_the_program_sees_itself_and_the_standard_library_not_the_package(tmp_path):
    """``-I`` keeps the child's directory (grpo_family/rewards, with its own ``code.py``) off ``sys.path``: the
    program's ``import code`` is the standard library's, and its ``argv`` is its own."""
    program = (
        "import sys, code\nprint(sys.argv)\nprint(code.__file__)\nprint(any('grpo_family' in p for p in sys.path))\n"
    )
    code, stdout, stderr, lines = run_child(tmp_path, program)
    assert code == 0, stderr
    argv, code_file, package_on_path = stdout.splitlines()
    assert argv == "['program.py']"
    assert "grpo_family" not in code_file
    assert package_on_path == "False"
    assert len(lines) == 1  # the report only: no probes, no values line


def test_the_guard_blocks_writes_outside_the_run_directory(tmp_path):
    outside = tmp_path.parent / f"outside-{tmp_path.name}.txt"
    program = f"open({str(outside)!r}, 'w').write('x')\n"
    code, _, stderr, _ = run_child(tmp_path, program)
    assert code == 1 and "writing outside the run's directory is blocked" in stderr, stderr
    assert not outside.exists()
    code, _, stderr, _ = run_child(tmp_path, program, guard=False)  # control: the same program, guard off
    assert code == 0 and outside.exists(), stderr
    outside.unlink()
