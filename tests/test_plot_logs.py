"""examples/plot_logs.py turns a trainer_state.json into a PNG with the method's metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import plot_logs  # noqa: E402


def test_plot_from_trainer_state(tmp_path):
    history = [
        {"step": s, "reward": 0.1 * s, "entropy": 1.0 - 0.05 * s, "ms_grpo/abs_diff_to_grpo": 0.3,
         "rewards/arithmetic_reward/mean": 0.1 * s, "learning_rate": 1e-3}
        for s in range(1, 6)
    ] + [{"step": 5, "train_runtime": 12.0, "train_loss": 0.1}]  # fmt: skip
    run = tmp_path / "run" / "checkpoint-5"
    run.mkdir(parents=True)
    (run / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    series = plot_logs.metric_series(history)
    assert series["reward"] == ([1, 2, 3, 4, 5], [0.1 * s for s in range(1, 6)])
    assert "train_runtime" not in series
    names = plot_logs.selected_metrics(series)
    assert names[:2] == ["reward", "entropy"] and "ms_grpo/abs_diff_to_grpo" in names
    out = plot_logs.main([str(tmp_path / "run")])
    assert out == run / "metrics.png" and out.stat().st_size > 1000
