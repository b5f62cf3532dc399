"""MSGRPOTrainer: what reaches the loss is multiscale_advantages of the gathered rewards, on every process."""

from __future__ import annotations

import pytest
import torch
from conftest import digit_share_reward
from dist_suite import TINY_MODEL, scenario

from grpo_family import METHODS, MSGRPOConfig, MSGRPOTrainer
from grpo_family.algorithms.grpo import group_advantages
from grpo_family.algorithms.ms_grpo import multiscale_advantages
from grpo_family.trainers.stages import stage_generator


class Recording(MSGRPOTrainer):
    def compute_advantages(self, batch):
        generator_state = batch.generator("ms_grpo").get_state()  # the generator this call draws from
        advantages = super().compute_advantages(batch)
        self.records = getattr(self, "records", []) + [(batch.rewards.clone(), advantages.clone(), generator_state)]
        return advantages

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.local = getattr(self, "local", []) + [out["advantages"].clone()]  # before TRL shuffles the rows
        return out


# The options each run sets, and the maths' keyword arguments they must reach, written out by hand (not taken from
# MSGRPOConfig.multiscale_kwargs, which is the code under test).
RUNS = {
    "exact": ({}, dict(tau_min=2, weights="uniform", std="population", eps=1e-6)),
    "accelerated": (
        dict(num_scales=2, subgroups_per_scale=2),
        dict(tau_min=2, weights="uniform", std="population", eps=1e-6, num_scales=2, subgroups_per_scale=2),
    ),
    # G = 5, every option off its default: scales 3..5, "paper" intervals [3, 3], [4, 5] ("bottom": [3, 4], [5])
    "non_default": (
        dict(
            num_generations=5, per_device_train_batch_size=10, tau_min=3, weights="1,0,2", std="sample", eps=1e-3,
            num_scales=2, subgroups_per_scale=3, partition="paper", selection="random", draw="per_batch",
            permute_labels=True,
        ),
        dict(
            tau_min=3, weights=[1.0, 0.0, 2.0], std="sample", eps=1e-3, num_scales=2, subgroups_per_scale=3,
            partition="paper", selection="random", draw="per_batch", permute_labels=True,
        ),
    ),
}  # fmt: skip
DEFAULTS = dict(
    tau_min=2, weights="uniform", std="population", eps=1e-6, num_scales=None, subgroups_per_scale=None,
    partition="bottom", selection="greedy", draw="per_group", permute_labels=False,
)  # fmt: skip
# ms_grpo/subgroups_per_prompt (docs/methods/ms_grpo.md §2.8d): G=4 exact: C(4,2) + C(4,3) + 1 = 11; M=2 (bottom: [2, 3], [4]), K=2:
# 2 + 1 = 3; non_default: tau=3 always (min(3, C(5,3)) = 3), tau=5 half of the time (1), tau=4 has weight 0: 3.5.
SUBGROUPS = {"exact": 11.0, "accelerated": 3.0, "non_default": 3.5}


def _trainer(cls, model_dir, tokenizer, dataset, config_kwargs, **options):
    config = MSGRPOConfig(**config_kwargs(**options))
    return cls(
        model=model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip


@pytest.mark.parametrize("run", list(RUNS))
def test_trained_advantages_are_multiscale(tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, run):
    options, maths_kwargs = RUNS[run]
    trainer = _trainer(
        Recording, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, max_steps=2, **options
    )
    trainer.train()
    assert len(trainer.records) == len(trainer.local) == 2
    option_matters = {name: False for name, value in maths_kwargs.items() if value != DEFAULTS[name]}
    for (rewards, advantages, state), local in zip(trainer.records, trainer.local):
        expected = multiscale_advantages(rewards, generator=torch.Generator().set_state(state), **maths_kwargs)
        assert torch.equal(advantages, expected)
        # tol: allclose's defaults (rtol 1e-5, atol 1e-8) are far above float32 rounding of group statistics, and
        # MS-GRPO's advantages differ from GRPO's by order 0.1 here: not equal means a different method.
        assert not torch.allclose(expected, group_advantages(rewards))  # MS-GRPO is not GRPO here
        # single process: the whole batch, each completion with its own advantage (before TRL shuffles the rows)
        assert torch.equal(local, expected.reshape(-1).to(local.dtype))
        for name in option_matters:  # had the trainer dropped this option, the test would see it
            try:
                dropped = multiscale_advantages(
                    rewards, generator=torch.Generator().set_state(state), **{**maths_kwargs, name: DEFAULTS[name]}
                )
            except ValueError:  # e.g. 3 explicit weights with tau_min back at 2
                option_matters[name] = True
            else:
                option_matters[name] |= not torch.equal(dropped, expected)
    assert all(option_matters.values()), option_matters
    logs = trainer.state.log_history[0]
    assert logs["ms_grpo/subgroups_per_prompt"] == SUBGROUPS[run]
    assert logs["ms_grpo/abs_diff_to_grpo"] > 0


@pytest.mark.parametrize(
    "options, expected",
    [
        (dict(num_scales=4, subgroups_per_scale=8), 25.0),  # bottom: 8 + 8 + 8 + 1
        (dict(num_scales=4, subgroups_per_scale=8, partition="paper"), 8 + 8 + 8 + (8 + 1) / 2),  # 25 or 32
        (dict(weights="0,0,0,0,0,0,1"), 1.0),  # one-hot on tau = G: the full group only
        (dict(weights="1,0,0,0,0,0,0", num_scales=4, subgroups_per_scale=8), 8 / 2),  # tau=2 drawn from [2, 3]
    ],
)
def test_logged_subgroups_per_prompt(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, options, expected
):
    trainer = _trainer(
        MSGRPOTrainer, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, num_generations=8,
        per_device_train_batch_size=8, **options,
    )  # fmt: skip
    trainer.model.train()
    trainer.compute_advantages(trainer.generation_batch(torch.rand(4, 8, generator=torch.Generator().manual_seed(0))))
    assert trainer._metrics["train"]["ms_grpo/subgroups_per_prompt"] == [expected]


def test_scale_draws_are_seeded_per_call_from_the_step(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs
):
    """docs/methods/ms_grpo.md §3.4, §11.5: draws seeded from (seed, global_step), identical on all ranks; an evaluation in between
    leaves training's draws unchanged, and a resumed run (a new trainer at the same step) draws the same."""
    options = dict(num_scales=2, subgroups_per_scale=2, selection="random")
    gen = torch.Generator().manual_seed(0)
    r1, r2, r_eval = (torch.rand(16, 4, generator=gen) for _ in range(3))

    def call(trainer, rewards, global_step, micro_step, mode="train"):
        trainer.state.global_step, trainer._step = global_step, micro_step
        trainer.model.train(mode == "train")
        return trainer.compute_advantages(trainer.generation_batch(rewards))

    def make():
        return _trainer(MSGRPOTrainer, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, **options)

    trainer = make()
    first, second = call(trainer, r1, 0, 0), call(trainer, r2, 1, 1)
    # the same two training steps with an evaluation between them
    with_eval = make()
    assert torch.equal(call(with_eval, r1, 0, 0), first)
    call(with_eval, r_eval, 1, 1, mode="eval")
    assert torch.equal(call(with_eval, r2, 1, 1), second)
    # a resumed run: a fresh trainer whose counters the checkpoint restored
    assert torch.equal(call(make(), r2, 1, 1), second)
    # the draws do change: with the step, and between two generation batches of one optimizer step
    assert not torch.equal(call(trainer, r2, 2, 1), second)
    assert not torch.equal(call(trainer, r2, 1, 2), second)
    assert not torch.equal(call(trainer, r2, 1, 1, mode="eval"), second)


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
        (dict(draw="per_step"), "per_group"),
        (dict(permute_labels="yes"), "permute_labels"),
        # docs/methods/ms_grpo.md §6: G < tau_min is a configuration error at init, for the eval groups too
        (dict(num_generations_eval=2, tau_min=3, per_device_eval_batch_size=4), "num_generations_eval=2: tau_min=3"),
        (dict(num_generations_eval=2, weights="1,1,1", per_device_eval_batch_size=4), "num_generations_eval=2"),
        # MS-GRPO standardises the summed reward: a per-function normalisation would be silently ignored
        (dict(multi_objective_aggregation="normalize_then_sum"), "sum_then_normalize"),
    ],
)
def test_invalid_options_fail_at_config_time(config_kwargs, bad, message):
    with pytest.raises(ValueError, match=message):
        MSGRPOConfig(**config_kwargs(), **bad)


def test_valid_eval_group_size_and_new_options_are_accepted(config_kwargs):
    config = MSGRPOConfig(
        **config_kwargs(), num_generations_eval=2, per_device_eval_batch_size=4, draw="per_batch", permute_labels=True
    )
    assert config.multiscale_kwargs()["draw"] == "per_batch" and config.multiscale_kwargs()["permute_labels"]


def test_registered():
    assert METHODS["ms_grpo"] == (MSGRPOConfig, MSGRPOTrainer)


@scenario("record_advantages", "ms_grpo", TINY_MODEL, {"num_scales": 2, "subgroups_per_scale": 2})
def test_two_processes_get_identical_advantages_for_the_whole_batch(dist_output):
    rank0, rank1 = (torch.load(dist_output / f"rank{r}.pt") for r in (0, 1))
    assert len(rank0) == len(rank1) == 2
    for r0, r1 in zip(rank0, rank1):
        assert torch.equal(r0["rewards"], r1["rewards"])
        assert torch.equal(r0["advantages"], r1["advantages"])  # same scale draws on both ranks
        assert torch.equal(torch.cat([r0["local"], r1["local"]]), r0["advantages"].reshape(-1))
    # A single process with the config's seed (0) draws the same scales: generation i happens at optimizer step i
    # and micro-step i (one micro-step per optimizer step).
    for i, record in enumerate(rank0):
        generator = stage_generator("ms_grpo", 0, i, 1 + i)  # (name, seed, global step, 1 + micro-step)
        kwargs = dict(tau_min=2, num_scales=2, subgroups_per_scale=2)
        assert torch.equal(
            record["advantages"], multiscale_advantages(record["rewards"], generator=generator, **kwargs)
        )
