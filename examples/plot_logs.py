"""Plot a training run from its ``trainer_state.json``: reward, accuracy, entropy and the method's own metrics.

python examples/plot_logs.py outputs/ms_grpo                # finds the newest trainer_state.json below it
python examples/plot_logs.py outputs/ms_grpo/checkpoint-50/trainer_state.json --out plots.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Always plotted when present; then every "<method>/..." metric and every "rewards/<func>/mean".
CORE_METRICS = ("reward", "entropy", "kl", "completions/mean_length")


def find_state(path: Path) -> Path:
    if path.is_file():
        return path
    candidates = sorted(path.rglob("trainer_state.json"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(f"no trainer_state.json under {path} (save_strategy must not be 'no')")
    return candidates[-1]


def metric_series(log_history: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric: (steps, values)}`` for every numeric metric logged during training."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    for entry in log_history:
        step = entry.get("step")
        for key, value in entry.items():
            if key == "step" or not isinstance(value, int | float) or "train_" in key:
                continue
            steps, values = series.setdefault(key, ([], []))
            steps.append(step)
            values.append(float(value))
    return series


def selected_metrics(series: dict) -> list[str]:
    method = [k for k in series if "/" in k and k.split("/")[0] not in ("rewards", "completions", "clip_ratio")]
    rewards = [k for k in series if k.startswith("rewards/") and k.endswith("/mean")]
    return [k for k in CORE_METRICS if k in series] + sorted(rewards) + sorted(method)


def plot(state_path: Path, out: Path) -> Path:
    log_history = json.loads(state_path.read_text())["log_history"]
    series = metric_series(log_history)
    names = selected_metrics(series)
    if not names:
        raise ValueError(f"{state_path} has no metrics to plot")
    cols = min(3, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        steps, values = series[name]
        ax.plot(steps, values, marker=".", linewidth=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="an output dir or a trainer_state.json")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: <output dir>/metrics.png)")
    args = parser.parse_args(argv)
    state = find_state(args.path)
    out = plot(state, args.out or state.parent / "metrics.png")
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
