"""The real model (SmolLM2-135M-Instruct) with real vLLM on this CPU: the vLLM lane (`bash .ci/vllm`), in the
environment README's "vLLM on a CPU machine" installs (with the real-model install in it).

* vLLM colocate: `examples/train.py` trains 2 steps of the real model from vLLM's rollouts, through the base class's
  CPU weight sync, with TRL's importance-sampling correction on vLLM's own log-probs of real BPE text;
* SGPO's step judge is the real model behind `vllm serve` on 127.0.0.1 (an OpenAI-compatible endpoint, the paper's
  setting): the judge is called on the all-wrong groups and the run trains through.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.realmodel]

from conftest import require_vllm_or_skip_module  # noqa: E402

require_vllm_or_skip_module()

from test_vllm import _free_port  # noqa: E402

from grpo_family.integrations import vllm_cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
# Small and hard enough that the 135M model's answers are wrong: SGPO's judge sees all-wrong groups.
DATA = ["--dataset_name", "reasoning_gym/chain_sum", "--dataset_options", '{"size": 16, "min_terms": 5, "min_digits": 4}',
        "--reward_funcs", "reasoning_gym"]  # fmt: skip
SMALL = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4",
         "--max_completion_length", "24", "--num_eval_examples", "4", "--held_out_every", "0", "--logging_steps", "1",
         "--gradient_checkpointing", "false", "--report_to", "none"]  # fmt: skip


@pytest.fixture(scope="module")
def real_model_dir() -> str:
    from grpo_family.models import resolve_model

    return resolve_model(MODEL)


def _env() -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return {**vllm_cpu.engine_env(), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}


def _train(tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / "out"
    cmd = ["accelerate", "launch", "examples/train.py", "--model_name_or_path", MODEL, *DATA, *SMALL,
           "--output_dir", str(out), *extra]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [h for h in state["log_history"] if "loss" in h and "train_loss" not in h]
    assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps), steps
    return steps


def test_colocated_vllm_trains_the_real_model(real_model_dir, tmp_path):
    steps = _train(tmp_path, "--method", "grpo", "--use_vllm", "--vllm_mode", "colocate")
    for h in steps:
        # TRL's correction ran on vLLM's log-probs: the sampler's and the trainer's differ (bfloat16 vs float32
        # weights) but stay close after every weight sync.
        assert math.isfinite(h["sampling/importance_sampling_ratio/mean"]), h
        assert h["sampling/sampling_logp_difference/max"] < 1.0, h


def test_sgpo_with_the_real_model_as_step_judge_behind_vllm_serve(real_model_dir, tmp_path):
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    cmd = ["vllm", "serve", real_model_dir, "--host", "127.0.0.1", "--port", str(port), "--served-model-name",
           "smollm2-judge", "--max-model-len", "4096", "--seed", "0"]  # fmt: skip
    server = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                    assert "smollm2-judge" in response.read().decode()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
                assert time.monotonic() < deadline, "vllm serve did not start in 400 s"
                time.sleep(3)
        steps = _train(tmp_path, "--method", "sgpo", "--judge_type", "openai", "--judge_base_url",
                       f"http://127.0.0.1:{port}/v1", "--judge_model", "smollm2-judge", "--judge_max_tokens", "64")  # fmt: skip
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
        log.close()
    served = (tmp_path / "server.log").read_text()
    # The subject happened: groups were all wrong, the judge was asked, and the server answered.
    assert sum(h.get("sgpo/judge_requests", 0) for h in steps) > 0, steps
    assert sum(h.get("sgpo/judge_calls", 0) for h in steps) > 0, steps
    assert "POST /v1/chat/completions" in served or "/v1/completions" in served, served[-3000:]
    print("SGPO judge failure rate per step:", [h.get("sgpo/judge_failure_rate") for h in steps])
