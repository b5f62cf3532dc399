"""``python -m grpo_family.eval``: evaluate a model on benchmarks the way the papers do, or compare two evaluations.

    python -m grpo_family.eval --model outputs/grpo --dataset arithmetic --max_new_tokens 40
    python -m grpo_family.eval --model Qwen/Qwen2.5-Math-1.5B --dataset aime24 math500 --preset d3s --backend vllm
    python -m grpo_family.eval --compare outputs/eval/grpo-greedy outputs/eval/ms_grpo-greedy
    python -m grpo_family.eval --model outputs/ms_grpo_small --recipe examples/recipes/ms_grpo_small.yaml

Everything that can be checked is checked before the model loads: every option against its bound (declared once, in
:class:`EvalArguments`, and walked by tests/test_bounds.py like the training configs), preset, model and its weight
files, datasets and their golds, k against the samples, reward names, and the output folder (an evaluation never
writes into a folder that holds another command's results); each failure names the fix. See ``docs/evaluation.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import struct
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar

from grpo_family.bounds import BOUNDS, Bound, Flag, Float, Int, ListOf, OneOf, Text, check_bounds

from ..errors import BoundsError, EvalSetupError, PreflightError
from .data import BENCHMARKS, BUNDLED, load_eval_data
from .presets import PRESETS, get_preset

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
    d.add_argument("--dataset_options", help="reasoning_gym/<task>: its size, seed and options as JSON, as given to "
                   "examples/train.py (the same options give the same held-out problems)")  # fmt: skip
    b = p.add_argument_group("backend")
    b.add_argument("--backend", default="generate", choices=("generate", "vllm"))
    b.add_argument("--dtype", default="checkpoint", help="checkpoint (the saved dtype), float32, bfloat16, float16")
    b.add_argument("--batch_size", type=int, default=64, help="sequences per generate call (generate backend)")
    b.add_argument("--max_model_len", type=int, help="vLLM's context length")
    b.add_argument("--gpu_memory_utilization", type=float, help="vLLM's share of GPU memory")
    p.add_argument("--recipe", help="a training recipe (examples/recipes/*.yaml): its dataset, test split, columns, "
                   "system prompt, reward and (greedy) completion length, as the run trained and held out")  # fmt: skip
    p.add_argument("--output_dir", help="default: <model folder>/eval-<preset>, or outputs/eval/<hub id>-<preset>; "
                   "a folder holding another command's results gets an eval-<preset> subfolder")  # fmt: skip
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two evaluation output folders")
    return p


def _optional(name: str) -> Bound:
    """The training script's bound of ``name``, None allowed too (here None means "not given")."""
    return dataclasses.replace(BOUNDS[name], optional=True)


@dataclasses.dataclass
class EvalArguments:
    """The command line's options, one field per flag (the parser's ``dest``), with their bounds in ``field_bounds``:
    checked by :func:`grpo_family.bounds.check_bounds` right after parsing, and walked by tests/test_bounds.py like
    every training config. None means "not given" (the preset's or the dataset's value is used)."""

    model: str | None = None
    datasets: list[str] | None = None
    preset: str = "greedy"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    num_samples: int | None = None
    max_new_tokens: int | None = None
    seed: int = 0
    k: list[int] | None = None
    maj_k: list[int] | None = None
    reward: str | None = None
    mode: str = "eval"
    threshold: float = 1.0
    no_math_verify: bool = False
    reward_timeout: float = 600.0
    limit: int | None = None
    split: str | None = None
    config: str | None = None
    dataset_preset: str | None = None
    question_column: str | None = None
    answer_column: str | None = None
    solution_column: str | None = None
    options_column: str | None = None
    system_prompt: str | None = None
    user_instruction: str | None = None
    task_difficulty: str = "default"
    dataset_options: str | None = None
    backend: str = "generate"
    dtype: str = "checkpoint"
    batch_size: int = 64
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    recipe: str | None = None
    output_dir: str | None = None
    compare: list[str] | None = None

    field_bounds: ClassVar[dict[str, Bound]] = {
        "model": Text(nonempty=True, optional=True),
        "datasets": ListOf(Text(nonempty=True), min_items=1, optional=True),
        "preset": OneOf(tuple(PRESETS)),
        "temperature": Float(0, optional=True, hint="0 is greedy."),
        "top_p": Float(0, 1, min_open=True, optional=True),
        "top_k": Int(0, optional=True, hint="0 is off."),
        "num_samples": Int(1, optional=True),
        "max_new_tokens": Int(1, optional=True),
        "seed": BOUNDS["seed"],
        "k": ListOf(Int(1), min_items=1, optional=True, hint="pass@k needs k >= 1 samples."),
        "maj_k": ListOf(Int(1), min_items=1, optional=True),
        "reward": Text(nonempty=True, optional=True),
        "mode": OneOf(("eval", "train")),
        "threshold": Float(
            0,
            1,
            min_open=True,
            hint="A sample is correct when its reward is >= this; rewards "
            "score in [0, 1], so a threshold above 1 would count nothing correct.",
        ),  # fmt: skip
        "no_math_verify": Flag(),
        "reward_timeout": Float(0, hint="0 is no limit."),
        "limit": Int(1, optional=True, hint="Leave it out to evaluate every problem."),
        "split": Text(nonempty=True, optional=True),
        "config": _optional("dataset_config"),
        "dataset_preset": _optional("dataset_preset"),
        "question_column": BOUNDS["question_column"],
        "answer_column": BOUNDS["answer_column"],
        "solution_column": BOUNDS["solution_column"],
        "options_column": BOUNDS["options_column"],
        "system_prompt": BOUNDS["system_prompt"],
        "user_instruction": BOUNDS["user_instruction"],
        "task_difficulty": BOUNDS["task_difficulty"],
        "dataset_options": BOUNDS["dataset_options"],
        "backend": OneOf(("generate", "vllm")),
        "dtype": OneOf(("checkpoint", "auto", "float32", "bfloat16", "float16")),
        "batch_size": Int(1, hint="Sequences per generate call."),
        "max_model_len": Int(1, optional=True),
        "gpu_memory_utilization": Float(0, 1, min_open=True, optional=True),
        "recipe": Text(nonempty=True, optional=True),
        "output_dir": Text(nonempty=True, optional=True),
        "compare": ListOf(Text(nonempty=True), min_items=2, optional=True),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed options, each within its bound (:class:`~grpo_family.bounds.BoundsError` names every one that is
    not), with a ``--recipe``'s settings filled in where the command line gives none."""
    args = build_parser().parse_args(argv)
    check_bounds(EvalArguments(**vars(args)))
    if args.config is not None and (os.path.isfile(args.config) or args.config.endswith((".yaml", ".yml"))):
        raise EvalSetupError(
            f"--config {args.config}: --config is the dataset's Hub builder configuration (e.g. main for "
            "openai/gsm8k), not a file. To evaluate as a training recipe holds its data, give it as --recipe "
            f"{args.config}."
        )
    if args.recipe is not None:
        apply_recipe(args)
    return args


# recipe key -> this command's option (filled only where the command line gives none)
_RECIPE_KEYS = {"dataset_config": "config", "dataset_test_split": "split", "dataset_preset": "dataset_preset",
                "question_column": "question_column", "answer_column": "answer_column",
                "solution_column": "solution_column", "options_column": "options_column",
                "system_prompt": "system_prompt", "user_instruction": "user_instruction",
                "dataset_options": "dataset_options", "task_difficulty": "task_difficulty"}  # fmt: skip


def apply_recipe(args: argparse.Namespace) -> None:
    """A training recipe's data settings into ``args``: its ``dataset_name`` (when no --dataset), test split, builder
    config, columns, system prompt and instruction, dataset options, its reward when it names exactly one, and, for
    the greedy preset, its ``max_completion_length`` as the generation length (what the run was trained to write)."""
    from grpo_family.launch import load_config_file

    if not os.path.isfile(args.recipe):
        raise EvalSetupError(f"--recipe {args.recipe}: no such file. Give a training recipe (examples/recipes/).")
    try:
        recipe = load_config_file(args.recipe)
    except PreflightError as error:
        raise EvalSetupError(f"--recipe: {error}") from None
    if not recipe.get("dataset_name") and not recipe.get("method"):
        raise EvalSetupError(
            f"--recipe {args.recipe}: not a training recipe (it names neither method nor dataset_name)."
        )
    if args.datasets is None:
        if not recipe.get("dataset_name"):
            raise EvalSetupError(
                f"--recipe {args.recipe}: it names no dataset_name (a `datasets:` mixture has no single held-out "
                "set); give the benchmark with --dataset."
            )
        args.datasets = [recipe["dataset_name"]]
    for key, option in _RECIPE_KEYS.items():
        value = recipe.get(key)
        if value is not None and getattr(args, option) in (None, EvalArguments.__dataclass_fields__[option].default):
            if option == "dataset_options" and isinstance(value, dict):
                value = json.dumps(value)
            setattr(args, option, value)
    rewards = recipe.get("reward_funcs")
    rewards = [rewards] if isinstance(rewards, str) else rewards or []
    if args.reward is None and len(rewards) == 1:
        args.reward = rewards[0]
    if args.max_new_tokens is None and args.preset == "greedy" and recipe.get("max_completion_length"):
        args.max_new_tokens = int(recipe["max_completion_length"])
    check_bounds(EvalArguments(**vars(args)))


# Files that say a folder holds a run of another command (training: examples/train.py, a checkpoint, a saved model).
_OTHER_COMMANDS_FILES = ("trainer_state.json", "config.json", "model.safetensors", "adapter_config.json",
                         "training_args.bin", "run.json")  # fmt: skip


def other_commands_results(folder: Path) -> str | None:
    """What in ``folder`` belongs to another command (so an evaluation must not write there), or None."""
    if not folder.is_dir():
        return None
    results = folder / "results.json"
    if results.is_file():
        try:
            written = json.loads(results.read_text())
        except (OSError, ValueError):
            return "a results.json this command cannot read"
        if not (isinstance(written, dict) and "benchmarks" in written):
            return "the results.json of a training run (or of another command)"
    found = [name for name in _OTHER_COMMANDS_FILES if (folder / name).exists()]
    found += sorted(p.name for p in folder.glob("checkpoint-*"))[:1]
    return f"{found[0]} (a training run or a saved model)" if found else None


def _output_dir(args) -> Path:
    """``--output_dir``, else ``eval-<preset>`` inside a local model folder, else ``outputs/eval/<hub id>-<preset>``;
    a folder holding another command's results gets the ``eval-<preset>`` subfolder instead (said on stderr)."""
    if args.output_dir:
        out = Path(args.output_dir)
    elif os.path.isdir(os.path.expanduser(args.model)):
        out = Path(os.path.expanduser(args.model)) / f"eval-{args.preset}"
    else:
        out = Path("outputs") / "eval" / f"{args.model.replace('/', '--')}-{args.preset}"
    other = other_commands_results(out)
    if other is not None:
        inside = out / f"eval-{args.preset}"
        if other_commands_results(inside) is not None:
            raise EvalSetupError(
                f"--output_dir {out}: it holds {other}, and {inside} does too; an evaluation never writes over "
                "another command's results. Give an empty or new --output_dir."
            )
        print(f"[eval] {out} holds {other}: writing this evaluation into {inside} instead", file=sys.stderr)
        out = inside
    return out


def check_weight_files(folder: str, what: str) -> None:
    """Every ``*.safetensors`` in ``folder`` whole: its size is what its header says (8 bytes of header length, the
    header, then the tensors up to the largest end offset). A file cut short (an interrupted save or copy) is refused
    here, naming the file, instead of failing inside the loader with a raw message."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        size = path.stat().st_size
        expected = None
        try:
            with open(path, "rb") as f:
                (header_length,) = struct.unpack("<Q", f.read(8))
                if header_length <= size:
                    header = json.loads(f.read(header_length))
                    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
                    expected = 8 + header_length + max(ends, default=0)
        except (struct.error, ValueError, KeyError, TypeError, IndexError):
            expected = None
        if expected != size:
            says = "an unreadable header" if expected is None else f"{expected} bytes by its header"
            raise EvalSetupError(
                f"{what}: {path} is incomplete or damaged ({size} bytes on disk, {says}). The save or copy did not "
                "finish: copy the folder again, or evaluate another checkpoint-N."
            )


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
    for folder in (resolved.path, resolved.adapter):
        if folder is not None and os.path.isdir(folder):
            check_weight_files(folder, f"--model {args.model}")
    output_dir = _output_dir(args)
    overrides = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                 "num_samples": args.num_samples, "max_new_tokens": args.max_new_tokens}  # fmt: skip
    columns = {"preset": args.dataset_preset, "question_column": args.question_column,
               "answer_column": args.answer_column, "solution_column": args.solution_column,
               "options_column": args.options_column, "system_prompt": args.system_prompt,
               "user_instruction": args.user_instruction}  # fmt: skip
    jobs = []
    for spec in args.datasets:
        data = load_eval_data(spec, limit=args.limit, split=args.split, config=args.config, reward=args.reward,
                              difficulty=args.task_difficulty, dataset_options=args.dataset_options,
                              **columns)  # fmt: skip
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
    return {"model": resolved, "preset": preset, "jobs": jobs, "output_dir": output_dir}


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
        "command": "grpo_family.eval",
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
        decoding = job["decoding"]
        print(f"[eval] {data.name}: {len(data)} problems, {decoding.num_samples} sample(s) each, at most "
              f"{decoding.max_new_tokens or 'the context'} new tokens", file=sys.stderr)  # fmt: skip
        result = evaluate_data(backend, data, job["decoding"], job["reward"], headline=job["headline"], ks=job["ks"],
                               maj_ks=job["maj_ks"], mode=args.mode, seed=args.seed, threshold=args.threshold,
                               math_verify=not args.no_math_verify, reward_timeout=args.reward_timeout or None,
                               progress=True)  # fmt: skip
        results["benchmarks"][data.name] = {"source": data.source, "dataset": data.settings,
                                            "decoding": asdict(job["decoding"]), "headline": list(job["headline"]),
                                            "ks": job["ks"], "maj_ks": job["maj_ks"], "scoring": result.scoring,
                                            "summary": result.summary}  # fmt: skip
        problems[data.name] = result.problems
        print(f"[eval] {data.name}: " + ", ".join(
            f"{k} {result.summary[k]:.3f}" for k in (*job["headline"], "mean_length") if k in result.summary))  # fmt: skip
    results["seconds"] = time.perf_counter() - start
    out = planned["output_dir"]
    write_results(out, results, problems)
    print(results_markdown(results))
    print(f"[eval] wrote results.json, results.md and samples-*.jsonl to {out}")
    return results


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "WARNING").upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        args = parse_args(argv)
        if args.compare:
            from .report import compare, compare_markdown

            other = other_commands_results(Path(args.output_dir)) if args.output_dir else None
            if other is not None:  # compare.json beside a training run's files is not this command's place
                raise EvalSetupError(
                    f"--output_dir {args.output_dir}: it holds {other}; an evaluation never writes into another "
                    "command's folder. Give a new or empty --output_dir for the comparison."
                )
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
    except (EvalSetupError, BoundsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
