"""GPG training-step time as a ratio to ``grpo`` with its usual KL (beta 0.04, reference model) and to ``grpo`` with
beta 0, interleaved in one process.

    python benchmarks/bench_gpg.py                      # tiny warm-started model, CPU
    python benchmarks/bench_gpg.py --reps 5 --steps 6 --device cuda --model-size 0.5b

Runs, each from the same model, data and batch settings (benchmarks/speed.py's BASE_ARGS, bundled arithmetic task):

* ``grpo_kl``: ``GRPOFamilyTrainer`` (the library's ``grpo``), ``beta=0.04`` -- TRL loads a reference model and
  runs it on every generation batch;
* ``grpo_beta0``: the same with ``beta=0`` (no reference model);
* ``gpg``: ``GPGTrainer`` with ``beta_th=None`` -- the per-step cost of the GPG loss, alpha and Eq. 5 weights;
* ``gpg_beta_th``: ``GPGTrainer`` with its default ``beta_th=0.6`` -- adds the extra generation rounds that the
  threshold costs on this task (mean rounds per step reported).

Per-step time covers generation + scoring + forward/backward + optimizer; the first step of each run is dropped as
warm-up; the order of the runs rotates between repetitions, and a figure is the median over repetitions of the
per-repetition ratio. Two choices keep the comparison about the methods rather than the machine:

* the learning rate is 1e-48 by default (``harness.FROZEN_LEARNING_RATE``; the bounds refuse 0), whose update
  rounds to nothing in float32, so the weights -- hence the sampled completions, their lengths and the rewards --
  are the same in every run (checked after each run; the step's cost does not depend on the learning rate's value;
  TRL's optimizer step still runs);
* on CPU the clock is the process CPU time of each optimizer step, with torch on one thread by default
  (``--threads``): single-threaded CPU time counts the work done and hardly moves when other jobs share the
  machine, whereas wall time -- and the CPU time of spinning OpenMP threads -- does. TRL's wall-clock
  ``step_time`` ratios are reported alongside. On CUDA the clock is wall time.

Writes ``benchmarks/results/gpg.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from transformers import TrainerCallback, set_seed

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trl import GRPOConfig  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.speed import BASE_ARGS, MODEL_SIZES, model_path  # noqa: E402
from grpo_family import GRPOFamilyTrainer  # noqa: E402
from grpo_family.tasks import arithmetic_reward, make_arithmetic_dataset  # noqa: E402
from grpo_family.trainers.gpg import GPGConfig, GPGTrainer  # noqa: E402

RUNS = {
    "grpo_kl": (GRPOConfig, GRPOFamilyTrainer, {"beta": 0.04}),
    "grpo_beta0": (GRPOConfig, GRPOFamilyTrainer, {"beta": 0.0}),
    "gpg": (GPGConfig, GPGTrainer, {"beta_th": None}),
    "gpg_beta_th": (GPGConfig, GPGTrainer, {"beta_th": 0.6}),
}


class Reseed(TrainerCallback):
    """Reseeds at the start of training, so that every run samples from the same random state whatever its set-up
    consumed (e.g. building a reference model)."""

    def on_train_begin(self, args, state, control, **kwargs):
        set_seed(args.seed)


def make_config(name: str, steps: int, device: str, workdir: Path, lr: float):
    """The config of one run of ``name`` (a ``RUNS`` key): speed.py's ``BASE_ARGS``, the learning rate, the run's
    own settings."""
    config_cls, _, extra = RUNS[name]
    return config_cls(
        output_dir=str(workdir / name), max_steps=steps, use_cpu=device == "cpu", bf16=device == "cuda",
        **{**BASE_ARGS, "learning_rate": lr, **extra},
    )  # fmt: skip


def run_once(name: str, model: str, dataset, steps: int, device: str, workdir: Path, lr: float) -> dict:
    trainer_cls = RUNS[name][1]
    args = make_config(name, steps, device, workdir, lr)
    cpu = harness.step_timer()  # process CPU time (all threads) of every optimizer step
    trainer = trainer_cls(
        model=model, reward_funcs=[arithmetic_reward], args=args, train_dataset=dataset, callbacks=[Reseed(), cpu]
    )
    frozen = lr == harness.FROZEN_LEARNING_RATE
    before = harness.weights_digest(trainer.model) if frozen else None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h][1:]
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    if frozen:  # after the measurements
        harness.check_frozen(before, trainer.model, name)
    rounds = [h["gpg/rounds"] for h in logs if "gpg/rounds" in h]
    wall_step = statistics.median(h["step_time"] for h in logs)
    return {
        "tokens": [h["num_tokens"] for h in logs],
        "step_time": statistics.median(cpu.times[1:]) if device == "cpu" else wall_step,
        "wall_step_time": wall_step,
        "peak_mib": peak,
        "rounds": statistics.mean(rounds) if rounds else 1.0,
        "alpha": statistics.mean(h["gpg/alpha"] for h in logs) if "gpg/alpha" in logs[0] else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model-size", default="tiny", choices=["tiny", *MODEL_SIZES])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU device only)")
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=harness.FROZEN_LEARNING_RATE,
        help="the default leaves the weights unchanged (checked), so every run's completions are alike; must be > 0",
    )
    parser.add_argument("--output", default=str(harness.RESULTS / "gpg.md"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-gpg-"))
    model = model_path(args.model_size, workdir)
    dataset = make_arithmetic_dataset("train", 2000, seed=0)
    names = list(RUNS)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in harness.rotation(names, rep):
            results[name].append(
                run_once(name, model, dataset, args.steps + 1, args.device, workdir, args.learning_rate)
            )
        print(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{n} {results[n][-1]['step_time']:.3f}s" for n in names))

    def ratios(name: str, reference: str, key: str = "step_time") -> list[float]:
        return [a[key] / b[key] for a, b in zip(results[name], results[reference])]

    clock = "process CPU time per step" if args.device == "cpu" else "wall time per step"

    lines = [
        "# GPG training-step time vs GRPO",
        "",
        f"Command: `{harness.command_line(__file__, argv)}`",
        "",
        f"Machine: {harness.machine_line()}, device {args.device}, model {args.model_size}; {args.reps} interleaved repetitions of "
        f"{args.steps} timed steps (batch {BASE_ARGS['per_device_train_batch_size']}, G={BASE_ARGS['num_generations']}, "
        f"{BASE_ARGS['max_completion_length']} new tokens, bundled arithmetic task, learning rate "
        f"{args.learning_rate}). Clock: {clock}"
        + (f" ({args.threads} torch thread(s))." if args.device == "cpu" else "."),
        "",
        "| run | median step time (s) | vs grpo beta 0.04 (median ratio, min / max) | vs grpo beta 0 (median ratio, "
        "min / max) | wall-clock ratio vs beta 0.04 / vs beta 0 | mean generation rounds | mean alpha | peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        times = [r["step_time"] for r in results[name]]
        kl, zero = ratios(name, "grpo_kl"), ratios(name, "grpo_beta0")
        alphas = [r["alpha"] for r in results[name] if r["alpha"] is not None]
        peak = results[name][-1]["peak_mib"]
        lines.append(
            f"| {name} | {statistics.median(times):.3f} | {statistics.median(kl):.3f} ({min(kl):.3f} / {max(kl):.3f}) "
            f"| {statistics.median(zero):.3f} ({min(zero):.3f} / {max(zero):.3f}) "
            f"| {statistics.median(ratios(name, 'grpo_kl', 'wall_step_time')):.3f} / "
            f"{statistics.median(ratios(name, 'grpo_beta0', 'wall_step_time')):.3f} "
            f"| {statistics.mean(r['rounds'] for r in results[name]):.2f} "
            f"| {f'{statistics.mean(alphas):.2f}' if alphas else '-'} | {'n/a' if peak is None else f'{peak:.0f}'} |"
        )
    same = all(
        r["tokens"] == results["grpo_kl"][0]["tokens"] for n in ("grpo_kl", "grpo_beta0", "gpg") for r in results[n]
    )
    lines += [
        "",
        f"Same completions in grpo_kl, grpo_beta0 and gpg (identical token counts every step, every repetition): "
        f"{'yes' if same else 'no'}. gpg_beta_th generates {statistics.mean(r['rounds'] for r in results['gpg_beta_th']):.2f}"
        " rounds per step on average (the task's warm-started policy leaves many groups all-wrong).",
        "",
        "What differs per step: grpo_kl also runs the reference model over every generation batch and the KL term; "
        "grpo_beta0 and gpg share the policy's generation, forward and backward. gpg replaces TRL's clipped "
        "surrogate and its clip-ratio metrics by `-A * logp` with per-row weights, plus one all-gather of the "
        "completion masks per step. gpg_beta_th adds whole generation rounds (the cost of the threshold, not of the "
        "loss).",
    ]
    return harness.write_report(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
