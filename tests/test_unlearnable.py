"""Runs that cannot learn stop (or warn, on request) instead of running to the end, and reward calls have a
deadline by default (``GRPOFamilyConfig``: max_unscorable_batches, max_degenerate_batches, on_unlearnable,
reward_timeout)."""

from __future__ import annotations

import logging
import math
import threading

import pytest
from conftest import digit_share_reward
from transformers import PreTrainedTokenizerFast
from trl import GRPOConfig

from grpo_family import METHODS, GRPOFamilyConfig, GRPOFamilyTrainer, get_method
from grpo_family.errors import UnlearnableRunError
from grpo_family.rewards import with_timeout


def nan_reward(completions, **kwargs):
    return [math.nan] * len(completions)


def none_reward(completions, **kwargs):
    return [None] * len(completions)


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def _trainer(model_dir, dataset, config, rewards, trainer_cls=GRPOFamilyTrainer):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    return trainer_cls(model=model_dir, reward_funcs=rewards, args=config, train_dataset=dataset,
                       processing_class=tokenizer)  # fmt: skip


@pytest.mark.parametrize(
    ("rewards", "limits", "message"),
    [
        ([none_reward], dict(max_unscorable_batches=2), "no completion could be scored"),
        ([nan_reward], dict(max_unscorable_batches=2), "'nan_reward' failed on every completion"),
        ([digit_share_reward, nan_reward], dict(max_unscorable_batches=2), "'nan_reward' failed on every completion"),
        ([constant_reward], dict(max_degenerate_batches=2), "every group was degenerate"),
    ],
)
def test_a_run_that_cannot_learn_stops_before_the_next_update(
    tiny_model_dir, arithmetic_train, config_kwargs, rewards, limits, message
):
    """Before the policy these ran to max_steps with exit code 0 (a NaN reward only warned, every step)."""
    config = GRPOFamilyConfig(**config_kwargs(max_steps=5, **limits))
    trainer = _trainer(tiny_model_dir, arithmetic_train, config, rewards)
    with pytest.raises(UnlearnableRunError, match=message) as info:
        trainer.train()
    assert "on_unlearnable='warn'" in str(info.value)
    assert trainer.state.global_step == 1  # stopped while generating the 2nd batch, before its update


def test_warn_only_on_request(tiny_model_dir, arithmetic_train, config_kwargs, caplog):
    config = GRPOFamilyConfig(**config_kwargs(max_steps=3, max_unscorable_batches=2, on_unlearnable="warn"))
    trainer = _trainer(tiny_model_dir, arithmetic_train, config, [nan_reward])
    with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.base"):
        trainer.train()
    assert trainer.state.global_step == 3
    assert caplog.text.count("The run cannot learn") == 1  # at batch 2 (and again at 4, 6, ...)


def test_defaults_and_checks_off(tiny_model_dir, arithmetic_train, config_kwargs):
    """Default limits (3 unscorable, 20 degenerate batches) apply to a plain GRPOConfig; 0 turns a check off."""
    trainer = _trainer(tiny_model_dir, arithmetic_train, GRPOConfig(**config_kwargs(max_steps=3)), [constant_reward])
    trainer.train()  # 3 degenerate batches < 20
    assert trainer.state.global_step == 3
    config = GRPOFamilyConfig(**config_kwargs(max_steps=3, max_unscorable_batches=0))
    trainer = _trainer(tiny_model_dir, arithmetic_train, config, [nan_reward])
    trainer.train()
    assert trainer.state.global_step == 3


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_config_carries_the_policy(method, tmp_path):
    config_cls, _ = get_method(method)
    assert issubclass(config_cls, GRPOFamilyConfig)
    for field in ("max_unscorable_batches", "max_degenerate_batches", "on_unlearnable", "reward_timeout"):
        assert config_cls.__dataclass_fields__[field].metadata["help"]


@pytest.mark.parametrize(
    "bad", [dict(on_unlearnable="ignore"), dict(max_degenerate_batches=-1), dict(reward_timeout=-1.0)]
)
def test_config_checks(config_kwargs, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        GRPOFamilyConfig(**config_kwargs(**bad))


def test_every_reward_call_has_a_deadline_by_default(tiny_model_dir, arithmetic_train, config_kwargs, caplog):
    """A reward that never returns used to hang the run with no word; now its batch is unscored after
    reward_timeout seconds, with the warning and metric of with_timeout, and the scored function still trains."""
    never = threading.Event()

    def hanging_reward(completions, **kwargs):
        never.wait()

    config = GRPOFamilyConfig(**config_kwargs(max_steps=1, reward_timeout=0.5))
    trainer = _trainer(tiny_model_dir, arithmetic_train, config, [digit_share_reward, hanging_reward])
    assert trainer.reward_funcs[1].func.reward_deadline == 0.5
    with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.base"):
        trainer.train()
    never.set()
    assert "did not return within 0.5 s" in caplog.text
    assert any("reward_errors/hanging_reward" in h for h in trainer.state.log_history)
    own = with_timeout(digit_share_reward, 7)
    trainer = _trainer(tiny_model_dir, arithmetic_train, config, [own])
    assert trainer.reward_funcs[0].func is own  # its own deadline is kept
    off = GRPOFamilyConfig(**config_kwargs(reward_timeout=None))
    assert _trainer(tiny_model_dir, arithmetic_train, off, [digit_share_reward]).reward_funcs[0].func is (
        digit_share_reward
    )


def test_gpg_counts_assembled_batches_not_rounds(tiny_model_dir, arithmetic_train, config_kwargs):
    """GPG's beta_th rounds of one step count once: 3 all-degenerate rounds per step, limit 2 -> stops at step 1."""
    config_cls, trainer_cls = get_method("gpg")
    config = config_cls(**config_kwargs(max_steps=5, beta_th=0.5, max_generation_rounds=3, max_degenerate_batches=2))
    trainer = _trainer(tiny_model_dir, arithmetic_train, config, [constant_reward], trainer_cls)
    with pytest.raises(UnlearnableRunError, match="every group was degenerate"):
        trainer.train()
    assert trainer.state.global_step == 1


class RefusingJudge:
    """A judge whose server refuses every request."""

    def judge(self, requests):
        raise ConnectionRefusedError("connection refused")


def test_sgpo_judge_failing_on_every_request_stops_the_run(tiny_model_dir, arithmetic_train, config_kwargs):
    """Was: every judged completion unscorable, warned each step, and SGPO quietly trained as GRPO to the end."""
    from grpo_family.tasks import arithmetic_reward

    config_cls, trainer_cls = get_method("sgpo")
    config = config_cls(**config_kwargs(max_steps=4, max_unscorable_batches=2))
    trainer = trainer_cls(model=tiny_model_dir, reward_funcs=[arithmetic_reward], args=config,
                          train_dataset=arithmetic_train, judge=RefusingJudge())  # fmt: skip
    with pytest.raises(UnlearnableRunError, match="'SGPO judge' failed on every completion it was asked to score"):
        trainer.train()
    assert trainer.state.global_step == 1
