"""Code-execution reward: extraction, test-case formats, scoring, and the sandbox against hostile programs.

Every hostile-program test checks the outcome *and* that this process is unharmed: the run ends within a bound
set by its timeout, no process of the sandbox is left behind, our memory did not grow, and the run's directory
is gone. Tests that exercise one OS layer on its own (guard off) are skipped where this machine does not provide
that layer (not root, no CAP_SYS_ADMIN); the "control" tests run the same hostile programs with every layer off
and show that they do succeed then, so the protection tests are not passing by accident.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
import time
import uuid

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
    plan_assert_test,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the code sandbox is Linux-only")

TIMEOUT = 3.0  # generous: start-up on a loaded 2-core machine can take a few hundred ms

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
    assert [c.test_code for c in cases] == [
        "import math\nassert f(1) == 1\n",
        "import math\nx = 2\nassert f(x) == 4\n",
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


def _connect_attempt(sandbox):
    server = _listening_socket()
    try:
        result = run_bounded(sandbox, CONNECT.format(port=server.getsockname()[1]))
        time.sleep(0.2)
        try:
            server.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
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
        "assert f(1) == (1, [1], {1}, {'k': 1}, 0.5, b'x', None, False)",  # decided here
        "expected = (2, [2])\nassert f(2)[:2] == expected",  # decided by the judge
        "assert f(3)[7] is True",
        "assert sorted(f(4)[2]) == [4] and f(4)[4] > 1",
        "assert f(5)[0] == 6",  # fails
    ]
    assert reward([fenced(pairs)], test_cases=[tests]) == [pytest.approx(4 / 5)]
    # A value that is not a plain builtin (here a generator) fails its test; nothing of it reaches a comparison.
    assert reward([fenced("def f(x):\n    return (i for i in [x])\n")], test_cases=[["assert list(f(1)) == [1]"]]) == [
        0.0
    ]


def test_assert_tests_that_cannot_be_graded_outside_are_left_out():
    assert plan_assert_test("assert all(f(i) == i for i in range(3))") is None  # a comprehension's variable
    assert plan_assert_test("for i in range(3):\n    assert f(i) == i\n") is None  # an assert in a loop
    assert plan_assert_test("r = f(2)\nassert r == 4") is None  # setup calling into the program
    plan = plan_assert_test("import math\nx = 2\nexpected = 4\nassert f(x) == expected")
    assert plan.probes == ("f(x)",) and plan.program_setup == "x = 2" and "expected" in plan.judge_setup
    reward = CodeTestsReward(timeout_s=TIMEOUT)
    assert reward(["def f(x):\n    return x"], test_cases=[["assert all(f(i) == i for i in range(3))"]]) == [None]


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
    "system_v_shared_memory": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.shmget(0, 1 << 20, 0o1600) >= 0:\n    print('ESCAPED')\n"
    ),
    "exec_a_fresh_interpreter_without_the_audit_hook": "import os\nos.execv('/bin/echo', ['echo', 'ESCAPED'])\n",
    "ptrace": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.ptrace(0, 0, 0, 0) == 0:\n    print('ESCAPED')\n",
    "inet_socket_with_no_network_namespace": "import socket\nsocket.socket()\nprint('ESCAPED')\n",
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


@pytest.mark.parametrize("escape", ["memfd_create", "system_v_shared_memory", "ptrace"])
def test_control_without_the_syscall_filter_the_escape_works(tmp_root, escape):
    sandbox = Sandbox(timeout_s=TIMEOUT, tmp_root=str(tmp_root), python_guard=False, syscall_filter=False)
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
