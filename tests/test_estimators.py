"""The estimator registry and its composition with D3S's selection and CW-GRPO's token weights (issue 19 item 3),
selected from the config and from the command line; the one seeding helper of sampled draws."""

# tol(defaults): assert_close's defaults for the dtype compared: float64 (rtol 1e-7, atol 1e-7) for results of a
# few dozen float64 operations on values of order 1-10 (rounding under 100 x 2^-52 x 10 ~ 2e-13); float32
# (rtol 1.3e-6, atol 1e-5) for group statistics over at most 16 values of order 1 (a sum of n terms rounds
# to within n x 2^-23 of its size: 16 x 2^-23 ~ 1.9e-6, under atol). A wrong formula differs by order 1e-1.
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch
from conftest import digit_share_reward
from test_d3s_trainer import run

from grpo_family.algorithms.estimators import (
    ESTIMATORS,
    estimator_names,
    get_estimator,
    register_estimator,
    validate_estimator,
)
from grpo_family.algorithms.gpg import gpg_advantages
from grpo_family.algorithms.grpo import group_advantages
from grpo_family.algorithms.ms_grpo import multiscale_advantages
from grpo_family.trainers.cw_grpo import CWGRPOConfig, CWGRPOTrainer
from grpo_family.trainers.d3s import D3SConfig
from grpo_family.trainers.stages import stage_generator

ROOT = Path(__file__).resolve().parents[1]
MS_OPTIONS = {"num_scales": 2, "subgroups_per_scale": 2}  # the accelerated (sampled) mode


def test_registry_names_values_and_option_checks():
    assert estimator_names() == ("gpg", "grpo", "ms_grpo")
    # each registered itself in its method's module (grpo_family.algorithms imports them)
    assert {name: e.function.__module__ for name, e in ESTIMATORS.items()} == {
        "grpo": "grpo_family.algorithms.grpo", "ms_grpo": "grpo_family.algorithms.ms_grpo",
        "gpg": "grpo_family.algorithms.gpg",
    }  # fmt: skip
    rewards = torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    rewards[0] = 1.0  # a degenerate group
    assert torch.equal(get_estimator("grpo")(rewards, scale="batch"), group_advantages(rewards, scale="batch"))
    assert torch.equal(get_estimator("gpg")(rewards, tol=0.0), gpg_advantages(rewards, f_norm="none"))
    drawn = get_estimator("ms_grpo")(rewards, generator=torch.Generator().manual_seed(3), **MS_OPTIONS)
    expected = multiscale_advantages(rewards, generator=torch.Generator().manual_seed(3), **MS_OPTIONS)
    assert torch.equal(drawn, expected)
    assert get_estimator("ms_grpo").sampled and not get_estimator("gpg").sampled
    with pytest.raises(ValueError, match=r"Unknown advantage estimator 'ppo'"):
        get_estimator("ppo")
    with pytest.raises(ValueError, match=r"Unknown option\(s\) \['tau_min'\] for the 'gpg' estimator"):
        validate_estimator("gpg", 4, {"tau_min": 2})
    with pytest.raises(ValueError, match="f_norm must be one of"):
        validate_estimator("gpg", 4, {"f_norm": "std"})
    with pytest.raises(ValueError, match="scale must be 'group', 'batch' or 'none'"):
        validate_estimator("grpo", 4, {"scale": "std"})
    with pytest.raises(ValueError, match="tau_min"):
        validate_estimator("ms_grpo", 4, {"tau_min": 5})
    validate_estimator("ms_grpo", 4, MS_OPTIONS)


def test_a_second_estimator_under_a_taken_name_is_refused():
    """The duplicate guard: a new function under a registered name fails at registration (a method's file cannot
    silently replace another's estimator); registering the same function again (a module reloaded) is allowed."""
    original = ESTIMATORS["grpo"]
    with pytest.raises(ValueError, match="An advantage estimator named 'grpo' is already registered"):
        register_estimator("grpo")(lambda rewards, *, generator=None: rewards)
    assert ESTIMATORS["grpo"] is original
    register_estimator("grpo", original.validate)(original.function)
    assert ESTIMATORS["grpo"].function is original.function


def test_one_seeding_helper_keeps_ms_grpos_stream():
    """``stage_generator`` is MS-GRPO's former per-call seed (blake2b of "ms_grpo:seed:step:slot"), so its draws,
    and every ms_grpo run, are unchanged; keys that differ in any part give different streams."""
    key = b"ms_grpo:7:3:2"
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
    assert stage_generator("ms_grpo", 7, 3, 2).initial_seed() == seed
    draws = {
        stage_generator(*k).initial_seed() for k in [("ms_grpo", 7, 3, 2), ("d3s", 7, 3, 2), ("ms_grpo", 7, 3, 1)]
    }
    assert len(draws) == 3


@pytest.mark.parametrize(
    "estimator, options",
    [("grpo", None), ("ms_grpo", MS_OPTIONS), ("gpg", None), ("gpg", {"f_norm": "group", "tol": 0.05})],
    ids=["grpo", "ms_grpo", "gpg", "gpg_group"],
)
def test_d3s_selects_over_any_estimator(tiny_model_dir, arithmetic_train, config_kwargs, estimator, options):
    """D3S's rows are chosen on the named estimator's full-group advantages, which are what its rows train on."""
    config = D3SConfig(
        **config_kwargs(max_steps=1, per_device_train_batch_size=16, bf16=False),
        d3s_base_estimator=estimator,
        d3s_estimator_options=options,
    )
    trainer = run(tiny_model_dir, arithmetic_train, config)
    (rewards,), full = trainer.rec["rewards"], trainer.rec["full"][0]
    options = options or {}
    if estimator == "ms_grpo":  # drawn from the stage generator of the first generation batch
        expected = multiscale_advantages(rewards, generator=stage_generator("ms_grpo", 0, 0, 1), **options)
    elif estimator == "gpg":
        expected = gpg_advantages(rewards, **options)
    else:
        expected = group_advantages(rewards)
    assert expected.abs().sum() > 0
    torch.testing.assert_close(full["advantages"], expected.reshape(-1).to(full["advantages"].dtype))
    assert torch.equal(trainer.d3s_last_selection["advantages"], full["advantages"])


def test_cw_grpo_reweights_ms_grpo_advantages(tiny_model_dir, arithmetic_train, config_kwargs):
    """CW-GRPO over ms_grpo: every valid token of row i trains on A_i^MS x w_it (unit weights here, so A_i^MS)."""
    rewards_seen, batches = [], []

    class UnitWeights(CWGRPOTrainer):
        def _covariance_weights(self, logps, advantages, mask, num_generations):
            return mask.float()

        def compute_advantages(self, batch):
            rewards_seen.append(batch.rewards.clone())
            return super().compute_advantages(batch)

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            batches.append({k: v.clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
            return out

    config = CWGRPOConfig(
        **config_kwargs(max_steps=1, bf16=False, cw_reuse_loss_logps=False),
        cw_base_estimator="ms_grpo",
        cw_estimator_options=MS_OPTIONS,
    )
    trainer = UnitWeights(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train
    )
    trainer.train()
    (rewards,), (batch,) = rewards_seen, batches
    expected = multiscale_advantages(rewards, generator=stage_generator("ms_grpo", 0, 0, 1), **MS_OPTIONS).reshape(-1)
    assert expected.abs().sum() > 0
    mask = batch["completion_mask"].bool()
    per_token = expected[:, None].expand_as(mask).to(batch["advantages"].dtype)
    torch.testing.assert_close(batch["advantages"][mask], per_token[mask])


def test_estimator_and_options_from_the_command_line():
    sys.path.insert(0, str(ROOT / "examples"))
    import train

    _, args, _, _ = train.parse_args(
        [
            "--method",
            "d3s",
            "--d3s_base_estimator",
            "gpg",
            "--d3s_estimator_options",
            '{"f_norm": "group", "tol": 0.1}',
        ]
    )
    assert (args.d3s_base_estimator, args.d3s_estimator_options) == ("gpg", {"f_norm": "group", "tol": 0.1})
    _, args, _, _ = train.parse_args(
        ["--method", "cw_grpo", "--cw_base_estimator", "ms_grpo", "--cw_estimator_options", '{"num_scales": 2}']
    )
    assert (args.cw_base_estimator, args.cw_estimator_options) == ("ms_grpo", {"num_scales": 2})
    with pytest.raises(ValueError, match="d3s_estimator_options must be a JSON object"):
        train.parse_args(["--method", "d3s", "--d3s_estimator_options", "num_scales=2"])
