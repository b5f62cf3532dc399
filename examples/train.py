"""Train a language model with any grpo_family method.

    accelerate launch examples/train.py --method ms_grpo                        # embedded default, offline
    accelerate launch examples/train.py --method grpo --config examples/recipes/ms_grpo_small.yaml
    accelerate launch examples/train.py --method cw_grpo \\
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main \\
        --reward_funcs math_accuracy --use_peft --lora_r 16

Arguments are parsed with TRL's ``TrlParser``: every ``GRPOConfig`` / ``TrainingArguments`` / ``ModelConfig``
flag works, plus the method's own config fields and the script arguments below. With no model and no dataset
it trains the bundled tiny model on the bundled arithmetic task (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, TrainerCallback, set_seed
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.models import unwrap_model_for_generation

from grpo_family import METHODS, get_method

logger = logging.getLogger("grpo_family.train")
# transformers 5 renamed gradient checkpointing to activation checkpointing; TRL 1.16 still uses the old names, so
# every run would print four deprecation notices that are not the user's to act on.
warnings.filterwarnings("ignore", message=r"`\w*gradient_checkpointing\w*` is deprecated", category=FutureWarning)


@dataclass
class TrainScriptArguments(ScriptArguments):
    """Script arguments on top of TRL's ``ScriptArguments`` (dataset_name, dataset_config, splits, ...)."""

    method: str = field(default="grpo", metadata={"help": f"Training method, one of: {', '.join(METHODS)}."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_accuracy"],
        metadata={"help": "Reward functions by name (see grpo_family.rewards.REWARD_FUNCS); real datasets only."},
    )
    dataset_preset: str = field(
        default="auto",
        metadata={
            "help": "Collator preset: auto, gsm8k, math, dapo, choice, qa, code or prompt (see grpo_family.collator)."
        },
    )
    question_column: str | None = field(default=None, metadata={"help": "Column holding the question."})
    answer_column: str | None = field(
        default=None, metadata={"help": "Column holding the gold answer (the test cases for the code preset)."}
    )
    solution_column: str | None = field(default=None, metadata={"help": "Column holding a reference solution."})
    options_column: str | None = field(default=None, metadata={"help": "Column holding multiple-choice options."})
    system_prompt: str | None = field(default=None, metadata={"help": "System prompt (collator default if unset)."})
    num_eval_examples: int = field(default=200, metadata={"help": "Held-out examples scored before and after."})
    eval_max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Generation length for the held-out accuracy (max_completion_length if unset)."},
    )
    held_out_every: int = field(
        default=25,
        metadata={
            "help": "Also score the held-out set every this many optimizer steps during training (0: only before and "
            "after). The scores go into the logs as `held_out_accuracy` and onto the plot."
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
    if known.config:
        import yaml

        with open(known.config) as f:
            recipe = yaml.safe_load(f) or {}
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
    parser = TrlParser((TrainScriptArguments, config_cls, ModelConfig))
    if not torch.cuda.is_available():  # TRL defaults to bf16 and pinned memory, which a CPU-only machine rejects
        parser.set_defaults(bf16=False, dataloader_pin_memory=False)
    if known.model_name_or_path is None and known.dataset_name is None:
        # Embedded default: the bundled task's tuned settings as defaults, before the config's own checks run (so
        # `--num_generations 16` is checked against the demo's batch of 64, not TRL's 8); the YAML and the command
        # line still win.
        from grpo_family.tasks import DEFAULT_GRPO_ARGS

        parser.set_defaults(**DEFAULT_GRPO_ARGS, output_dir=f"outputs/{known.method}")
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if known.model_name_or_path is not None or known.dataset_name is not None:
        from grpo_family.rewards import get_reward_funcs

        get_reward_funcs(script_args.reward_funcs)  # an unknown name fails here, before any model or data loads
    return script_args, training_args, model_args, trainer_cls


def load_embedded_default(script_args, training_args):
    """The bundled tiny model (warm-started, cached on disk) and the bundled arithmetic task."""
    from grpo_family.tasks import DEFAULT_TRAIN_EXAMPLES, arithmetic_reward, load_warm_start, make_arithmetic_dataset

    model, tokenizer = load_warm_start(seed=0)
    difficulty = script_args.task_difficulty
    train = make_arithmetic_dataset("train", DEFAULT_TRAIN_EXAMPLES, seed=training_args.seed, difficulty=difficulty)
    evaluation = make_arithmetic_dataset(
        "eval", script_args.num_eval_examples, seed=0, difficulty=script_args.task_difficulty
    )
    return model, tokenizer, train, evaluation, [arithmetic_reward]


def load_real(script_args, training_args, model_args):
    """A Hub (or local) model and dataset, formatted by the collator, scored by named reward functions."""
    from datasets import load_dataset

    from grpo_family.collator import prepare_dataset
    from grpo_family.rewards import check_golds, get_reward_funcs

    # trust_remote_code stays off (only architectures transformers itself ships are loaded) unless asked for with
    # trust_remote_code set in --model_init_kwargs (a JSON dict; TRL's ModelConfig has no flag for it), which runs
    # Python code from the model repository; the tokenizer then follows the same choice.
    trust = bool((training_args.model_init_kwargs or {}).get("trust_remote_code", False))
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
    raw = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    columns = dict(
        preset=script_args.dataset_preset,
        system_prompt=script_args.system_prompt,
        question_column=script_args.question_column,
        answer_column=script_args.answer_column,
        solution_column=script_args.solution_column,
        options_column=script_args.options_column,
    )
    train = prepare_dataset(raw[script_args.dataset_train_split], **columns)
    evaluation = None
    if script_args.dataset_test_split in raw:
        test = raw[script_args.dataset_test_split]
        evaluation = prepare_dataset(test.select(range(min(len(test), script_args.num_eval_examples))), **columns)
    check_golds(train, get_reward_funcs(script_args.reward_funcs))  # unreadable golds: reported, or fail fast
    return model_args.model_name_or_path, tokenizer, train, evaluation, get_reward_funcs(script_args.reward_funcs)


def held_out_accuracy(model, tokenizer, dataset, reward_func, max_new_tokens: int) -> float:
    """Mean reward of greedy completions on the held-out set (unscorable rows excluded)."""
    from grpo_family.tasks import generate_completions

    completions = generate_completions(model, tokenizer, list(dataset["prompt"]), max_new_tokens=max_new_tokens)
    columns = {c: list(dataset[c]) for c in dataset.column_names if c != "prompt"}
    scores = [
        s for s in reward_func(completions=completions, prompts=list(dataset["prompt"]), **columns) if s is not None
    ]
    return sum(scores) / max(1, len(scores))


class HeldOutAccuracy(TrainerCallback):
    """Scores the held-out set every ``every`` steps (main process) into the log history as `held_out_accuracy`;
    the score before training (``initial``) goes in at step 0 (``train()`` starts a new log history)."""

    def __init__(self, score, every: int, label: str):
        self.score, self.every, self.label, self.initial = score, every, label, None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            record_accuracy(state, self.initial, self.label)

    def on_step_end(self, args, state, control, **kwargs):
        if self.every and state.global_step % self.every == 0 and state.global_step < state.max_steps:
            record_accuracy(state, self.score(), self.label)


def record_accuracy(state, accuracy: float | None, label: str) -> None:
    if accuracy is None:
        return
    state.log_history.append({"step": state.global_step, "held_out_accuracy": accuracy})
    tqdm.write(f"[{label}] step {state.global_step}: held-out accuracy {accuracy:.3f}")  # keeps the progress bar


def plot_rewards(log_history: list[dict], path: Path, title: str) -> None:
    """Training reward (raw, faint; smoothed, bold) and held-out accuracy (markers) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards = [(h["step"], h["reward"]) for h in log_history if "reward" in h]
    accuracy = [(h["step"], h["held_out_accuracy"]) for h in log_history if "held_out_accuracy" in h]
    if not rewards and not accuracy:
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    if rewards:
        steps, values = zip(*rewards)
        window = max(1, len(values) // 10)
        smooth = [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
                  for i in range(len(values))]  # fmt: skip
        ax.plot(steps, values, color="tab:blue", alpha=0.3, linewidth=1, label="training reward")
        ax.plot(steps, smooth, color="tab:blue", linewidth=2.5, label=f"training reward, mean of {window} logs")
    if accuracy:
        steps, values = zip(*accuracy)
        ax.plot(steps, values, color="tab:red", marker="o", linewidth=1.5, label="held-out greedy accuracy")
        for step, value in (accuracy[0], accuracy[-1]):
            ax.annotate(f"{value:.2f}", (step, value), textcoords="offset points", xytext=(0, 7), ha="center")
    ax.set(xlabel="optimizer step", ylabel="reward / accuracy", title=title, ylim=(0, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    script_args, training_args, model_args, trainer_cls = parse_args(argv)
    set_seed(training_args.seed)
    embedded = model_args.model_name_or_path is None and script_args.dataset_name is None
    if embedded:
        model, tokenizer, train, evaluation, reward_funcs = load_embedded_default(script_args, training_args)
    elif model_args.model_name_or_path is None or script_args.dataset_name is None:
        raise ValueError("Give both --model_name_or_path and --dataset_name, or neither (embedded default).")
    else:
        model, tokenizer, train, evaluation, reward_funcs = load_real(script_args, training_args, model_args)

    label = script_args.method
    max_new_tokens = script_args.eval_max_new_tokens or training_args.max_completion_length
    trainer = None

    def score() -> float | None:  # called on every process
        if evaluation is None:
            return None
        # Under DeepSpeed ZeRO-3 each process holds a shard of every weight (a forward outside TRL's context fails)
        # and its hooks run collectives in every forward: every process enters TRL's context, which gathers the
        # weights (a no-op without ZeRO-3), and generates the same greedy completions; the main process scores.
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            accuracy = held_out_accuracy(model, tokenizer, evaluation, reward_funcs[0], max_new_tokens)
        return accuracy if trainer.accelerator.is_main_process else None

    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[held_out := HeldOutAccuracy(score, script_args.held_out_every, label)],
    )
    results = {"method": label, "accuracy_before": score()}
    held_out.initial = results["accuracy_before"]
    # `--resume_from_checkpoint <dir>` (or `true` for the latest in output_dir) continues an interrupted run.
    resume = training_args.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=True if resume in ("true", "True") else resume)
    results["accuracy_after"] = score()
    record_accuracy(trainer.state, results["accuracy_after"], label)

    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json: what examples/plot_logs.py reads
    if trainer.accelerator.is_main_process:
        out = Path(training_args.output_dir)
        before, after = results["accuracy_before"], results["accuracy_after"]
        title = f"{label}: held-out accuracy {before:.2f} -> {after:.2f}" if after is not None else label
        plot_rewards(trainer.state.log_history, out / "reward_curve.png", title)
        (out / "results.json").write_text(json.dumps(results, indent=2))
        if after is not None:
            print(f"[{label}] held-out accuracy: {before:.3f} before training, {after:.3f} after")
        print(f"[{label}] saved the model, trainer_state.json, reward_curve.png and results.json to {out}")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    return results


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    main()
