"""Training-step time of every method as a ratio to stock ``trl.GRPOTrainer``, interleaved in one process.

    python benchmarks/speed.py                       # every method, embedded default, CPU
    python benchmarks/speed.py --methods grpo --reps 7 --steps 6
    python benchmarks/speed.py --device cuda --model-size 0.5b

Each repetition builds one trainer per method (stock TRL included) from the same model, data and config, and
trains it for ``--steps`` optimizer steps; the order of the methods rotates between repetitions so drift in the
machine's speed hits all of them alike. Per-step time is TRL's own ``step_time`` metric (generation + scoring
+ forward/backward + optimizer), the first step of each run dropped as warm-up. A method's figure is the median
over repetitions of (its step time / stock TRL's step time in the same repetition). On a shared machine wall-clock
time drifts with other jobs, so the process CPU time of each step (one torch thread by default on CPU, ``--threads``)
is reported beside it: it moves much less with the machine's load. Peak memory: on CUDA
``torch.cuda.max_memory_allocated`` per run; on CPU the peak resident set size of the process during the run
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``) minus the resident size before the trainer was
built, i.e. what the run itself added (model copies, activations, optimizer state), measured in a fresh
subprocess per method (``--steps`` steps) because memory freed by an earlier run in the same process is reused. Both are given as ratios to stock TRL in the same repetition.
Writes ``benchmarks/results/speed.md``: only what the run measured, plus a summary computed from those numbers.
A reading written for one run goes in a separate, dated note (``benchmarks/results/speed_reading.md``) that names
the run it reads. Work per step (forwards, backwards, host syncs) is counted exactly by ``benchmarks/compute.py``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from benchmarks import harness  # noqa: E402
from grpo_family import METHODS  # noqa: E402
from grpo_family.tasks import arithmetic_reward, load_warm_start, make_arithmetic_dataset  # noqa: E402

MODEL_SIZES = {  # Qwen2.5 architectures, random-initialised: enough for throughput
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, max_position_embeddings=4096),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, max_position_embeddings=4096),
}  # fmt: skip

BASE_ARGS = dict(
    per_device_train_batch_size=32,
    num_generations=8,
    max_completion_length=48,
    # Weights that never move: every method samples exactly the same completions as stock TRL in the same
    # repetition, so the ratio measures each method's own cost rather than the lengths its diverging policy happens
    # to generate. Not 0, which the bounds refuse: a rate whose update rounds to nothing (harness.FROZEN_LEARNING_RATE,
    # derivation there), checked after every run (harness.check_frozen).
    learning_rate=harness.FROZEN_LEARNING_RATE,
    beta=0.0,
    temperature=1.0,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    disable_tqdm=True,
    seed=0,
)


def model_path(size: str, workdir: Path) -> str:
    """A model directory on disk (TRL builds its reference model from the path)."""
    if size == "tiny":
        model, tokenizer = load_warm_start(seed=0)
    else:
        from grpo_family.tasks import build_tiny_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, seed=0, **MODEL_SIZES[size])
    path = workdir / f"model-{size}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def make_config(name: str, steps: int, device: str, workdir: Path, extra: dict):
    """The config of one run of ``name`` (a ``METHODS`` key or ``stock_trl``): ``BASE_ARGS``, then ``extra``."""
    config_cls = GRPOConfig if name == "stock_trl" else METHODS[name][0]
    return config_cls(
        output_dir=str(workdir / name), max_steps=steps, use_cpu=device == "cpu", bf16=device == "cuda",
        **{**BASE_ARGS, **extra},
    )  # fmt: skip


def run_once(name: str, model: str, dataset, steps: int, device: str, workdir: Path, extra: dict) -> dict:
    gc.collect()
    baseline, reset = harness.rss_mib("VmRSS"), harness.reset_peak_rss()
    trainer_cls = GRPOTrainer if name == "stock_trl" else METHODS[name][1]
    args = make_config(name, steps, device, workdir, extra)
    # The character-level tokenizer must be passed explicitly: from the path alone, AutoTokenizer would build
    # a Qwen2Tokenizer (model_type qwen2) that mangles this vocabulary.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    trainer = trainer_cls(
        model=model, reward_funcs=[arithmetic_reward], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    cpu_time = harness.step_timer()  # process CPU seconds of each step, beside TRL's wall-clock step_time
    trainer.add_callback(cpu_time)
    frozen = args.learning_rate == harness.FROZEN_LEARNING_RATE
    before = harness.weights_digest(trainer.model) if frozen else None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with harness.Timer() as run:
        trainer.train()
    step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        high = harness.rss_mib("VmHWM") if reset else None
        peak = None if high is None or baseline is None else high - baseline
    if frozen:  # after the measurements: the check's copies are not counted
        harness.check_frozen(before, trainer.model, name)
    del trainer
    return {
        "step_time": statistics.median(step_times),
        "cpu_time": statistics.median(cpu_time.times[1:]),
        "wall": run.wall,
        "peak_mib": peak,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model-size", default="tiny", choices=["tiny", *MODEL_SIZES])
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)  # internal: fresh-process memory run
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (1: CPU time ~ busy time)")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient for every method (GPG needs 0)")
    parser.add_argument("--output", default=str(harness.RESULTS / "speed.md"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-speed-"))
    model = args.model_dir or model_path(args.model_size, workdir)
    dataset = make_arithmetic_dataset("train", 2000, seed=0)
    if args.memory_of:
        run = run_once(args.memory_of, model, dataset, args.steps + 1, args.device, workdir, {"beta": args.beta})
        print("PEAK_MIB", run["peak_mib"])
        return ""
    names = ["stock_trl", *args.methods]
    results: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in harness.rotation(names, rep):
            results[name].append(
                run_once(name, model, dataset, args.steps + 1, args.device, workdir, {"beta": args.beta})
            )
        print(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{n} {results[n][-1]['cpu_time']:.3f}s CPU" for n in names))

    if args.device == "cpu":  # peak memory from one fresh process per method (see the module docstring)
        for name in names:
            child = subprocess.run(
                [sys.executable, __file__, "--memory-of", name, "--model-dir", model, "--steps", str(args.steps)]
                + ["--threads", str(args.threads), "--beta", str(args.beta)],
                capture_output=True,
                text=True,
                check=True,
            )
            peak = float(child.stdout.rsplit("PEAK_MIB", 1)[1].split()[0])
            for run in results[name]:
                run["peak_mib"] = peak

    lines = [
        "# Training-step time vs stock `trl.GRPOTrainer`",
        "",
        f"Command: `{harness.command_line(__file__, argv)}`",
        f"Machine: {harness.machine_line()}, device {args.device}, model {args.model_size}; {args.reps} interleaved "
        f"repetitions of {args.steps} timed steps (learning rate {BASE_ARGS['learning_rate']:g}, which leaves the "
        "weights unchanged (checked after every run), so every method generates the same completions; batch "
        f"{BASE_ARGS['per_device_train_batch_size']}, G={BASE_ARGS['num_generations']}, "
        f"{BASE_ARGS['max_completion_length']} new tokens, beta {args.beta}).",
        "",
        "| method | median step wall time (s) | wall ratio to stock TRL (median of per-rep ratios) | min / max "
        "| median step CPU time (s) | CPU-time ratio (median) | min / max | peak memory (MiB) | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def ratios(name: str, key: str) -> list[float]:
        return [r[key] / s[key] for r, s in zip(results[name], results["stock_trl"])]

    for name in names:
        wall, cpu = ratios(name, "step_time"), ratios(name, "cpu_time")
        peaks = [r["peak_mib"] for r in results[name]]
        stock_peaks = [r["peak_mib"] for r in results["stock_trl"]]
        if None in peaks or None in stock_peaks:
            memory = "n/a | n/a"
        else:
            memory = (
                f"{statistics.median(peaks):.0f} | {statistics.median(p / s for p, s in zip(peaks, stock_peaks)):.2f}"
            )
        lines.append(
            f"| {name} | {statistics.median(r['step_time'] for r in results[name]):.3f} | {statistics.median(wall):.3f} "
            f"| {min(wall):.3f} / {max(wall):.3f} | {statistics.median(r['cpu_time'] for r in results[name]):.3f} "
            f"| {statistics.median(cpu):.3f} | {min(cpu):.3f} / {max(cpu):.3f} | {memory} |"
        )
    lines += [
        "",
        f"Threads: {torch.get_num_threads()} torch thread(s). Load average when the run ended: "
        f"{', '.join(f'{x:.1f}' for x in harness.load_average())}. Peak memory: "
        + (
            "`torch.cuda.max_memory_allocated` per run."
            if args.device == "cuda"
            else "peak resident set size of a fresh process during a run of each method minus its size before the "
            "trainer was built (what the run added)."
        ),
    ]
    # Only what this run produced: a summary computed from its own numbers. Readings written by hand for a given
    # run live in speed_reading.md, which names the run it reads and is not touched here.
    methods = [name for name in names if name != "stock_trl"]
    if methods:
        medians = [statistics.median(ratios(name, "cpu_time")) for name in methods]
        per_rep = [ratio for name in methods for ratio in ratios(name, "cpu_time")]
        lines += [
            "",
            f"From this run: median CPU-time ratios to stock TRL {min(medians):.2f}-{max(medians):.2f}; the "
            f"per-repetition ratios of the methods span {min(per_rep):.2f}-{max(per_rep):.2f}, so differences "
            "smaller than that spread are not resolved by this table.",
        ]
    return harness.write_report(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
