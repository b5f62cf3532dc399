"""GRPOFamilyTrainer: bit-for-bit equal to stock TRL for grpo, the advantage hook, and contained trouble."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import digit_share_reward
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from grpo_family import METHODS, GRPOFamilyConfig, GRPOFamilyTrainer, get_method
from grpo_family.algorithms.grpo import group_advantages
from grpo_family.errors import RewardFunctionError

TIMING_KEYS = ("time", "runtime", "per_second")


def _run(trainer_cls, model_dir, dataset, config, reward=digit_share_reward):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    trainer = trainer_cls(
        model=model_dir, reward_funcs=[reward], args=config, train_dataset=dataset, processing_class=tokenizer
    )
    seen = []
    original = trainer._generate_and_score_completions

    def record(inputs):
        out = original(inputs)
        seen.append(out["advantages"].clone())
        return out

    trainer._generate_and_score_completions = record
    trainer.train()
    logs = [{k: v for k, v in h.items() if not any(t in k for t in TIMING_KEYS)} for h in trainer.state.log_history]
    return trainer, seen, logs


def test_grpo_through_base_class_is_bit_identical_to_stock_trl(tiny_model_dir, arithmetic_train, config_kwargs):
    config = GRPOConfig(**config_kwargs(max_steps=3, beta=0.04, gradient_accumulation_steps=2))
    stock, stock_adv, stock_logs = _run(GRPOTrainer, tiny_model_dir, arithmetic_train, config)
    ours, our_adv, our_logs = _run(GRPOFamilyTrainer, tiny_model_dir, arithmetic_train, config)
    assert len(stock_adv) == len(our_adv) == 3
    assert any(a.abs().sum() > 0 for a in stock_adv), "degenerate rewards: the comparison would prove nothing"
    for a, b in zip(stock_adv, our_adv):
        assert torch.equal(a, b)
    assert stock_logs == our_logs
    stock_weights, our_weights = stock.model.state_dict(), ours.model.state_dict()
    assert all(torch.equal(stock_weights[k], our_weights[k]) for k in stock_weights)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(initial[k], our_weights[k]) for k in initial), "training did not move the weights"


class ConstantAdvantage(GRPOFamilyTrainer):
    """Trains on advantages it makes up, to check they are what reaches the loss and the logs."""

    def compute_advantages(self, batch):
        rewards = batch.rewards
        self.seen_rewards = rewards.clone()
        return torch.arange(rewards.numel(), dtype=torch.float32).view_as(rewards) - 7.5


def test_hook_output_is_what_is_trained_on_and_logged(tiny_model_dir, arithmetic_train, config_kwargs):
    config = GRPOConfig(**config_kwargs(max_steps=1, per_device_train_batch_size=16, num_generations=4))
    trainer, seen, _ = _run(ConstantAdvantage, tiny_model_dir, arithmetic_train, config)
    expected = torch.arange(16, dtype=torch.float32) - 7.5
    assert sorted(seen[0].tolist()) == expected.tolist()  # TRL shuffles rows after scoring
    assert list(trainer._logs["advantages"]) == expected.tolist()
    assert trainer.seen_rewards.shape == (4, 4)


class PerTokenAdvantage(GRPOFamilyTrainer):
    def compute_advantages(self, batch):
        rewards, width = batch.rewards, batch.completion_width
        return torch.ones(*rewards.shape, width) * torch.arange(rewards.numel()).view(*rewards.shape, 1)


def test_per_token_advantages_reach_the_loss(tiny_model_dir, arithmetic_train, config_kwargs):
    config = GRPOConfig(**config_kwargs(max_steps=1, per_device_train_batch_size=8, num_generations=4))
    trainer, seen, _ = _run(PerTokenAdvantage, tiny_model_dir, arithmetic_train, config)
    assert seen[0].dim() == 2 and seen[0].size(0) == 8
    assert sorted(seen[0][:, 0].tolist()) == list(range(8))
    assert sorted(trainer._logs["advantages"]) == list(range(8))


def test_logged_reward_metrics_follow_rewards_changed_by_the_hook(tiny_model_dir, arithmetic_train, config_kwargs):
    class Doubled(GRPOFamilyTrainer):
        def transform_rewards(self, batch):
            batch.rewards = torch.full_like(batch.rewards, 2.0)

        def compute_advantages(self, batch):
            return group_advantages(batch.rewards)

    config = GRPOConfig(**config_kwargs(max_steps=1))
    trainer, _, logs = _run(Doubled, tiny_model_dir, arithmetic_train, config)
    assert logs[0]["reward"] == 2.0 and logs[0]["reward_std"] == 0.0 and logs[0]["frac_reward_zero_std"] == 1.0


def test_missing_reward_column_fails_before_training(tiny_model_dir, arithmetic_train, config_kwargs):
    def needs_gold(completions, gold, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"needs_gold.*'gold'.*answer"):
        GRPOFamilyTrainer(
            model=tiny_model_dir,
            reward_funcs=[needs_gold],
            args=GRPOConfig(**config_kwargs()),
            train_dataset=arithmetic_train,
        )


def test_reward_that_always_raises_names_itself(tiny_model_dir, arithmetic_train, config_kwargs):
    def broken_reward(completions, **kwargs):
        raise KeyError("oops")

    trainer = GRPOFamilyTrainer(
        model=tiny_model_dir,
        reward_funcs=[broken_reward],
        args=GRPOConfig(**config_kwargs()),
        train_dataset=arithmetic_train,
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(RewardFunctionError, match="broken_reward.*KeyError"):
        trainer.train()
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_reward_with_wrong_count_is_an_error(tiny_model_dir, arithmetic_train, config_kwargs):
    def short_reward(completions, **kwargs):
        return [1.0]

    trainer = GRPOFamilyTrainer(
        model=tiny_model_dir,
        reward_funcs=[short_reward],
        args=GRPOConfig(**config_kwargs()),
        train_dataset=arithmetic_train,
    )
    with pytest.raises(RewardFunctionError, match="short_reward.*returned 1 values for 8"):
        trainer.train()


def test_reward_failing_on_some_completions_is_contained(tiny_model_dir, arithmetic_train, config_kwargs):
    calls = {"n": 0}

    def flaky_reward(completions, **kwargs):
        calls["n"] += 1
        texts = [c[0]["content"] for c in completions]
        if len(texts) > 1 and calls["n"] > 1:
            raise RuntimeError("batch failed")  # from the second batch on: the row-wise retry isolates the rows
        return [float("inf") if i == 0 else float(len(t)) for i, t in enumerate(texts)]

    config = GRPOConfig(**config_kwargs(max_steps=2))
    trainer, seen, logs = _run(GRPOFamilyTrainer, tiny_model_dir, arithmetic_train, config, reward=flaky_reward)
    assert all(torch.isfinite(a).all() for a in seen)
    assert logs[0]["reward_errors/flaky_reward"] >= 1  # the inf of the first batch became "unscorable"
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_non_finite_gradients_skip_the_step(tiny_model_dir, arithmetic_train, config_kwargs):
    class NaNLoss(GRPOFamilyTrainer):
        def compute_loss(self, model, inputs, **kwargs):
            return super().compute_loss(model, inputs, **kwargs) * math.nan

    config = GRPOConfig(**config_kwargs(max_steps=1, max_grad_norm=0.0))
    trainer = NaNLoss(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert trainer.state.log_history[0]["skipped_steps"] == 1.0


def test_num_generations_must_divide_the_batch(config_kwargs):
    with pytest.raises(ValueError, match="divisible by num_generations"):
        GRPOConfig(**config_kwargs(per_device_train_batch_size=6, num_generations=4))


def test_unknown_method_lists_valid_ones():
    with pytest.raises(ValueError, match="Unknown method 'nope'.*grpo"):
        get_method("nope")
    assert METHODS["grpo"] == (GRPOFamilyConfig, GRPOFamilyTrainer) and issubclass(GRPOFamilyConfig, GRPOConfig)
