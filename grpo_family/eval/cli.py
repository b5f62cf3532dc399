"""``python -m grpo_family.eval``: evaluate a model on benchmarks the way the papers do, or compare two evaluations.

    python -m grpo_family.eval --model outputs/grpo --dataset arithmetic --max_new_tokens 40
    python -m grpo_family.eval --model Qwen/Qwen2.5-Math-1.5B --dataset aime24 math500 --preset d3s --backend vllm
    python -m grpo_family.eval --compare outputs/eval/grpo-greedy outputs/eval/ms_grpo-greedy

Everything that can be checked is checked before the model loads (preset, model, datasets and their golds, k against
the samples, reward names); each failure names the fix. See ``docs/evaluation.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .data import BENCHMARKS, BUNDLED, load_eval_data
from .presets import PRESETS, EvalSetupError, get_preset

logger = logging.getLogger("grpo_family.eval")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m grpo_family.eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="a model folder, a training output folder, a LoRA adapter folder or a Hub id")
    p.add_argument("--dataset", "--dataset_name", nargs="+", dest="datasets", metavar="DATASET",
                   help=f"benchmarks ({', '.join(BENCHMARKS)}) or their Hub ids, NAME=FILE for a local copy of a "
                   f"benchmark, {BUNDLED!r} (the bundled task), reasoning_gym/<task>, local data files, Hub ids")  # fmt: skip
    p.add_argument("--preset", default="greedy", help=f"one of {', '.join(PRESETS)} (docs/evaluation.md)")
    g = p.add_argument_group("decoding (overrides the preset)")
    g.add_argument("--temperature", type=float)
    g.add_argument("--top_p", type=float)
    g.add_argument("--top_k", type=int)
    g.add_argument("--num_samples", type=int, help="samples per problem (n)")
    g.add_argument("--max_new_tokens", type=int, help="generation length (capped to the model's context)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed")
    m = p.add_argument_group("metrics and scoring")
    m.add_argument("--k", type=int, nargs="+", help="pass@k for these k (default: 1, the preset's, and n)")
    m.add_argument("--maj_k", type=int, nargs="+", help="maj@k for these k (default: n when n > 1)")
    m.add_argument(
        "--reward", help="reward function by name (default: math_accuracy; arithmetic for the bundled task)"
    )
    m.add_argument("--mode", default="eval", choices=("eval", "train"), help="the reward's scoring mode")
    m.add_argument("--threshold", type=float, default=1.0, help="a sample is correct when its reward is >= this")
    m.add_argument("--no_math_verify", action="store_true", help="skip math-verify's verdict beside ours")
    m.add_argument("--reward_timeout", type=float, default=600.0, help="seconds per reward call (0: none)")
    d = p.add_argument_group("data")
    d.add_argument("--limit", type=int, help="evaluate the first N problems of each dataset")
    d.add_argument("--split")
    d.add_argument("--config", help="dataset config (Hub builder configuration)")
    for flag in ("dataset_preset", "question_column", "answer_column", "solution_column", "options_column",
                 "system_prompt", "user_instruction"):  # fmt: skip
        d.add_argument(f"--{flag}", help="as in examples/train.py (grpo_family.collator.prepare_dataset)")
    d.add_argument("--task_difficulty", default="default", help="the bundled task's difficulty")
    b = p.add_argument_group("backend")
    b.add_argument("--backend", default="generate", choices=("generate", "vllm"))
    b.add_argument("--dtype", default="checkpoint", help="checkpoint (the saved dtype), float32, bfloat16, float16")
    b.add_argument("--batch_size", type=int, default=64, help="sequences per generate call (generate backend)")
    b.add_argument("--max_model_len", type=int, help="vLLM's context length")
    b.add_argument("--gpu_memory_utilization", type=float, help="vLLM's share of GPU memory")
    p.add_argument("--output_dir", help="default: <model folder>/eval-<preset>, or outputs/eval/<hub id>-<preset>")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two evaluation output folders")
    return p


def _output_dir(args, resolved) -> Path:
    """``--output_dir``, else ``eval-<preset>`` inside a local model folder, else ``outputs/eval/<hub id>-<preset>``."""
    if args.output_dir:
        return Path(args.output_dir)
    if os.path.isdir(os.path.expanduser(args.model)):
        return Path(os.path.expanduser(args.model)) / f"eval-{args.preset}"
    return Path("outputs") / "eval" / f"{args.model.replace('/', '--')}-{args.preset}"


def plan(args) -> dict:
    """Everything checkable before the model loads: the resolved model, datasets, decodings, ks and rewards."""
    from grpo_family.rewards import get_reward_funcs

    from .core import check_ks, default_ks
    from .models import resolve_model

    preset = get_preset(args.preset)
    if not args.model:
        raise EvalSetupError("Give --model (a model folder, a training output folder, a LoRA adapter or a Hub id).")
    if not args.datasets:
        raise EvalSetupError(f"Give --dataset: {', '.join(BENCHMARKS)}, {BUNDLED}, a data file or a Hub id.")
    resolved = resolve_model(args.model)
    overrides = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                 "num_samples": args.num_samples, "max_new_tokens": args.max_new_tokens}  # fmt: skip
    columns = {"preset": args.dataset_preset, "question_column": args.question_column,
               "answer_column": args.answer_column, "solution_column": args.solution_column,
               "options_column": args.options_column, "system_prompt": args.system_prompt,
               "user_instruction": args.user_instruction}  # fmt: skip
    jobs = []
    for spec in args.datasets:
        data = load_eval_data(spec, limit=args.limit, split=args.split, config=args.config, reward=args.reward,
                              difficulty=args.task_difficulty, **columns)  # fmt: skip
        decoding, headline = preset.resolve(len(data), **overrides)
        ks = args.k or default_ks(decoding, headline)
        maj_ks = args.maj_k if args.maj_k is not None else ([decoding.num_samples] if decoding.num_samples > 1 else [])
        check_ks([*ks, *maj_ks], decoding, f"dataset {data.name}")
        try:
            (reward,) = get_reward_funcs([data.reward])
        except ValueError as error:
            raise EvalSetupError(f"--reward: {error}") from None
        jobs.append({"data": data, "decoding": decoding, "headline": headline, "ks": ks, "maj_ks": maj_ks,
                     "reward": reward})  # fmt: skip
    return {"model": resolved, "preset": preset, "jobs": jobs}


def make_backend(args, resolved):
    """The generation backend, with the model loaded."""
    from .generation import GenerateBackend, VLLMBackend
    from .models import load_model, load_tokenizer

    if args.backend == "vllm":
        engine = {k: v for k, v in (("max_model_len", args.max_model_len),
                                    ("gpu_memory_utilization", args.gpu_memory_utilization)) if v is not None}  # fmt: skip
        path = resolved.path
        if resolved.adapter is not None:  # vLLM serves the merged weights
            import tempfile

            model, tokenizer = load_model(resolved, dtype="auto", device="cpu")
            path = tempfile.mkdtemp(prefix="grpo-family-eval-merged-")
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            del model
        return VLLMBackend(path, load_tokenizer(resolved.tokenizer), dtype=args.dtype, seed=args.seed, **engine)
    model, tokenizer = load_model(resolved, dtype="auto" if args.dtype == "checkpoint" else args.dtype)
    return GenerateBackend(model, tokenizer, batch_size=args.batch_size)


def run(args) -> dict:
    from .core import evaluate_data
    from .report import package_versions, results_markdown, write_results

    planned = plan(args)
    resolved = planned["model"]
    start = time.perf_counter()
    backend = make_backend(args, resolved)
    results = {
        "model": {"spec": args.model, "kind": resolved.kind, "path": resolved.path, "adapter": resolved.adapter},
        "preset": args.preset,
        "backend": args.backend,
        "mode": args.mode,
        "settings": {k: v for k, v in vars(args).items() if k != "compare"},
        "versions": package_versions(),
        "benchmarks": {},
    }
    problems = {}
    for job in planned["jobs"]:
        data = job["data"]
        result = evaluate_data(backend, data, job["decoding"], job["reward"], headline=job["headline"], ks=job["ks"],
                               maj_ks=job["maj_ks"], mode=args.mode, seed=args.seed, threshold=args.threshold,
                               math_verify=not args.no_math_verify, reward_timeout=args.reward_timeout or None)  # fmt: skip
        results["benchmarks"][data.name] = {"source": data.source, "dataset": data.settings,
                                            "decoding": asdict(job["decoding"]), "headline": list(job["headline"]),
                                            "ks": job["ks"], "maj_ks": job["maj_ks"], "scoring": result.scoring,
                                            "summary": result.summary}  # fmt: skip
        problems[data.name] = result.problems
        print(f"[eval] {data.name}: " + ", ".join(
            f"{k} {result.summary[k]:.3f}" for k in (*job["headline"], "mean_length") if k in result.summary))  # fmt: skip
    results["seconds"] = time.perf_counter() - start
    out = _output_dir(args, resolved)
    write_results(out, results, problems)
    print(results_markdown(results))
    print(f"[eval] wrote results.json, results.md and samples-*.jsonl to {out}")
    return results


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "WARNING").upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    try:
        if args.compare:
            from .report import compare, compare_markdown

            result = compare(*args.compare)
            text = compare_markdown(result)
            print(text)
            if args.output_dir:
                out = Path(args.output_dir)
                out.mkdir(parents=True, exist_ok=True)
                (out / "compare.json").write_text(json.dumps(result, indent=2))
                (out / "compare.md").write_text(text)
            return 0
        run(args)
    except EvalSetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
