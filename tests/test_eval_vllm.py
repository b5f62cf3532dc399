"""The held-out evaluation on a real colocated vLLM engine (the vllm lane: ``pytest -m vllm`` in the environment of
README's "vLLM on a CPU machine"; vLLM is not installed in the default environment, where this module is skipped).
tests/test_eval_engine.py checks the engine selection with a fake engine; this checks the real one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

from conftest import require_vllm_or_skip_module  # noqa: E402

require_vllm_or_skip_module()

from dist.eval_callback import HELD_OUT  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_held_out_evaluation_uses_the_colocated_engine(tmp_path):
    """A grpo run with colocated vLLM: every evaluation (before training, steps 1 and 2) generated with the run's
    engine after pushing that step's weights, and its generations were saved."""
    from grpo_family.integrations import vllm_cpu
    from grpo_family.tasks import load_warm_start, warm_start_dir

    load_warm_start()
    script = ROOT / "tests" / "dist" / "eval_callback.py"
    command = [sys.executable, str(script), str(warm_start_dir()), str(tmp_path), str(ROOT / "tests"), "vllm"]
    result = subprocess.run(command, cwd=ROOT, env=vllm_cpu.engine_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    run = json.loads((tmp_path / "rank0.json").read_text())
    assert run["backend"] == "vllm-colocate" and run["last_loaded_step"] == 2
    assert sorted(run["history"], key=int) == ["0", "1", "2"]
    for metrics in run["history"].values():
        assert 0 <= metrics["held_out_accuracy"] <= 1 and metrics["held_out_accuracy_stderr"] is not None
        assert metrics["held_out/pass@1"] <= metrics["held_out/pass@4"]
    for step in (0, 1, 2):
        lines = (tmp_path / "eval_generations" / f"step-{step}" / "held-out-sampled.jsonl").read_text().splitlines()
        assert len(lines) == HELD_OUT and all(len(json.loads(line)["samples"]) == 4 for line in lines)
