"""D3S vs ``grpo``: policy forward+backward time, training-step time and memory at both ends of the schedule.

    python benchmarks/bench_d3s.py                        # CPU, G = 32, 2 prompts per step
    python benchmarks/bench_d3s.py --device cuda --model-size 0.5b --prompts 8

Three trainers on the same random-initialised Qwen2-architecture model, data, reward and config:

* ``grpo``      the base trainer (``GRPOFamilyTrainer``, TRL's maths, ``loss_type="dapo"``);
* ``d3s_start`` D3S pinned at the start of its schedule (p = 0): 8 of 32 rollouts per prompt, 5 % of tokens;
* ``d3s_end``   D3S pinned at the end (p = 1): 32 of 32 rollouts, 20 % of tokens.

The endpoints are pinned (``d3s_samples_start = d3s_samples_end``, same for the token ratio) so that every
measurement sits at one point of the schedule; a scheduled run moves linearly between the two.

Part A (the policy forward+backward, the part D3S shrinks): in one process, each trainer generates and scores one
generation batch through its own ``_prepare_inputs`` (so D3S's batch holds only its kept rows; the three batches
come from the same rollouts, as each trainer is seeded alike), then the three forward (``compute_loss``) +
backward passes are timed round-robin, ``--rounds`` times, so that load from other processes hits all three alike.
Ratio = median over rounds of (trainer / grpo in the same round). Memory: on CUDA the peak allocated during the
pass; on CPU, and also on CUDA, the activation memory autograd saves for the backward (the bytes of the distinct
tensors it keeps, via ``saved_tensors_hooks``), deterministic.

Part B (whole training steps): every (trainer, repetition) trains ``--steps + 1`` optimizer steps in a fresh
subprocess, in an order that rotates between repetitions (first step dropped as warm-up). Reported: TRL's
``step_time`` (generation + scoring + forward/backward + optimizer) and the peak memory (CUDA max allocated; on CPU
the peak RSS during ``train()`` (VmHWM, reset just before) minus the RSS before it: coarse, it includes generation,
the optimizer state and allocator caching). Writes ``benchmarks/results/d3s.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

MODEL_SIZES = {  # Qwen2 architectures, random-initialised: enough for throughput
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, max_position_embeddings=4096),
}  # fmt: skip

METHODS = {
    "grpo": {},
    "d3s_start": dict(d3s_samples_start=8, d3s_samples_end=8, d3s_token_ratio_start=0.05, d3s_token_ratio_end=0.05),
    "d3s_end": dict(d3s_samples_start=32, d3s_samples_end=32, d3s_token_ratio_start=0.2, d3s_token_ratio_end=0.2),
}


def digit_share_reward(completions, **kwargs):
    """Dense reward (share of digit characters): a random model's groups are not degenerate."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def build_trainer(name: str, model: str, options: dict):
    from trl import GRPOConfig

    from grpo_family import GRPOFamilyTrainer
    from grpo_family.tasks import make_arithmetic_dataset
    from grpo_family.trainers.d3s import D3SConfig, D3STrainer

    options = dict(options)
    device = options.pop("device")
    options.pop("threads")
    config_cls, trainer_cls = (GRPOConfig, GRPOFamilyTrainer) if name == "grpo" else (D3SConfig, D3STrainer)
    args = config_cls(use_cpu=device == "cpu", bf16=device == "cuda", **options, **METHODS[name])
    dataset = make_arithmetic_dataset("train", 500, seed=0)
    return trainer_cls(model=model, reward_funcs=[digit_share_reward], args=args, train_dataset=dataset)


# ------------------------------------------------------------------------------------------ part A: fwd+bwd
def saved_activation_bytes():
    """Context manager + counter: bytes of the distinct tensors autograd saves for the backward."""
    import torch

    seen, total = set(), [0]

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total[0] += key[1]
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), total


def interleaved_fwd_bwd(model: str, options: dict, rounds: int) -> dict:
    import torch

    device = options["device"]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    trainers, batches = {}, {}
    for name in METHODS:  # build + generate one after the other: each trainer seeds alike, so same rollouts
        trainer = build_trainer(name, model, options)
        trainer.state.max_steps, trainer.state.global_step = options["max_steps"], 0
        trainer.current_gradient_accumulation_steps = 1  # set by the training loop, read by TRL's loss
        trainer.model.train()
        batches[name] = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        trainers[name] = trainer
    out = {n: {"time": [], "rows": int(b["completion_mask"].any(1).sum())} for n, b in batches.items()}
    names = list(METHODS)
    for r in range(rounds + 1):  # round 0 is a warm-up
        for name in harness.rotation(names, r):
            trainer, inputs = trainers[name], batches[name]
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            hooks, saved = saved_activation_bytes()
            timer = harness.Timer(sync=sync)
            with hooks:
                loss = trainer.compute_loss(trainer.model, inputs)
            trainer.accelerator.backward(loss)
            timer.stop()
            trainer.model.zero_grad(set_to_none=True)
            if r:
                out[name]["time"].append(timer.wall)
                out[name]["saved_mib"] = saved[0] / 2**20
                if device == "cuda":
                    out[name]["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


# ------------------------------------------------------------------------------------------ part B: whole steps
def run_once(name: str, model: str, options: dict, queue) -> None:
    """One training run in this (fresh) process; puts its measurements on ``queue``."""
    import torch

    torch.set_num_threads(options["threads"])
    device = options["device"]
    trainer = build_trainer(name, model, options)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    reset = harness.reset_peak_rss()
    baseline = harness.rss_mib("VmRSS")
    trainer.train()
    # Peak RSS during train() only; without the reset, the process's lifetime peak.
    peak_rss = harness.rss_mib("VmHWM") if reset else harness.max_rss_mib()
    step_time = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
    queue.put(
        {
            "step": statistics.median(step_time),
            "step_min": min(step_time),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else peak_rss - baseline,
        }
    )


def spawn(name: str, model: str, options: dict) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=run_once, args=(name, model, dict(options), queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="part A: interleaved fwd+bwd rounds")
    parser.add_argument("--reps", type=int, default=2, help="part B: repetitions of each training run")
    parser.add_argument("--steps", type=int, default=2, help="part B: timed optimizer steps per run (+1 warm-up)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per optimizer step (G = 32 each)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model-size", default="small", choices=list(MODEL_SIZES))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a loaded shared CPU, multi-threaded ops wait for every thread to be "
        "scheduled, which makes the cost per op nearly size-independent and hides the effect of fewer rows)",
    )
    parser.add_argument("--output", default=str(harness.RESULTS / "d3s.md"))
    args = parser.parse_args(argv)

    import torch

    from grpo_family.tasks import build_tiny_model, build_tokenizer

    torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-d3s-"))
    tokenizer = build_tokenizer()
    model_dir = workdir / "model"
    build_tiny_model(tokenizer, seed=0, **MODEL_SIZES[args.model_size]).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    group = 32
    options = dict(
        output_dir=str(workdir / "out"),
        per_device_train_batch_size=args.prompts * group,
        num_generations=group,
        max_completion_length=args.new_tokens,
        max_steps=args.steps + 1,
        learning_rate=1e-5,
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        device=args.device,
        threads=args.threads,
    )
    names = list(METHODS)
    median = statistics.median

    part_a = interleaved_fwd_bwd(str(model_dir), options, args.rounds)
    print("part A: " + ", ".join(f"{n} {median(part_a[n]['time']):.3f}s" for n in names), flush=True)
    part_b: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in harness.rotation(names, rep):
            part_b[name].append(spawn(name, str(model_dir), options))
        print(f"part B rep {rep + 1}/{args.reps}: " + ", ".join(f"{n} {part_b[n][-1]['step']:.2f}s" for n in names))

    def spread(values):
        return f"{median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    cuda = args.device == "cuda"
    base_a = part_a["grpo"]
    lines = [
        "# D3S vs grpo: cost of a training step at both ends of the schedule",
        "",
        f"Command: `{harness.command_line(__file__, argv)}`",
        "",
        f"Machine: {harness.machine_line(torch=False)} ({args.threads} torch threads), device {args.device}; model "
        f"{args.model_size} (random init); {args.prompts} prompts x G = {group} "
        f"= {args.prompts * group} rollouts per step, {args.new_tokens} new tokens, beta 0, one micro-step per "
        "optimizer step. `d3s_start` / `d3s_end`: D3S pinned at p = 0 (8 of 32 rollouts, 5 % of tokens) / p = 1 "
        "(32 of 32, 20 %).",
        "",
        f"## A. Policy forward + backward on one generation batch ({args.rounds} interleaved rounds, same rollouts)",
        "",
        "| trainer | rows in the forward | fwd+bwd (s, median) | **fwd+bwd / grpo** (median of per-round ratios, "
        "min-max) | saved activations (MiB) | activations / grpo |" + (" CUDA peak (MiB) |" if cuda else ""),
        "|---|---|---|---|---|---|" + ("---|" if cuda else ""),
    ]
    for name in names:
        a = part_a[name]
        ratios = [t / b for t, b in zip(a["time"], base_a["time"])]
        row = (
            f"| {name} | {a['rows']} | {median(a['time']):.3f} | **{spread(ratios)}** | {a['saved_mib']:.1f} | "
            f"{a['saved_mib'] / base_a['saved_mib']:.3f} |"
        )
        lines.append(row + (f" {a['cuda_peak_mib']:.0f} |" if cuda else ""))
    memory = "CUDA max allocated" if cuda else "peak-RSS rise, coarse"
    lines += [
        "",
        f"## B. Whole training steps ({args.reps} interleaved repetitions x {args.steps} timed steps, fresh process "
        "each)",
        "",
        f"| trainer | step time (s, median) | step / grpo (median of per-rep ratios, min-max) | {memory} (MiB) | "
        "memory / grpo |",
        "|---|---|---|---|---|",
    ]
    base_b = part_b["grpo"]
    for name in names:
        b = part_b[name]
        lines.append(
            f"| {name} | {median(r['step'] for r in b):.3f} | "
            f"{spread([r['step'] / g['step'] for r, g in zip(b, base_b)])} | {median(r['peak_mib'] for r in b):.0f} | "
            f"{median(r['peak_mib'] / max(g['peak_mib'], 1e-9) for r, g in zip(b, base_b)):.2f} |"
        )
    lines += [
        "",
        "Generation, scoring and the optimizer step are the same work in every trainer (D3S does not reduce them, "
        "docs/methods/d3s.md §3), so the whole-step ratio is diluted by them. Timings on a shared CPU are noisy: part A "
        "interleaves the three passes round by round so that outside load hits them alike; part B's runs are minutes "
        "apart and vary more.",
    ]
    return harness.write_report(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
