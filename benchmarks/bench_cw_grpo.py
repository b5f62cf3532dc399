"""CW-GRPO on the embedded default: policy entropy over training vs ``grpo`` (the paper's central claim, its
Figure 1) and the training-step time ratio vs ``grpo``.

    python benchmarks/bench_cw_grpo.py                           # a few minutes on 2 CPU cores
    python benchmarks/bench_cw_grpo.py --steps 60 --seeds 0 1 2  # longer curves

1. Entropy: for every seed, ``grpo`` and ``cw_grpo`` train the warm-started tiny model on the bundled arithmetic
   task with identical settings (``DEFAULT_GRPO_ARGS`` if the task module populates it, else the settings below);
   TRL's per-step ``entropy`` (mean next-token entropy over completion tokens, the quantity the paper plots) is
   plotted and its spread across steps tabulated. The order of the two methods alternates between seeds.
2. Step time: interleaved repetitions of short ``grpo`` / ``cw_grpo`` runs from the same model and data; a
   repetition's figure is the ratio of the median TRL ``step_time`` (first step dropped), the reported figure is
   the median over repetitions. Two configurations: TRL's defaults, where TRL computes no ``old_per_token_logps``
   and CW-GRPO makes one extra no-grad forward pass per generation batch, and ``num_iterations=2``, where TRL
   computes them for both methods and CW-GRPO needs no extra pass. The time spent in that extra forward is also
   measured directly (wall time of ``_rollout_logps`` divided by the step time).

Writes ``benchmarks/results/cw_grpo.md`` and ``benchmarks/results/cw_grpo_entropy.png``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from benchmarks import harness  # noqa: E402
from grpo_family import GRPOFamilyTrainer  # noqa: E402
from grpo_family.tasks import (  # noqa: E402
    DEFAULT_GRPO_ARGS,
    arithmetic_reward,
    load_warm_start,
    make_arithmetic_dataset,
)
from grpo_family.trainers.cw_grpo import CWGRPOConfig, CWGRPOTrainer  # noqa: E402

METHODS = {"grpo": (GRPOConfig, GRPOFamilyTrainer), "cw_grpo": (CWGRPOConfig, CWGRPOTrainer)}

# Used when grpo_family.tasks.DEFAULT_GRPO_ARGS is empty: a short, cheap run of the warm-started tiny model.
FALLBACK_ARGS = dict(
    per_device_train_batch_size=32,
    num_generations=8,
    max_completion_length=40,
    learning_rate=3e-4,
    lr_scheduler_type="constant",
    beta=0.0,
    temperature=1.0,
)
# label -> (arguments for both methods, arguments for cw_grpo only, whether cw_grpo makes the extra forward)
TIMING_CONFIGS = {
    "TRL defaults (steps_per_generation=1): weights from the loss's own log-probs": ({}, {}, False),
    "cw_reuse_loss_logps=False (as with steps_per_generation>1): extra forward": (
        {},
        {"cw_reuse_loss_logps": False},
        True,
    ),
    "num_iterations=2: TRL computes old_per_token_logps": ({"num_iterations": 2}, {}, False),
}
FIXED_ARGS = dict(logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True, bf16=False)
PER_RUN = ("output_dir", "max_steps", "seed")  # set by each run (train), over the shared settings' own values


def grpo_args() -> dict:
    return {**(DEFAULT_GRPO_ARGS or FALLBACK_ARGS), **FIXED_ARGS}


def make_config(method: str, workdir: Path, steps: int, seed: int, **extra):
    """A run's config: the shared settings, then ``extra``, then the run's own output folder, steps and seed, each
    later one winning (``DEFAULT_GRPO_ARGS`` has its own ``max_steps``: passed beside it as a keyword, the run's
    was a ``TypeError``)."""
    own = dict(output_dir=str(workdir / f"{method}-{seed}"), max_steps=steps, seed=seed)
    return METHODS[method][0](**{**grpo_args(), **extra, **own})


def train(method: str, model: str, dataset, steps: int, seed: int, workdir: Path, retime=False, **extra) -> dict:
    """One run: TRL's per-step log rows and, per generation batch, CW-GRPO's added wall time (advantage hook +
    weights made in the loss), whether it computed weights (not every group degenerate) and its extra-forward
    time. With ``retime``, the rollout log-probs are also timed warm (3 times) on the run's last batch."""
    trainer_cls = METHODS[method][1]
    args = make_config(method, workdir, steps, seed, **extra)
    # The character-level tokenizer explicitly: from the path alone, AutoTokenizer builds a Qwen2Tokenizer that
    # drops newlines of this vocabulary.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    trainer = trainer_cls(
        model=model, reward_funcs=[arithmetic_reward], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    batches, last = [], {}
    hook = trainer.compute_advantages

    def timed(fn, key):
        def wrapper(*a):
            with harness.Timer() as timer:
                out = fn(*a)
            batches[-1][key] += timer.wall
            if key == "forward" and not out[1]:  # no forward: old_per_token_logps or the sampler's
                batches[-1][key] = 0.0
            batches[-1]["weighted"] |= key != "hook"
            return out

        return wrapper

    def new_batch(batch):
        batches.append({"hook": 0.0, "forward": 0.0, "loss": 0.0, "weighted": False})
        last["batch"] = batch
        return timed(hook, "hook")(batch)

    trainer.compute_advantages = new_batch
    if isinstance(trainer, CWGRPOTrainer):
        trainer._rollout_logps = timed(trainer._rollout_logps, "forward")
        trainer._weigh_in_loss = timed(trainer._weigh_in_loss, "loss")
    trainer.train()
    rows = [h for h in trainer.state.log_history if "step_time" in h]
    logps_s = []
    for _ in range(3 if retime else 0):
        with harness.Timer() as timer:
            CWGRPOTrainer._rollout_logps(trainer, last["batch"])
        logps_s.append(timer.wall)
    return {"rows": rows, "batches": batches, "cycle": extra.get("num_iterations", 1), "logps_s": logps_s}


def cw_cost(runs: list[dict]) -> dict:
    """CW-GRPO's added time per generation batch, as shares of the generation cycle (num_iterations steps).

    Extra forward: timed warm on each run's last batch (runs that make it). The rest (padded gather, weights,
    metrics, in the hook or in the loss): over the batches it weighted, each run's first batch (warm-up) excluded.
    """
    forward, rest, weighted, total = [], [], 0, 0
    for run in runs:
        cycle_s = run["cycle"] * statistics.median(r["step_time"] for r in run["rows"])
        if run["logps_s"]:
            forward.append(statistics.median(run["logps_s"]) / cycle_s)
        for b in run["batches"][1:]:
            total += 1
            if b["weighted"]:
                weighted += 1
                rest.append((b["hook"] + b["loss"] - b["forward"]) / cycle_s)
    fwd = statistics.median(forward) if forward else 0.0
    other = statistics.median(rest) if rest else float("nan")
    return {
        "weighted": weighted,
        "total": total,
        "forward": fwd,
        "rest": other,
        "implied": 1 / (1 - fwd - (other if rest else 0.0)),
    }


def spread(values: list[float]) -> dict:
    steps = [abs(b - a) for a, b in zip(values, values[1:])]
    return {
        "first": values[0],
        "last": values[-1],
        "min": min(values),
        "max": max(values),
        "range": max(values) - min(values),
        "std": statistics.pstdev(values),
        "step_change": statistics.mean(steps) if steps else 0.0,
    }


def plot(curves: dict[str, list[list[float]]], path: Path, title: str) -> None:
    colors = {"grpo": "tab:blue", "cw_grpo": "tab:red"}
    fig, ax = harness.pyplot().subplots(figsize=(7, 4))
    for method, runs in curves.items():
        for run in runs:
            ax.plot(range(1, len(run) + 1), run, color=colors[method], alpha=0.3, lw=1)
        mean = [statistics.mean(v) for v in zip(*runs)]
        ax.plot(range(1, len(mean) + 1), mean, color=colors[method], lw=2.2, label=f"{method} (mean of {len(runs)})")
    ax.set(xlabel="training step", ylabel="policy entropy (nats / token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    harness.save_figure(fig, path, dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps per entropy run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timing-reps", type=int, default=3)
    parser.add_argument("--timing-steps", type=int, default=5, help="timed generation cycles per run (+1 warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the tiny model gains nothing more)")
    parser.add_argument("--output", default=str(harness.RESULTS / "cw_grpo.md"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = harness.Timer()  # the whole benchmark (not `run`: the loops below name each training run so)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-cw-"))
    model, tokenizer = load_warm_start(seed=0)
    model_dir = workdir / "warm-start"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    dataset = make_arithmetic_dataset("train", 2000, seed=0)

    # 1. Entropy over training, same seeds for both methods.
    entropy_runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for i, seed in enumerate(args.seeds):
        for method in list(METHODS)[:: 1 if i % 2 == 0 else -1]:
            run = train(method, str(model_dir), dataset, args.steps, seed, workdir)
            entropy_runs[method].append(run)
            ent = [r["entropy"] for r in run["rows"]]
            print(f"seed {seed} {method}: entropy {ent[0]:.3f} -> {ent[-1]:.3f}", flush=True)

    # 2. Step time, interleaved; plus CW-GRPO's own time, measured inside the same steps.
    timing: dict[str, dict] = {}
    for label, (common, cw_only, extra_forward) in TIMING_CONFIGS.items():
        t = {"ratios": [], "times": {m: [] for m in METHODS}, "cw_runs": [], "extra_forward": extra_forward}
        cycle = common.get("num_iterations", 1)  # one generation batch and its num_iterations optimizer steps
        for rep in range(args.timing_reps):
            per = {}
            for method in list(METHODS)[:: 1 if rep % 2 == 0 else -1]:
                extra = {**common, **(cw_only if method == "cw_grpo" else {})}
                retime = method == "cw_grpo" and extra_forward
                steps = (args.timing_steps + 1) * cycle  # the first cycle is warm-up
                run = train(method, str(model_dir), dataset, steps, 0, workdir, retime=retime, **extra)
                step_times = [r["step_time"] for r in run["rows"]]
                cycles = [sum(step_times[i : i + cycle]) / cycle for i in range(cycle, len(step_times), cycle)]
                per[method] = statistics.median(cycles)
                t["times"][method].append(per[method])
                if method == "cw_grpo":
                    t["cw_runs"].append(run)
            t["ratios"].append(per["cw_grpo"] / per["grpo"])
            print(f"{label} rep {rep + 1}: ratio {t['ratios'][-1]:.3f}", flush=True)
        timing[label] = t

    # Report.
    settings = grpo_args()
    source = "DEFAULT_GRPO_ARGS" if DEFAULT_GRPO_ARGS else "the benchmark's fallback settings"
    curves = {m: [[r["entropy"] for r in run["rows"]] for run in runs] for m, runs in entropy_runs.items()}
    png = Path(args.output).with_name(Path(args.output).stem + "_entropy.png")
    plot(curves, png, f"Policy entropy, warm-started tiny model, arithmetic task ({len(args.seeds)} seeds)")

    lines = [
        "# CW-GRPO vs GRPO on the embedded default",
        "",
        f"Command: `{harness.command_line(__file__, argv)}` ({clock.wall:.0f} s wall, {clock.cpu:.0f} s CPU)",
        f"Machine: {harness.machine_line(torch=False)} (shared with other jobs: timings are noisy), torch "
        f"{torch.__version__} with {args.threads} thread(s), CPU, fp32.",
        f"Model: the warm-started tiny Qwen2 (`load_warm_start(seed=0)`); data: bundled arithmetic task; reward: "
        f"`arithmetic_reward`; settings from {source}: "
        + ", ".join(f"{k}={v}" for k, v in settings.items() if k not in FIXED_ARGS and k not in PER_RUN)
        + ".",
        "",
        f"## Policy entropy over {args.steps} steps (seeds {', '.join(map(str, args.seeds))}; same seeds for both)",
        "",
        f"![entropy]({png.name})",
        "",
        "TRL's `entropy` metric per step (mean next-token entropy over completion tokens). Spread across steps per "
        "run, then the mean over seeds (min / max over seeds in brackets for the std); *last, across seeds* = min / "
        "max over seeds of the last step's entropy. *Learning steps* = steps with at least one group whose rewards "
        "differ (the others have zero advantages everywhere and no policy-gradient signal).",
        "",
        "| method | first | last | last, across seeds | min | max | range (max-min) | std across steps | mean abs "
        "step-to-step change | reward, first / last 5 steps | learning steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    learning = {}
    for method, runs in entropy_runs.items():
        stats = [spread([r["entropy"] for r in run["rows"]]) for run in runs]
        first = statistics.mean(r["reward"] for run in runs for r in run["rows"][:5])
        last = statistics.mean(r["reward"] for run in runs for r in run["rows"][-5:])
        learning[method] = (first, last)
        live = sum(r["frac_reward_zero_std"] < 1 for run in runs for r in run["rows"])

        def avg(key, stats=stats):
            return statistics.mean(s[key] for s in stats)

        stds, lasts = [s["std"] for s in stats], [s["last"] for s in stats]
        lines.append(
            f"| {method} | {avg('first'):.3f} | {avg('last'):.3f} | {min(lasts):.3f} / {max(lasts):.3f} | "
            f"{avg('min'):.3f} | {avg('max'):.3f} | {avg('range'):.3f} | {avg('std'):.3f} [{min(stds):.3f} / "
            f"{max(stds):.3f}] | {avg('step_change'):.3f} | {first:.3f} / {last:.3f} | "
            f"{live} / {sum(len(run['rows']) for run in runs)} |"
        )
    if all(last < max(0.05, first) for first, last in learning.values()):
        lines += [
            "",
            "**Caveat:** neither method raised the mean reward in these runs (first vs last 5 steps above): the "
            "curves show how each method's updates move the entropy of a policy that is not improving, not the "
            "paper's regime of a model that is learning.",
        ]
    lines += [
        "",
        "The measurement of this claim on a learning run is in `learning.md` (`python benchmarks/learning.py`: "
        "`DEFAULT_GRPO_ARGS`, 150 steps on the default setting and 100 on the hard one, 3 seeds, the same seeds for "
        "both methods), table *Policy entropy, CW-GRPO vs GRPO*; this short run is the quick look.",
    ]
    cw_rows = [r for run in entropy_runs["cw_grpo"] for r in run["rows"] if r.get("cw_grpo/degenerate_frac", 1) < 1]
    if cw_rows:
        lines += [
            "",
            f"CW weights over the cw_grpo steps with at least one non-degenerate group ({len(cw_rows)} of "
            f"{sum(len(run['rows']) for run in entropy_runs['cw_grpo'])}; per-step values, mean over those steps): "
            + ", ".join(
                f"{k.split('/')[1]} {statistics.mean(r[k] for r in cw_rows if k in r):.3g}"
                for k in (
                    "cw_grpo/weight_min",
                    "cw_grpo/weight_max",
                    "cw_grpo/weight_std",
                    "cw_grpo/frac_weight_lt_0.5",
                )
            )
            + ".",
        ]
    lines += [
        "",
        f"## Training-step time vs grpo ({args.timing_reps} interleaved repetitions of {args.timing_steps} timed "
        "generation cycles)",
        "",
        "*Step ratio*: median TRL `step_time` (per generation cycle of `num_iterations` steps, first cycle "
        "dropped) of cw_grpo over grpo's, per repetition; median (min / max) over repetitions. On a shared, loaded "
        "2-core machine it is noisy, and the arithmetic task's many all-wrong groups leave few batches to weight "
        "(an all-degenerate batch skips the log-probs and the weights), so CW-GRPO's own cost is also measured "
        "directly, as shares of the same run's median generation-cycle time: *extra forward* = `_rollout_logps` "
        "timed warm on the run's last generation batch, in the configuration that makes it; *gather + weights* = "
        "the rest of CW-GRPO's time (padded gather, weights, metrics; in the advantage hook or in the loss) over "
        "the batches it weighted, first batch excluded; medians over runs / batches. *Implied ratio* = 1 / (1 - "
        "both shares): the step-time ratio when every batch needs weights, the worst case. The first row's direct "
        "figures pool its timing runs and the entropy runs (same configuration).",
        "",
        "| configuration | extra forward for rollout log-probs | grpo step (s) | cw_grpo step (s) | step ratio "
        "(min / max) | batches weighted | extra forward share | gather + weights share | implied ratio "
        "(worst case) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (label, t) in enumerate(timing.items()):
        cost = cw_cost(t["cw_runs"] + (entropy_runs["cw_grpo"] if i == 0 else []))
        lines.append(
            f"| {label} | {'yes' if t['extra_forward'] else 'no'} | {statistics.median(t['times']['grpo']):.3f} | "
            f"{statistics.median(t['times']['cw_grpo']):.3f} | {statistics.median(t['ratios']):.3f} "
            f"({min(t['ratios']):.3f} / {max(t['ratios']):.3f}) | {cost['weighted']} / {cost['total']} | "
            f"{cost['forward']:.1%} | {cost['rest']:.2%} | {cost['implied']:.3f} |"
        )
    lines += [
        "",
        "Where the rollout log-probs come from: TRL's `old_per_token_logps` when it computes them "
        "(`num_iterations > 1`, accumulation misaligned with generation, or vLLM with importance-sampling "
        "correction, its default: the paper's setup); vLLM's sampling log-probs only when asked for "
        "(`cw_logps_source='sampler'`, which deviates from docs/methods/cw_grpo.md §2.4; the default `'policy'` never uses them); "
        "the loss's own forward when every loss call sees a whole generation batch "
        "(`steps_per_generation=1`, TRL's default when `gradient_accumulation_steps=1`, and evaluation); otherwise "
        "(`steps_per_generation > 1` without vLLM, e.g. gradient accumulation with TRL's defaults) one extra no-grad "
        "forward pass over the generation batch, the cost in the second row. Its share grows with the model and "
        "shrinks as completions get longer (generation is sequential, the forward is one batched pass).",
    ]
    return harness.write_report(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
