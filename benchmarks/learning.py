"""Learning benchmark: every method and ``grpo`` on the embedded default (the bundled arithmetic task), same budget,
several seeds: what ``accelerate launch examples/train.py --method X`` does, measured.

    python benchmarks/learning.py            # full: every method x 3 seeds, ~30 min on 2 CPU cores
    python benchmarks/learning.py --quick    # the same tables from a few tiny steps, < 1 min (run in CI)

Every run starts from the same warm-started tiny Qwen2 (``load_warm_start(seed=0)``) and trains with the
embedded default's settings (``DEFAULT_GRPO_ARGS``, the demo's) and each method's own defaults (SGPO with its
offline programmatic judge), for the same number of steps. Seeds change the training-data order and the sampling;
the held-out problems are fixed. The warm start's sampled pass@k on the held-out problems (temperature 1, 16
samples each, the unbiased estimator) is reported as the ceiling that sharpening can reach with k samples.

Recorded per run: greedy held-out accuracy every ``--eval-every`` steps (and at step 0), TRL's per-step
``entropy`` (mean next-token entropy of the policy over completion tokens) and ``reward``. Reported per method:
final accuracy (mean, standard deviation and min / max over seeds), its gain over the warm start and that gain as
a share of grpo's, steps to reach the threshold (warm-start accuracy + ``--threshold-gain``, first evaluation at
or above it, in every seed), the entropy's spread across steps, and plots. Runs execute in ``--workers`` processes
with one torch thread each (as ``accelerate launch`` gives a CPU run); a run's numbers depend only on its (method,
setting, seed), so re-running regenerates the same tables on the same machine and library versions. Writes
``benchmarks/results/learning.md``, ``learning.json``, ``learning_<setting>.png`` and ``demo_grpo.png`` (the demo's
picture for grpo's first seed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from benchmarks.runs import _mean, _std, run_all  # noqa: E402 - the training runs, shared with claims.py
from grpo_family import METHODS  # noqa: E402 - the one method list (light: the trainers load on first use)

METHOD_NAMES = list(METHODS)
SETTINGS = {  # setting -> (task difficulty, training steps in a full run: the demo's)
    "default": ("default", None),
}
# Per-method changes to the method's defaults (none: every method runs as `--method X` runs it).
METHOD_OVERRIDES: dict[str, dict] = {}
PASS_AT = (1, 2, 4, 8, 16)
QUICK_ARGS = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=24)  # 2 prompts a step


def warm_start_pass_at_k(difficulty: str, args) -> dict:
    """Greedy accuracy and sampled pass@k of the warm start on the held-out problems, through the evaluation package:
    n samples per problem at temperature 1 (top-k 50, transformers' default, which these numbers were first measured
    with), the unbiased pass@k estimator."""
    from grpo_family.eval import Decoding, EvalData, GenerateBackend, evaluate_data
    from grpo_family.tasks import DEFAULT_GRPO_ARGS, arithmetic_reward, load_warm_start, make_arithmetic_dataset

    n = 4 if args.quick else max(PASS_AT)
    model, tokenizer = load_warm_start(seed=0)
    held_out = EvalData.held_out(
        make_arithmetic_dataset("eval", args.eval_examples, seed=0, difficulty=difficulty), arithmetic_reward
    )
    tokens = DEFAULT_GRPO_ARGS["max_completion_length"]
    sampled = Decoding(temperature=1.0, top_k=50, num_samples=n, max_new_tokens=tokens)
    ks = [k for k in PASS_AT if k <= n]
    backend = GenerateBackend(model, tokenizer, batch_size=256)
    pass_at = evaluate_data(backend, held_out, sampled, arithmetic_reward, ks=ks, seed=0, mode="train").summary
    greedy = evaluate_data(
        GenerateBackend(model, tokenizer), held_out, Decoding(max_new_tokens=tokens), arithmetic_reward, mode="train"
    ).summary
    return {"greedy": greedy["greedy_accuracy"], "samples": n, **{f"pass@{k}": pass_at[f"pass@{k}"] for k in ks}}


def summarise(runs: list[dict], threshold_gain: float) -> dict:
    """Per setting and method: final accuracy over seeds, steps to threshold, entropy spread, reward."""
    table: dict[str, dict[str, dict]] = {}
    for setting in dict.fromkeys(r["setting"] for r in runs):
        in_setting = [r for r in runs if r["setting"] == setting]
        start = _mean([r["accuracy"]["0"] for r in in_setting])  # every run starts from the same warm start
        threshold = start + threshold_gain
        table[setting] = {"start_accuracy": start, "threshold": threshold, "methods": {}}
        for method in dict.fromkeys(r["method"] for r in in_setting):
            mine = sorted((r for r in in_setting if r["method"] == method), key=lambda r: r["seed"])
            finals = [list(r["accuracy"].values())[-1] for r in mine]
            reached = []
            for r in mine:
                hits = [int(step) for step, acc in r["accuracy"].items() if int(step) > 0 and acc >= threshold - 1e-12]
                reached.append(hits[0] if hits else None)
            entropy_std = [_std(r["entropy"]) for r in mine]
            tail = max(1, len(mine[0]["reward"]) // 10)
            table[setting]["methods"][method] = {
                "seeds": [r["seed"] for r in mine],
                "final_accuracy": finals,
                "final_mean": _mean(finals),
                "final_std": _std(finals),
                "steps_to_threshold": reached,
                "entropy_first": _mean([r["entropy"][0] for r in mine]),
                "entropy_last": _mean([r["entropy"][-1] for r in mine]),
                "entropy_std_across_steps": _mean(entropy_std),
                "entropy_std_min_max": [min(entropy_std), max(entropy_std)],
                "reward_first": _mean([_mean(r["reward"][:tail]) for r in mine]),
                "reward_last": _mean([_mean(r["reward"][-tail:]) for r in mine]),
                "frac_zero_std": _mean([_mean([f for f in r["frac_reward_zero_std"] if f is not None]) for r in mine]),
                "seconds": _mean([r["seconds"] for r in mine]),
                "completions_per_step": _mean([r.get("completions_per_step", math.nan) for r in mine]),
            }
    return table


def _steps_cell(reached: list[int | None]) -> str:
    if all(s is not None for s in reached):
        return f"{statistics.median(reached):g} ({min(reached)}-{max(reached)})"
    hit = [s for s in reached if s is not None]
    return f"not reached in {len(reached) - len(hit)} of {len(reached)} seeds" + (
        f" ({', '.join(map(str, hit))})" if hit else ""
    )


def plot(runs: list[dict], setting: str, path: Path) -> None:
    fig, (ax_acc, ax_ent) = harness.pyplot().subplots(1, 2, figsize=(12, 4.2))
    for index, method in enumerate(dict.fromkeys(r["method"] for r in runs)):
        mine = [r for r in runs if r["setting"] == setting and r["method"] == method]
        if not mine:
            continue
        color = f"C{index}"
        steps = [int(s) for s in mine[0]["accuracy"]]
        acc = [[r["accuracy"][str(s)] for s in steps] for r in mine]
        mean = [_mean(col) for col in zip(*acc)]
        ax_acc.plot(steps, mean, color=color, label=method, marker="o", markersize=3)
        ax_acc.fill_between(steps, [min(c) for c in zip(*acc)], [max(c) for c in zip(*acc)], color=color, alpha=0.12)
        ent = [_mean(col) for col in zip(*(r["entropy"] for r in mine))]
        window = max(1, min(10, len(ent) // 5))  # per-step values swing with the batch's prompts: smooth them
        smooth = [_mean(ent[max(0, i - window + 1) : i + 1]) for i in range(len(ent))]
        ax_ent.plot(range(1, len(ent) + 1), smooth, color=color, label=method, linewidth=1.2)
    ax_acc.set(
        xlabel="optimizer step", ylabel="greedy held-out accuracy", title=f"{setting}: accuracy (mean, min-max)"
    )
    ax_ent.set(
        xlabel="optimizer step",
        ylabel="policy entropy (nats/token)",
        title=f"{setting}: entropy (seed mean, 10-step rolling mean)",
    )
    ax_acc.legend(fontsize=8)
    ax_ent.legend(fontsize=8)
    harness.save_figure(fig, path, dpi=110)


def demo_curve(runs: list[dict], path: Path) -> None:
    """The demo's own picture (`examples/train.py`'s reward_curve.png) for grpo's first seed on the default setting."""
    from grpo_family.tasks.plot import plot_training_curve

    mine = sorted((r for r in runs if r["method"] == "grpo" and r["setting"] == "default"), key=lambda r: r["seed"])
    if not mine:
        return
    run = mine[0]
    history = [{"step": step + 1, "reward": reward} for step, reward in enumerate(run["reward"])]
    history += [{"step": int(step), "held_out_accuracy": acc} for step, acc in run["accuracy"].items()]
    first, last = list(run["accuracy"].values())[0], list(run["accuracy"].values())[-1]
    plot_training_curve(history, path, f"grpo, seed {run['seed']}: held-out accuracy {first:.3f} -> {last:.3f}")


def entropy_section(runs: list[dict]) -> list[str]:
    """CW-GRPO's central claim (steadier policy entropy than GRPO), seed by seed on the same seeds."""
    pairs = {}
    for r in runs:
        if r["method"] in ("grpo", "cw_grpo"):
            pairs.setdefault((r["setting"], r["seed"]), {})[r["method"]] = r["entropy"]
    rows = [(key, p) for key, p in sorted(pairs.items()) if len(p) == 2]
    if not rows:
        return []
    lines = [
        "## Policy entropy, CW-GRPO vs GRPO (same seeds)",
        "",
        "CW-GRPO's claim is a steadier entropy than GRPO's. Per run: the standard deviation of the per-step "
        "entropy across steps, its range (max - min), and the change from the mean of the first 10% of steps to "
        "the mean of the last 10%.",
        "",
        "| setting | seed | sd across steps, grpo / cw_grpo | range, grpo / cw_grpo | drift, grpo / cw_grpo |",
        "|---|---|---|---|---|",
    ]
    for (setting, seed), p in rows:
        g, c = p["grpo"], p["cw_grpo"]

        def drift(e: list[float]) -> float:
            k = max(1, len(e) // 10)
            return _mean(e[-k:]) - _mean(e[:k])

        lines.append(
            f"| {setting} | {seed} | {_std(g):.4f} / {_std(c):.4f} | {max(g) - min(g):.3f} / {max(c) - min(c):.3f} "
            f"| {drift(g):+.3f} / {drift(c):+.3f} |"
        )
    steadier = sum(_std(p["cw_grpo"]) < _std(p["grpo"]) for _, p in rows)
    lines += ["", f"CW-GRPO's entropy had the smaller spread in {steadier} of {len(rows)} runs.", ""]
    return lines


def _ceiling_lines(ceiling: dict | None) -> list[str]:
    if not ceiling:
        return []
    ks = [k for k in ceiling if k.startswith("pass@")]
    return [
        f"The warm start on the same problems ({ceiling['samples']} samples each at temperature 1, top-k 50): the "
        "ceiling that sharpening what it already does can reach.",
        "",
        "| greedy | " + " | ".join(ks) + " |",
        "|---" * (len(ks) + 1) + "|",
        f"| {ceiling['greedy']:.3f} | " + " | ".join(f"{ceiling[k]:.3f}" for k in ks) + " |",
        "",
    ]


def write_markdown(runs: list[dict], table: dict, meta: dict, path: Path) -> str:
    lines = [
        "# Learning: every method vs GRPO on the bundled arithmetic task",
        "",
        f"Command: `{meta['command']}` ({meta['wall_minutes']:.1f} min wall, {meta['workers']} worker processes"
        + (
            f"; it trained {meta['runs_trained']} of the {len(runs)} runs, the others came from the run cache"
            if meta.get("runs_trained", len(runs)) < len(runs)
            else ""
        )
        + ")",
        f"Machine: {meta['machine']}",
        f"Settings: warm-started tiny Qwen2 (`load_warm_start(seed=0)`), `DEFAULT_GRPO_ARGS` {meta['grpo_args']}, "
        "each method's default config"
        + (
            " except " + ", ".join(f"{m}: {k}={v}" for m, o in METHOD_OVERRIDES.items() for k, v in o.items())
            if METHOD_OVERRIDES
            else ""
        )
        + f"; seeds {meta['seeds']}; greedy held-out accuracy on {meta['eval_examples']} "
        f"fixed problems every {meta['eval_every']} steps. Threshold = warm-start accuracy + {meta['threshold_gain']}. "
        "`s / run`: the training loop of one run, held-out evaluations included (one thread).",
        "",
    ]
    if meta["quick"]:
        lines += [
            "**Quick mode** (`--quick`): a few tiny steps per run, to check the pipeline; the numbers mean nothing.",
            "",
        ]
    for setting, info in table.items():
        difficulty, _ = SETTINGS[setting]
        lines += [
            f"## Setting `{setting}` (task difficulty `{difficulty}`)",
            "",
            f"![{setting}](learning_{setting}.png)",
            "",
            f"Warm-start greedy accuracy {info['start_accuracy']:.3f}; threshold {info['threshold']:.3f}.",
            "",
            *_ceiling_lines(meta.get("warm_start_pass_at_k", {}).get(setting)),
            "| method | final accuracy, mean ± sd | gain over the warm start (× start) | share of grpo's gain "
            "| min / max over seeds | Δ vs grpo | steps to threshold, median (range) "
            "| entropy first → last | entropy sd across steps (min / max over seeds) | reward first → last 10% "
            "| share of all-equal groups | completions sampled / step | s / run |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        grpo_mean = info["methods"].get("grpo", {}).get("final_mean", math.nan)
        start = info["start_accuracy"]
        for method, m in info["methods"].items():
            gain, grpo_gain = m["final_mean"] - start, grpo_mean - start
            lines.append(
                f"| {method} | {m['final_mean']:.3f} ± {m['final_std']:.3f} | {gain:+.3f} "
                f"(×{m['final_mean'] / start if start else math.inf:.2f}) "
                f"| {gain / grpo_gain if grpo_gain else math.nan:.2f} | {min(m['final_accuracy']):.3f} / "
                f"{max(m['final_accuracy']):.3f} | {m['final_mean'] - grpo_mean:+.3f} | {_steps_cell(m['steps_to_threshold'])} "
                f"| {m['entropy_first']:.3f} → {m['entropy_last']:.3f} | {m['entropy_std_across_steps']:.4f} "
                f"({m['entropy_std_min_max'][0]:.4f} / {m['entropy_std_min_max'][1]:.4f}) "
                f"| {m['reward_first']:.3f} → {m['reward_last']:.3f} | {m['frac_zero_std']:.2f} | {m['completions_per_step']:.0f} | {m['seconds']:.0f} |"
            )
        lines.append("")
    lines += entropy_section(runs)
    lines += [
        "## The papers' claims, at their scale (for reference)",
        "",
        "| method | the paper's headline result, on its own models and benchmarks |",
        "|---|---|",
        *[f"| {m} | {METHODS[m][1].reported_result} |" for m in METHOD_NAMES],
        "",
    ]
    # only what this run produced; readings live in learning_reading.md
    return harness.write_report(path, "\n".join(lines) + "\n", echo=False)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few tiny steps per run (pipeline check, < 1 min)")
    parser.add_argument("--methods", nargs="+", default=METHOD_NAMES)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: per setting)")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-examples", type=int, default=200)
    parser.add_argument("--threshold-gain", type=float, default=0.03)
    parser.add_argument(
        "--from-json", default=None, help="rebuild the tables and plots from a learning.json without training again"
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="retrain every run (a full run keeps finished runs in outputs/learning_runs/, keyed by the job's "
        "settings, not the code: use --fresh after changing the library)",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes, one torch thread each")
    parser.add_argument(
        "--output-dir",
        default=None,
        help="default: benchmarks/results (full run), outputs/learning_quick (--quick, so it never overwrites them)",
    )
    args = parser.parse_args(argv)

    overrides: dict = {}
    if args.quick:
        overrides = QUICK_ARGS
        args.eval_every, args.eval_examples = 1, 4
    from grpo_family.tasks import DEFAULT_GRPO_ARGS, load_warm_start

    jobs = [
        {
            "method": method,
            "setting": setting,
            "difficulty": SETTINGS[setting][0],
            "seed": seed,
            "steps": args.steps or (2 if args.quick else SETTINGS[setting][1] or DEFAULT_GRPO_ARGS["max_steps"]),
            "eval_every": args.eval_every,
            "eval_examples": args.eval_examples,
            "overrides": {**overrides, **METHOD_OVERRIDES.get(method, {})},
        }
        for setting in args.settings
        for seed in args.seeds
        for method in args.methods
    ]

    if args.from_json:  # re-tabulate stored runs (e.g. after changing the tables), keeping how they were made
        stored = json.loads(Path(args.from_json).read_text())
        runs, meta = stored["runs"], {k: v for k, v in stored["meta"].items() if k != "reading"}
    else:
        load_warm_start(seed=0)  # build the cache once, before the workers race for it
        run = harness.Timer()
        ceiling = {setting: warm_start_pass_at_k(SETTINGS[setting][0], args) for setting in args.settings}
        cache = None if args.fresh or args.quick else ROOT / "outputs" / "learning_runs"
        runs, runs_trained = run_all(jobs, args.workers, cache, label="learning")
        grpo_args = {**DEFAULT_GRPO_ARGS, **overrides}
        shown = ("per_device_train_batch_size", "num_generations", "max_completion_length", "learning_rate", "beta")
        meta = {
            "command": harness.command_line(__file__, argv),
            "wall_minutes": run.wall / 60,
            "workers": args.workers,
            "runs_trained": runs_trained,
            "machine": f"{harness.machine_line()}, 1 thread per worker",
            "grpo_args": ", ".join(f"{k}={grpo_args[k]}" for k in shown),
            "seeds": args.seeds,
            "eval_examples": args.eval_examples,
            "eval_every": args.eval_every,
            "threshold_gain": args.threshold_gain,
            "quick": args.quick,
            "warm_start_pass_at_k": ceiling,
        }

    out_dir = Path(args.output_dir or (ROOT / "outputs" / "learning_quick" if meta["quick"] else harness.RESULTS))
    out_dir.mkdir(parents=True, exist_ok=True)
    table = summarise(runs, meta["threshold_gain"])
    for setting in table:
        plot(runs, setting, out_dir / f"learning_{setting}.png")
    demo_curve(runs, out_dir / "demo_grpo.png")
    print(write_markdown(runs, table, meta, out_dir / "learning.md"))
    harness.write_json(out_dir / "learning.json", {"meta": meta, "summary": table, "runs": runs})
    return {"meta": meta, "summary": table, "runs": runs}


if __name__ == "__main__":
    main()
