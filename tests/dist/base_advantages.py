"""Run under `accelerate launch --config_file accelerate_configs/cpu_2proc.yaml`: records, on every rank, the
gathered rewards, the global advantages of the hook and this rank's slice, for the test to compare."""

import sys

import torch
from trl import GRPOConfig

from grpo_family import GRPOFamilyTrainer
from grpo_family.tasks import make_arithmetic_dataset

sys.path.insert(0, sys.argv[3])  # tests/ (for conftest helpers)
from conftest import digit_share_reward, tiny_config_kwargs  # noqa: E402


class Recording(GRPOFamilyTrainer):
    records = []

    def _compute_advantages(self, rewards, batch):
        advantages = super()._compute_advantages(rewards, batch)
        self.records.append({"rewards": rewards.clone(), "advantages": advantages.clone()})
        return advantages

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.records[-1]["local"] = out["advantages"].clone()  # before TRL shuffles the rows
        return out


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    # 6 completions per process, groups of 4: the middle group straddles the two processes.
    config = GRPOConfig(**tiny_config_kwargs(out_dir, per_device_train_batch_size=6, num_generations=4, max_steps=2))
    trainer = Recording(
        model=model_dir,
        reward_funcs=[digit_share_reward],
        args=config,
        train_dataset=make_arithmetic_dataset("train", 32, seed=0),
    )
    trainer.train()
    torch.save(trainer.records, f"{out_dir}/rank{trainer.accelerator.process_index}.pt")


if __name__ == "__main__":
    main()
