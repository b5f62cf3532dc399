"""Run under `accelerate launch` with a 2-process config (cpu_2proc.yaml for DDP, zero3_cpu.yaml, zero2_cpu.yaml or
an offload variant):

    deepspeed_runs.py SUITE MODEL_DIR OUT_DIR TESTS_DIR

Runs every job of SUITE in sequence in this one launch (start-up is most of a launch's cost) and saves, per job and
rank, the full weights before and after training (gathered from ZeRO-3's partitions), the log history and
job-specific records to OUT_DIR/<job>_rank<r>.pt, for tests/test_deepspeed.py to compare across suites.
``DS_JOBS=job1,job2`` in the environment runs only those jobs (to debug one).

Every run trains with plain SGD and no gradient clipping, so that a gradient scaled wrongly under DeepSpeed shows
up in the weights as it is (Adam would normalise it away).
"""

import contextlib
import os
import sys

import torch
from accelerate import PartialState
from peft import LoraConfig
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, sys.argv[4])  # tests/ (for conftest helpers and the per-method setups)
sys.path.insert(0, sys.argv[4] + "/dist")
from conftest import digit_share_reward, tiny_config_kwargs  # noqa: E402
from gpg_common import flagged_dataset, flat_or_dense_reward  # noqa: E402
from test_resume import SETUPS  # noqa: E402

from grpo_family import METHODS  # noqa: E402
from grpo_family.tasks import make_arithmetic_dataset  # noqa: E402

METHOD_NAMES = list(METHODS)
SGD = dict(optim="sgd", learning_rate=0.1, max_grad_norm=0.0, lr_scheduler_type="constant")


def rank_dependent_reward(completions, **kwargs):
    """Dense on rank 0, zero on rank 1: rank 1's groups are degenerate, so the ranks keep different numbers of rows."""
    if os.environ.get("RANK", "0") == "1":
        return [0.0] * len(completions)
    return digit_share_reward(completions)


def avoid_shm_build():
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op (minutes on 2 cores) when it starts, for
    inference kernels training never calls. Marking the op incompatible in DeepSpeed's own table of compatible
    ops (probed once per process, edits persist) makes it fall back to plain torch.distributed (gloo)."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def full_weights(trainer) -> dict:
    """Every parameter in full (ZeRO-3 keeps 1/W of each on each rank: gather, copy, repartition)."""
    params = dict(trainer.model.named_parameters())
    gather = contextlib.nullcontext()
    if trainer.is_deepspeed_enabled:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(params.values()))
    with gather:
        return {name: p.detach().clone().cpu() for name, p in params.items()}


def method_trainer(method, out_dir, **overrides):
    options, rewards = SETUPS[method]
    config_cls, trainer_cls = METHODS[method]
    peft = overrides.pop("peft", False)
    kwargs = tiny_config_kwargs(out_dir, **{"max_steps": 3, **SGD, **options, **overrides})
    return trainer_cls(
        model=MODEL_DIR,
        reward_funcs=rewards,
        args=config_cls(**kwargs),
        train_dataset=make_arithmetic_dataset("train", 16, seed=0),
        processing_class=TOKENIZER,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear") if peft else None,
    )


def gpg_alpha_trainer(out_dir, use_alpha):
    """One GPG optimizer step in which rank 1's groups are all degenerate: alpha = 2 only if it is global."""
    config_cls, trainer_cls = METHODS["gpg"]
    kwargs = tiny_config_kwargs(
        out_dir, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1, shuffle_dataset=False,
        beta_th=None, use_alpha=use_alpha, **SGD,
    )  # fmt: skip
    return trainer_cls(
        model=MODEL_DIR,
        reward_funcs=[flat_or_dense_reward],
        args=config_cls(**kwargs),
        train_dataset=flagged_dataset(48, lambda i: i % 4 >= 2),
        processing_class=TOKENIZER,
    )


def d3s_rows_trainer(out_dir):
    """D3S whose schedule moves every step while the ranks keep different numbers of rows (rank 1 keeps none), with
    a KL term: the reference forwards, which cover the kept rows only, are padded to equal row counts on both ranks
    (ZeRO-3 forwards are collective)."""
    options, _ = SETUPS["d3s"]
    options = {**options, "beta": 0.04}
    config_cls, trainer_cls = METHODS["d3s"]

    class Counting(trainer_cls):
        kept_per_step = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            kept = self.d3s_last_selection["kept"]
            num_local = len(inputs)
            start = self.accelerator.process_index * num_local
            self.kept_per_step.append(int(((kept >= start) & (kept < start + num_local)).sum()))
            return out

    return Counting(
        model=MODEL_DIR,
        reward_funcs=[rank_dependent_reward],
        args=config_cls(**tiny_config_kwargs(out_dir, max_steps=4, **SGD, **options)),
        train_dataset=make_arithmetic_dataset("train", 16, seed=0),
        processing_class=TOKENIZER,
    )


def jobs(suite):
    """``{name: (build(out_dir) -> trainer, resume_from)}`` in launch order."""
    out = {}
    methods = ["grpo"] if suite == "offload" else METHOD_NAMES
    for method in methods:
        out[method] = (lambda d, m=method: method_trainer(m, d), None)
    if suite in ("ddp", "zero3"):
        for method in METHOD_NAMES:
            out[f"lora_{method}"] = (lambda d, m=method: method_trainer(m, d, peft=True), None)
        for use_alpha in (True, False):
            out[f"gpg_alpha_{use_alpha}"] = (lambda d, a=use_alpha: gpg_alpha_trainer(d, a), None)
    if suite == "zero3":
        out["d3s_rows"] = (d3s_rows_trainer, None)
        for method in METHOD_NAMES:  # with test_resume.py's settings, under which each method's state matters
            save = dict(max_steps=4, save_strategy="steps", save_steps=2)
            out[f"full_{method}"] = (lambda d, m=method: method_trainer(m, d, **save), None)
            out[f"resumed_{method}"] = (lambda d, m=method: method_trainer(m, d, **save), f"full_{method}")
    return out




def main():
    global MODEL_DIR, TOKENIZER
    suite, MODEL_DIR, out_dir = sys.argv[1:4]
    avoid_shm_build()
    TOKENIZER = PreTrainedTokenizerFast.from_pretrained(MODEL_DIR)
    only = set(os.environ.get("DS_JOBS", "").split(",")) - {""}
    for name, (build, resume_from) in jobs(suite).items():
        if only and name not in only:
            continue
        job_dir = f"{out_dir}/{name}"
        trainer = build(job_dir)
        rank = trainer.accelerator.process_index
        init = full_weights(trainer)
        checkpoint = f"{out_dir}/{resume_from}/checkpoint-2" if resume_from else None
        trainer.train(resume_from_checkpoint=checkpoint)
        record = {
            "init": init,
            "final": full_weights(trainer),
            "logs": trainer.state.log_history,
            "kept_per_step": getattr(trainer, "kept_per_step", None),
            "deepspeed": trainer.is_deepspeed_enabled,
        }
        torch.save(record, f"{out_dir}/{name}_rank{rank}.pt")
        trainer.accelerator.wait_for_everyone()
        del trainer


if __name__ == "__main__":
    main()
    PartialState().destroy_process_group()  # gloo's worker threads stop while the interpreter lives: exiting with the group alive can abort (SIGABRT)
