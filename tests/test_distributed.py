"""2-process CPU runs (gloo) for everything that must be global across processes: the default suite's run as scenarios of
one launch (tests/dist_suite.py); :func:`launch` runs a script of tests/dist on its own (the slow lane's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_suite import TINY_MODEL, scenario

from grpo_family.algorithms.grpo import group_advantages

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def launch(script: str, *args: str, timeout: int = 300) -> str:
    """Run ``tests/dist/<script>`` on 2 CPU processes with accelerate; fail with its output on error; its stdout."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
        "--main_process_port", str(29500 + os.getpid() % 1000),
        str(TESTS / "dist" / script), *args,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if result.returncode != 0:
        pytest.fail(f"2-process run failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result.stdout


@scenario("record_advantages", "grpo", TINY_MODEL)
def test_base_trainer_advantages_are_global(dist_output):
    rank0, rank1 = (torch.load(dist_output / f"rank{r}.pt") for r in (0, 1))
    assert len(rank0) == len(rank1) == 2
    for r0, r1 in zip(rank0, rank1):
        assert r0["rewards"].shape == (3, 4)  # 12 completions, 3 groups, the middle one split 2 + 2
        assert torch.equal(r0["rewards"], r1["rewards"])
        single_process = group_advantages(r0["rewards"]).reshape(-1)
        assert single_process.abs().sum() > 0
        assert torch.equal(torch.cat([r0["local"], r1["local"]]), single_process)
