"""The default suite's 2-process scenarios (CPU, gloo), run in one `accelerate launch`.

Start-up is most of a 2-process launch's cost (each process imports TRL, ~12 CPU-s, then joins the process group),
while a scenario trains for a few seconds. So a test declares its scenario with :func:`scenario` and takes the
``dist_output`` fixture: the first such test of a session launches ``tests/dist/suite.py`` once for the scenarios of
every selected test (``pytest -k`` selects fewer), and each test reads the folder its own scenario wrote::

    @scenario("gpg_grads", TINY_MODEL)  # tests/dist/gpg_grads.py's run(out, model_dir) on both ranks
    def test_...(dist_output): ...

A scenario that raised fails its test with its traceback; the others still run (the launch ends at an exception,
and a new launch runs the scenarios not started yet). Inputs built here and passed to the scenarios: TINY_MODEL
(conftest's ``tiny_model_dir``), WARM_START (the tiny model's warm start, default cache) and MEMORISING_MODEL
(tests/test_sgpo_trainer.py's, built once per session).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SCENARIO_TIMEOUT_S = 600  # a liveness guard per scenario (a hung collective), not a budget

TINY_MODEL, WARM_START, MEMORISING_MODEL = "<tiny_model_dir>", "<warm_start_dir>", "<memorising_model_dir>"


def scenario(module: str, *args, **kwargs):
    """Mark a test as a 2-process scenario: ``tests/dist/<module>.py``'s ``run(out, *args, **kwargs)`` on both ranks,
    with JSON-able arguments (TINY_MODEL etc. stand for the folders the suite builds)."""

    def mark(test):
        test.dist_scenario = {"module": module, "args": list(args), "kwargs": kwargs}
        return pytest.mark.multiprocess(test)

    return mark


def _spec(item) -> dict | None:
    return getattr(getattr(item, "function", None), "dist_scenario", None)


class DistSuite:
    """The session's scenario results, launched on first use: ``output(item)`` -> the folder its scenario wrote."""

    def __init__(self, request, root: Path):
        self.request, self.root = request, root
        self.inputs: dict[str, str] = {}
        self.results: dict[str, tuple[bool, Path | str]] = {}
        self.launches = 0

    def input(self, name: str) -> str:
        if name not in self.inputs:
            if name == TINY_MODEL:
                self.inputs[name] = self.request.getfixturevalue("tiny_model_dir")
            elif name == WARM_START:
                from grpo_family.tasks import load_warm_start, warm_start_dir

                load_warm_start()
                self.inputs[name] = str(warm_start_dir())
            elif name == MEMORISING_MODEL:
                from test_sgpo_trainer import build_memorising_model

                self.inputs[name] = build_memorising_model(self.root / "memorising-model")
            else:
                raise KeyError(name)
        return self.inputs[name]

    def resolve(self, value):
        return self.input(value) if value in (TINY_MODEL, WARM_START, MEMORISING_MODEL) else value

    def output(self, item) -> Path:
        if item.nodeid not in self.results:
            items = [i for i in item.session.items if _spec(i) and i.nodeid not in self.results]
            self.run(items if item in items else [item, *items])
        ok, result = self.results[item.nodeid]
        if not ok:
            pytest.fail(f"the 2-process scenario of this test failed:\n{result}", pytrace=False)
        return result

    def run(self, items) -> None:
        pending = {
            i.nodeid: {
                "module": _spec(i)["module"],
                "args": [self.resolve(a) for a in _spec(i)["args"]],
                "kwargs": {k: self.resolve(v) for k, v in _spec(i)["kwargs"].items()},
            }
            for i in items
        }
        while pending:
            self.launches += 1
            folder = self.root / f"launch{self.launches}"
            folder.mkdir()
            outs = {nodeid: folder / re.sub(r"[^\w.-]+", "-", nodeid) for nodeid in pending}
            spec = [{**pending[n], "out": str(outs[n])} for n in pending]
            (folder / "spec.json").write_text(json.dumps(spec, indent=1))
            log = self.launch(folder)
            started = False
            for nodeid, out in outs.items():
                errors = sorted(out.glob("error_rank*.txt"))
                if (out / "done").exists():
                    self.results[nodeid] = (True, out)
                elif errors:
                    tracebacks = "\n".join(f"{e.name}:\n{e.read_text()}" for e in errors)
                    self.results[nodeid] = (False, f"{tracebacks}\nlaunch output:\n{log[-3000:]}")
                elif any(out.glob("started_rank*")):
                    self.results[nodeid] = (False, f"the launch ended during this scenario:\n{log[-6000:]}")
                else:
                    continue
                started = True
                del pending[nodeid]
            if not started:  # the launch failed before any scenario: it would fail again
                for nodeid in pending:
                    self.results[nodeid] = (False, f"the 2-process launch failed before any scenario:\n{log[-6000:]}")
                pending = {}

    def launch(self, folder: Path) -> str:
        """One launch of tests/dist/suite.py on ``folder/spec.json``; its output. Killed when a scenario (or the
        start-up) runs longer than SCENARIO_TIMEOUT_S."""
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
            "--main_process_port", str(29500 + (os.getpid() + 3) % 1000),
            str(TESTS / "dist" / "suite.py"), str(folder / "spec.json"),
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        with open(folder / "launch.log", "w") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
            )
            try:
                last, seen = time.monotonic(), 0
                while proc.poll() is None:
                    time.sleep(1)
                    markers = len(list(folder.glob("*/started_rank*"))) + len(list(folder.glob("*/done")))
                    if markers != seen:
                        seen, last = markers, time.monotonic()
                    elif time.monotonic() - last > SCENARIO_TIMEOUT_S:
                        log.write(f"\nkilled: no scenario progress in {SCENARIO_TIMEOUT_S} s\n")
                        break
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        return (folder / "launch.log").read_text()


@pytest.fixture(scope="session")
def dist_suite(request, tmp_path_factory):
    return DistSuite(request, tmp_path_factory.mktemp("dist-suite"))


@pytest.fixture
def dist_output(request, dist_suite) -> Path:
    """The folder this test's 2-process scenario (:func:`scenario`) wrote."""
    return dist_suite.output(request.node)
