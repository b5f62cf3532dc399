"""Training-step time of every method as a ratio to stock ``trl.GRPOTrainer``, interleaved in one process.

    python benchmarks/speed.py                       # every method, embedded default, CPU
    python benchmarks/speed.py --methods grpo --reps 7 --steps 6
    python benchmarks/speed.py --device cuda --model-size 0.5b

Each repetition builds one trainer per method (stock TRL included) from the same model, data and config, and
trains it for ``--steps`` optimizer steps; the order of the methods rotates between repetitions so drift in the
machine's speed hits all of them alike. Per-step time is TRL's own ``step_time`` metric (generation + scoring
+ forward/backward + optimizer), the first step of each run dropped as warm-up. A method's figure is the median
over repetitions of (its step time / stock TRL's step time in the same repetition). Peak memory is reported on
CUDA only (``torch.cuda.max_memory_allocated``); CPU allocations are not tracked per run.
Writes ``benchmarks/results/speed.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

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
    # lr 0: every method samples exactly the same completions as stock TRL in the same repetition, so the ratio
    # measures each method's own cost rather than the lengths its diverging policy happens to generate.
    learning_rate=0.0,
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


def run_once(name: str, model: str, dataset, steps: int, device: str, workdir: Path, extra: dict) -> dict:
    config_cls, trainer_cls = (GRPOConfig, GRPOTrainer) if name == "stock_trl" else METHODS[name]
    args = config_cls(
        output_dir=str(workdir / name), max_steps=steps, use_cpu=device == "cpu", bf16=device == "cuda",
        **{**BASE_ARGS, **extra},
    )  # fmt: skip
    # The character-level tokenizer must be passed explicitly: from the path alone, AutoTokenizer would build
    # a Qwen2Tokenizer (model_type qwen2) that mangles this vocabulary.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    trainer = trainer_cls(
        model=model, reward_funcs=[arithmetic_reward], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    return {"step_time": statistics.median(step_times), "wall": wall, "peak_mib": peak}


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model-size", default="tiny", choices=["tiny", *MODEL_SIZES])
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient for every method (GPG needs 0)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "speed.md"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-speed-"))
    model = model_path(args.model_size, workdir)
    dataset = make_arithmetic_dataset("train", 2000, seed=0)
    names = ["stock_trl", *args.methods]
    results: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            results[name].append(
                run_once(name, model, dataset, args.steps + 1, args.device, workdir, {"beta": args.beta})
            )
        print(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{n} {results[n][-1]['step_time']:.3f}s" for n in names))

    lines = [
        "# Training-step time vs stock `trl.GRPOTrainer`",
        "",
        f"Command: `python benchmarks/speed.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip() + "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch "
        f"{torch.__version__}, device {args.device}, model {args.model_size}; {args.reps} interleaved repetitions "
        f"of {args.steps} timed steps (learning rate 0, so every method generates the same completions; batch {BASE_ARGS['per_device_train_batch_size']}, G="
        f"{BASE_ARGS['num_generations']}, {BASE_ARGS['max_completion_length']} new tokens, beta {args.beta}).",
        "",
        "| method | median step time (s) | ratio to stock TRL (median of per-rep ratios) | min / max ratio | peak MiB |",
        "|---|---|---|---|---|",
    ]
    stock = [r["step_time"] for r in results["stock_trl"]]
    for name in names:
        times = [r["step_time"] for r in results[name]]
        ratios = [t / s for t, s in zip(times, stock)]
        peak = results[name][-1]["peak_mib"]
        lines.append(
            f"| {name} | {statistics.median(times):.3f} | {statistics.median(ratios):.3f} | "
            f"{min(ratios):.3f} / {max(ratios):.3f} | {'n/a' if peak is None else f'{peak:.0f}'} |"
        )
    table = "\n".join(lines) + "\n"
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(table)
    print(table)
    return table


if __name__ == "__main__":
    main()
