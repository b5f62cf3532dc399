"""A 2-process scenario (tests/dist_suite.py), ``run(out, model_dir)``: one D3S optimizer step with a KL
term on 2 processes, rank 1's groups all degenerate, so that rank 1 keeps no rollout and trains on inert padding
rows only. Every rank records the logged metrics and, per loss call, the entropies of the loss forward and its mask,
for the test to recompute the true mean entropy."""

import os

import torch

from grpo_family.tasks import make_arithmetic_dataset
from grpo_family.trainers.d3s import D3SConfig, D3STrainer
from conftest import digit_share_reward, tiny_config_kwargs


def rank_dependent_reward(completions, **kwargs):
    """Dense on rank 0, zero on rank 1: rank 1's groups are degenerate (advantage 0), so the max-variance selection
    keeps none of its rollouts."""
    if os.environ.get("RANK", "0") == "1":
        return [0.0] * len(completions)
    return digit_share_reward(completions)


class Recording(D3STrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def transform_loss_forward(self, call):
        self.calls.append({"entropies": call.entropies.detach().clone(), "mask": call.loss_mask.detach().clone()})
        super().transform_loss_forward(call)


def run(out_dir, model_dir):
    trainer = Recording(
        model=model_dir,
        reward_funcs=[rank_dependent_reward],
        args=D3SConfig(**tiny_config_kwargs(out_dir, max_steps=1, beta=0.04, max_completion_length=12)),
        train_dataset=make_arithmetic_dataset("train", 16, seed=0),
    )
    trainer.train()
    kept = trainer.d3s_last_selection["kept"]
    record = {"logs": trainer.state.log_history, "calls": trainer.calls, "kept": kept}
    torch.save(record, f"{out_dir}/rank{trainer.accelerator.process_index}.pt")
