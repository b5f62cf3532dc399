"""GPGTrainer: config guards, the resampling bookkeeping, and real optimizer steps whose gradients are compared with
an independent single-process float64 computation (plain forward pass + ``grpo_family.algorithms.gpg``).

Tolerance: TRL scores completions with a chunked log-prob kernel that accumulates in float32 even for a float64
model, so recomputed gradients agree to ~5e-7 of each tensor's largest entry; we allow 1e-5. Every mistake these
tests target (a per-rank or per-micro-batch alpha, local group token counts, a missing factor for DDP's mean or for
gradient accumulation) is an O(1) error.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_config_kwargs
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent / "dist"))
from gpg_common import RecordingGPG, constant_reward, flagged_dataset, flat_or_dense_reward, reference_step  # noqa: E402

from grpo_family.algorithms.gpg import degenerate_groups, gpg_loss, loss_row_weights  # noqa: E402
from grpo_family.trainers.gpg import GPGConfig, informative_share, plan_assembly  # noqa: E402

NORMALIZATION = {"group_token_mean": "group", "global_token_mean": "token", "sequence_mean": "sequence"}


def _assert_grads_match(got: dict, expected: dict, rtol: float = 1e-5) -> None:
    assert got.keys() == expected.keys()
    for name, ref in expected.items():
        scale = ref.abs().max().item()
        assert scale > 0, f"{name}: reference gradient is zero, the comparison would prove nothing"
        err = (got[name].double() - ref).abs().max().item()
        assert err <= rtol * scale, f"{name}: max error {err:.3g} vs max |grad| {scale:.3g}"


def _train(model_dir, tmp_path, reward, flat, **overrides) -> RecordingGPG:
    kwargs = dict(max_steps=1, bf16=False, max_grad_norm=0.0, shuffle_dataset=False, beta_th=None)
    config = GPGConfig(**tiny_config_kwargs(tmp_path / "out", **{**kwargs, **overrides}))
    trainer = RecordingGPG(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64),
        reward_funcs=[reward],
        args=config,
        train_dataset=flagged_dataset(32, flat),
    )
    trainer.train()
    return trainer


# ---------------------------------------------------------------------------------------------------- config
def test_config_defaults_are_the_papers(tmp_path):
    config = GPGConfig(**tiny_config_kwargs(tmp_path))
    assert config.beta == 0.0 and config.scale_rewards == "none" and config.num_iterations == 1
    assert config.beta_th == 0.6 and config.loss_aggregation == "group_token_mean" and config.use_alpha
    assert config.vllm_importance_sampling_correction is False


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(beta=0.04), "no KL term and loads no reference model"),
        (dict(num_iterations=2), "num_iterations must be 1"),
        (dict(steps_per_generation=2), "steps_per_generation"),
        (dict(loss_aggregation="token"), "loss_aggregation"),
        (dict(scale_rewards="std"), "F_norm"),
        (dict(beta_th=1.5), "beta_th"),
        (dict(multi_objective_aggregation="normalize_then_sum"), "sum_then_normalize"),
        (dict(entropy_coef=0.01), "plain policy gradient"),
    ],
)
def test_config_rejects_what_gpg_does_not_have(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        GPGConfig(**tiny_config_kwargs(tmp_path, **overrides))


def test_resampling_needs_whole_groups_per_process(tmp_path, monkeypatch):
    # 2 processes x 6 rows, groups of 4: valid for TRL (12 rows) but the middle group straddles the processes.
    monkeypatch.setattr(GPGConfig, "world_size", property(lambda self: 2))
    kwargs = dict(per_device_train_batch_size=6, num_generations=4)
    with pytest.raises(ValueError, match="whole groups"):
        GPGConfig(**tiny_config_kwargs(tmp_path, **kwargs))
    assert GPGConfig(**tiny_config_kwargs(tmp_path, beta_th=None, **kwargs)).generation_batch_size == 12


# ---------------------------------------------------------------------------------------------------- pure helpers
def test_plan_assembly_worked_example():
    # One process, P = 5 (spec Sec. 12 Example 5's bookkeeping): round 0 has 2 informative groups, round 1 two more.
    rounds = [torch.tensor([False, True, True, False, True]), torch.tensor([True, False, True, False, True])]
    assert informative_share(rounds[:1], 1) == 0.4
    assert plan_assembly(rounds, 1) == [(0, 0), (1, 1), (1, 3), (0, 3), (0, 4)]
    assert informative_share(rounds, 1) == 0.8
    # Two processes: process 1 owns groups 2..3 (all degenerate in round 0) and may only use its own extras.
    two = [torch.tensor([False, False, True, True]), torch.tensor([False, False, True, False])]
    assert plan_assembly(two, 2) == [(0, 0), (0, 1), (1, 3), (0, 3)]
    assert informative_share(two, 2) == 0.75


@settings(max_examples=60, deadline=None)
@given(
    num_processes=st.sampled_from([1, 2, 4]),
    groups_per_process=st.integers(1, 3),
    num_rounds=st.integers(1, 4),
    data=st.data(),
)
def test_plan_assembly_properties(num_processes, groups_per_process, num_rounds, data):
    P = num_processes * groups_per_process
    rounds = [torch.tensor(data.draw(st.lists(st.booleans(), min_size=P, max_size=P))) for _ in range(num_rounds)]
    plan = plan_assembly(rounds, num_processes)
    assert len(plan) == P and len(set(plan)) == P  # nothing used twice
    for slot, (k, g) in enumerate(plan):
        assert g // groups_per_process == slot // groups_per_process  # no completion moves between processes
        if not rounds[0][slot]:
            assert (k, g) == (0, slot)  # informative round-0 groups stay in place
        if k > 0:
            assert not rounds[k][g] and rounds[0][slot]  # only degenerate slots are replaced, by informative groups
    for rank in range(num_processes):
        mine = range(rank * groups_per_process, (rank + 1) * groups_per_process)
        available = sum(not rounds[k][g] for k in range(num_rounds) for g in mine)
        got = sum(not rounds[plan[s][0]][plan[s][1]] for s in mine)
        assert got == min(groups_per_process, available)  # as many informative groups as the process can have


@settings(max_examples=40, deadline=None)
@given(
    num_groups=st.integers(1, 4),
    G=st.integers(2, 4),
    width=st.integers(1, 5),
    normalization=st.sampled_from(["group", "token", "sequence"]),
    seed=st.integers(0, 2**16),
)
def test_loss_row_weights_reproduce_gpg_loss(num_groups, G, width, normalization, seed):
    generator = torch.Generator().manual_seed(seed)
    N = num_groups * G
    logps = -torch.rand(N, width, generator=generator, dtype=torch.float64) * 3
    mask = torch.rand(N, width, generator=generator) < 0.7
    advantages = torch.randn(N, generator=generator, dtype=torch.float64)
    weights = loss_row_weights(mask, G, normalization=normalization)
    as_sum = (weights * (-advantages[:, None] * logps * mask).sum(dim=1)).sum()
    expected = gpg_loss(logps, advantages, mask, G, normalization=normalization)
    assert torch.allclose(as_sum, expected, rtol=1e-12, atol=1e-12)
    # Any split of the rows (processes, micro-steps) adds up to the whole: the loss is a plain row sum.
    split = torch.randperm(N, generator=generator)[: N // 2]
    rest = torch.ones(N, dtype=torch.bool)
    rest[split] = False
    parts = [(weights[i] * (-advantages[i, None] * logps[i] * mask[i]).sum(dim=1)).sum() for i in (split, rest)]
    assert torch.allclose(parts[0] + parts[1], expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------- trainer steps
def _metric(trainer, name):
    return next(h[name] for h in trainer.state.log_history if name in h)


def test_alpha_is_one_without_degenerate_groups(tiny_model_dir, tmp_path):
    trainer = _train(
        tiny_model_dir, tmp_path, flat_or_dense_reward, flat=lambda i: False, gradient_accumulation_steps=2
    )
    record = trainer.records[0]
    assert not degenerate_groups(record["rewards"]).any()
    assert record["alpha"] == 1.0 and _metric(trainer, "gpg/alpha") == 1.0 and _metric(trainer, "gpg/M") == 0
    loss, alpha, _, grads = reference_step(tiny_model_dir, [record], 4)
    assert alpha == 1.0
    assert _metric(trainer, "loss") == pytest.approx(loss, abs=1e-6)
    _assert_grads_match(trainer.grads[0], grads)


@pytest.mark.parametrize("aggregation", ["group_token_mean", "global_token_mean", "sequence_mean"])
def test_logged_loss_is_unscaled_while_gradients_carry_alpha(tiny_model_dir, tmp_path, aggregation):
    # Prompts 2 and 3 of 4 are flat: half the groups are degenerate, alpha = 16 / 8 = 2; 2 accumulation steps.
    trainer = _train(
        tiny_model_dir, tmp_path, flat_or_dense_reward, flat=lambda i: i % 4 >= 2,
        gradient_accumulation_steps=2, per_device_train_batch_size=8, loss_aggregation=aggregation,
    )  # fmt: skip
    record = trainer.records[0]
    assert degenerate_groups(record["rewards"]).tolist() == [False, False, True, True]
    assert record["alpha"] == 2.0 and _metric(trainer, "gpg/alpha") == 2.0
    assert _metric(trainer, "gpg/M") == 8 and _metric(trainer, "gpg/frac_degenerate") == 0.5
    loss, alpha, advantages, grads = reference_step(
        tiny_model_dir, [record], 4, normalization=NORMALIZATION[aggregation]
    )
    assert alpha == 2.0
    assert torch.equal(record["advantages"].double(), advantages)
    assert _metric(trainer, "loss") == pytest.approx(loss, abs=1e-6)  # the policy loss, not alpha * loss
    _assert_grads_match(trainer.grads[0], grads)  # grads of alpha * loss
    unscaled = {name: g / alpha for name, g in grads.items()}
    with pytest.raises(AssertionError):
        _assert_grads_match(trainer.grads[0], unscaled)


def test_all_degenerate_gives_zero_gradient_and_bounded_resampling(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.gpg"):
        trainer = _train(tiny_model_dir, tmp_path, constant_reward, flat=lambda i: True, beta_th=0.5,
                         max_generation_rounds=2)  # fmt: skip
    assert "still below beta_th" in caplog.text
    assert _metric(trainer, "gpg/rounds") == 2 and _metric(trainer, "gpg/threshold_met") == 0.0
    assert _metric(trainer, "gpg/alpha") == 1.0 and _metric(trainer, "gpg/frac_degenerate") == 1.0
    assert _metric(trainer, "loss") == 0.0
    grads = trainer.grads[0]
    assert grads and all(torch.isfinite(g).all() and not g.any() for g in grads.values())
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).state_dict()
    trained = trainer.model.state_dict()
    assert all(torch.equal(initial[k], trained[k]) for k in initial)  # zero gradient, AdamW without decay: no move


def test_resampling_replaces_degenerate_groups(tiny_model_dir, tmp_path):
    trainer = _train(
        tiny_model_dir, tmp_path, flat_or_dense_reward, flat=lambda i: i % 4 >= 2, beta_th=0.75,
        max_generation_rounds=8, gradient_accumulation_steps=2, per_device_train_batch_size=8,
    )  # fmt: skip
    record = trainer.records[0]
    rounds = _metric(trainer, "gpg/rounds")
    assert rounds > 1  # round 0 had share 0.5 < 0.75
    share = 1 - degenerate_groups(record["rewards"]).float().mean().item()
    assert share == _metric(trainer, "gpg/informative_share")
    assert share >= 0.75 and _metric(trainer, "gpg/threshold_met") == 1.0
    assert _metric(trainer, "gpg/alpha") == pytest.approx(1 / share)
    assert _metric(trainer, "reward") == pytest.approx(record["rewards"].mean().item())  # metrics: trained batch
    assert record["completion_ids"].size(0) == 16  # the generation batch size is unchanged
    loss, alpha, advantages, grads = reference_step(tiny_model_dir, [record], 4)
    assert torch.equal(record["advantages"].double(), advantages)
    assert _metric(trainer, "loss") == pytest.approx(loss, abs=1e-6)
    _assert_grads_match(trainer.grads[0], grads)
    # Extra prompts are a function of (seed, step, round): the same when asked again, other ones for another round.
    draw = [x["problem"] for x in trainer._draw_prompts(1)]
    assert draw == [x["problem"] for x in trainer._draw_prompts(1)]
    assert draw != [x["problem"] for x in trainer._draw_prompts(2)]
    assert draw[::4] == draw[1::4] == draw[2::4] == draw[3::4]  # TRL's layout: each prompt G times in a row


# ---------------------------------------------------------------------------------------------------- 2 processes
@pytest.mark.multiprocess
def test_two_process_gradients_equal_single_process_with_global_alpha(tiny_model_dir, tmp_path):
    from test_distributed import TESTS, launch

    launch("gpg_grads.py", tiny_model_dir, str(tmp_path), str(TESTS), timeout=600)
    for scenario, expected_alpha in [("whole", 2.0), ("straddle", 1.5), ("resample", None)]:
        ranks = [torch.load(tmp_path / f"{scenario}_rank{r}.pt", weights_only=False) for r in (0, 1)]
        records = [r["records"][0] for r in ranks]
        assert torch.equal(records[0]["rewards"], records[1]["rewards"]), scenario
        assert records[0]["alpha"] == records[1]["alpha"], scenario  # P15: alpha identical on every process
        loss, alpha, advantages, grads = reference_step(tiny_model_dir, records, 4)
        assert records[0]["alpha"] == alpha, scenario
        if expected_alpha is not None:
            assert alpha == expected_alpha, scenario
        assert torch.equal(torch.cat([r["advantages"] for r in records]).double(), advantages), scenario
        for rank in ranks:
            assert rank["logs"][0]["loss"] == pytest.approx(loss, abs=1e-6), scenario
            _assert_grads_match(rank["grads"][0], grads)
        degenerate = degenerate_groups(records[0]["rewards"])
        if scenario == "whole":  # rank 1 held only degenerate groups; per-rank alphas would have been 1 and 1
            assert degenerate.tolist() == [False, False, True, True]
        if scenario == "resample":
            rounds = [r["logs"][0]["gpg/rounds"] for r in ranks]
            assert rounds[0] == rounds[1] > 1  # both processes ran the same rounds
            assert 1 - degenerate.float().mean().item() >= 0.75
