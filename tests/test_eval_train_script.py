"""examples/train.py's held-out scoring goes through the evaluation package's guard (issue 34's list): a reward that
raises, is async, returns strings or numpy values, or calls sys.exit when it scores the held-out set leaves those
rows unscored; the run finishes and writes its model, results.json and plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train  # noqa: E402

# Golds 0..30 train; the held-out (test) split's golds are 99 and 100, which only the held-out scoring sees.
TRAIN_ROWS = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in range(16)]
HELD_OUT = [{"question": "What is 99 plus 0?", "answer": "99+0=99\n#### 99"},
            {"question": "What is 50 plus 50?", "answer": "50+50=100\n#### 100"}]  # fmt: skip

REWARDS = """
import asyncio, sys
import numpy as np

def _scores(completions, answer):
    return [0.5 if "99" in str(c) else 0.0 for c in completions]

def raises(completions, answer, **kw):
    if "99" in answer:
        raise RuntimeError("cannot score 99")
    return _scores(completions, answer)

def strings(completions, answer, **kw):
    return ["high" if a == "99" else s for a, s in zip(answer, _scores(completions, answer))]

def numpy_values(completions, answer, **kw):
    return np.asarray(_scores(completions, answer), dtype=np.float32)

async def asynchronous(completions, answer, **kw):
    await asyncio.sleep(0)
    return _scores(completions, answer)

def exits(completions, answer, **kw):
    if "99" in answer:
        sys.exit(0)
    return _scores(completions, answer)
"""


@pytest.mark.parametrize(
    "reward, unscored",
    [("raises", 1), ("strings", 1), ("numpy_values", 0), ("asynchronous", 0), ("exits", 1)],
)
def test_held_out_scoring_contains_a_misbehaving_reward(tiny_model_dir, tmp_path, monkeypatch, reward, unscored):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAIN_ROWS))
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HELD_OUT))
    (tmp_path / "held_out_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    results = train.main([
        "--model_name_or_path", tiny_model_dir, "--dataset_name", str(data), "--output_dir", str(out),
        "--reward_funcs", f"held_out_rewards.{reward}", "--max_steps", "2", "--per_device_train_batch_size", "8",
        "--num_generations", "4", "--max_completion_length", "8", "--report_to", "none", "--save_strategy", "no",
        "--num_eval_examples", "2", "--held_out_every", "1", "--held_out_samples", "2", "--logging_steps", "1",
    ])  # fmt: skip
    for when in ("held_out_before", "held_out_after"):
        assert results[when]["held_out/greedy_samples_unscored"] == unscored, results[when]
        assert results[when]["held_out/sampled_samples_unscored"] == 2 * unscored
    assert results["accuracy_after"] is not None and type(results["accuracy_after"]) is float
    written = json.loads((out / "results.json").read_text())
    assert written["accuracy_after"] == results["accuracy_after"]
    assert (out / "reward_curve.png").exists() and (out / "model.safetensors").exists()
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [row["step"] for row in history if "held_out_accuracy" in row] == [0, 1, 2]
