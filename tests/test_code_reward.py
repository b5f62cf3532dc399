"""Code-execution reward: extraction, test-case formats, scoring, and the sandbox against hostile programs.

Every hostile-program test checks the outcome *and* that this process is unharmed: the run ends within a bound
set by its timeout, no process of the sandbox is left behind, our memory did not grow, and the run's directory
is gone. Tests that exercise one OS layer on its own (guard off) are skipped where this machine does not provide
that layer (not root, no CAP_SYS_ADMIN); the "control" tests run the same hostile programs with every layer off
and show that they do succeed then, so the protection tests are not passing by accident.
"""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.rewards import REWARD_FUNCS, get_reward_funcs
from grpo_family.rewards.code import (
    CodeTestsReward,
    Sandbox,
    TestCase,
    code_tests_reward,
    extract_code,
    normalize_output,
    parse_test_cases,
    prompt_helpers,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the code sandbox is Linux-only")

TIMEOUT = 3.0  # generous: start-up on a loaded 2-core machine can take a few hundred ms
# For programs that finish at once and whose test is not about the deadline (what a program can import, what reaches
# the trainer): a limit that only a hang reaches, so that a machine loaded by other work (a 2-core CI runner beside
# two training runs made these programs miss TIMEOUT and print nothing) cannot fail them.
UNHURRIED = 60.0

ADD = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"
ADD_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -3", "output": "7"}, {"input": "0 0\n", "output": "0"}]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\nDone."


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def processes_of_uid(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def our_children() -> list[int]:
    children = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                children.append(int(name))
    return children


@pytest.fixture
def tmp_root(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    yield root
    assert list(root.iterdir()) == [], "a sandbox run directory was left behind"


@pytest.fixture
def sandbox(tmp_root):
    return Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root))


@pytest.fixture(scope="module")
def full_isolation():
    """The isolation report of this machine (auto mode), for skipping tests of layers it lacks."""
    return Sandbox(timeout_s=10).check()


def needs(report: dict, *, namespaces: tuple[str, ...] = (), uid: bool = False) -> None:
    missing = [ns for ns in namespaces if ns not in report["namespaces"]]
    if missing or (uid and report["uid"] is None):
        pytest.skip(f"this machine does not provide {missing or 'the uid drop'} (needs root with CAP_SYS_ADMIN)")


def needs_syscall_filter(report: dict) -> None:
    if not report["syscall_filter"]:
        pytest.skip(f"this machine does not provide the seccomp filter: {report['notes']}")


def run_bounded(sandbox: Sandbox, program: str, **kwargs):
    """Run and check what every hostile test checks: the run returns (a hang fails after conftest's HANG_GUARD_S, a
    liveness guard, not a budget: whether the deadline stopped it is the test's ``timed_out`` check), no process
    left, our RSS unchanged."""
    children_before = set(our_children())
    rss_before = rss_mb()
    box: list = []
    thread = threading.Thread(target=lambda: box.append(sandbox.run(program, **kwargs)), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert box, f"the sandbox run did not return within {HANG_GUARD_S} s"
    result = box[0]
    assert set(our_children()) <= children_before, "a sandbox process is still our child"
    if result.isolation.get("uid") is not None:
        assert processes_of_uid(result.isolation["uid"]) == [], "a sandboxed process outlived the run"
    assert rss_mb() - rss_before < 50, "our memory grew"
    assert result.error is None, result.error
    return result


# ----------------------------------------------------------------------------------------------- extraction


def test_extract_code_prefers_the_last_python_block():
    text = "```python\nfirst()\n```\ntext\n```py\nsecond()\n```\n```\nplain()\n```\n```bash\nls\n```"
    assert extract_code(text) == "second()\n"
    assert extract_code("a\n```\nplain()\n```\n```bash\nls\n```") == "plain()\n"
    assert extract_code("print(1)") == "print(1)"
    # An unclosed fence (a completion cut off mid-program) is not a block.
    assert extract_code("```python\nok()\n```\n```python\nunfinished(") == "ok()\n"


@given(st.text(alphabet=st.characters(blacklist_characters="`"), max_size=50))
@settings(max_examples=50, deadline=None)
def test_extract_code_returns_a_fenced_body_verbatim(body):
    body = body if body.endswith("\n") or not body else body + "\n"
    assert extract_code(f"intro\n```python\n{body}```\noutro") == body


# ----------------------------------------------------------------------------------------------- test cases


def test_parse_stdin_stdout_formats():
    cases = parse_test_cases([{"input": "1", "output": "2"}, {"input": ["a", "b"], "output": "c"}])
    assert cases == [TestCase(stdin="1", expected="2"), TestCase(stdin="a\nb\n", expected="c")]
    apps = {"inputs": ["1\n", "2\n"], "outputs": ["1\n", "4\n"]}
    assert parse_test_cases(apps) == parse_test_cases(json.dumps(apps))
    assert len(parse_test_cases(apps)) == 2
    assert parse_test_cases({"input": "x", "output": "y"}) == [TestCase(stdin="x", expected="y")]


def test_parse_assert_formats():
    cases = parse_test_cases("import math\nassert f(1) == 1\nx = 2\nassert f(x) == 4\n")
    # A later case runs the asserts above it too, as expressions whose outcome is not its own (issue 30: a list
    # sorted in place by an earlier call is sorted for a later assert, as in plain Python).
    assert [c.test_code for c in cases] == [
        "import math\nassert f(1) == 1\n",
        "import math\ntry:\n    f(1) == 1\nexcept Exception:\n    pass\nx = 2\nassert f(x) == 4\n",
    ]
    assert len(parse_test_cases(["assert f(1) == 1", "assert f(2) == 4"])) == 2
    humaneval = "def check(candidate):\n    assert candidate(1) == 1\ncheck(f)\n"
    assert parse_test_cases(humaneval) == [TestCase(test_code=humaneval)]


@pytest.mark.parametrize(
    "value",
    [None, "", "   ", [], {}, "[not json", "assert (", [{"input": "1"}], [1, 2], {"inputs": ["1"], "outputs": []},
     {"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}, [{"input": 1, "output": "1"}], ["assert ("]],
)  # fmt: skip
def test_parse_unusable_rows_give_none(value):
    assert parse_test_cases(value) is None


@given(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), min_size=1, max_size=8))
@settings(max_examples=50, deadline=None)
def test_parse_keeps_every_io_case_in_order(pairs):
    cases = parse_test_cases([{"input": i, "output": o} for i, o in pairs])
    assert [(c.stdin, c.expected) for c in cases] == pairs


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", "\x0b", "\x0c", "\x85", "\u2028", "\u200b"])
def test_only_ascii_spaces_tabs_and_line_endings_are_forgiven(space, tmp_root):
    assert normalize_output("3 \t\r\n\r\n\n") == normalize_output("3") == "3"
    assert normalize_output("1\r\n2\r\n") == normalize_output("1\n2")
    assert normalize_output("3" + space + "\n") != normalize_output("3\n")
    assert normalize_output(space + "\n3") != normalize_output("\n3")
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    printing = fenced(f"print('3' + {space!r})\n")
    assert reward([printing, fenced("print('3 ')\n")], test_cases=[[{"input": "", "output": "3\n"}]] * 2) == [0.0, 1.0]


@given(st.text(alphabet=" \tab\n", max_size=40))
@settings(max_examples=100, deadline=None)
def test_normalize_output_is_idempotent_and_ignores_trailing_space(text):
    once = normalize_output(text)
    assert normalize_output(once) == once
    assert normalize_output(text + " \n\n") == once


# ----------------------------------------------------------------------------------------------- the reward


def test_registered_and_picklable():
    assert REWARD_FUNCS["code_tests"] is code_tests_reward
    assert get_reward_funcs("code_tests") == [code_tests_reward]
    copy = pickle.loads(pickle.dumps(CodeTestsReward(timeout_s=2.0, max_workers=2)))
    assert copy.sandbox.timeout_s == 2.0 and copy.max_workers == 2


def test_scores_fractions_and_none(tmp_root):
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root), max_workers=2)
    partly = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b if a < 5 else 0)\n"
    completions = [fenced(ADD), fenced(partly), fenced("def broken(:\n"), "no code at all", fenced(ADD)]
    test_cases = [ADD_TESTS, ADD_TESTS, ADD_TESTS, ADD_TESTS, None]
    metrics = {}
    rewards = reward(completions, test_cases=test_cases, log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert rewards == [1.0, pytest.approx(2 / 3), 0.0, 0.0, None]
    assert metrics["code/no_tests"] == pytest.approx(1 / 5)
    assert metrics["code/syntax_errors"] == pytest.approx(2 / 5)  # the broken program and the prose
    assert metrics["code/sandbox_errors"] == 0.0
    assert reward.counts["total"] == 5


def test_conversational_completions_and_assert_tests(tmp_root):
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    square = "def square(x):\n    return x * x if x < 3 else x\n"
    asserts = "assert square(1) == 1\nassert square(2) == 4\nassert square(3) == 9\nassert square(4) == 16\n"
    completion = [{"role": "assistant", "content": fenced(square)}]
    assert reward([completion], test_cases=[asserts]) == [0.5]
    assert reward([completion], test_cases=[["assert square(2) == 4", "assert square(5) == 25"]]) == [0.5]


@pytest.mark.parametrize("escape", ["exit(0)", "import sys; sys.exit()", "import os; os._exit(0)"])
def test_exiting_before_the_asserts_does_not_pass(tmp_root, escape):
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert reward([fenced(f"def f(x):\n    return 0\n{escape}\n")], test_cases=["assert f(1) == 1"]) == [0.0]


def test_missing_column_and_wrong_count_are_clear_errors():
    with pytest.raises(ValueError, match="test_cases"):
        code_tests_reward(["x"])
    with pytest.raises(ValueError, match="2 completions but 1"):
        code_tests_reward(["x", "y"], test_cases=[ADD_TESTS])


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="none")
    with pytest.raises(ValueError, match="timeout_s"):
        Sandbox(timeout_s=0)
    with pytest.raises(ValueError, match="max_workers"):
        CodeTestsReward(max_workers=0)


def test_skip_after_timeout_saves_the_remaining_runs(tmp_root):
    reward = CodeTestsReward(timeout_s=1.0, tmp_root=str(tmp_root), max_workers=1)
    runs = []
    real_run = reward.sandbox.run
    reward.sandbox.run = lambda *args, **kwargs: runs.append(args) or real_run(*args, **kwargs)
    assert reward([fenced("while True:\n    pass\n")], test_cases=[ADD_TESTS * 3]) == [0.0]
    assert len([args for args in runs if args != ("",)]) == 1  # one timeout, not nine (counted, not timed)
    assert reward.counts["timeouts"] == 1


def test_syntax_error_runs_once_and_max_tests(tmp_root):
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root), max_workers=1, max_tests=2)
    runs = []
    real_run = reward.sandbox.run
    reward.sandbox.run = lambda *args, **kwargs: runs.append(args) or real_run(*args, **kwargs)
    assert reward([fenced("print(1 +)\n"), fenced(ADD)], test_cases=[ADD_TESTS, ADD_TESTS]) == [0.0, 1.0]
    runs = [args for args in runs if args != ("",)]  # not the first call's check of the sandbox
    assert len(runs) == 1 + 2  # the broken program ran once; the other ran its first 2 of 3 test cases


def test_signalling_other_processes_is_blocked(sandbox):
    result = run_bounded(sandbox, f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)\n")
    assert result.returncode != 0 and "signalling other processes is blocked" in result.stderr


# ----------------------------------------------------------------------------------------------- hostile programs


def test_infinite_loop_is_stopped_at_the_timeout(sandbox):
    result = run_bounded(sandbox, "while True:\n    pass\n")
    assert result.timed_out and not result.completed


def test_memory_bomb_fails_fast_and_our_memory_is_untouched(sandbox):
    result = run_bounded(sandbox, "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n")
    assert not result.timed_out and result.returncode != 0
    assert "MemoryError" in result.stderr


def test_fork_bomb_is_contained(sandbox):
    result = run_bounded(sandbox, "import os\nwhile True:\n    os.fork()\n")
    assert result.returncode != 0 and not result.completed
    assert "blocked" in result.stderr  # the Python guard refuses the first fork


def test_fork_bomb_is_contained_by_the_os_alone(tmp_root, full_isolation):
    needs(full_isolation, namespaces=("pid",), uid=True)
    sandbox = Sandbox(timeout_s=2.0, tmp_root=str(tmp_root), python_guard=False, max_processes=8)
    counted = (
        "import os, time\nn = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n    except OSError:\n"
        "        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    n += 1\nprint(n)\n"
    )
    result = run_bounded(sandbox, counted)
    assert 0 < int(result.stdout) < 8  # RLIMIT_NPROC (8, this process included) stopped the forks
    result = run_bounded(
        sandbox, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    assert result.timed_out


def test_a_detached_grandchild_does_not_outlive_the_run(tmp_root, full_isolation):
    needs(full_isolation, namespaces=("pid",), uid=True)
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False)
    program = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint('parent done')\n"
    result = run_bounded(sandbox, program)  # checks that no process of the sandbox uid is left
    assert result.stdout == "parent done\n" and not result.timed_out


def _listening_socket():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    return server


CONNECT = (
    "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
    "    s.sendall(b'leak')\n    print('CONNECTED')\nexcept Exception as e:\n    print('FAILED', type(e).__name__, e)\n"
)


def _accepted(server: socket.socket) -> bool:
    """Whether a connection is waiting on our non-blocking listening ``server`` (accepted and closed)."""
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def _connect_attempt(sandbox):
    server = _listening_socket()
    try:
        result = run_bounded(sandbox, CONNECT.format(port=server.getsockname()[1]))
        time.sleep(0.2)
        reached = _accepted(server)
    finally:
        server.close()
    return result, reached


@pytest.mark.parametrize("layer", ["all", "network namespace only", "syscall filter only", "python guard only"])
def test_network_connection_fails(tmp_root, full_isolation, layer):
    if layer == "network namespace only":
        needs(full_isolation, namespaces=("net",))
    if layer == "syscall filter only":
        needs_syscall_filter(full_isolation)
    sandbox = Sandbox(
        timeout_s=TIMEOUT,
        tmp_root=str(tmp_root),
        python_guard=layer in ("all", "python guard only"),
        syscall_filter=layer in ("all", "syscall filter only"),
        isolation="auto" if layer in ("all", "network namespace only") else "minimal",
        outer_sandbox=True,
    )
    result, reached = _connect_attempt(sandbox)
    assert result.stdout.startswith("FAILED"), result.stdout
    assert not reached, "our server saw a connection"
    assert result.isolation["syscall_filter"] == sandbox.syscall_filter  # the layer under test was on


def test_control_without_any_layer_the_connection_succeeds(tmp_root):
    result, reached = _connect_attempt(Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), isolation="minimal",
                                               outer_sandbox=True, python_guard=False, syscall_filter=False))  # fmt: skip
    assert result.stdout.startswith("CONNECTED") and reached


WRITE = (
    "import os\nfor path in {paths!r}:\n    try:\n        with open(path, 'w') as f:\n            f.write('x')\n"
    "        print('WROTE', path)\n    except OSError as e:\n        print('FAILED', path, type(e).__name__)\n"
    "with open('inside.txt', 'w') as f:\n    f.write('fine')\nprint(open('inside.txt').read())\n"
)


def _outside_paths() -> list[str]:
    tag = uuid.uuid4().hex
    return [f"/tmp/grpo_sandbox_escape_{tag}", f"/var/tmp/grpo_sandbox_escape_{tag}", f"/dev/shm/grpo_escape_{tag}"]


@pytest.mark.parametrize("layer", ["all", "os layers only", "python guard only"])
def test_writes_outside_the_run_directory_do_not_land(tmp_root, full_isolation, layer):
    if layer == "os layers only":
        needs(full_isolation, namespaces=("mnt",))
    sandbox = Sandbox(
        timeout_s=TIMEOUT,
        tmp_root=str(tmp_root),
        python_guard=layer != "os layers only",
        isolation="minimal" if layer == "python guard only" else "auto",
        outer_sandbox=True,
    )
    paths = [p for p in _outside_paths() if os.path.isdir(os.path.dirname(p))]
    result = run_bounded(sandbox, WRITE.format(paths=paths))
    assert result.stdout.rstrip().endswith("fine")  # writing inside its own directory works
    assert [p for p in paths if os.path.exists(p)] == []


def test_control_without_any_layer_the_write_lands(tmp_root):
    path = _outside_paths()[0]
    try:
        sandbox = Sandbox(
            timeout_s=TIMEOUT, tmp_root=str(tmp_root), isolation="minimal", outer_sandbox=True, python_guard=False
        )
        run_bounded(sandbox, WRITE.format(paths=[path]))
        assert os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.remove(path)


SECRET_SCAN = (
    "import os\nprint(sorted(os.environ))\nprint(dict(os.environ))\n"
    "for pid in os.listdir('/proc'):\n    if pid.isdigit():\n        try:\n"
    "            print(open(f'/proc/{pid}/environ', 'rb').read())\n        except OSError:\n            pass\n"
)


def our_launch_environment_entry() -> str:
    """One ``KEY=value`` of this process's environment at launch (what /proc/<pid>/environ shows), where a real
    run's HF_TOKEN would be; not one of the few variables the sandbox sets itself."""
    with open(f"/proc/{os.getpid()}/environ", "rb") as f:
        entries = [e.decode(errors="replace") for e in f.read().split(b"\0") if b"=" in e]
    entries = [e for e in entries if e.split("=")[0] not in ("PATH", "HOME", "TMPDIR", "LANG") and len(e) > 8]
    if not entries:
        pytest.skip("this process was launched with an empty environment")
    return max(entries, key=len)


def test_environment_secrets_are_not_visible(sandbox, monkeypatch, full_isolation):
    needs(full_isolation, namespaces=("pid",))  # without a PID namespace, root can read /proc/<our pid>/environ
    secret = "hf_FAKE" + uuid.uuid4().hex
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    result = run_bounded(sandbox, SECRET_SCAN)
    assert "'PATH'" in result.stdout  # the program ran and printed its environment
    assert secret not in result.stdout + result.stderr and "HF_TOKEN" not in result.stdout
    assert our_launch_environment_entry() not in result.stdout  # nor ours through /proc


def test_environment_is_scrubbed_even_in_minimal_mode(tmp_root, monkeypatch):
    secret = "hf_FAKE" + uuid.uuid4().hex
    monkeypatch.setenv("HF_TOKEN", secret)
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), isolation="minimal", outer_sandbox=True)
    result = run_bounded(sandbox, "import os\nprint(dict(os.environ))\n")
    assert "'PATH'" in result.stdout and secret not in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="documents a root-only weakness")
def test_control_minimal_mode_as_root_reads_our_environment_through_proc(tmp_root):
    """Why the README says root without namespaces is weak: /proc/<our pid>/environ is readable."""
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), isolation="minimal", outer_sandbox=True)
    result = run_bounded(sandbox, f"print(open('/proc/{os.getpid()}/environ', 'rb').read())\n")
    assert our_launch_environment_entry() in result.stdout


def test_huge_output_is_capped_and_fast(tmp_root):
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), max_output_bytes=100_000)
    for program in ("while True:\n    print('x' * 100_000)\n", "import sys\nsys.stdout.write('y' * 10**8)\n",
                    "import sys\nwhile True:\n    sys.stderr.write('z' * 100_000)\n"):  # fmt: skip
        result = run_bounded(sandbox, program)
        assert result.output_overflow and not result.timed_out  # stopped by the cap, before the deadline
        assert len(result.stdout) <= 100_000 and len(result.stderr) <= 100_000


def test_big_files_and_private_tmp(tmp_root, full_isolation):
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), disk_mb=8)
    program = (
        "import os\ntry:\n    with open('big.bin', 'wb') as f:\n        f.write(b'0' * (64 * 2**20))\n"
        "    print('WROTE')\nexcept OSError as e:\n    print('FAILED', e.errno)\nprint(sorted(os.listdir('/tmp')))\n"
    )
    result = run_bounded(sandbox, program)
    assert result.stdout.startswith("FAILED 27")  # EFBIG from RLIMIT_FSIZE
    if "mnt" in full_isolation["namespaces"]:
        assert result.stdout.splitlines()[1].count("'") == 2  # /tmp holds only the run's own directory


def test_parallel_runs_and_the_reward_on_hostile_completions(tmp_root):
    reward = CodeTestsReward(timeout_s=2.0, tmp_root=str(tmp_root), max_workers=3)
    hostile = [
        fenced("while True:\n    pass\n"),
        fenced("import os\nwhile True:\n    os.fork()\n"),
        fenced("x = bytearray(2**40)\n"),
        fenced("import socket\nsocket.create_connection(('127.0.0.1', 9))\n"),
        fenced("while True:\n    print('x' * 10**6)\n"),
        fenced(ADD),
    ]
    children_before = set(our_children())
    lock, in_flight, peak, timed_out = threading.Lock(), [0], [0], []
    real_run = reward.sandbox.run

    def counted_run(program, *args, **kwargs):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            result = real_run(program, *args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1
        if result.timed_out:
            timed_out.append(program)
        return result

    reward.sandbox.run = counted_run
    rewards = reward(hostile, test_cases=[ADD_TESTS] * len(hostile))
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # The bound by construction, not by the clock: only the endless loop ran into the deadline, at most once per
    # test case (none started after its first timeout is started at all), and never more than max_workers at once.
    assert set(timed_out) == {"while True:\n    pass\n"} and len(timed_out) <= len(ADD_TESTS)
    assert peak[0] <= reward.max_workers
    assert set(our_children()) <= children_before


def test_isolation_report_and_strict_mode(tmp_root, full_isolation):
    assert full_isolation["python_guard"] is True
    if os.geteuid() == 0 and "pid" in full_isolation["namespaces"]:
        assert full_isolation["uid"] is not None and full_isolation["nproc_limit"] == 8
        assert Sandbox(isolation="strict", tmp_root=str(tmp_root)).check()["namespaces"]
    minimal = Sandbox(isolation="minimal", outer_sandbox=True, tmp_root=str(tmp_root)).check()
    assert minimal["namespaces"] == [] and minimal["uid"] is None


# ----------------------------------------------------------------------------------------------- assert tests: gaming

WRONG = "def f(x):\n    return -12345\n"
RIGHT = "def f(x):\n    return {1: 2, 2: 4, 3: [1, (2, 3)]}[x]\n"
F_ASSERTS = "assert f(1) == 2\nassert f(2) == 4\nassert f(3) == [1, (2, 3)]\n"

# What a policy writing the program can do to the interpreter it runs in. Against the harness before issue 22
# (program and asserts in one interpreter) each of these scored 1.0 with a wrong f.
GAMING = {
    "status_pipe_and_nonce_from_the_harness_frame": (
        "import sys, os\nloc = sys._getframe(1).f_locals\n"
        "os.write(loc['status_fd'], b'done ' + loc['nonce'] + b'\\n')\nos._exit(0)\n"
    ),
    "fake_status_lines_on_every_fd_then_exit": (
        "import os, sys, json\nsecrets = [v for d in range(1, 4) for v in sys._getframe(d).f_locals.values()\n"
        "           if isinstance(v, (bytes, str)) and len(v) == 32] if sys._getframe(1) else []\n"
        "lines = [b'done ' + (v if isinstance(v, bytes) else v.encode()) for v in secrets]\n"
        "lines.append(b'values ' + json.dumps([['value', 2], ['value', 4]]).encode())\n"
        "for fd in range(3, 64):\n    for line in lines:\n        try:\n            os.write(fd, line + b'\\n')\n"
        "        except OSError:\n            pass\nos._exit(0)\n"
    ),
    "patched_compile": (
        "import builtins\nreal = builtins.compile\n"
        "builtins.compile = lambda src, name, mode, *a, **k: real('pass' if mode == 'exec' else 'True', name, mode)\n"
        + WRONG
    ),
    "always_equal_object": "class Anything:\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = object.__hash__\ndef f(x):\n    return Anything()\n",
    "int_subclass_equal_to_everything": "class Int(int):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\ndef f(x):\n    return Int(0)\n",
    "lookup_table_from_the_test_source_in_memory": (
        "import gc, re, sys\ntable = {}\n"
        "def scan(v):\n    if isinstance(v, bytes):\n        v = v.decode(errors='ignore')\n"
        "    if isinstance(v, str):\n        for a, b in re.findall(r'f\\((.*?)\\) == (.*)', v):\n"
        "            table[a.strip()] = b.strip()\n"
        "fr = sys._getframe()\nwhile fr is not None:\n    for v in list(fr.f_locals.values()) + list(fr.f_globals.values()):\n"
        "        scan(v)\n    fr = fr.f_back\n"
        "for o in gc.get_objects():\n    if isinstance(o, dict):\n        for v in list(o.values()):\n            scan(v)\n"
        "    elif isinstance(o, (list, tuple)):\n        for v in o:\n            scan(v)\n"
        "def f(x):\n    return eval(table[repr(x)])\n"
    ),
    "exit_zero_before_the_asserts": WRONG + "import os\nos._exit(0)\n",
    "exit_from_inside_the_call": "import os\ndef f(x):\n    os._exit(0)\n",
}


@pytest.mark.parametrize("attack", list(GAMING))
def test_wrong_programs_score_zero_on_assert_tests_whatever_they_do_to_their_interpreter(tmp_root, attack):
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    metrics = {}
    assert reward([fenced(GAMING[attack])], test_cases=[F_ASSERTS], log_metric=metrics.__setitem__) == [0.0]
    assert metrics["code/sandbox_errors"] == 0.0
    assert reward([fenced(RIGHT)], test_cases=[F_ASSERTS]) == [1.0]  # the same tests pass a correct program


def test_expected_values_kept_in_setup_variables_stay_out_of_the_programs_reach(tmp_root):
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    tests = "secret_answer = 987654321\narg = 3\nassert f(arg) == secret_answer\n"
    reader = (
        "import gc\ndef f(x):\n    found = [o['secret_answer'] for o in gc.get_objects()\n"
        "             if isinstance(o, dict) and 'secret_answer' in o]\n    return found[0] if found else None\n"
    )
    assert reward([fenced(reader)], test_cases=[tests]) == [0.0]
    assert reward([fenced("def f(x):\n    return 987654321\n")], test_cases=[tests]) == [1.0]


def test_a_correct_program_cannot_lower_its_score_or_the_metrics_through_the_status_pipe(tmp_root):
    scribbler = (
        "import os\nfor fd in range(3, 64):\n    for line in (b'syntax', b'values [[\"error\", \"x\"]]', b'{}'):\n"
        "        try:\n            os.write(fd, line + b'\\n')\n        except OSError:\n            pass\n"
        "print('syntax')\n"
    )
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    metrics = {}
    rewards = reward(
        [fenced(scribbler + RIGHT), fenced(scribbler + ADD)],
        test_cases=[F_ASSERTS, [{"input": "1 2", "output": "syntax\n3"}]],
        log_metric=metrics.__setitem__,
    )
    assert rewards == [1.0, 1.0]
    assert metrics["code/syntax_errors"] == 0.0


def test_assert_forms_graded_outside_the_program(tmp_root):
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    humaneval = (
        "METADATA = {}\nimport math\n\ndef check(candidate):\n    assert candidate(2) == 4\n"
        "    assert math.isclose(candidate(1.5), 2.25)\n    assert candidate(3) in {9, 10}\n"
        "    assert not candidate(0)\n\ncheck(square)\n"
    )
    square, wrong = "def square(x):\n    return x * x\n", "def square(x):\n    return 4 if x == 2 else x * x + 1\n"
    assert reward([fenced(square), fenced(wrong)], test_cases=[humaneval] * 2) == [1.0, 0.0]
    pairs = "def f(x):\n    return (x, [x], {x}, {'k': x}, float(x) / 2, b'x', None, x > 1)\n"
    tests = [
        "assert f(1) == (1, [1], {1}, {'k': 1}, 0.5, b'x', None, False)",
        "expected = (2, [2])\nassert f(2)[:2] == expected",
        "assert f(3)[7] is True",
        "assert sorted(f(4)[2]) == [4] and f(4)[4] > 1",
        "assert f(5)[0] == 6",  # fails
    ]
    assert reward([fenced(pairs)], test_cases=[tests]) == [pytest.approx(4 / 5)]
    # A value that is not a plain builtin reaches the test only as a reference: a generator is iterated through the
    # program and its items compared here (before issue 30 this scored 0.0; plain Python passes it), while an
    # object's own __eq__ is never asked (GAMING["always_equal_object"]).
    assert reward([fenced("def f(x):\n    return (i for i in [x])\n")], test_cases=[["assert list(f(1)) == [1]"]]) == [
        1.0
    ]


def test_assert_forms_the_old_planner_left_out_are_judged(tmp_root):
    """Before issue 30 these rows were left out (None): the judge now runs the test as ordinary Python, calls into
    the program included, so loops, comprehensions and setup that calls the program are judged like the rest."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    tests = [
        "assert all(f(i) == i for i in range(3))",
        "for i in range(3):\n    assert f(i) == i\n",
        "r = f(2)\nassert r == 2",
        "assert [f(x) for x in (1, 2)] == [1, 2]\nassert (lambda g: g(5))(f) == 5",
    ]
    assert reward([fenced("def f(x):\n    return x\n")], test_cases=[tests]) == [1.0]
    assert reward([fenced("def f(x):\n    return 0\n")], test_cases=[tests]) == [0.0]


# ----------------------------------------------------------------------------------------------- kernel-enforced limits

ESCAPES = {
    # memfd memory is not counted by RLIMIT_AS (it held 1,984 MB under a 512 MB limit before issue 22)
    "memfd_create": "import os\nfd = os.memfd_create('m')\nos.ftruncate(fd, 1 << 20)\nprint('ESCAPED')\n",
    "unshare_user_and_net_namespaces": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.unshare(0x10000000 | 0x40000000) == 0:\n    print('ESCAPED')\n"
    ),
    "clone_into_a_new_user_namespace": (
        "import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "pid = libc.syscall(56, 0x10000000 | signal.SIGCHLD, 0, 0, 0, 0)\n"
        "if pid == 0:\n    os._exit(0)\nif pid > 0:\n    os.waitpid(pid, 0)\n    print('ESCAPED')\n"
    ),
    "system_v_shared_memory": (  # removed again: in the control without namespaces it would outlive the run
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nsegment = libc.shmget(0, 1 << 20, 0o1600)\n"
        "if segment >= 0:\n    libc.shmctl(segment, 0, None)\n    print('ESCAPED')\n"
    ),
    "exec_a_fresh_interpreter_without_the_audit_hook": "import os\nos.execv('/bin/echo', ['echo', 'ESCAPED'])\n",
    "ptrace": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.ptrace(0, 0, 0, 0) == 0:\n    print('ESCAPED')\n",
    "inet_socket_with_no_network_namespace": "import socket\nsocket.socket()\nprint('ESCAPED')\n",
    # per-user kernel allowances a fresh uid would get whole: ~190k inotify watches, tens of thousands of timers
    "inotify_watches": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.inotify_init() >= 0:\n    print('ESCAPED')\n"
    ),
    "posix_timers": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\ntimer = ctypes.c_void_p()\n"
        "if libc.timer_create(1, None, ctypes.byref(timer)) == 0:\n    print('ESCAPED')\n"
    ),
}


@pytest.mark.parametrize("escape", list(ESCAPES))
@pytest.mark.parametrize("isolation", ["auto", "minimal"])
def test_the_syscall_filter_refuses_kernel_interfaces(tmp_root, full_isolation, escape, isolation):
    """Python guard off, so that the seccomp filter alone is tested (minimal: it is the only OS layer left)."""
    needs_syscall_filter(full_isolation)
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False, isolation=isolation,
                      outer_sandbox=True)  # fmt: skip
    result = run_bounded(sandbox, ESCAPES[escape])
    assert result.isolation["syscall_filter"] is True
    assert "ESCAPED" not in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize(
    "escape", ["memfd_create", "system_v_shared_memory", "ptrace", "inotify_watches", "posix_timers"]
)
def test_control_without_the_syscall_filter_the_escape_works(tmp_root, escape):
    # System V: the run's own IPC namespace allows no segment either (issue 30), so its control has no namespaces.
    isolation = "minimal" if escape == "system_v_shared_memory" else "auto"
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False, syscall_filter=False,
                      isolation=isolation, outer_sandbox=True)  # fmt: skip
    result = run_bounded(sandbox, ESCAPES[escape])
    assert result.isolation["syscall_filter"] is False
    assert "ESCAPED" in result.stdout, result.stdout + result.stderr


def test_threads_forks_and_the_standard_library_still_work_under_the_filter(sandbox):
    program = (
        "import threading, json, re, math\nout = []\nt = threading.Thread(target=lambda: out.append(math.factorial(5)))\n"
        "t.start()\nt.join()\nprint(json.dumps(out), re.sub('a', 'b', 'aa'))\n"
    )
    result = run_bounded(sandbox, program)
    assert result.stdout == "[120] bb\n" and result.isolation["syscall_filter"] is True


def test_one_run_gets_at_most_a_few_ptys(tmp_root, full_isolation):
    needs(full_isolation, namespaces=("mnt",))
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False)
    program = (
        "import os\nn = 0\nfds = []\nfor _ in range(64):\n    try:\n        fds.extend(os.openpty())\n"
        "        n += 1\n    except OSError:\n        break\nprint(n)\n"
    )
    result = run_bounded(sandbox, program)
    assert result.isolation["pty_limit"] == 4
    assert 1 <= int(result.stdout) <= 4, result.stdout + result.stderr  # it can open some, not 64


def test_one_run_gets_at_most_a_bounded_number_of_inodes(tmp_root, full_isolation):
    needs(full_isolation, namespaces=("mnt",))
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False)
    program = (
        "import os\nn = 0\nfor i in range(5000):\n    try:\n        os.mkdir(f'/tmp/d{i}')\n        n += 1\n"
        "    except OSError:\n        break\nprint(n)\n"
    )
    result = run_bounded(sandbox, program)
    assert result.isolation["tmpfs_inodes"] == 1024
    assert 900 < int(result.stdout) < 1024, result.stdout + result.stderr


def test_minimal_mode_refuses_without_a_declared_outer_sandbox():
    with pytest.raises(ValueError, match="outer_sandbox=True") as error:
        Sandbox(isolation="minimal")
    assert "writes anywhere" in str(error.value)
    with pytest.raises(ValueError, match="outer_sandbox=True"):
        CodeTestsReward(isolation="minimal")
    assert Sandbox(isolation="minimal", outer_sandbox=True).isolation == "minimal"


# ----------------------------------------------------------------------------------------------- issue 30: routes
# Each test below failed on the code before issue 30 (the outcome it had is in its docstring). The routes are data
# (ROUTES, the program constants) so that benchmarks/code_sandbox.py runs the same attacks on the code before and
# after and writes both outcomes into benchmarks/results/hostile_inputs.md.


@dataclass(frozen=True)
class Route:
    """An attack through the reward: each program (as a completion) with its test cases (and prompt), and the
    rewards plain Python gives them."""

    programs: tuple[str, ...]
    tests: tuple
    expected: tuple
    prompts: tuple | None = None

    def rewards(self, reward) -> list:
        completions = [fenced(program) for program in self.programs]
        prompts = None if self.prompts is None else list(self.prompts)
        return reward(completions, test_cases=list(self.tests), prompts=prompts)


ISCLOSE = "assert math.isclose(area(2), 12.566, rel_tol=0.001)\n"  # MBPP's shape: the test never imports math
CYCLIC_PROMPT = '''def encode_cyclic(s: str):
    """returns encoded string by cycling groups of three characters."""
    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]
    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]
    return "".join(groups)


def decode_cyclic(s: str):
    """
    takes as input string encoded with encode_cyclic function. Returns decoded string.
    """
'''
CYCLIC_CHAT = ({"role": "system", "content": "Complete the function."}, {"role": "user", "content": CYCLIC_PROMPT})
CYCLIC_TEST = (
    "def check(candidate):\n    assert candidate(encode_cyclic('abcdefgh')) == 'abcdefgh'\n"
    "    assert candidate(encode_cyclic('hello world')) == 'hello world'\n\ncheck(decode_cyclic)\n"
)
CYCLIC_TEST_WITH_A_LOOP = (  # HumanEval/38's own shape: random strings in a loop
    "def check(candidate):\n    from random import randint, choice\n    import string\n\n"
    "    letters = string.ascii_lowercase\n    for _ in range(100):\n"
    "        str = ''.join(choice(letters) for i in range(randint(10, 20)))\n"
    "        encoded_str = encode_cyclic(str)\n        assert candidate(encoded_str) == str\n\ncheck(decode_cyclic)\n"
)
CYCLIC_PROGRAMS = (
    "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",  # the identity pair
    "def decode_cyclic(s):\n    return encode_cyclic(encode_cyclic(s))\n",  # relies on the prompt's helper
    CYCLIC_PROMPT + "    return encode_cyclic(encode_cyclic(s))\n",  # the prompt completed
)
TABLE = (
    "cases = [((1, 2), 3), ((30, 4), 34), ((5, -6), -1)]\n"
    "assert add(*cases[0][0]) == cases[0][1]\nassert add(*cases[1][0]) == cases[1][1]\n"
    "assert add(*cases[2][0]) == cases[2][1]\n"
)
TABLE_READER = (
    "import gc\ndef add(*args):\n    for o in gc.get_objects():\n"
    "        if isinstance(o, list) and o and all(isinstance(c, tuple) and len(c) == 2 for c in o):\n"
    "            for c in o:\n                if c[0] == args:\n                    return c[1]\n    return None\n"
)
SAME_CONFIG = "assert get_config() is get_config()\n"
COLLIDING = "M = (1 << 61) - 1\ndef f():\n    return [k * M for k in range(1, 30001)]\n"  # 30,000 ints, one hash
PLAIN_PYTHON_PASSES = {
    # name: (program, test) -- each passes when run as plain Python (program, then test, in one namespace)
    "counter_against_a_dict_literal": (
        "from collections import Counter\ndef count(s):\n    return Counter(s)\n",
        "assert count('abca') == {'a': 2, 'b': 1, 'c': 1}\n",
    ),
    "bytearray_against_bytes": ("def raw(s):\n    return bytearray(s, 'ascii')\n", "assert raw('ab') == b'ab'\n"),
    "in_place_sort_checked_by_a_later_assert": (
        "def sort_in_place(a):\n    a.sort()\n",
        "a = [3, 1, 2]\nassert sort_in_place(a) is None\nassert a == [1, 2, 3]\n",
    ),
    "result_over_4300_digits": (
        "def fact(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r\n",
        "import math\nassert fact(2000) == math.factorial(2000)\n",
    ),
}
ROUTES = {
    "free_name_math": Route(
        (
            "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef area(r):\n    return 0\n",
            "import math\ndef area(r):\n    return math.pi * r * r\n",
            "def area(r):\n    return 3.14159265 * r * r\n",  # relies on the test's own math
        ),
        (ISCLOSE,) * 3,
        (0.0, 1.0, 1.0),
    ),
    "free_name_numpy": Route(
        ("class numpy:\n    allclose = staticmethod(lambda *a, **k: True)\ndef area(r):\n    return 0\n",),
        ("assert numpy.allclose(area(2), 12.566)",),
        (0.0,),
    ),
    "prompt_helper": Route(CYCLIC_PROGRAMS, (CYCLIC_TEST,) * 3, (0.0, 1.0, 1.0), (CYCLIC_CHAT,) * 3),
    "prompt_helper_in_a_loop": Route(
        CYCLIC_PROGRAMS, (CYCLIC_TEST_WITH_A_LOOP,) * 3, (0.0, 1.0, 1.0), (CYCLIC_CHAT,) * 3
    ),
    "setup_table": Route((TABLE_READER, "def add(a, b):\n    return a + b\n"), (TABLE,) * 2, (0.0, 1.0)),
    "identical_calls": Route(
        (
            "def get_config():\n    return {}\n",
            "CONFIG = {}\ndef get_config():\n    return CONFIG\n",
            "n = 0\ndef tick():\n    global n\n    n += 1\n    return n\n",
        ),
        (SAME_CONFIG, SAME_CONFIG, "assert tick() != tick()\nassert tick() == 3\n"),
        (0.0, 1.0, 1.0),
    ),
    "colliding_values_in_the_judge": Route(
        ("def f():\n    return [3, 1, 2]\n", COLLIDING, "def f():\n    return [3, 1, 2]\n"),
        ("assert set(f()) == {1, 2, 3}",) * 3,
        (1.0, 0.0, 1.0),
    ),
    **{name: Route((program,), (test,), (1.0,)) for name, (program, test) in PLAIN_PYTHON_PASSES.items()},
}


def test_a_free_name_in_a_test_resolves_outside_the_program(tmp_root):
    """Before: [1.0, 1.0, 0.0]: 1.0 for the fake ``math`` (the free name resolved in the program's namespace), 0.0
    for a right area() that does not import math; 1.0 for a fake ``numpy`` (a module the sandbox does not have,
    so no program passes that test honestly)."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    for name in ("free_name_math", "free_name_numpy"):
        assert ROUTES[name].rewards(reward) == list(ROUTES[name].expected)
    # A function under test named like a standard module is the program's where the test calls it.
    calendar = "def calendar(year):\n    return year % 4 == 0\n"
    assert reward([fenced(calendar)], test_cases=["assert calendar(2024) and not calendar(2023)"]) == [1.0]
    # The prompt's helpers resolve the same way: a helper using math without importing it gets the real one.
    prompt = "def circle(r):\n    return math.pi * r * r\n\ndef area(r):\n    ...\n"
    fake = "class math:\n    pi = 0\ndef area(r):\n    return 0\n"
    assert reward([fenced(fake)], test_cases=["assert area(2) == circle(2)"], prompts=[prompt]) == [0.0]


@pytest.mark.parametrize("route", ["prompt_helper", "prompt_helper_in_a_loop"])
def test_helpers_the_prompt_provides_are_taken_from_the_prompt(tmp_root, route):
    """Before: [1.0, 0.0, 1.0] on the plain asserts (the identity pair's own ``encode_cyclic`` answered the test;
    the program relying on the prompt's helper failed); the loop form was left out (None) whatever the program."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert ROUTES[route].rewards(reward) == list(ROUTES[route].expected)


def test_prompt_helpers_are_the_prompts_definitions_and_its_stubs_are_the_programs():
    source, stubs = prompt_helpers(CYCLIC_PROMPT)
    assert stubs == ("decode_cyclic",) and "def encode_cyclic" in source and "decode_cyclic(" not in source
    chat = [
        {"role": "system", "content": "Solve it."},
        {"role": "user", "content": "Write f.\n```python\nimport math\nK = 3\ndef g(x):\n    return x + K\n\n"
         "def f(x):\n    ...\n\nclass S:\n    def m(self):\n        raise NotImplementedError\n```\nThanks."},
    ]  # fmt: skip
    source, stubs = prompt_helpers(chat)
    assert stubs == ("f", "S") and source == "import math\n\nK = 3\n\ndef g(x):\n    return x + K"
    assert prompt_helpers("Write a function that adds two numbers.") == ("", ())
    parts = [{"role": "user", "content": [{"type": "text", "text": CYCLIC_PROMPT}]}]
    assert prompt_helpers(parts)[1] == ("decode_cyclic",)


def test_a_stub_named_like_a_builtin_is_the_programs(tmp_root):
    """A name the prompt leaves to the program means the program's, even where a builtin has it; without the
    prompt the builtin would answer the test (docs/code_sandbox.md says to give such rows a stub)."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    prompt = 'def max(xs):\n    """The largest element of xs."""\n'
    wrong, right = "def max(xs):\n    return 0\n", "def max(xs):\n    return sorted(xs)[-1]\n"
    tests = ["assert max([1, 3, 2]) == 3"] * 2
    assert reward([fenced(wrong), fenced(right)], test_cases=tests, prompts=[prompt] * 2) == [0.0, 1.0]


def test_test_setup_never_enters_the_programs_namespace(tmp_root):
    """Before: [1.0, 1.0] (the table reader found the expected values in its memory)."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert ROUTES["setup_table"].rewards(reward) == list(ROUTES["setup_table"].expected)


def test_every_call_is_its_own_probe(tmp_root):
    """Before: [1.0, 1.0, 0.0] (the identical calls were merged into one probe: fresh dicts passed ``is``, the
    counter's two calls were one)."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert ROUTES["identical_calls"].rewards(reward) == list(ROUTES["identical_calls"].expected)


def test_a_judge_timeout_is_confined_to_the_row_that_caused_it(tmp_root):
    """Before: [None, None, None] (the shared judge timed out on the colliding values and every row lost its
    score)."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert ROUTES["colliding_values_in_the_judge"].rewards(reward) == [1.0, 0.0, 1.0]


FORGE = (
    "import json, os, sys\nM = (1 << 61) - 1\nlines = {{'colliding': json.dumps([['value', {{'set': [k * M for k in "
    "range(1, 32001)]}}]]), 'empty_lists': json.dumps([['value', [[]] * 275000]])}}\n"
    "line = b'values ' + lines[{kind!r}].encode() + b'\\n'\nfds = set(range(3, 256))\nframe = sys._getframe(0)\n"
    "while frame is not None:\n    fds.update(v for k, v in frame.f_locals.items() if k.endswith('fd') and "
    "isinstance(v, int))\n    frame = frame.f_back\nfor fd in sorted(fds):\n    try:\n        os.write(fd, line)\n"
    "    except OSError:\n        pass\nos._exit(0)\n"
)


def trainer_side_cost(reward, completions: list, test_cases: list, deadline_s: float = 5.0) -> dict:
    """Call ``with_timeout(reward, deadline_s)`` and measure what it costs this process: the rewards (or "timed
    out"), seconds until it returned or raised, the longest stall of another thread of ours, and the peak of our
    Python memory during the call."""
    import threading
    import tracemalloc

    from grpo_family.errors import RewardTimeoutError
    from grpo_family.rewards.timeout import with_timeout

    gaps, stop = [0.0], threading.Event()

    def ticker():
        last = time.monotonic()
        while not stop.wait(0.01):
            now = time.monotonic()
            gaps[0] = max(gaps[0], now - last)
            last = now

    thread = threading.Thread(target=ticker, daemon=True)
    tracemalloc.start()
    thread.start()
    start = time.monotonic()
    try:
        rewards = with_timeout(reward, deadline_s)(completions, test_cases=test_cases)
    except RewardTimeoutError:
        rewards = "timed out"
    elapsed = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    stop.set()
    thread.join()
    return {"rewards": rewards, "elapsed_s": elapsed, "stall_s": gaps[0], "peak_mb": peak / 2**20}


@pytest.mark.parametrize("kind", ["colliding", "empty_lists"])
def test_forged_lines_from_the_sandbox_cannot_stall_or_bloat_the_trainer(tmp_root, kind, monkeypatch):
    """A program writes a forged ``values`` line (32,000 ints sharing one hash; 1.1 MB of empty lists) to every
    descriptor it can reach, then exits. Before: decoded in the trainer (colliding: ``with_timeout(5 s)`` raised
    after 17.0 s, another thread of ours stalled 16.8 s; empty lists: our Python memory peaked at 37 MB). Checked
    by construction, not by the clock: nothing this process decodes during the call is anywhere near the forged
    line's size (only the short status lines, under 500 characters here)."""
    reward = CodeTestsReward(timeout_s=UNHURRIED, tmp_root=str(tmp_root), max_output_bytes=2 << 20)
    reward._check_once()  # the sandbox probe is not part of what is measured
    decoded: list[int] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: decoded.append(len(text)) or loads(text, *a, **k))
    cost = trainer_side_cost(reward, [fenced(FORGE.format(kind=kind))], ["assert f(1) == 2"], deadline_s=UNHURRIED)
    assert cost["rewards"] == [0.0]
    assert decoded and max(decoded) < 64 * 1024, (sorted(decoded)[-5:], cost)
    assert cost["peak_mb"] < 16, cost


def _guard_off(tmp_root, **kwargs):
    return Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False, **kwargs)


SYSTEM_V = (  # what it makes it removes again (in minimal mode they would outlive the run on the host)
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nmade = []\nq = libc.msgget(0, 0o1600)\n"
    "if q >= 0:\n    made.append('msgget')\n    libc.msgctl(q, 0, None)\n"
    "s = libc.semget(0, 1, 0o1600)\nif s >= 0:\n    made.append('semget')\n    libc.semctl(s, 0, 0)\n"
    "m = libc.shmget(0, 4096, 0o1600)\nif m >= 0:\n    made.append('shmget')\n    libc.shmctl(m, 0, None)\n"
    "libc.mq_open.restype = ctypes.c_int\n"
    "if libc.mq_open(b'/grpo_q', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0:\n    made.append('mq_open')\n"
    "    libc.mq_unlink(b'/grpo_q')\nprint('MADE', made)\n"
)


@pytest.mark.parametrize("layer", ["all", "syscall filter only", "ipc namespace only"])
def test_system_v_and_posix_message_queues_are_refused(tmp_root, full_isolation, layer):
    """Before: ``msgget``, ``semget`` and ``mq_open`` succeeded (System V queues held ~500 MB of kernel memory)."""
    if layer != "ipc namespace only":
        needs_syscall_filter(full_isolation)
    if layer != "syscall filter only":
        needs(full_isolation, namespaces=("ipc",))
    sandbox = _guard_off(
        tmp_root,
        syscall_filter=layer != "ipc namespace only",
        isolation="minimal" if layer == "syscall filter only" else "auto",
        outer_sandbox=True,
    )
    result = run_bounded(sandbox, SYSTEM_V)
    assert result.stdout == "MADE []\n", result.stdout + result.stderr
    assert result.isolation["ipc_limits"] is (layer != "syscall filter only")  # the layer under test was on


def test_control_without_the_syscall_filter_or_namespaces_message_queues_are_made(tmp_root):
    sandbox = _guard_off(tmp_root, syscall_filter=False, isolation="minimal", outer_sandbox=True)
    result = run_bounded(sandbox, SYSTEM_V)
    assert "'msgget'" in result.stdout and "'semget'" in result.stdout, result.stdout + result.stderr


UNIX_SOCKETS = (
    "import socket\nmade = []\nfor kind in ('socketpair', 'unix_socket'):\n    try:\n"
    "        socket.socketpair() if kind == 'socketpair' else socket.socket(socket.AF_UNIX)\n"
    "        made.append(kind)\n    except OSError:\n        pass\nprint('MADE', made)\n"
)


def test_unix_socket_pairs_are_refused(tmp_root, full_isolation):
    """Before: allowed (socket-pair buffers across 8 processes held 448 MB of kernel memory)."""
    needs_syscall_filter(full_isolation)
    result = run_bounded(_guard_off(tmp_root), UNIX_SOCKETS)
    assert result.stdout == "MADE []\n", result.stdout + result.stderr


PIPES = (  # 8 processes, each opening pipes until its descriptors run out and filling each, at 1 MB where allowed
    "import fcntl, os, time\ndef fill():\n    held = 0\n    while True:\n        try:\n            r, w = os.pipe()\n"
    "        except OSError:\n            return held\n        try:\n            fcntl.fcntl(w, 1031, 1 << 20)\n"
    "        except OSError:\n            pass\n        os.set_blocking(w, False)\n        while True:\n"
    "            try:\n                held += os.write(w, b'x' * 65536)\n            except BlockingIOError:\n"
    "                break\nreport_r, report_w = os.pipe()\nchildren = 0\nfor _ in range(7):\n    try:\n"
    "        if os.fork() == 0:\n            os.write(report_w, b'%d\\n' % fill())\n            time.sleep(30)\n"
    "            os._exit(0)\n        children += 1\n    except OSError:\n        break\nheld = fill()\n"
    "time.sleep(1.0)\nheld += sum(int(x) for x in os.read(report_r, 65536).split())\n"
    "print(children, held >> 20)\n"
)


def test_pipe_buffers_are_bounded_by_the_runs_own_uid(tmp_root, full_isolation):
    """Pipes are the kernel memory a run can still hold (socket pairs and message queues are refused): with a fresh
    uid per run the kernel's per-user pipe limit (``pipe-user-pages-soft``) bounds them, whatever the run forks."""
    needs(full_isolation, namespaces=("pid",), uid=True)
    soft_pages = int(Path("/proc/sys/fs/pipe-user-pages-soft").read_text())
    if soft_pages == 0:
        pytest.skip("this kernel sets no per-user pipe limit")
    result = run_bounded(Sandbox(timeout_s=10, tmp_root=str(tmp_root), python_guard=False), PIPES)
    children, held_mb = map(int, result.stdout.split())
    assert children == 7  # 8 processes filled pipes
    # The soft limit, then 2 pages for each further pipe (at most 8 processes x 256 descriptors).
    assert 16 < held_mb <= soft_pages * 4096 / 2**20 + 8 * 128 * 8192 / 2**20, result.stdout


@contextmanager
def host_directory():
    """A world-readable directory on the host outside /tmp (where a service's socket or a dataset could be)."""
    import shutil

    root = Path("/var/tmp") if os.path.isdir("/var/tmp") else Path.home()
    path = root / f"grpo_host_{uuid.uuid4().hex}"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def host_dir():
    with host_directory() as path:
        yield path


REACH_HOST = (
    "import os, socket\nout = []\ntry:\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({sock!r})\n"
    "    s.sendall(b'leak')\n    out.append('SOCKET')\nexcept OSError as e:\n    out.append('socket: ' + type(e).__name__)\n"
    "try:\n    fd = os.open({fifo!r}, os.O_WRONLY | os.O_NONBLOCK)\n    os.write(fd, b'leak')\n    out.append('FIFO')\n"
    "except OSError as e:\n    out.append('fifo: ' + type(e).__name__)\nprint(out)\n"
)


def reach_host(sandbox, host_dir):
    """Run REACH_HOST against a 0666 socket and FIFO of ours in ``host_dir``: (result, socket reached, FIFO
    reached)."""
    sock_path, fifo_path = str(host_dir / "service.sock"), str(host_dir / "pipe.fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    os.chmod(sock_path, 0o666)
    server.listen(5)
    server.setblocking(False)
    os.mkfifo(fifo_path, 0o666)
    os.chmod(fifo_path, 0o666)
    fifo = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        result = run_bounded(sandbox, REACH_HOST.format(sock=sock_path, fifo=fifo_path))
        socket_reached = _accepted(server)
        try:
            fifo_reached = os.read(fifo, 100) == b"leak"
        except BlockingIOError:
            fifo_reached = False
    finally:
        server.close()
        os.close(fifo)
    return result, socket_reached, fifo_reached


def test_host_unix_sockets_and_fifos_are_out_of_reach(tmp_root, full_isolation, host_dir):
    """Python guard off (it is a tripwire). Before: a 0666 socket and a 0666 FIFO outside /tmp received data."""
    needs(full_isolation, namespaces=("mnt",))
    result, socket_reached, fifo_reached = reach_host(_guard_off(tmp_root), host_dir)
    assert not socket_reached and not fifo_reached, result.stdout + result.stderr
    assert "socket: " in result.stdout and "fifo: FileNotFoundError" in result.stdout, result.stdout


def test_control_without_any_layer_host_sockets_and_fifos_are_reached(tmp_root, host_dir):
    sandbox = _guard_off(tmp_root, isolation="minimal", outer_sandbox=True, syscall_filter=False)
    result, socket_reached, fifo_reached = reach_host(sandbox, host_dir)
    assert socket_reached and fifo_reached, result.stdout + result.stderr


READ_HOST = (
    "out = []\nfor path in {paths!r}:\n    try:\n        out.append(('READ', len(open(path, 'rb').read())))\n"
    "    except OSError as e:\n        out.append(type(e).__name__)\nprint(out)\n"
)


def test_without_the_private_root_the_host_tree_is_read_only_and_said_so(tmp_root, full_isolation, monkeypatch):
    """Where the private view cannot be built (here: an impossible pty limit makes its devpts mount fail), the run
    falls back to the host's tree read-only with a private /tmp, and the report and the warning say so."""
    needs(full_isolation, namespaces=("mnt",))
    import grpo_family.rewards.code as code

    monkeypatch.setattr(code, "_MAX_PTYS", -1)
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False)  # the OS layers alone
    paths = [p for p in _outside_paths() if os.path.isdir(os.path.dirname(p))]
    result = run_bounded(sandbox, WRITE.format(paths=paths))
    report = result.isolation
    assert report["private_root"] is False and report["readonly_root"] is True and report["private_tmp"] is True
    assert any(note.startswith("no private root") for note in report["notes"]), report["notes"]
    assert any("private filesystem view" in m and "read-only" in m for m in code.missing_layers(report, sandbox))
    assert result.stdout.rstrip().endswith("fine") and [p for p in paths if os.path.exists(p)] == []


def read_host(sandbox, host_dir):
    """Run READ_HOST on this file (the checkout) and a world-readable dataset file in ``host_dir``."""
    dataset = host_dir / "tests.jsonl"
    dataset.write_text('{"test_cases": "assert f(1) == 2"}\n')
    os.chmod(dataset, 0o644)
    return run_bounded(sandbox, READ_HOST.format(paths=[str(Path(__file__).resolve()), str(dataset)]))


def test_the_checkout_and_datasets_are_not_readable(tmp_root, full_isolation, host_dir):
    """Every layer on. Before: this test file (the checkout) and a world-readable dataset file were read."""
    needs(full_isolation, namespaces=("mnt",))
    result = read_host(Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root)), host_dir)
    assert result.stdout == "['FileNotFoundError', 'FileNotFoundError']\n", result.stdout + result.stderr
    control = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), isolation="minimal", outer_sandbox=True)
    assert read_host(control, host_dir).stdout.count("READ") == 2


@pytest.mark.parametrize("case", list(PLAIN_PYTHON_PASSES))
def test_comparisons_equal_plain_pythons(tmp_root, case):
    """Before: 0.0 (Counter, bytearray: not plain values; 4,300+ digits: not encodable) or 0.5 (the in-place
    sort's later assert judged on a fresh list)."""
    program, test = PLAIN_PYTHON_PASSES[case]
    namespace: dict = {}
    exec(program + test, namespace)  # plain Python passes it
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert ROUTES[case].rewards(reward) == [1.0]


def test_program_objects_are_used_as_plain_python_would_but_never_compare_themselves(tmp_root):
    """Generators, closures and instances work through the program (iteration, calls, attributes); the program's
    own ``__eq__`` is never asked: an object of the program's equals only itself."""
    program = (
        "class Always:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def squares(n):\n    return (i * i for i in range(n))\n"
        "def adder(k):\n    return lambda x: x + k\n"
        "class Stack:\n    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n        return self\n"
        "def always():\n    return Always()\n"
    )
    tests = [
        "assert list(squares(4)) == [0, 1, 4, 9]",
        "assert 4 in squares(3) and len(list(squares(5))) == 5",
        "assert adder(2)(3) == 5",
        "assert Stack().push(1).push(2).items == [1, 2]",
        "assert always() == 1",  # fails: the program's __eq__ is never asked
        "assert always() != always()",  # two objects, neither equal to the other
    ]
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert reward([fenced(program)], test_cases=[tests]) == [pytest.approx(5 / 6)]


# Aimed at the sandbox's own processes only (the program's parent and its other children: the judge), never at the
# rest of the machine: in minimal mode as root the program could reach every process here.
TAMPER = (
    "import json, os, signal\nverdict = (json.dumps({'passed': True, 'calls': 1, 'note': ''}) + '\\n').encode()\n"
    "reached = []\nfor fd in range(3, 256):\n    try:\n        os.write(fd, verdict)\n        reached.append(fd)\n"
    "    except OSError:\n        pass\nparent, siblings = os.getppid(), []\nfor pid in os.listdir('/proc'):\n"
    "    try:\n        with open(f'/proc/{pid}/stat') as stat:\n"
    "            if int(stat.read().rsplit(')', 1)[1].split()[1]) == parent and int(pid) != os.getpid():\n"
    "                siblings.append(int(pid))\n    except (OSError, ValueError):\n        pass\n"
    "for pid in siblings + [parent]:\n"
    "    for path in [f'/proc/{pid}/mem'] + [f'/proc/{pid}/fd/{n}' for n in range(3, 16)]:\n        try:\n"
    "            fd = os.open(path, os.O_WRONLY)\n            os.write(fd, verdict)\n            reached.append(path)\n"
    "        except OSError:\n            pass\nfor pid in siblings:\n    try:\n        os.kill(pid, signal.SIGSTOP)\n"
    "        reached.append(f'stopped {pid}')\n    except OSError:\n        pass\n"
    "print(len(siblings), reached, flush=True)\ndef f(x):\n    return -1\n"
)


def test_the_program_cannot_forge_the_judges_verdict(tmp_root, full_isolation):
    """Guard off. The program writes a passing verdict to every descriptor it holds and to the memory and
    descriptors of the sandbox's other processes, and tries to stop the judge: the judge runs under another uid and
    is not dumpable, so none of it lands. (Where no uid can be dropped, a root program reaches the judge: see
    docs/code_sandbox.md.)"""
    needs(full_isolation, namespaces=("pid",), uid=True)
    result = run_bounded(_guard_off(tmp_root), TAMPER, test="assert f(1) == 2\n")
    assert result.stdout.startswith("1 "), result.stdout + result.stderr  # it found the judge
    assert result.verdict is False and result.judge["calls"] == 1  # the judge ran the test, untouched
    reached = result.stdout.strip()
    assert "mem" not in reached and "stopped" not in reached and "/fd/" not in reached, reached


# ----------------------------------------------------------------------------------------------- issue 42: routes
# Each test below failed on the code before issue 42 (the outcome it had is in its docstring or the commit that
# added it).

_OLD_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


def _old_extract_code(text: str) -> str:
    """extract_code as the regex before issue 42 defined it (quadratic on hostile text; fine on small texts)."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _OLD_FENCE.finditer(text)]
    for wanted in (lambda label: label in {"python", "py", "python3"}, lambda label: label == ""):
        chosen = [body for label, body in blocks if wanted(label)]
        if chosen:
            return chosen[-1]
    return text


@given(st.lists(st.sampled_from(["```", "```python", "```py x", "````", " ```\t", "```bash", "x = 1", "", "  ``` ",
                                 "```\r", "\t```python3 -c", "```+-_"]), max_size=12),
       st.booleans())  # fmt: skip
@settings(max_examples=400, deadline=None)
def test_the_line_scanner_extracts_what_the_old_pattern_did(lines, final_newline):
    text = "\n".join(lines) + ("\n" if final_newline else "")
    assert extract_code(text) == _old_extract_code(text)


def _best_of(function, argument, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(argument)
        times.append(time.perf_counter() - start)
    return min(times)


def test_fence_extraction_of_a_hostile_megabyte_costs_what_a_plain_one_does():
    """An unclosed fence with a long label held the trainer 8-15 s at 48 KB (quadratic backtracking of the old
    ``_FENCE``; 1 MB would take hours: killed after 60 s). Every hostile shape of 1 MB costs at most a generous
    multiple of a plain 1 MB completion (prose with closed code blocks), timed in the same run."""
    size = 1 << 20
    paragraph = "The loop adds each number to the total, then prints it.\n" * 8
    block = "```python\nimport sys\nprint(sum(map(int, sys.stdin.read().split())))\n```\n"
    plain = ((paragraph + block) * (size // len(paragraph + block) + 1))[:size]
    hostile = {
        "unclosed fence, long label": "```" + "a" * (size - 3),
        "unclosed fence, long label and spaces": "```py" + "a" * (size // 2) + " " * (size // 2 - 5),
        "unclosed fence, long body": "```python\n" + "x = 1\n" * ((size - 10) // 6),
        "fence lines that never close": "```py\n" * (size // 6),
        "a block every two lines": "```\n" * (size // 4),
        "spaces before a fence, no fence": (" " * 4095 + "\n") * (size // 4096),
    }
    baseline = _best_of(extract_code, plain)
    for name, text in hostile.items():
        assert abs(len(text) - size) < 4096, name
        elapsed = _best_of(extract_code, text)
        assert elapsed <= 50 * baseline, (name, elapsed, baseline)


def test_the_program_that_runs_is_the_text_the_trainer_read(tmp_root):
    """A ``# coding: utf-7`` cookie: the trainer reads a comment, the child used to compile the file's bytes with
    the cookie, where ``+AAo-`` is a newline, and ran ``print(3)``: 1.0 for a program that, as read, does
    nothing. Both sides now compile the same decoded text (the cookie ignored on both)."""
    program = "# coding: utf-7\n#+AAo-print(3)\n"
    exec(compile(program, "as_read", "exec"), {})  # as read: a comment, nothing printed (pytest captures nothing)
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root))
    assert reward([fenced(program)], test_cases=[[{"input": "", "output": "3\n"}]]) == [0.0]


def _installed_package_dirs() -> list[str]:
    """Directories of third-party packages of this interpreter and its base installation, as they are here."""
    import sysconfig

    dirs = set()
    for base in (sys.prefix, sys.base_prefix):
        paths = sysconfig.get_paths(vars={"base": base, "platbase": base})
        dirs.update(os.path.realpath(paths[key]) for key in ("purelib", "platlib"))
    return sorted(d for d in dirs if os.path.isdir(d) and os.listdir(d))


def test_only_the_standard_library_is_readable_inside(tmp_root, full_isolation):
    """The base interpreter's ``site-packages`` lies inside its standard library directory, which the private view
    binds: every package installed there (pytest, hypothesis, IPython here) was readable and importable by path
    from inside. Now an empty directory."""
    needs(full_isolation, namespaces=("mnt",))
    dirs = _installed_package_dirs()
    assert dirs, "no third-party package directory here: nothing to hide"
    probe = f"import os\nfor d in {dirs!r}:\n    try:\n        print(d, len(os.listdir(d)))\n    except OSError:\n        print(d, 0)\n"
    result = run_bounded(_guard_off(tmp_root), probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [x for d in dirs for x in (d, "0")], result.stdout


# Listed packages (issue 42, item 5): ``packages=("numpy",)`` exposes what numpy installed in site-packages, to the
# program only, in each view a run can get. ``packaging`` is the unlisted control: pure Python, installed wherever
# pytest is (a dependency of it), and not needed by numpy.
NUMPY_SUM = "import numpy as np\nprint(int(np.arange(4).sum()))\n"
VIEWS = ("private view", "shared view", "minimal")


def _in_view(view: str, full_isolation: dict, monkeypatch) -> dict:
    """The Sandbox settings that put a run in ``view`` (skipping where this machine cannot): the private view,
    the shared-view fallback (an impossible pty limit makes the private view's devpts mount fail, as in
    ``test_without_the_private_root_the_host_tree_is_read_only_and_said_so``), or no mounts at all (``minimal``:
    a directory of symlinks)."""
    pytest.importorskip("numpy")
    if view == "minimal":
        return {"isolation": "minimal", "outer_sandbox": True}
    needs(full_isolation, namespaces=("mnt",))
    if view == "shared view":
        import grpo_family.rewards.code as code

        monkeypatch.setattr(code, "_MAX_PTYS", -1)
    return {}


@pytest.mark.parametrize("view", VIEWS)
def test_a_package_is_importable_only_when_listed(tmp_root, full_isolation, monkeypatch, view):
    """Before: only the standard library was importable whatever the reward's config said (there was no
    ``packages``); a program using numpy scored 0. Now it scores 1 when numpy is listed, and still 0 when not."""
    settings = _in_view(view, full_isolation, monkeypatch)
    unlisted = run_bounded(Sandbox(timeout_s=UNHURRIED, tmp_root=str(tmp_root), **settings), NUMPY_SUM)
    assert "ModuleNotFoundError: No module named 'numpy'" in unlisted.stderr, unlisted.stderr
    completions, tests = [fenced(NUMPY_SUM)], [[{"input": "", "output": "6\n"}]]
    assert CodeTestsReward(timeout_s=UNHURRIED, tmp_root=str(tmp_root), **settings)(completions, tests) == [0.0]
    listed = CodeTestsReward(timeout_s=UNHURRIED, tmp_root=str(tmp_root), packages=("numpy",), **settings)
    assert listed(completions, tests) == [1.0]


UNLISTED = (
    "import os, sys\ntry:\n    import packaging\n    print('IMPORTED packaging')\nexcept ImportError as e:\n"
    "    print(type(e).__name__)\nprint(sorted(os.listdir(sys.path[-1])))\nfor d in {dirs!r}:\n    try:\n"
    "        print(d, len(os.listdir(d)))\n    except OSError:\n        print(d, 0)\n"
)


@pytest.mark.parametrize("view", VIEWS)
def test_only_what_a_listed_package_installed_is_exposed(tmp_root, full_isolation, monkeypatch, view):
    """With numpy listed, the program's extra ``sys.path`` entry holds numpy's own top-level paths and nothing
    else: ``packaging``, installed beside it, still cannot be imported, and in the private view the site-packages
    directories themselves stay empty or absent. (Exposing numpy's whole site-packages directory instead, bound or
    on ``sys.path``, imports ``packaging`` and lists every installed package.)"""
    settings = _in_view(view, full_isolation, monkeypatch)
    assert importlib.util.find_spec("packaging") is not None  # the control is installed here
    sandbox = Sandbox(timeout_s=UNHURRIED, tmp_root=str(tmp_root), packages=("numpy",), **settings)
    names = sorted(os.path.basename(p) for p in sandbox.package_paths)
    assert "numpy" in names and all(n.startswith("numpy") for n in names), names  # numpy, numpy.libs, its dist-info
    dirs = _installed_package_dirs() if view == "private view" else []  # the host tree is readable in the others
    result = run_bounded(sandbox, UNLISTED.format(dirs=dirs))
    assert result.isolation["private_root"] is (view == "private view"), result.isolation["notes"]
    lines = result.stdout.splitlines()
    assert lines[:2] == ["ModuleNotFoundError", repr(names)], (result.timed_out, result.stdout + result.stderr)
    assert lines[2:] == [f"{d} 0" for d in dirs], result.stdout


def test_a_listed_native_package_starts_no_thread_pool(tmp_root):
    """numpy's OpenBLAS starts a thread per core when numpy is imported. With more cores than ``max_processes``
    (here 1 process: no thread at all) RLIMIT_NPROC refused them and the import died (OpenBLAS's
    ``pthread_create failed``, then a KeyboardInterrupt). Listed packages now run with one BLAS / OpenMP thread."""
    pytest.importorskip("numpy")
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), packages=("numpy",), max_processes=1)
    result = run_bounded(sandbox, NUMPY_SUM)
    assert result.stdout == "6\n", result.stderr


def test_the_judge_keeps_the_standard_library(tmp_root):
    """Listed packages are the program's: its functions may use numpy under an assert test, but the judge, which
    decides the verdict, does not get them (a test that imports numpy fails whatever the program does)."""
    pytest.importorskip("numpy")
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root), packages=("numpy",))
    program = fenced("import numpy as np\ndef f(n):\n    return int(np.arange(n).sum())\n")
    assert reward([program], test_cases=["assert f(4) == 6"]) == [1.0]
    assert reward([program], test_cases=["import numpy\nassert f(4) == 6"]) == [0.0]


@pytest.mark.parametrize("name", ["grpo-no-such-package", "numpy/../packaging", "../numpy", "", "numpy "])
def test_a_package_that_cannot_be_listed_is_refused_at_construction(name):
    """Before any run (any training): a name not installed in the sandbox's interpreter names itself and the fix;
    a name that is no package name (a path, a space) is refused as such."""
    with pytest.raises(ValueError) as refused:
        CodeTestsReward(packages=(name,))
    message = str(refused.value)
    if name == "grpo-no-such-package":
        assert repr(name) in message and "install it, or remove it from packages" in message, message
    else:
        assert f"{name!r} is not a package name" in message, message


def test_packages_are_resolved_in_the_sandboxs_interpreter(tmp_root):
    """Another ``python`` is asked itself (here this interpreter, spelled differently, so that it is run): the same
    paths as this process finds, the same refusal with the fix; the reward stays picklable with them."""
    pytest.importorskip("numpy")
    here = Sandbox(packages=("numpy",)).package_paths
    other = os.path.join(os.path.dirname(sys.executable), ".", os.path.basename(sys.executable))
    assert Sandbox(packages=("numpy",), python=other).package_paths == here
    with pytest.raises(ValueError, match="install it, or remove it from packages"):
        Sandbox(packages=("grpo-no-such-package",), python=other)
    reward = pickle.loads(pickle.dumps(CodeTestsReward(packages=("numpy",), tmp_root=str(tmp_root))))
    assert reward.sandbox.packages == ("numpy",) and reward.sandbox.package_paths == here


# Siblings of one prompt: HOLDER solves the task and leaves a mark in state every run shares (the interpreter's
# read-only files, bound into every run); PROBE cannot solve it and prints the answer only when it sees the mark.
SIBLING_CHANNELS = {
    "flock": (
        "import fcntl, os, sys, time\nf = open(os.__file__, 'rb')\nfcntl.flock(f, fcntl.LOCK_SH)\n",
        "import fcntl, os, sys\nf = open(os.__file__, 'rb')\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "    return_mark = False\nexcept BlockingIOError:\n    return_mark = True\nexcept OSError:\n"
        "    return_mark = False\n",
    ),
    "ofd_getlk": (
        "import fcntl, os, struct, sys\nf = open(os.__file__, 'rb')\n"
        "fcntl.fcntl(f, fcntl.F_OFD_SETLK, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 1, 0))\n",
        "import fcntl, os, struct, sys\nf = open(os.__file__, 'rb')\ntry:\n"
        "    got = fcntl.fcntl(f, fcntl.F_OFD_GETLK, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 1, 0))\n"
        "    return_mark = struct.unpack('hhqqi4x', got)[0] != fcntl.F_UNLCK\nexcept OSError:\n"
        "    return_mark = False\n",
    ),
    "page_cache": (
        "import os\npath = os.path.dirname(os.__file__) + '/antigravity.py'\n"
        "fd = os.open(path, os.O_RDONLY)\nimport time\nend = time.monotonic() + 2.5\nwhile time.monotonic() < end:\n"
        "    os.pread(fd, 4096, 0)\n    time.sleep(0.01)\n",
        "import os, time\npath = os.path.dirname(os.__file__) + '/antigravity.py'\nfd = os.open(path, os.O_RDONLY)\n"
        "return_mark = False\nend = time.monotonic() + 2.0\nwhile time.monotonic() < end and not return_mark:\n"
        "    try:\n        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n        time.sleep(0.05)\n"
        "        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)\n        return_mark = True\n"
        "    except OSError:\n        time.sleep(0.01)\n",
    ),
}
_HOLD = "import time\ntime.sleep(2.5)\nprint(3)\n"  # the holder's answer, after holding the mark


def _holder(program: str) -> str:
    """The holder: leaves its mark where it can (a refused call does not stop it), then solves."""
    body = "".join("    " + line + "\n" for line in program.splitlines())
    return f"try:\n{body}except OSError:\n    pass\n{_HOLD}"


_PROBE_FOR_A_WHILE = (
    "import time\nstart = time.monotonic()\nwhile True:\n{probe}    if return_mark or time.monotonic() - start > 2:\n"
    "        break\n    time.sleep(0.05)\nprint(3 if return_mark else 0)\n"
)


@pytest.mark.parametrize("channel", sorted(SIBLING_CHANNELS))
def test_siblings_of_one_prompt_cannot_signal_each_other(tmp_root, channel):
    """Before: the prober scored 1.0 beside a sibling that solved the task (flock, OFD locks, the page cache of an
    interpreter file: issue 42), because siblings ran at the same time and the filter allowed these calls. Now
    siblings run one after the other, and the filter refuses these calls (either closes the channel)."""
    holder, probe = SIBLING_CHANNELS[channel]
    probe_body = "".join("    " + line + "\n" for line in probe.splitlines())
    prober = _PROBE_FOR_A_WHILE.format(probe=probe_body)
    reward = CodeTestsReward(timeout_s=6.0, tmp_root=str(tmp_root), max_workers=2, python_guard=False)
    tests = [[{"input": "", "output": "3\n"}]] * 2
    prompt = [{"role": "user", "content": "Print 3."}]
    rewards = reward([fenced(_holder(holder)), fenced(prober)], test_cases=tests, prompts=[prompt, prompt])
    assert rewards == [1.0, 0.0], rewards


@pytest.mark.parametrize("channel", sorted(SIBLING_CHANNELS))
def test_control_without_the_filter_the_channel_works_between_prompts(tmp_root, channel):
    """The same pair as two different prompts' completions (which run at the same time), without the syscall
    filter: the prober sees the holder, so the test above is not passing because the channel does not exist."""
    holder, probe = SIBLING_CHANNELS[channel]
    prober = _PROBE_FOR_A_WHILE.format(probe="".join("    " + line + "\n" for line in probe.splitlines()))
    reward = CodeTestsReward(
        timeout_s=6.0, tmp_root=str(tmp_root), max_workers=2, python_guard=False, syscall_filter=False
    )
    prompts = [[{"role": "user", "content": "Print 3."}], [{"role": "user", "content": "Print 3 too."}]]
    rewards = reward([fenced(_holder(holder)), fenced(prober)], test_cases=[[{"input": "", "output": "3\n"}]] * 2,
                     prompts=prompts)  # fmt: skip
    assert rewards == [1.0, 1.0], rewards


def test_runs_of_one_prompt_never_overlap_and_other_prompts_run_beside_them(tmp_root, monkeypatch):
    """The schedule: every run of one prompt's completions after the previous one ended; runs of different prompts
    at the same time (max_workers of them). Before: every run of the batch in one pool, siblings at once."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root), max_workers=4)
    reward._checked = True
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def fake_run(program, stdin="", **kwargs):
        start = time.monotonic()
        time.sleep(0.05)
        with lock:
            spans.append((program.split("#")[1], start, time.monotonic()))
        from grpo_family.rewards.code import RunResult

        return RunResult(returncode=0, output_matches=kwargs.get("expected") == "3\n")

    monkeypatch.setattr(reward.sandbox, "run", fake_run)
    prompts = [[{"role": "user", "content": f"prompt {k}"}] for k in (0, 1, 0, 1, 0, 1, 0, 1)]
    completions = [fenced(f"print(3)  #{k}#\n") for k in (0, 1, 0, 1, 0, 1, 0, 1)]
    tests = [[{"input": "", "output": "3\n"}] * 2] * 8
    assert reward(completions, test_cases=tests, prompts=prompts) == [1.0] * 8
    assert len(spans) == 16

    def overlap(a, b):
        return a[1] < b[2] and b[1] < a[2]

    same = [(a, b) for a in spans for b in spans if a is not b and a[0] == b[0] and overlap(a, b)]
    across = [(a, b) for a in spans for b in spans if a[0] != b[0] and overlap(a, b)]
    assert same == [], same[:3]
    assert across, "runs of different prompts never ran at the same time"


def test_the_trainer_keeps_booleans_not_output(tmp_root):
    """32 runs (8 prompts' programs x 4 cases) each printing 1 MiB of invalid UTF-8: the runs' output was decoded
    and kept until the batch was scored (~2 MB per run: a 66 MB peak of our Python memory here before issue 42). Now
    each run's stdout is compared where it is collected and dropped: the peak is bounded by the runs in flight
    (2 workers x a few copies of 1 MiB), whatever the batch size."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root), max_workers=2)
    reward._check_once()
    printer = fenced("import sys\nsys.stdout.buffer.write(b'\\xff' * (1 << 20))\n")
    test_cases = [[{"input": str(c), "output": f"{k}\n"} for c in range(4)] for k in range(8)]
    cost = trainer_side_cost(reward, [printer] * 8, test_cases, deadline_s=120.0)
    assert cost["rewards"] == [0.0] * 8, cost
    assert cost["peak_mb"] < 2 * 8 * (reward.sandbox.max_output_bytes / 2**20), cost


_SYSCALL = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nNR = {nr}[os.uname().machine]\n"
# What the allow-list filter refuses that the deny-list before issue 42 allowed (each printed ESCAPED then).
FILTER_ROUTES = {
    "flock": "import fcntl, os, sys\nf = open(os.__file__, 'rb')\nfcntl.flock(f, fcntl.LOCK_SH)\nprint('ESCAPED')\n",
    "ofd_getlk": (
        "import fcntl, os, struct, sys\nf = open(os.__file__, 'rb')\n"
        "fcntl.fcntl(f, fcntl.F_OFD_GETLK, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 1, 0))\nprint('ESCAPED')\n"
    ),
    # a lock per byte of a file: kernel memory no rlimit counts (130-270 MB seen with 1-byte mappings)
    "byte_range_locks": (
        "import fcntl, os\nfd = os.open('locks', os.O_RDWR | os.O_CREAT)\nos.ftruncate(fd, 4096)\nheld = 0\n"
        "for i in range(0, 4096, 2):\n    try:\n        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, i)\n"
        "        held += 1\n    except OSError:\n        pass\nif held:\n    print('ESCAPED', held)\n"
    ),
    "fadvise_dontneed": (
        "import os, sys\nfd = os.open(os.__file__, os.O_RDONLY)\n"
        "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\nprint('ESCAPED')\n"
    ),
    "preadv2_nowait": (
        "import os, sys\nfd = os.open(os.__file__, os.O_RDONLY)\n"
        "os.preadv(fd, [bytearray(16)], 0, os.RWF_NOWAIT)\nprint('ESCAPED')\n"
    ),
    "readahead": _SYSCALL.format(nr="{'x86_64': 187, 'aarch64': 213}")
    + "import sys\nfd = os.open(os.__file__, os.O_RDONLY)\nif libc.syscall(NR, fd, 0, 4096) == 0:\n"
    "    print('ESCAPED')\n",
    "mincore": (
        "import ctypes, mmap\nlibc = ctypes.CDLL(None, use_errno=True)\nm = mmap.mmap(-1, 4096)\n"
        "address = ctypes.addressof(ctypes.c_char.from_buffer(m))\nvec = ctypes.create_string_buffer(1)\n"
        "if libc.mincore(ctypes.c_void_p(address), 4096, vec) == 0:\n    print('ESCAPED')\n"
    ),
    # the system-wide AIO quota (fs.aio-max-nr) taken whole: another process's io_setup fails meanwhile
    "io_setup": _SYSCALL.format(nr="{'x86_64': 206, 'aarch64': 0}")
    + "ctx = ctypes.c_ulong(0)\nif libc.syscall(NR, 4096, ctypes.byref(ctx)) == 0:\n    print('ESCAPED')\n",
    "setsid": (
        "import os\npid = os.fork()\nif pid == 0:\n    try:\n        os.setsid()\n        print('ESCAPED', flush=True)\n"
        "    finally:\n        os._exit(0)\nos.waitpid(pid, 0)\n"
    ),
    "setpgid": "import os\nos.setpgid(0, 0)\nprint('ESCAPED')\n",
    "madvise_willneed": (
        "import mmap, os, sys\nf = open(os.__file__, 'rb')\nm = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)\n"
        "m.madvise(mmap.MADV_WILLNEED)\nprint('ESCAPED')\n"
    ),
}


@pytest.mark.parametrize("route", sorted(FILTER_ROUTES))
def test_the_allow_list_filter_refuses_what_a_test_program_does_not_need(tmp_root, full_isolation, route):
    """Guard off: the filter alone. Each of these worked under the deny-list filter before issue 42."""
    needs_syscall_filter(full_isolation)
    result = run_bounded(_guard_off(tmp_root), FILTER_ROUTES[route])
    assert result.isolation["syscall_filter"] is True
    assert "ESCAPED" not in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("route", sorted(FILTER_ROUTES))
def test_control_without_the_filter_each_route_works(tmp_root, route):
    result = run_bounded(_guard_off(tmp_root, syscall_filter=False), FILTER_ROUTES[route])
    assert "ESCAPED" in result.stdout, result.stdout + result.stderr


BUSY_SIBLING = (
    "import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n        try:\n            os.setsid()\n"
    "        except OSError:\n            pass\n        while True:\n            pass\nend = time.monotonic() + 20\n"
    "while time.monotonic() < end:\n    pass\n"
)


@pytest.mark.parametrize("same_prompt", [True, False])
def test_busy_setsid_processes_do_not_starve_an_honest_program(tmp_root, same_prompt):
    """Six busy processes, each setsid-ed into a scheduler group of its own, beside an honest program (issue 42
    saw it miss its deadline: 1.0 -> 0.0 with skip_after_timeout). Now siblings never overlap and setsid is refused
    (the busy processes share their run's one group). This end-to-end case did not reproduce the miss on the
    2-core machine it was written on (it passes on the code before too); the routes it needs fail there:
    ``...refuses_what_a_test_program_does_not_need[setsid]`` and ``test_runs_of_one_prompt_never_overlap...``."""
    reward = CodeTestsReward(timeout_s=TIMEOUT, tmp_root=str(tmp_root), max_workers=2, python_guard=False)
    prompts = [[{"role": "user", "content": "Add."}], [{"role": "user", "content": "Add." if same_prompt else "Sum."}]]
    rewards = reward([fenced(BUSY_SIBLING), fenced(ADD)], test_cases=[ADD_TESTS, ADD_TESTS], prompts=prompts)
    assert rewards == [0.0, 1.0], rewards


def test_the_deadline_is_on_the_runs_cpu_time_with_a_wall_cap(tmp_root):
    """Before issue 42 the deadline was wall-clock: a program that waits (or is starved by other runs on a busy
    machine) failed at ``timeout_s`` having used no CPU. Now the run's CPU time (all its processes) is charged
    against ``timeout_s`` and the wall clock only caps it (3 x ``timeout_s``); busy and blocked programs are both
    still stopped."""
    sandbox = Sandbox(timeout_s=1.0, tmp_root=str(tmp_root))
    waited = run_bounded(sandbox, "import time\ntime.sleep(1.5)\nprint('woke')\n")
    assert not waited.timed_out and waited.stdout == "woke\n", (waited.timed_out, waited.stdout, waited.stderr)
    assert run_bounded(sandbox, "import time\ntime.sleep(100)\n").timed_out
    busy = "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"
    assert run_bounded(Sandbox(timeout_s=1.0, tmp_root=str(tmp_root), python_guard=False), busy).timed_out
