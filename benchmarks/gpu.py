"""The GPU check: every method of ``grpo_family.METHODS`` against stock ``trl.GRPOTrainer``, bf16, real model shapes.

    bash .ci/gpu run -- --output-dir DIR      # a lent GPU machine, offline: installs the prepared bundle, then this
    bash .ci/gpu                              # a CUDA machine with network: installs the package, then this
    python benchmarks/gpu.py --device cuda    # an environment that already holds everything
    python benchmarks/gpu.py --device cpu     # the dry run: the tiny shape, a step or two (tests/test_gpu_check.py)

Models are random-initialised from configurations written out below (SmolLM2-135M, Qwen2.5-0.5B, Qwen2.5-1.5B; no
download), in bf16, with the bundled character tokenizer padded to each model's vocabulary size (its embedding and
logits have their real shape). Every method trains ``--steps`` timed optimizer steps (after one warm-up step) with
``generate`` on the device, interleaved with stock ``trl.GRPOTrainer`` in the same process: in each repetition every
trainer runs once, the order rotating between repetitions. Rewards: the task's ``arithmetic_reward`` (zero on a random
model; SGPO's correctness reward) plus the share of digits in a completion, dense on random text, so that groups are
not degenerate and gradients flow. The learning rate is ``harness.FROZEN_LEARNING_RATE`` (1e-48: the bounds refuse 0;
every update rounds to nothing), so every trainer generates from the same weights, checked after each run.

Recorded per shape and trainer: the optimizer-step wall time (CUDA synchronised at both ends; generation, scoring,
forward, backward and optimizer step) and its ratio to stock TRL in the same repetition; tokens/s (TRL's own
``num_tokens`` count of prompt + completion tokens, per second of step time); peak memory
(``torch.cuda.max_memory_allocated``, reset before each trainer is built; n/a on CPU); whether every logged loss and
gradient norm is finite, and the largest gradient norm (it must be > 0: the step computed a gradient). ``grpo_ref``
is ``grpo`` at ``beta`` = ``--ref-beta`` (TRL then loads a reference model): GPG's memory, which needs no reference
model, is compared with it. One DeepSpeed ZeRO-3 run (``grpo``, the first shape) runs in a 1-process
``accelerate launch`` under ``accelerate_configs/zero3.yaml`` (CPU: ``zero3_cpu.yaml``); it is recorded as skipped
when DeepSpeed is not installed.

Time: ``--budget-s`` bounds the whole check. The ZeRO-3 run comes first, then one repetition of each shape, smallest
first, then further repetitions while time is left. A shape is skipped, and so recorded, when the time left is below
its estimated cost (its own repetition time once measured; before that the previous shape's, scaled by the square
root of the parameter ratio); a trainer is not started when the time left is below the longest run of its shape.

Writes ``gpu.md`` and ``gpu.json`` in ``--output-dir`` (default ``benchmarks/results``) after every repetition, so a
run stopped early leaves what it measured. Exit status 1 if a run failed or logged a non-finite loss or gradient.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after the environment's packages: grpo_family from the installed bundle, not the tree

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import grpo_family  # noqa: E402
from benchmarks import harness  # noqa: E402
from grpo_family import METHODS  # noqa: E402
from grpo_family.tasks import arithmetic_reward, build_tokenizer, make_arithmetic_dataset  # noqa: E402
from grpo_family.tasks.tiny_model import TINY_MODEL_DEFAULTS  # noqa: E402

STOCK = "stock_trl"
WITH_REF = "grpo_ref"  # grpo at beta > 0: TRL loads a reference model


@dataclass(frozen=True)
class Shape:
    model_type: str
    fields: dict
    vocab_size: int | None  # None: the bundled tokenizer's own (104 tokens)


# From each model's config.json on the Hub (written out: nothing is downloaded).
SHAPES = {
    "tiny": Shape("qwen2", TINY_MODEL_DEFAULTS, None),
    "smollm2-135m": Shape(
        "llama",
        dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
             tie_word_embeddings=True),
        49152,
    ),
    "qwen2.5-0.5b": Shape(
        "qwen2",
        dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True),
        151936,
    ),
    "qwen2.5-1.5b": Shape(
        "qwen2",
        dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
             num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True),
        151936,
    ),
}  # fmt: skip

DEFAULTS = {  # per device: what fits the GPU check's 8 minutes, and a dry run of well under a minute on 2 cores
    "cuda": dict(shapes=["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"], steps=3, reps=3, batch=64, generations=8,
                 completion_length=64, budget_s=400.0),
    "cpu": dict(shapes=["tiny"], steps=1, reps=1, batch=16, generations=8, completion_length=16, budget_s=None),
}  # fmt: skip


def digit_share_reward(completions, **kwargs) -> list[float]:
    """Share of digit characters: dense on a random model's text, so groups differ and gradients flow."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


REWARDS = [arithmetic_reward, digit_share_reward]


class Clock:
    """Seconds used and left of the check's budget (None: no budget)."""

    now = staticmethod(time.monotonic)

    def __init__(self, budget_s: float | None):
        self.start, self.budget_s = self.now(), budget_s

    def elapsed(self) -> float:
        return self.now() - self.start

    def left(self) -> float:
        return math.inf if self.budget_s is None else self.budget_s - self.elapsed()


def model_config(shape: str, tokenizer) -> AutoConfig:
    spec = SHAPES[shape]
    return AutoConfig.for_model(
        spec.model_type,
        vocab_size=len(tokenizer),
        bos_token_id=None,  # as the tokenizer (ChatML has none)
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **spec.fields,
    )


def shape_params(shape: str) -> int:
    """Parameter count of ``shape``, from a model built on the meta device (no memory, no time)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(shape, build_tokenizer(SHAPES[shape].vocab_size)))
    return sum(p.numel() for p in model.parameters())


def build_model_dir(shape: str, device: str, workdir: Path) -> tuple[str, int]:
    """A random-initialised bf16 model of ``shape`` and its tokenizer, saved (TRL loads its reference from the path).
    Returns the directory and the parameter count."""
    tokenizer = build_tokenizer(SHAPES[shape].vocab_size)
    config = model_config(shape, tokenizer)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: seconds for 1.5B parameters on a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, getattr(config, key))
    path = workdir / f"model-{shape}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    del model
    free_memory(device)
    return str(path), params


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def trainer_for(name: str, model_dir: str, args: argparse.Namespace, output_dir: Path, **overrides):
    """A trainer of ``name`` (a METHODS key, ``stock_trl`` or ``grpo_ref``) with the check's settings."""
    config_cls, trainer_cls = (
        (GRPOConfig, GRPOTrainer) if name == STOCK else METHODS["grpo" if name == WITH_REF else name]
    )
    settings = dict(
        output_dir=str(output_dir),
        max_steps=args.steps + 1,  # the first step is the warm-up
        per_device_train_batch_size=args.batch,
        num_generations=args.generations,
        max_completion_length=args.completion_length,
        learning_rate=harness.FROZEN_LEARNING_RATE,  # every trainer generates from the same weights (checked)
        beta=args.ref_beta if name == WITH_REF else 0.0,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        use_cpu=args.device == "cpu",
        bf16=True,
        model_init_kwargs={"dtype": "bfloat16"},
    )
    settings.update(overrides)
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=REWARDS,
        args=config_cls(**settings),
        train_dataset=make_arithmetic_dataset("train", 512, seed=0),
        # From the path alone AutoTokenizer would build a Qwen2Tokenizer that mangles this vocabulary.
        processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
    )
    trainer.remove_callback(PrinterCallback)  # the per-step log dicts; what matters is printed per run
    return trainer


def step_logs(trainer) -> list[dict]:
    return [e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e]


def summarise_logs(logs: list[dict], step_times: list[float]) -> dict:
    """Timed steps (the warm-up dropped), tokens per timed step from TRL's cumulative ``num_tokens``, and whether
    every logged loss and gradient norm is finite."""
    tokens = [e.get("num_tokens") for e in logs]
    per_step = [b - a for a, b in zip([0.0, *tokens[:-1]], tokens)] if None not in tokens else []
    losses = [e["loss"] for e in logs]
    grad_norms = [e["grad_norm"] for e in logs if "grad_norm" in e]
    return {
        "steps": len(logs),
        "step_times": step_times[1:],
        "tokens": per_step[1:],
        "losses": losses,
        "grad_norms": grad_norms,
        "finite": bool(losses) and all(math.isfinite(x) for x in losses + grad_norms),
        "max_grad_norm": max(grad_norms) if grad_norms else None,
    }


def run_once(name: str, model_dir: str, args: argparse.Namespace, workdir: Path) -> dict:
    """Build and train one trainer; its timings, token counts, log checks and peak memory, or its error."""
    free_memory(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    timer = harness.Timer()
    trainer = None
    try:
        trainer = trainer_for(name, model_dir, args, workdir / name)
        clock = harness.step_timer(wall=True, sync=torch.cuda.synchronize if args.device == "cuda" else None)
        trainer.add_callback(clock)
        frozen = harness.weights_digest(trainer.model)
        trainer.train()
        harness.check_frozen(frozen, trainer.model, name)
        result = summarise_logs(step_logs(trainer), clock.times)
        if len(result["step_times"]) != args.steps:
            raise RuntimeError(f"{len(result['step_times'])} timed steps ran, {args.steps} were asked for")
    except Exception as error:  # one failing trainer must not cost the rest of a lent machine's minutes
        result = {"error": "".join(traceback.format_exception_only(error)).strip()[-2000:]}
        traceback.print_exc()
    result["seconds"] = timer.wall
    if args.device == "cuda":
        result["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        result["base_mib"] = base
    del trainer
    free_memory(args.device)
    return result


def zero3_run(shape: str, model_dir: str, args: argparse.Namespace, workdir: Path, timeout: float) -> dict:
    """One ``grpo`` run under DeepSpeed ZeRO-3 in a 1-process ``accelerate launch`` (a fresh process: DeepSpeed's
    ZeRO-3 initialisation patches module construction for the rest of a process)."""
    try:
        import deepspeed
    except ImportError:
        return {"skipped": "DeepSpeed is not installed (pip install -e '.[deepspeed]'; the GPU bundle holds it)"}
    config = "zero3.yaml" if args.device == "cuda" else "zero3_cpu.yaml"
    result_file = workdir / "zero3.json"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "accelerate_configs" / config),
        "--num_processes", "1", "--main_process_port", str(29500 + os.getpid() % 1000),
        __file__, "--zero3-worker", "--model-dir", model_dir, "--result-file", str(result_file),
        "--device", args.device, "--steps", str(args.steps), "--batch", str(args.batch),
        "--generations", str(args.generations), "--completion-length", str(args.completion_length),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    timer = harness.Timer()
    # Its own process group: on a timeout the launcher's worker goes too, and with it its GPU memory.
    child = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    try:
        returncode = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return {"shape": shape, "error": f"timed out after {timeout:.0f} s", "deepspeed": deepspeed.__version__}
    result = {"shape": shape, "deepspeed": deepspeed.__version__, "seconds": timer.wall}
    if returncode != 0 or not result_file.exists():
        result["error"] = f"the ZeRO-3 launch exited with status {returncode} (its output is above)"
    else:
        result.update(json.loads(result_file.read_text()))
    return result


def zero3_worker(args: argparse.Namespace) -> None:
    """Inside the 1-process ZeRO-3 launch: train ``grpo`` and write what ``run_once`` records."""
    if args.device == "cpu":
        # DeepSpeed's CPU backend would JIT-compile a shared-memory op (minutes); gloo serves one process.
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # On CPU, DeepSpeed runs without bf16 (accelerate_configs/zero3_cpu.yaml): the weights load in float32.
    cpu = {"bf16": False, "model_init_kwargs": {"dtype": "float32"}} if args.device == "cpu" else {}
    trainer = trainer_for("grpo", args.model_dir, args, Path(args.result_file).parent / "zero3", **cpu)
    if not trainer.is_deepspeed_enabled:
        raise RuntimeError("the ZeRO-3 launch did not enable DeepSpeed")
    clock = harness.step_timer(wall=True, sync=torch.cuda.synchronize if args.device == "cuda" else None)
    trainer.add_callback(clock)
    trainer.train()
    result = summarise_logs(step_logs(trainer), clock.times)
    result["zero_stage"] = trainer.accelerator.state.deepspeed_plugin.zero_stage
    if args.device == "cuda":
        result["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if trainer.accelerator.is_main_process:
        Path(args.result_file).write_text(json.dumps(result))


def versions() -> dict:
    out = {"python": platform.python_version(), "grpo_family_from": str(Path(grpo_family.__file__).parent)}
    for name in ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "deepspeed", "grpo_family"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["cuda"] = torch.version.cuda
    return out


def device_name(device: str) -> str:
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    return f"CPU ({harness.machine_line(torch=False)})"


@dataclass
class ShapeRecord:
    params: int
    runs: dict[str, list[dict]] = field(default_factory=dict)  # trainer -> one entry per repetition it ran in
    rep_seconds: list[float] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def ratio_stats(record: ShapeRecord, name: str, key: str) -> tuple[float | None, float | None]:
    """(median over repetitions of the trainer's median per-step ``key``, median of its per-repetition ratio to stock
    TRL's); tokens are turned into tokens/s."""

    def value(run: dict) -> float | None:
        if "error" in run or not run.get("step_times"):
            return None
        if key == "tokens_per_s":
            return sum(run["tokens"]) / sum(run["step_times"]) if run["tokens"] else None
        return statistics.median(run["step_times"])

    own = [value(r) for r in record.runs.get(name, [])]
    stock = [value(r) for r in record.runs.get(STOCK, [])]
    mine = [v for v in own if v is not None]
    pairs = [a / b for a, b in zip(own, stock) if a is not None and b]
    return (statistics.median(mine) if mine else None), (statistics.median(pairs) if pairs else None)


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def peak(record: ShapeRecord, name: str) -> float | None:
    peaks = [r["peak_mib"] for r in record.runs.get(name, []) if r.get("peak_mib") is not None and "error" not in r]
    return max(peaks) if peaks else None


def render(report: dict, records: dict[str, ShapeRecord]) -> str:
    settings = report["settings"]
    lines = [
        "# GPU check: every method against stock `trl.GRPOTrainer`, bf16, real model shapes",
        "",
        f"Command: `{report['command']}`",
        f"Device: {report['device']}; {report['date']}; "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if k != "grpo_family_from"),
        f"Settings: {settings['steps']} timed step(s) after 1 warm-up per trainer, batch {settings['batch']} "
        f"completions (groups of {settings['generations']}), {settings['completion_length']} new tokens at most, "
        f"learning rate {harness.FROZEN_LEARNING_RATE:g} (weights checked unchanged), beta 0 (`{WITH_REF}`: {settings['ref_beta']}); up to {settings['reps']} interleaved "
        f"repetitions; {report['elapsed_s']:.0f} s of a {fmt(settings['budget_s'], '.0f')} s budget used.",
        "",
        "Step time: one optimizer step's wall time (generation, scoring, forward, backward, optimizer), median over "
        "the timed steps, then over repetitions; ratios are medians of per-repetition ratios to stock TRL. "
        "Tokens/s: TRL's `num_tokens` (prompt + completion) per second of step time. Peak memory: "
        "`torch.cuda.max_memory_allocated` of the run (n/a on CPU).",
    ]
    for shape, record in records.items():
        lines += [
            "",
            f"## {shape} ({record.params / 1e6:.1f}M parameters, {len(record.rep_seconds)} repetition(s))",
            "",
            "| trainer | step time (s) | ratio to stock | tokens/s | tokens/s ratio | peak memory (MiB) | memory ratio "
            "| losses and grad norms finite | largest grad norm | runs |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        stock_peak = peak(record, STOCK)
        for name, runs in record.runs.items():
            errors = [r["error"] for r in runs if "error" in r]
            step, step_ratio = ratio_stats(record, name, "step_time")
            speed, speed_ratio = ratio_stats(record, name, "tokens_per_s")
            mem = peak(record, name)
            ok = [r for r in runs if "error" not in r]
            grads = [r["max_grad_norm"] for r in ok if r["max_grad_norm"] is not None]
            lines.append(
                f"| {name} | {fmt(step)} | {fmt(step_ratio)} | {fmt(speed, '.0f')} | {fmt(speed_ratio)} "
                f"| {fmt(mem, '.0f')} | {fmt(mem / stock_peak if mem and stock_peak else None, '.2f')} "
                f"| {'yes' if ok and all(r['finite'] for r in ok) else 'NO'} | {fmt(max(grads) if grads else None, '.3g')} "
                f"| {len(ok)}{f', {len(errors)} failed: {errors[-1].splitlines()[-1][:120]}' if errors else ''} |"
            )
        gpg, ref = peak(record, "gpg"), peak(record, WITH_REF)
        if "gpg" in record.runs and WITH_REF in record.runs:
            lines += [
                "",
                f"GPG (beta 0, no reference model) peak {fmt(gpg, '.0f')} MiB; grpo at beta {settings['ref_beta']} "
                f"(reference model loaded) {fmt(ref, '.0f')} MiB; GPG / grpo_ref = "
                f"{fmt(gpg / ref if gpg and ref else None, '.2f')}.",
            ]
        lines += [f"- skipped: {reason}" for reason in record.skipped]
    zero3 = report["zero3"]
    lines += ["", "## DeepSpeed ZeRO-3 (1 process, `grpo`)", ""]
    if "skipped" in zero3 or "error" in zero3:
        lines.append(f"Not measured: {zero3.get('skipped') or zero3.get('error')}.")
    else:
        lines.append(
            f"Shape {zero3['shape']}, DeepSpeed {zero3['deepspeed']}, stage {zero3['zero_stage']}: median step time "
            f"{fmt(statistics.median(zero3['step_times']) if zero3['step_times'] else None)} s, peak memory "
            f"{fmt(zero3.get('peak_mib'), '.0f')} MiB, losses and grad norms finite: "
            f"{'yes' if zero3['finite'] else 'NO'}, largest grad norm {fmt(zero3['max_grad_norm'], '.3g')}, "
            f"{zero3['seconds']:.0f} s with the launch."
        )
    if report["skipped_shapes"]:
        lines += ["", "## Shapes skipped for time", ""]
        lines += [f"- {shape}: {reason}" for shape, reason in report["skipped_shapes"].items()]
    return "\n".join(lines) + "\n"


def write(report: dict, records: dict[str, ShapeRecord], output_dir: Path, clock: Clock) -> None:
    report["elapsed_s"] = clock.elapsed()
    report["shapes"] = {
        shape: {"params": r.params, "rep_seconds": r.rep_seconds, "skipped": r.skipped, "runs": r.runs}
        for shape, r in records.items()
    }
    harness.write_json(output_dir / "gpu.json", report)
    harness.write_report(output_dir / "gpu.md", render(report, records), echo=False)


def failures(report: dict) -> list[str]:
    """Runs that raised or logged a non-finite loss or gradient norm, or computed no gradient at all."""
    out = []
    for shape, data in report["shapes"].items():
        for name, runs in data["runs"].items():
            for run in runs:
                if "error" in run:
                    out.append(f"{shape}/{name}: {run['error'].splitlines()[-1]}")
                elif not run["finite"]:
                    out.append(f"{shape}/{name}: non-finite loss or gradient norm")
                elif not run["max_grad_norm"]:
                    out.append(f"{shape}/{name}: gradient norm 0 at every step")
    zero3 = report["zero3"]
    if "error" in zero3:
        out.append(f"zero3: {zero3['error']}")
    elif "skipped" not in zero3 and not zero3["finite"]:
        out.append("zero3: non-finite loss or gradient norm")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), help="default: the device's (see DEFAULTS)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--steps", type=int, help="timed optimizer steps per trainer (after one warm-up)")
    parser.add_argument("--reps", type=int, help="most interleaved repetitions per shape")
    parser.add_argument("--batch", type=int, help="completions per optimizer step")
    parser.add_argument("--generations", type=int, help="completions per prompt (G)")
    parser.add_argument("--completion-length", type=int, help="max new tokens")
    parser.add_argument("--budget-s", type=float, help="seconds for the whole check (default: cuda 400, cpu none)")
    parser.add_argument("--ref-beta", type=float, default=0.04, help=f"beta of {WITH_REF} (TRL's default 0.0)")
    parser.add_argument("--no-zero3", action="store_true", help="skip the DeepSpeed ZeRO-3 run")
    parser.add_argument("--output-dir", default=str(harness.RESULTS))
    parser.add_argument("--zero3-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hf_logging.disable_progress_bar()
    if args.zero3_worker:
        zero3_worker(args)
        return 0
    clock = Clock(args.budget_s)
    if args.device == "cpu":
        torch.set_num_threads(1)
    output_dir = Path(args.output_dir)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-gpu-"))
    report = {
        "command": harness.command_line(__file__, argv),
        "device": device_name(args.device),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "settings": {k: getattr(args, k) for k in ("steps", "reps", "batch", "generations", "completion_length")}
        | {"budget_s": args.budget_s, "ref_beta": args.ref_beta, "methods": args.methods},
        "zero3": {"skipped": "--no-zero3"},
        "skipped_shapes": {},
    }
    records: dict[str, ShapeRecord] = {}
    model_dirs: dict[str, str] = {}

    if not args.no_zero3:  # first: it is the one most likely to need a second look
        shape = args.shapes[0]
        model_dirs[shape], params = build_model_dir(shape, args.device, workdir)
        records[shape] = ShapeRecord(params)
        timeout = min(240.0, max(60.0, clock.left() / 3))
        report["zero3"] = zero3_run(shape, model_dirs[shape], args, workdir, timeout)
        print(f"ZeRO-3: {report['zero3']}")
        write(report, records, output_dir, clock)

    names = [STOCK, *args.methods] + ([WITH_REF] if "grpo" in args.methods else [])
    print(f"GPU check on {report['device']}: shapes {args.shapes}, trainers {names}", flush=True)
    last: tuple[int, float] | None = None  # (parameters, seconds of one repetition) of the last shape measured
    for rep in range(args.reps):
        for shape in args.shapes:
            if shape in report["skipped_shapes"]:
                continue
            if shape not in model_dirs:  # its first repetition
                params = shape_params(shape)
                guess = last[1] * math.sqrt(params / last[0]) if last else 0.0
                if clock.left() < guess:
                    report["skipped_shapes"][shape] = (
                        f"not started: {clock.left():.0f} s left, one repetition estimated at {guess:.0f} s "
                        f"({last[1]:.0f} s for {last[0] / 1e6:.0f}M parameters x sqrt of the parameter ratio)"
                    )
                    continue
                model_dirs[shape], params = build_model_dir(shape, args.device, workdir)
                records[shape] = ShapeRecord(params)
            record = records[shape]
            if record.rep_seconds and clock.left() < max(record.rep_seconds):
                record.skipped.append(
                    f"repetition {rep + 1}: {clock.left():.0f} s left, one took {max(record.rep_seconds):.0f} s"
                )
                continue
            start = clock.elapsed()
            for name in harness.rotation(names, rep):
                longest = max((r["seconds"] for runs in record.runs.values() for r in runs), default=0.0)
                if clock.left() < longest:
                    record.skipped.append(f"repetition {rep + 1}, {name} and after: {clock.left():.0f} s left")
                    break
                result = run_once(name, model_dirs[shape], args, workdir)
                record.runs.setdefault(name, []).append(result)
                brief = {k: v for k, v in result.items() if k not in ("losses", "grad_norms", "tokens")}
                print(f"{shape} repetition {rep + 1} {name}: {json.dumps(brief)}", flush=True)
            else:
                record.rep_seconds.append(clock.elapsed() - start)
                last = (record.params, max(record.rep_seconds))
            write(report, records, output_dir, clock)
    write(report, records, output_dir, clock)
    shutil.rmtree(workdir, ignore_errors=True)
    failed = failures(report)
    print(f"GPU check: {clock.elapsed():.0f} s; results in {output_dir}/gpu.md and gpu.json")
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
