"""Train a language model with any grpo_family method.

    accelerate launch examples/train.py --method ms_grpo                        # embedded default, offline
    accelerate launch examples/train.py --method grpo --config examples/recipes/ms_grpo_small.yaml
    accelerate launch examples/train.py --method cw_grpo \\
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main \\
        --reward_funcs math_accuracy --use_peft --lora_r 16

Arguments are parsed with TRL's ``TrlParser``: every ``GRPOConfig`` / ``TrainingArguments`` / ``ModelConfig`` /
``DatasetMixtureConfig`` flag works (what ``trl grpo`` takes; the README's "`trl grpo` vs `examples/train.py`" table),
plus the method's own config fields and the script arguments below. With no model and no dataset it trains the
bundled tiny model on the bundled arithmetic task (nothing is downloaded). Problems that can be known at start fail
before anything trains (``grpo_family.preflight``), with a message and no traceback: any error before training
starts is a refused input and prints as one line (a bare ``--debug`` shows its traceback); a refused run leaves no
empty output folder behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

# torch.distributed.elastic reads LOGLEVEL when transformers imports it and fails on anything but an upper-case level
# name (`LOGLEVEL=debug` was "ValueError: Unknown level"): a name is upper-cased here; any other value is kept from
# torch and checked in __main__ (grpo_family.launch.log_level, which also takes a number).
if os.environ.get("LOGLEVEL", "").strip().upper() in logging.getLevelNamesMapping():
    os.environ["LOGLEVEL"] = os.environ["LOGLEVEL"].strip().upper()
elif "LOGLEVEL" in os.environ:
    os.environ["_GRPO_FAMILY_LOGLEVEL"] = os.environ.pop("LOGLEVEL")

import torch
from transformers import AutoTokenizer, set_seed
from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser, get_peft_config

from grpo_family import METHODS, get_method
from grpo_family.bounds import Bound, OneOf, check_bounds
from grpo_family.errors import (
    DatasetFormatError,
    EvalSetupError,
    PreflightError,
    RewardFunctionError,
    RunFinishedError,
    UnlearnableRunError,
)
from grpo_family.eval import EvalData, EvaluationCallback
from grpo_family.integrations.vllm_cpu import shutdown_colocated_vllm
from grpo_family.launch import (
    check_config_keys,
    check_flags_apply,
    check_precision,
    given_flags,
    has_accelerator,
    load_config_file,
    log_level,
    stop_with_launcher,
)
from grpo_family.models import hub_id_of, record_hub_base, resolve_model
from grpo_family.preflight import split_module_names
from grpo_family.runtime.run_folder import OutputFolderLock, check_resume, json_ready, resolve_checkpoint
from grpo_family.tasks.plot import plot_training_curve

logger = logging.getLogger("grpo_family.train")


@dataclass
class TrainScriptArguments(ScriptArguments):
    """Script arguments on top of TRL's ``ScriptArguments`` (dataset_name, dataset_config, splits, ...); their bounds
    in ``grpo_family.bounds.SCRIPT_ARGUMENTS``, but for ``--method``, whose names the package root holds (a floor
    ``bounds`` may not import: ``docs/architecture.md`` §1)."""

    field_bounds: ClassVar[dict[str, Bound]] = {"method": OneOf(tuple(METHODS))}

    method: str = field(default="grpo", metadata={"help": f"Training method, one of: {', '.join(METHODS)}."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_accuracy"],
        metadata={
            "help": "Reward functions: grpo_family names (grpo_family.rewards.REWARD_FUNCS), trl grpo's names "
            "(accuracy_reward, think_format_reward, ...) or dotted import paths (my_pkg.rewards.my_reward); real "
            "datasets only."
        },
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A reward model (sequence classification, one label), scored before the reward functions."},
    )
    max_unreadable_golds: float = field(
        default=0.5,
        metadata={"help": "Fail at start when more than this fraction of gold answers cannot be read by a reward."},
    )
    dataset_preset: str = field(
        default="auto",
        metadata={
            "help": "Collator preset: auto, gsm8k, math, dapo, choice, qa, code, prompt or reasoning_gym (see "
            "grpo_family.collator)."
        },
    )
    question_column: str | None = field(default=None, metadata={"help": "Column holding the question."})
    answer_column: str | None = field(
        default=None, metadata={"help": "Column holding the gold answer (the test cases for the code preset)."}
    )
    solution_column: str | None = field(default=None, metadata={"help": "Column holding a reference solution."})
    options_column: str | None = field(default=None, metadata={"help": "Column holding multiple-choice options."})
    system_prompt: str | None = field(default=None, metadata={"help": "System prompt (collator default if unset)."})
    user_instruction: str | None = field(
        default=None,
        metadata={"help": "Text appended to the user turn after the question (e.g. GPG's step-by-step instruction)."},
    )
    dataset_filters: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keep only the training rows passing these column rules (grpo_family.collator.filter_rows): "
            'column -> allowed values, e.g. {"level": ["Level 3", "Level 4", "Level 5"]}, or a range, e.g. '
            '{"Year": {"min": 1997, "max": 2023}}. The kept-row count is logged; keeping 0 rows fails at start.'
        },
    )
    dataset_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "reasoning_gym/<task> datasets: the number of training problems (size, default 2000), the "
            'generator\'s seed (default 0) and the task\'s own options, e.g. {"size": 1000, "max_terms": 3} (JSON on '
            "the command line, a mapping in the YAML). The held-out split has num_eval_examples problems."
        },
    )
    num_eval_examples: int = field(default=200, metadata={"help": "Held-out examples scored before and after."})
    eval_max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Generation length for the held-out accuracy (max_completion_length if unset)."},
    )
    held_out_every: int = field(
        default=25,
        metadata={
            "help": "Also evaluate the held-out set every this many optimizer steps during training (0: only before and "
            "after). Greedy accuracy goes into the logs and the report_to backends as `held_out_accuracy` (and onto "
            "the plot), sampled pass@k / avg@n as `held_out/pass@k`, ... (grpo_family.eval.EvaluationCallback)."
        },
    )
    held_out_samples: int = field(
        default=0,
        metadata={
            "help": "Samples per held-out problem for pass@k / avg@n / maj@n at the training temperature, top_p and "
            "top_k (0: greedy accuracy only; the embedded default uses 4: pass@1 and pass@4)."
        },
    )
    task_difficulty: str = field(default="default", metadata={"help": "Bundled task difficulty (embedded default)."})


def _pre_parse(argv: list[str]) -> argparse.Namespace:
    """``--method``, ``--model_name_or_path`` and ``--dataset_name`` from the command line or the ``--config`` YAML,
    before the full parse (which needs the method's config class and the embedded default's settings)."""
    pre = argparse.ArgumentParser(add_help=False)
    for flag in ("--method", "--config", "--model_name_or_path", "--dataset_name"):
        pre.add_argument(flag, default=None)
    known, _ = pre.parse_known_args(argv)
    known.recipe = {}
    if known.config:
        known.recipe = recipe = load_config_file(known.config)  # a mapping without duplicate keys, or an error
        for key in ("method", "model_name_or_path", "dataset_name"):
            if getattr(known, key) is None:
                setattr(known, key, recipe.get(key))
    known.method = known.method or "grpo"
    get_method(known.method)  # unknown method -> ValueError listing the valid ones
    return known


def parse_args(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    known = _pre_parse(argv)
    config_cls, trainer_cls = get_method(known.method)
    parser = TrlParser((TrainScriptArguments, config_cls, ModelConfig, DatasetMixtureConfig))
    if known.config:
        check_config_keys(known.recipe, (action.dest for action in parser._actions), known.config)
    if not torch.cuda.is_available():
        # TRL defaults to bf16 and pinned memory, which a CPU-only machine rejects, and to gradient checkpointing,
        # which on a CPU recomputes every forward in the backward for memory a CPU rarely lacks (the real model's
        # backward: +40% CPU time; benchmarks/results/realmodel.md). Any of them can still be set.
        parser.set_defaults(bf16=False, dataloader_pin_memory=False, gradient_checkpointing=False)
    if not has_accelerator():  # CPU training arguments, so that a multi-process launch trains as one run (gloo)
        parser.set_defaults(use_cpu=True)
    embedded = known.model_name_or_path is None and known.dataset_name is None
    check_flags_apply(given_flags(argv, known.recipe), embedded)  # a flag the chosen path would ignore is refused
    if embedded:
        # Embedded default: the bundled task's tuned settings as defaults, before the config's own checks run (so
        # `--num_generations 16` is checked against the demo's batch of 64, not TRL's 8); the YAML and the command
        # line still win.
        from grpo_family.tasks import DEFAULT_GRPO_ARGS

        parser.set_defaults(**DEFAULT_GRPO_ARGS, output_dir=f"outputs/{known.method}", held_out_samples=4)
    script_args, training_args, model_args, mixture = parser.parse_args_and_config(argv)
    for config in (script_args, model_args, mixture):  # the method's config checked its own fields when built
        check_bounds(config)
    check_precision(training_args)
    # A YAML comma string ("q_proj, v_proj") is several module names, not one.
    model_args.lora_target_modules = split_module_names(model_args.lora_target_modules)
    script_args.mixture = mixture  # TRL's `datasets:` mixture (YAML), used instead of dataset_name when given
    if known.model_name_or_path is not None or known.dataset_name is not None:
        from grpo_family.preflight import resolve_reward_funcs

        resolve_reward_funcs(script_args.reward_funcs)  # an unknown name fails here, before any model or data loads
    return script_args, training_args, model_args, trainer_cls


def preflight(script_args, training_args, model_args) -> dict:
    """Every start-up check (``grpo_family.preflight``), before any model loads: what can be known now fails now,
    with the problem and the fix. Returns the raw data, the reward functions and the quantization config."""
    from grpo_family import preflight as checks
    from grpo_family.collator import filter_rows

    checks.check_vllm(training_args)
    checks.probe_judge(training_args)
    checks.check_judge_model(training_args)  # a transformers judge's model, before the policy loads
    checks.check_hub_reachable(training_args.push_to_hub)
    if model_args.model_name_or_path is None:  # the embedded default
        return {}
    model_args.hub_base = hub_id_of(model_args.model_name_or_path)  # what a saved adapter names as its base
    model_args.model_name_or_path = resolve_model(model_args.model_name_or_path)  # a local alias -> its checkpoint
    checks.check_model_path(model_args.model_name_or_path)
    if model_args.use_peft:  # each LoRA target must name a module of this model (read from its config, no weights)
        checks.check_lora_target_modules(
            model_args.model_name_or_path, model_args.lora_target_modules, revision=model_args.model_revision,
            trust_remote_code=bool(training_args.trust_remote_code),
        )  # fmt: skip
    checks.check_model_path(script_args.reward_model_name_or_path, "--reward_model_name_or_path")
    quantization_config = checks.check_quantization(model_args)
    reward_funcs = checks.resolve_reward_funcs(script_args.reward_funcs)
    mixture = getattr(script_args, "mixture", None)
    if mixture is not None and mixture.datasets:
        from trl import get_dataset

        if script_args.dataset_name:
            logger.warning("Both `datasets` and --dataset_name are given: the `datasets` mixture is used.")
        raw, name = get_dataset(mixture), ", ".join(d.path for d in mixture.datasets)
    elif script_args.dataset_name:
        name = script_args.dataset_name
        raw = checks.load_data(name, script_args.dataset_config, streaming=script_args.dataset_streaming,
                               options=script_args.dataset_options, eval_size=script_args.num_eval_examples)  # fmt: skip
    else:
        raise PreflightError("Give --dataset_name (or a `datasets:` mixture in the --config YAML).")
    train = filter_rows(checks.check_split(raw, script_args.dataset_train_split, name), script_args.dataset_filters,
                        name=f"{name} [{script_args.dataset_train_split}]")  # fmt: skip
    checks.check_enough_rows(train, training_args)  # fewer rows than one generation batch trains no step
    test = raw[script_args.dataset_test_split] if script_args.dataset_test_split in raw else None
    # A test split asked for by name (or needed by eval_strategy) must exist: held-out evaluation used to be skipped
    # silently. The default name, "test", is optional: data without it trains without held-out evaluation.
    if training_args.eval_strategy != "no" or script_args.dataset_test_split != "test":
        test = checks.check_split(raw, script_args.dataset_test_split, name)
    checks.check_gsm8k_markers(train, script_args.dataset_preset, script_args.answer_column)
    return dict(train=train, test=test, dataset_name=name, reward_funcs=reward_funcs,
                quantization_config=quantization_config)  # fmt: skip


def load_embedded_default(script_args, training_args):
    """The bundled tiny model (warm-started, cached on disk) and the bundled arithmetic task."""
    from grpo_family.tasks import DEFAULT_TRAIN_EXAMPLES, arithmetic_reward, load_warm_start, make_arithmetic_dataset

    model, tokenizer = load_warm_start(seed=0)
    difficulty = script_args.task_difficulty
    train = make_arithmetic_dataset("train", DEFAULT_TRAIN_EXAMPLES, seed=training_args.seed, difficulty=difficulty)
    evaluation = make_arithmetic_dataset("eval", script_args.num_eval_examples, seed=0, difficulty=difficulty)
    return model, tokenizer, train, evaluation, [arithmetic_reward]


def load_real(script_args, training_args, model_args, checked: dict):
    """A Hub (or local) model and the dataset ``preflight`` read, formatted by the collator, scored by the reward
    functions (and the reward model) it resolved."""
    from datasets import Dataset, IterableDataset

    from grpo_family.collator import prepare_dataset
    from grpo_family.preflight import check_gold_answers

    # trust_remote_code stays off (only architectures transformers itself ships are loaded) unless asked for with
    # --trust_remote_code (or trust_remote_code in --model_init_kwargs), which runs Python code from the model
    # repository; the tokenizer then follows the same choice.
    trust = bool(training_args.trust_remote_code) or bool(
        (training_args.model_init_kwargs or {}).get("trust_remote_code", False)
    )
    if trust:
        logger.warning("trust_remote_code: the model repository's own Python code will run on this machine.")
    training_args.model_init_kwargs = {
        **(training_args.model_init_kwargs or {}),
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        "trust_remote_code": trust,
    }
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision, trust_remote_code=trust
    )
    columns = dict(
        preset=script_args.dataset_preset,
        system_prompt=script_args.system_prompt,
        question_column=script_args.question_column,
        answer_column=script_args.answer_column,
        solution_column=script_args.solution_column,
        options_column=script_args.options_column,
        user_instruction=script_args.user_instruction,
    )
    train = prepare_dataset(checked["train"], **columns)
    evaluation = eval_dataset = None
    test = checked["test"]
    if test is not None:
        if isinstance(test, IterableDataset):  # a stream: the held-out set is its first rows
            head = Dataset.from_list(list(test.take(script_args.num_eval_examples)))
        else:
            head = test.select(range(min(len(test), script_args.num_eval_examples)))
        evaluation = prepare_dataset(head, **columns) if len(head) else None
        if training_args.eval_strategy != "no":  # TRL's evaluation during training, on the whole test split
            eval_dataset = prepare_dataset(test, **columns)
    reward_funcs = checked["reward_funcs"]
    # Unreadable golds: reported, or fail fast (a stream: judged on its first rows).
    sample = Dataset.from_list(list(train.take(1000))) if isinstance(train, IterableDataset) else train
    check_gold_answers(sample, reward_funcs, script_args.answer_column or "answer", script_args.max_unreadable_golds)
    if script_args.reward_model_name_or_path:
        reward_funcs = [script_args.reward_model_name_or_path, *reward_funcs]
    return model_args.model_name_or_path, tokenizer, train, evaluation, eval_dataset, reward_funcs


def _accuracy(metrics: dict | None) -> float | None:
    return None if metrics is None else metrics.get("held_out_accuracy")


def record_accuracy(state, accuracy: float | None, label: str) -> None:
    """The held-out accuracy after a run that trained no step (a finished run resumed) into the log history."""
    if accuracy is None:
        return
    state.log_history.append({"step": state.global_step, "held_out_accuracy": accuracy})
    print(f"[{label}] step {state.global_step}: held-out accuracy {accuracy:.3f}")


def skip_deepspeed_cpu_shm_op() -> None:
    """Under DeepSpeed on a CPU machine, keep DeepSpeed from JIT-compiling its shared-memory communication op (about
    2 minutes at the first launch): it then uses plain torch.distributed (gloo), which training needs anyway. Its
    compiled op also aborted a process at exit once ("terminate called without an active exception")."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true" or torch.cuda.is_available():
        return
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


TRAINING_STARTED = threading.Event()


def pop_debug_flag(argv: list[str]) -> bool:
    """Remove a bare ``--debug`` (no value: transformers' ``--debug <option>`` keeps its meaning) from ``argv``."""
    for i, arg in enumerate(argv):
        if arg == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            del argv[i]
            return True
    return False


def main(argv: list[str] | None = None) -> dict:
    skip_deepspeed_cpu_shm_op()  # before anything starts DeepSpeed
    script_args, training_args, model_args, trainer_cls = parse_args(argv)
    # One run per output folder: the main process holds the folder's lock until the run ends (a second run into it
    # is refused; a lock left by a killed run is taken over); every process learns the outcome.
    existed = Path(training_args.output_dir).exists()
    lock = OutputFolderLock(training_args.output_dir, is_main_process=training_args.process_index == 0)
    try:
        lock.acquire()
        return run(script_args, training_args, model_args, trainer_cls)
    finally:
        lock.release()
        if not existed and training_args.process_index == 0:
            with contextlib.suppress(OSError):  # a refused run leaves no empty folder; one that wrote keeps it
                os.rmdir(training_args.output_dir)


def save_trained(trainer, training_args, model_args) -> None:
    """Save the model (an adapter naming its base by the alias's Hub id, not this machine's cache path) and the
    trainer state (trainer_state.json: what examples/plot_logs.py reads)."""
    if getattr(model_args, "hub_base", None):
        record_hub_base(trainer.accelerator.unwrap_model(trainer.model), model_args.hub_base)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()


def run(script_args, training_args, model_args, trainer_cls) -> dict:
    set_seed(training_args.seed)
    has_data = script_args.dataset_name is not None or bool(getattr(script_args.mixture, "datasets", None))
    embedded = model_args.model_name_or_path is None and not has_data
    if not embedded and (model_args.model_name_or_path is None or not has_data):
        raise PreflightError("Give both --model_name_or_path and --dataset_name, or neither (embedded default).")
    # A checkpoint to resume must be of this method and batch layout; one that already reached the end is left alone.
    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if checkpoint is not None:
        try:
            check_resume(checkpoint, training_args, script_args.method, training_args.world_size, model_args.use_peft)
        except RunFinishedError as finished:
            print(f"[{script_args.method}] {finished}")
            return {"method": script_args.method, "finished": True}
        training_args.resume_from_checkpoint = checkpoint
    checked = preflight(script_args, training_args, model_args)
    eval_dataset, quantization_config = None, checked.get("quantization_config")
    if embedded:
        model, tokenizer, train, evaluation, reward_funcs = load_embedded_default(script_args, training_args)
    else:
        model, tokenizer, train, evaluation, eval_dataset, reward_funcs = load_real(
            script_args, training_args, model_args, checked
        )
    held_out_reward = next((f for f in reward_funcs if callable(f)), None)

    label = script_args.method
    held_out = EvaluationCallback(
        None if held_out_reward is None else EvalData.held_out(evaluation, held_out_reward),
        held_out_reward,
        every=script_args.held_out_every,
        max_new_tokens=script_args.eval_max_new_tokens or training_args.max_completion_length,
        num_samples=script_args.held_out_samples,
        temperature=training_args.temperature,
        top_p=training_args.top_p,
        top_k=training_args.top_k or 0,
        seed=training_args.seed,
        label=label,
        mode="train",  # held-out answers are scored under the contract the policy is trained on
    )
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        quantization_config=quantization_config,
        peft_config=get_peft_config(model_args),
        callbacks=[held_out],
    )
    held_out.bind(trainer)
    # Every process evaluates (under ZeRO-3 each holds a shard of every weight: all enter TRL's generation context,
    # which gathers them); the main process scores, and every process gets its numbers.
    held_out.initial = held_out.evaluate()
    results = {"method": label, "accuracy_before": _accuracy(held_out.initial), "held_out_before": held_out.initial}
    # `--resume_from_checkpoint <dir>` (or `true` for the latest in output_dir) continues an interrupted run.
    resume = training_args.resume_from_checkpoint
    TRAINING_STARTED.set()  # from here an error is the run's, not a refused input: it keeps its traceback
    trainer.train(resume_from_checkpoint=True if resume in ("true", "True") else resume)
    after = held_out.history.get(trainer.state.global_step)  # evaluated at the last step, inside training
    if after is None:  # no step trained now (a finished run resumed): evaluate here
        after = held_out.evaluate()
        record_accuracy(trainer.state, _accuracy(after), label)
    results.update(accuracy_after=_accuracy(after), held_out_after=after)

    save_trained(trainer, training_args, model_args)
    if trainer.accelerator.is_main_process:
        out = Path(training_args.output_dir)
        results = json_ready(results)  # plain numbers; an unscored (NaN) or missing score is null
        before, after = results["accuracy_before"], results["accuracy_after"]
        title = f"{label}: held-out accuracy {before:.3f} -> {after:.3f}" if None not in (before, after) else label
        plot_training_curve(trainer.state.log_history, out / "reward_curve.png", title)
        (out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=False))
        if None not in (before, after):
            print(f"[{label}] held-out accuracy: {before:.3f} before training, {after:.3f} after")
        print(f"[{label}] saved the model, trainer_state.json, reward_curve.png and results.json to {out}")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=checked.get("dataset_name", script_args.dataset_name))
    shutdown_colocated_vllm(trainer)  # before the process group goes: vLLM destroys its own groups first
    trainer.accelerator.end_training()  # trackers finished, process group destroyed before the interpreter exits
    return results


if __name__ == "__main__":
    stop_with_launcher()  # under `accelerate launch` / torchrun: stop when the launcher dies, never outlive it
    debug = pop_debug_flag(sys.argv)
    try:
        logging.basicConfig(level=log_level(os.environ.pop("_GRPO_FAMILY_LOGLEVEL", os.environ.get("LOGLEVEL"))))
        main()
    except (
        PreflightError,
        DatasetFormatError,
        UnlearnableRunError,
        RewardFunctionError,
        EvalSetupError,
    ) as error:  # the message says it all
        if debug:
            raise
        sys.exit(f"error: {error}")
    except Exception as error:  # before training: a refused input (TRL's or a config's own check), said in one line
        if debug or TRAINING_STARTED.is_set():
            raise
        sys.exit(f"error: {error} ({type(error).__name__}; --debug shows the traceback)")
