"""MSGRPOTrainer: what reaches the loss is multiscale_advantages of the gathered rewards, on every process."""

from __future__ import annotations

import pytest
import torch
from conftest import digit_share_reward
from test_distributed import record_advantages

from grpo_family import METHODS, MSGRPOConfig, MSGRPOTrainer
from grpo_family.algorithms.grpo import group_advantages
from grpo_family.algorithms.ms_grpo import multiscale_advantages


class Recording(MSGRPOTrainer):
    def _compute_advantages(self, rewards, batch):
        generator_state = self.scale_generator.get_state()
        advantages = super()._compute_advantages(rewards, batch)
        self.records = getattr(self, "records", []) + [(rewards.clone(), advantages.clone(), generator_state)]
        return advantages

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.local = getattr(self, "local", []) + [out["advantages"].clone()]
        return out


@pytest.mark.parametrize("accelerated", [False, True])
def test_trained_advantages_are_multiscale(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, accelerated
):
    extra = dict(num_scales=2, subgroups_per_scale=2) if accelerated else {}
    config = MSGRPOConfig(**config_kwargs(max_steps=2), **extra)
    trainer = Recording(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train
    )
    trainer.train()
    for (rewards, advantages, state), local in zip(trainer.records, trainer.local):
        generator = torch.Generator().set_state(state)
        expected = multiscale_advantages(rewards, generator=generator, **config.multiscale_kwargs())
        assert torch.equal(advantages, expected)
        assert not torch.allclose(expected, group_advantages(rewards))  # MS-GRPO is not GRPO here
        assert sorted(local.tolist()) == sorted(expected.reshape(-1).tolist())  # single process: the whole batch
    logs = trainer.state.log_history[0]
    # G=4 exact: C(4,2) + C(4,3) + 1 = 11; M=2 (bottom: [2..3], [4]), K=2: 2 + 1 = 3
    assert logs["ms_grpo/subgroups_per_prompt"] == (3.0 if accelerated else 11.0)
    assert logs["ms_grpo/abs_diff_to_grpo"] > 0


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(tau_min=5), "tau_min=5 exceeds num_generations=4"),
        (dict(tau_min=1), "tau_min"),
        (dict(weights="0.5,0.5"), "weights"),  # G=4, tau_min=2 needs 3 weights
        (dict(weights="1,-1,1"), ">= 0"),
        (dict(weights="heavy"), "uniform"),
        (dict(subgroups_per_scale=0), "subgroups_per_scale"),
        (dict(num_scales=0), "num_scales"),
        (dict(partition="middle"), "partition"),
    ],
)
def test_invalid_options_fail_at_config_time(config_kwargs, bad, message):
    with pytest.raises(ValueError, match=message):
        MSGRPOConfig(**config_kwargs(), **bad)


def test_registered():
    assert METHODS["ms_grpo"] == (MSGRPOConfig, MSGRPOTrainer)


def test_scale_generator_survives_a_checkpoint(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, tmp_path
):
    config = MSGRPOConfig(**config_kwargs(max_steps=1), num_scales=2, subgroups_per_scale=2)
    trainer = MSGRPOTrainer(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train
    )
    trainer.scale_generator.manual_seed(123)
    torch.rand(5, generator=trainer.scale_generator)
    saved = trainer.scale_generator.get_state()
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    trainer._save_rng_state(str(checkpoint))
    trainer.scale_generator.manual_seed(0)
    trainer._load_rng_state(str(checkpoint))
    assert torch.equal(trainer.scale_generator.get_state(), saved)


@pytest.mark.multiprocess
def test_two_processes_get_identical_advantages_for_the_whole_batch(tiny_model_dir, tmp_path):
    rank0, rank1 = record_advantages("ms_grpo", tiny_model_dir, tmp_path, num_scales=2, subgroups_per_scale=2)
    for r0, r1 in zip(rank0, rank1):
        assert torch.equal(r0["rewards"], r1["rewards"])
        assert torch.equal(r0["advantages"], r1["advantages"])  # same scale draws on both ranks
        assert torch.equal(torch.cat([r0["local"], r1["local"]]), r0["advantages"].reshape(-1))
    generator = torch.Generator().manual_seed(0)  # the config's seed: a single process draws the same scales
    for record in rank0:
        kwargs = dict(tau_min=2, num_scales=2, subgroups_per_scale=2)
        assert torch.equal(
            record["advantages"], multiscale_advantages(record["rewards"], generator=generator, **kwargs)
        )
