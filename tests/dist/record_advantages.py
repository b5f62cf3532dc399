"""A 2-process scenario (tests/dist_suite.py): ``run(out, method, model_dir, overrides)`` trains METHOD for 2 steps
and saves, on every rank, the gathered rewards, the global advantages of the hook and this rank's slice, for the
test to compare with a single-process computation.
"""

import torch
from transformers import PreTrainedTokenizerFast

from grpo_family import METHODS
from grpo_family.tasks import make_arithmetic_dataset
from conftest import digit_share_reward, tiny_config_kwargs


def recording(trainer_cls):
    class Recording(trainer_cls):
        records = []

        def compute_advantages(self, batch):
            advantages = super().compute_advantages(batch)
            self.records.append({"rewards": batch.rewards.clone(), "advantages": advantages.clone()})
            return advantages

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.records[-1]["local"] = out["advantages"].clone()  # before TRL shuffles the rows
            return out

    return Recording


def run(out_dir, method, model_dir, overrides=None):
    overrides = overrides or {}
    config_cls, trainer_cls = METHODS[method]
    # 6 completions per process, groups of 4: the middle group straddles the two processes.
    kwargs = tiny_config_kwargs(out_dir, per_device_train_batch_size=6, num_generations=4, max_steps=2)
    trainer = recording(trainer_cls)(
        model=model_dir,
        reward_funcs=[digit_share_reward],
        args=config_cls(**{**kwargs, **overrides}),
        train_dataset=make_arithmetic_dataset("train", 32, seed=0),
        processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
    )
    trainer.train()
    torch.save(trainer.records, f"{out_dir}/rank{trainer.accelerator.process_index}.pt")
