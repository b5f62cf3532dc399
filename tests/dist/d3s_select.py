"""A 2-process scenario (tests/dist_suite.py), ``run(out, model_dir)``: one D3S optimizer step (two
micro-steps) on 2 processes; every rank records the gathered rewards, the selection, its batch before selection,
what each loss call received (inputs, TRL's entropies, keep mask) and the reduced gradient, for the test to
recompute single-process."""

import os

import torch

from grpo_family.tasks import make_arithmetic_dataset
from grpo_family.trainers.d3s import D3SConfig
from conftest import digit_share_reward, tiny_config_kwargs
from test_d3s_trainer import Recorder


def rank_dependent_reward(completions, **kwargs):
    """Dense on rank 0, zero on rank 1: the last group (rank 1 only) is degenerate, so the ranks keep different
    numbers of rollouts and the padding path runs."""
    if os.environ.get("RANK", "0") == "1":
        return [0.0] * len(completions)
    return digit_share_reward(completions)


def run(out_dir, model_dir):
    # 3 rows x 2 micro-steps x 2 processes = 12 completions, groups of 4: the middle group straddles the processes.
    config = D3SConfig(
        **tiny_config_kwargs(
            out_dir,
            per_device_train_batch_size=3,
            gradient_accumulation_steps=2,
            num_generations=4,
            max_steps=1,
            max_completion_length=12,
            max_grad_norm=0.0,
            bf16=False,
            d3s_token_ratio_start=0.3,
            d3s_token_scope="micro",  # one ranking per micro-step over both ranks (no extra forward)
        )
    )
    trainer = Recorder(
        model=model_dir,
        reward_funcs=[rank_dependent_reward],
        args=config,
        train_dataset=make_arithmetic_dataset("train", 32, seed=0),
    )
    trainer.train()
    rec = trainer.rec
    record = {
        "selection": trainer.d3s_last_selection,
        "rewards": rec["rewards"][0],
        "full": rec["full"][0],
        "inputs": rec["inputs"],
        "loss_inputs": rec["loss_inputs"],
        "counts": rec["counts"],
        "entropies": rec["entropies"],
        "keep": rec["keep"],
        "grads": trainer.grad_capture.grads[0],
    }
    torch.save(record, f"{out_dir}/rank{trainer.accelerator.process_index}.pt")
