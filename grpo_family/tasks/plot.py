"""The demo's picture: training reward and held-out accuracy of one run (`examples/train.py`, the learning
benchmark)."""

from __future__ import annotations

import math
from pathlib import Path


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def plot_training_curve(log_history: list[dict], path: str | Path, title: str) -> None:
    """Training reward (raw, faint; smoothed, bold) and held-out accuracy (markers, first and last labelled)
    against the optimizer step, from a Trainer log history (`reward` and `held_out_accuracy` entries)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A step where no completion could be scored logs its reward as NaN (None once saved to JSON): left out.
    rewards = [(h["step"], h["reward"]) for h in log_history if _finite(h.get("reward"))]
    accuracy = [(h["step"], h["held_out_accuracy"]) for h in log_history if _finite(h.get("held_out_accuracy"))]
    if not rewards and not accuracy:
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    if rewards:
        steps, values = zip(*rewards)
        window = max(1, len(values) // 10)
        smooth = [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
                  for i in range(len(values))]  # fmt: skip
        ax.plot(steps, values, color="tab:blue", alpha=0.3, linewidth=1, label="training reward")
        ax.plot(steps, smooth, color="tab:blue", linewidth=2.5, label=f"training reward, mean of {window} logs")
    if accuracy:
        steps, values = zip(*accuracy)
        ax.plot(steps, values, color="tab:red", marker="o", linewidth=1.5, label="held-out greedy accuracy")
        for step, value in (accuracy[0], accuracy[-1]):
            ax.annotate(f"{value:.3f}", (step, value), textcoords="offset points", xytext=(0, 7), ha="center")
    ax.set(xlabel="optimizer step", ylabel="reward / accuracy", title=title, ylim=(0, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
