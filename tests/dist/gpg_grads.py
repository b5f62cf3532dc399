"""A 2-process scenario (tests/dist_suite.py), ``run(out, model_dir)``: one GPG optimizer step per case; every rank saves the batch it trained on, the gathered rewards, alpha, the logs and
the gradients the optimizer received, for tests/test_gpg_trainer.py to compare with a single-process computation.

Cases (the bundled task with a ``flat`` column; flat prompts get a constant reward, i.e. degenerate groups):
* ``whole``: 2 whole groups per rank, gradient accumulation 2; rank 1's groups are all degenerate (alpha = 2 only
  if it is global: per-rank alphas would be 1 and 1 -- rank 0 has no degenerate group, and rank 1, where every
  group is degenerate, falls back to 1 by convention).
* ``straddle``: 6 rows per rank with groups of 4, so the middle group is split over the ranks (global T_q).
* ``resample``: as ``whole`` with beta_th = 0.75: extra rounds must run in lockstep on both ranks.
"""

import torch
from conftest import tiny_config_kwargs
from gpg_common import RecordingGPG, flagged_dataset, flat_or_dense_reward
from transformers import AutoModelForCausalLM

from grpo_family.trainers.gpg import GPGConfig

CASES = {
    "whole": (dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, beta_th=None), lambda i: i % 4 >= 2),
    "straddle": (
        dict(per_device_train_batch_size=6, gradient_accumulation_steps=1, beta_th=None),
        lambda i: i % 3 == 2,
    ),
    "resample": (
        dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, beta_th=0.75, max_generation_rounds=8),
        lambda i: i % 4 >= 2,
    ),
}


def run(out_dir, model_dir):
    for name, (overrides, flat) in CASES.items():
        config = GPGConfig(
            **tiny_config_kwargs(
                f"{out_dir}/{name}", num_generations=4, max_steps=1, bf16=False, max_grad_norm=0.0,
                shuffle_dataset=False, **overrides,
            )
        )  # fmt: skip
        trainer = RecordingGPG(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64),
            reward_funcs=[flat_or_dense_reward],
            args=config,
            train_dataset=flagged_dataset(48, flat),
        )
        trainer.train()
        rank = trainer.accelerator.process_index
        result = {"records": trainer.records, "grads": trainer.grads, "logs": trainer.state.log_history}
        torch.save(result, f"{out_dir}/{name}_rank{rank}.pt")
