"""GPGTrainer: config guards, the resampling bookkeeping, and real optimizer steps whose gradients are compared with
an independent single-process float64 computation (plain forward pass + ``grpo_family.algorithms.gpg``).

Tolerance: TRL scores completions with a chunked log-prob kernel that accumulates in float32 even for a float64
model, so recomputed gradients agree to ~5e-7 of each tensor's largest entry; we allow 1e-5. Every mistake these
tests target (a per-rank or per-micro-batch alpha, local group token counts, a missing factor for DDP's mean or for
gradient accumulation) is an O(1) error.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import tiny_config_kwargs
from dist_suite import TINY_MODEL, scenario
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent / "dist"))
from gpg_common import RecordingGPG, constant_reward, flagged_dataset, flat_or_dense_reward, reference_step  # noqa: E402

from grpo_family.algorithms.gpg import (  # noqa: E402
    assemble_rewards,
    degenerate_groups,
    gpg_advantages,
    gpg_alpha,
    informative_share,
    loss_row_weights,
    plan_assembly,
)
from grpo_family.trainers.base import GRPOFamilyTrainer  # noqa: E402
from grpo_family.trainers.gpg import GPGConfig  # noqa: E402

NORMALIZATION = {"group_token_mean": "group", "global_token_mean": "token", "sequence_mean": "sequence"}


def _assert_grads_match(got: dict, expected: dict, rtol: float = 1e-5) -> None:
    assert got.keys() == expected.keys()
    for name, ref in expected.items():
        scale = ref.abs().max().item()
        assert scale > 0, f"{name}: reference gradient is zero, the comparison would prove nothing"
        err = (got[name].double() - ref).abs().max().item()
        assert err <= rtol * scale, f"{name}: max error {err:.3g} vs max |grad| {scale:.3g}"


def _train(model_dir, tmp_path, reward, flat, trainer_cls=RecordingGPG, processing_class=None, **overrides):
    kwargs = dict(max_steps=1, bf16=False, max_grad_norm=0.0, shuffle_dataset=False, beta_th=None)
    config = GPGConfig(**tiny_config_kwargs(tmp_path / "out", **{**kwargs, **overrides}))
    trainer = trainer_cls(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64),
        reward_funcs=[reward],
        args=config,
        train_dataset=flagged_dataset(32, flat),
        processing_class=processing_class,
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
        (dict(scale_rewards="std"), r"scale_rewards must be one of \('group', 'batch', 'none'"),
        (dict(beta_th=1.5), "beta_th"),
        (dict(beta_th=math.nan), "beta_th"),
        (dict(degenerate_tol=-1e-6), "degenerate_tol"),
        (dict(degenerate_tol=math.nan), "degenerate_tol"),  # NaN: every group degenerate, nothing learnt
        (dict(degenerate_tol=math.inf), "degenerate_tol"),
        (dict(max_alpha=0.5), "max_alpha"),
        (dict(max_alpha=math.nan), "max_alpha"),  # NaN: min(alpha, nan) silently disables the cap
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
def _binary_rewards(degenerate: torch.Tensor, G: int = 8) -> torch.Tensor:
    """(P, G) rewards: all 0 for a degenerate group, one correct completion otherwise."""
    informative = torch.tensor([1.0] + [0.0] * (G - 1))
    return torch.stack([torch.zeros(G) if d else informative for d in degenerate.tolist()])


def test_plan_assembly_worked_example():
    # docs/methods/gpg.md §12 Example 5 (P = 5, G = 8, one process): round 0 has 2 informative groups, round 1 two more; the
    # assembled batch is 4 informative groups + 1 degenerate filler group *from the last round*, alpha = 40/32.
    rounds = [torch.tensor([False, True, True, False, True]), torch.tensor([True, False, True, False, True])]
    rewards = [_binary_rewards(r) for r in rounds]
    assert informative_share(rewards[:1], 1) == 0.4
    plan = plan_assembly(rounds, 1)
    assert plan == [(0, 0), (1, 1), (1, 3), (0, 3), (1, 0)]
    assert [k for k, g in plan if rounds[k][g]] == [1]  # the filler comes from round 1, the last one
    assert informative_share(rewards, 1) == 0.8
    assert gpg_alpha(assemble_rewards(rewards, 1)[1]) == 1.25 <= 1 / 0.6
    # Two processes: process 1 owns groups 2..3 (all degenerate in round 0) and may only use its own groups: its
    # informative group of round 1, then its degenerate group of round 1 as filler.
    two = [torch.tensor([False, False, True, True]), torch.tensor([False, False, True, False])]
    assert plan_assembly(two, 2) == [(0, 0), (0, 1), (1, 3), (1, 2)]
    assert informative_share([_binary_rewards(r) for r in two], 2) == 0.75
    # A single round: the identity plan.
    assert plan_assembly(two[:1], 2) == [(0, 0), (0, 1), (0, 2), (0, 3)]


def test_threshold_counts_unscorable_rows_like_alpha():
    """P13 / A7 (the audit's case): the stop test is rho = (B - M) / B with unscorable rows in M, i.e. 1 / alpha.

    3 informative groups with one unscorable completion each + 2 degenerate groups: 60% of the groups are
    informative, but rho = 21/40 < beta_th = 0.6 (alpha = 40/21 > 1/0.6), so the threshold is not met.
    """
    nan, G, beta_th = math.nan, 8, 0.6
    informative = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, nan]
    round0 = torch.tensor([informative] * 3 + [[0.0] * G] * 2)
    share = informative_share([round0], 1)
    # tol: approx's default rel 1e-6: the share and 1/alpha are ratios of token counts (exact integers) taken in
    # float32 then read as Python floats: one or two roundings of a value <= 1 (<= 2 x 2^-24 = 1.2e-7 relative).
    assert share == pytest.approx(21 / 40) and share == pytest.approx(1 / gpg_alpha(round0))
    assert share < beta_th
    # A second round brings fully scorable informative groups for the two degenerate slots: rho = 37/40.
    round1 = torch.tensor([[0.0] * G] * 3 + [[1.0] + [0.0] * (G - 1)] * 2)
    _, assembled = assemble_rewards([round0, round1], 1)
    share = informative_share([round0, round1], 1)
    # tol: approx's default rel 1e-6 on a ratio of exact counts rounded once or twice in float32 (<= 1.2e-7 relative).
    assert share == pytest.approx(37 / 40) and share >= beta_th and gpg_alpha(assembled) <= 1 / beta_th


@settings(max_examples=60, deadline=None)
@given(
    num_processes=st.sampled_from([1, 2]),
    groups_per_process=st.integers(1, 3),
    num_rounds=st.integers(1, 3),
    data=st.data(),
)
def test_informative_share_is_one_over_alpha_of_the_assembled_batch(
    num_processes, groups_per_process, num_rounds, data
):
    P, G = num_processes * groups_per_process, 3
    value = st.sampled_from([0.0, 1.0, math.nan])
    rounds = [torch.tensor(data.draw(st.lists(st.lists(value, min_size=G, max_size=G), min_size=P, max_size=P)))
              for _ in range(num_rounds)]  # fmt: skip
    plan, assembled = assemble_rewards(rounds, num_processes)
    assert plan == plan_assembly([degenerate_groups(r) for r in rounds], num_processes)
    share = informative_share(rounds, num_processes)
    dead = degenerate_groups(assembled)[:, None] | torch.isnan(assembled)
    if dead.all():
        assert share == 0.0
    else:
        # tol: approx's default rel 1e-6: share and 1/alpha are ratios of exact counts, each a couple of float32
        # roundings (<= 1.2e-7 relative).
        assert share == pytest.approx(1 / gpg_alpha(assembled))  # rho >= beta_th  <=>  alpha <= 1 / beta_th


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
            assert rounds[0][slot]  # only degenerate round-0 slots are replaced
        if rounds[k][g]:
            # docs/methods/gpg.md §2.6 step 4: the degenerate filler comes from the last round.
            assert k == num_rounds - 1
    for rank in range(num_processes):
        mine = range(rank * groups_per_process, (rank + 1) * groups_per_process)
        available = sum(not rounds[k][g] for k in range(num_rounds) for g in mine)
        got = sum(not rounds[plan[s][0]][plan[s][1]] for s in mine)
        assert got == min(groups_per_process, available)  # as many informative groups as the process can have


def _brute_force_loss(logps, advantages, mask, G, normalization) -> float:
    """docs/methods/gpg.md §2.3 / §12 conventions as explicit loops: Eq. 5 (each group's token sum over its token count,
    mean over the P groups), the global token mean, or the per-completion token mean averaged over the N rows."""
    N, T = mask.shape
    terms = [[-advantages[i].item() * logps[i, t].item() for t in range(T) if mask[i, t]] for i in range(N)]
    if normalization == "group":
        groups = [[x for i in range(q * G, (q + 1) * G) for x in terms[i]] for q in range(N // G)]
        return sum(sum(group) / len(group) for group in groups if group) / len(groups)
    if normalization == "token":
        tokens = [x for row in terms for x in row]
        return sum(tokens) / max(len(tokens), 1)
    return sum(sum(row) / len(row) for row in terms if row) / N


@settings(max_examples=40, deadline=None)
@given(
    num_groups=st.integers(1, 4),
    G=st.integers(2, 4),
    width=st.integers(1, 5),
    normalization=st.sampled_from(["group", "token", "sequence"]),
    seed=st.integers(0, 2**16),
)
def test_loss_row_weights_give_the_brute_force_loss_over_any_split(num_groups, G, width, normalization, seed):
    generator = torch.Generator().manual_seed(seed)
    N = num_groups * G
    logps = -torch.rand(N, width, generator=generator, dtype=torch.float64) * 3
    mask = torch.rand(N, width, generator=generator) < 0.7
    advantages = torch.randn(N, generator=generator, dtype=torch.float64)
    weights = loss_row_weights(mask, G, normalization=normalization)
    expected = _brute_force_loss(logps, advantages, mask, G, normalization)  # not gpg_loss: it uses these weights
    as_sum = (weights * (-advantages[:, None] * logps * mask).sum(dim=1)).sum()
    # tol: float64 sums of n <= 4 x 4 x 5 = 80 terms |A logp| <= ~12 with weights summing to <= 1, in another order
    # than the brute force: <= n x 2^-53 x 12 ~ 1.1e-13 absolute, under abs 1e-12 (rel 1e-12 ~ 4500 float64 ULP).
    assert as_sum.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    # Any split of the rows (processes, micro-steps) adds up to the whole: the loss is a plain row sum.
    split = torch.randperm(N, generator=generator)[: N // 2]
    rest = torch.ones(N, dtype=torch.bool)
    rest[split] = False
    parts = [(weights[i] * (-advantages[i, None] * logps[i] * mask[i]).sum(dim=1)).sum() for i in (split, rest)]
    # tol: as above: any split regroups the same <= 80 float64 terms, <= 80 x 2^-53 x 12 ~ 1.1e-13 < 1e-12.
    assert (parts[0] + parts[1]).item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


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
    assert _metric(trainer, "gpg/rounds") == 1 and _metric(trainer, "gpg/all_degenerate") == 0.0  # no beta_th
    loss, alpha, _, grads = reference_step(tiny_model_dir, [record], 4)
    assert alpha == 1.0
    # tol: float32 trainer vs float64 reference (tests/dist/gpg_common.py): the loss is a token mean of A logp over the
    # batch, each fp32 logp a few ULP of |logp| <= ~5 off (2-layer width-32 forward), the errors of opposite signs
    # averaging over ~50-100 tokens; 1e-6 is a handful of float32 ULP of the loss, not a worst-case sum (flagged in the
    # issue-44 audit report).
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
    # tol: as in test_alpha_is_one_without_degenerate_groups: fp32 trainer vs fp64 reference loss, a handful of float32
    # ULP of the token mean (flagged in the audit report).
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
    assert _metric(trainer, "gpg/all_degenerate") == 1.0  # docs/methods/gpg.md §6: "log all_degenerate=1"
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
    # tol: approx's default rel 1e-6: alpha is 1/share of exact counts, two float32 roundings (<= 1.2e-7 relative).
    assert _metric(trainer, "gpg/alpha") == pytest.approx(1 / share)
    # tol: approx's default rel 1e-6: the logged reward and this mean of the same float32 rewards in [0, 1] (16 values,
    # <= 16 x 2^-24 ~ 9.5e-7 relative).
    assert _metric(trainer, "reward") == pytest.approx(record["rewards"].mean().item())  # metrics: trained batch
    assert record["completion_ids"].size(0) == 16  # the generation batch size is unchanged
    loss, alpha, advantages, grads = reference_step(tiny_model_dir, [record], 4)
    assert torch.equal(record["advantages"].double(), advantages)
    # tol: fp32 trainer vs fp64 reference loss, a handful of float32 ULP of the token mean (see
    # test_alpha_is_one_without_degenerate_groups; flagged in the audit report).
    assert _metric(trainer, "loss") == pytest.approx(loss, abs=1e-6)
    _assert_grads_match(trainer.grads[0], grads)
    # Extra prompts are a function of (seed, step, round): the same when asked again, other ones for another round.
    draw = [x["problem"] for x in trainer._draw_prompts(1)]
    assert draw == [x["problem"] for x in trainer._draw_prompts(1)]
    assert draw != [x["problem"] for x in trainer._draw_prompts(2)]
    assert draw[::4] == draw[1::4] == draw[2::4] == draw[3::4]  # TRL's layout: each prompt G times in a row


def test_rounds_and_all_degenerate_are_logged_every_step(tiny_model_dir, tmp_path):
    """docs/methods/gpg.md §3.1 and 6: ``rounds`` (1 without resampling) and ``all_degenerate`` on every optimizer step."""
    trainer = _train(tiny_model_dir, tmp_path, constant_reward, flat=lambda i: True, max_steps=2)
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    for logs in steps:
        assert logs["gpg/rounds"] == 1 and logs["gpg/all_degenerate"] == 1.0 and logs["gpg/alpha"] == 1.0


def near_flat_or_dense_reward(completions, completion_ids, flat, **kwargs):
    """Like ``flat_or_dense_reward``, but a ``flat`` prompt's completions get rewards 2e-7 apart (max - min = 6e-7
    for groups of 4, distinct in float32): degenerate only for a ``degenerate_tol`` >= 6e-7."""
    return [
        0.25 + 2e-7 * (j % 4) if f else (sum(ids) % 97) / 97 for j, (ids, f) in enumerate(zip(completion_ids, flat))
    ]


@pytest.mark.parametrize(
    ("options", "expected_alpha"),
    [
        (dict(scale_rewards="group", degenerate_tol=1e-6, max_alpha=1.5), 1.5),  # uncapped alpha would be 2
        (dict(scale_rewards="batch", degenerate_tol=1e-6, use_alpha=False), 1.0),
    ],
)
def test_options_reach_the_maths(tiny_model_dir, tmp_path, options, expected_alpha):
    """``scale_rewards`` (F_norm), ``degenerate_tol``, ``max_alpha`` and ``use_alpha`` through a real step."""
    trainer = _train(
        tiny_model_dir, tmp_path, near_flat_or_dense_reward, flat=lambda i: i % 4 >= 2,
        gradient_accumulation_steps=2, per_device_train_batch_size=8, **options,
    )  # fmt: skip
    record = trainer.records[0]
    rewards = record["rewards"]
    assert not degenerate_groups(rewards).any()  # with tol = 0 every group is informative ...
    assert degenerate_groups(rewards, tol=1e-6).tolist() == [False, False, True, True]  # ... the tolerance decides
    assert _metric(trainer, "gpg/M") == 8 and gpg_alpha(rewards, tol=1e-6) == 2.0
    assert record["alpha"] == expected_alpha and _metric(trainer, "gpg/alpha") == expected_alpha
    loss, alpha, advantages, grads = reference_step(
        tiny_model_dir, [record], 4, f_norm=options["scale_rewards"], tol=1e-6,
        max_alpha=options.get("max_alpha"), use_alpha=options.get("use_alpha", True),
    )  # fmt: skip
    assert alpha == expected_alpha
    assert torch.equal(record["advantages"].double(), advantages)
    assert not advantages[8:].any()  # the near-flat groups are zeroed
    unnormalised = gpg_advantages(rewards, tol=1e-6).reshape(-1).double()
    assert (advantages[:8] - unnormalised[:8]).abs().max() > 0.1  # F_norm really divided
    # tol: fp32 trainer vs fp64 reference loss, a handful of float32 ULP of the token mean (see
    # test_alpha_is_one_without_degenerate_groups; flagged in the audit report).
    assert _metric(trainer, "loss") == pytest.approx(loss, abs=1e-6)
    _assert_grads_match(trainer.grads[0], grads)


def test_resampling_threshold_counts_unscorable_rows(tiny_model_dir, tmp_path, caplog):
    """P13 with unscorable rows (A7) through the trainer. Group 3 of 4 is flat and every informative group has one
    unscorable completion: 3/4 of the groups are informative (>= beta_th = 0.7), but rho = 9/16 < 0.7, i.e.
    alpha = 16/9 > 1/0.7, so another round must run. Then rho = 12/16: met for 0.7; for 0.8 no degenerate slot is
    left, so further rounds could not change the batch and resampling stops early, with a warning."""

    def reward(completions, completion_ids, flat, **kwargs):
        values = [1.0 if f else (sum(ids) % 97) / 97 for ids, f in zip(completion_ids, flat)]
        return [None if j % 4 == 0 and not flat[j] else v for j, v in enumerate(values)]

    for beta_th in (0.7, 0.8):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.gpg"):
            trainer = _train(
                tiny_model_dir, tmp_path / str(beta_th), reward, flat=lambda i: i % 4 == 3, beta_th=beta_th,
                max_generation_rounds=5, gradient_accumulation_steps=2, per_device_train_batch_size=8,
            )  # fmt: skip
        rewards = trainer.records[0]["rewards"]
        alpha, share = _metric(trainer, "gpg/alpha"), _metric(trainer, "gpg/informative_share")
        assert torch.isnan(rewards).any() and not degenerate_groups(rewards).any()
        # tol: approx's default rel 1e-6: alpha is 1/share of exact counts, two float32 roundings (<= 1.2e-7 relative).
        assert _metric(trainer, "gpg/rounds") == 2 and share == 12 / 16 and alpha == pytest.approx(1 / share)
        if beta_th == 0.7:
            assert _metric(trainer, "gpg/threshold_met") == 1.0 and alpha <= 1 / beta_th
            assert "still below beta_th" not in caplog.text
        else:
            assert _metric(trainer, "gpg/threshold_met") == 0.0 and "still below beta_th" in caplog.text


class _EOSOnlyFirstRound(RecordingGPG):
    """Round 0 can only sample EOS (1-token completions, via ``generation_kwargs``); extra rounds sample freely."""

    def _draw_prompts(self, round_index):
        self.generation_kwargs.pop("suppress_tokens", None)
        self.generation_config.suppress_tokens = None
        return super()._draw_prompts(round_index)


def test_resampling_merges_a_round_of_one_token_completions(tiny_model_dir, tiny_tokenizer, tmp_path):
    """docs/methods/gpg.md §6 ("never crash"): round 0 is all 1-token completions, the extra round's are wider; the assembled
    batch mixes both (was a ``torch.stack`` size mismatch) and its gradient is the reference one."""
    counter = itertools.count()

    def reward(completions, flat, **kwargs):  # flat: constant; otherwise distinct within a group, even for EOS-only
        return [1.0 if f else (next(counter) % 5) / 5 for f in flat]

    eos = tiny_tokenizer.eos_token_id
    trainer = _train(
        tiny_model_dir, tmp_path, reward, flat=lambda i: i % 2 == 1, trainer_cls=_EOSOnlyFirstRound,
        processing_class=tiny_tokenizer, beta_th=1.0, max_generation_rounds=2,
        generation_kwargs={"suppress_tokens": [i for i in range(len(tiny_tokenizer)) if i != eos]},
    )  # fmt: skip
    record = trainer.records[0]
    assert _metric(trainer, "gpg/rounds") == 2
    lengths = record["completion_mask"].sum(dim=1)
    assert lengths[:4].tolist() == [1, 1, 1, 1]  # slot 0: round 0's informative group, EOS only
    assert record["completion_ids"].size(1) > 1 and lengths[4:].max() > 1  # slot 1: from the wider round 1
    assert (record["completion_ids"][:4, 1:] == tiny_tokenizer.pad_token_id).all()
    loss, _, advantages, grads = reference_step(tiny_model_dir, [record], 4)
    assert torch.equal(record["advantages"].double(), advantages)
    # tol: fp32 trainer vs fp64 reference loss, a handful of float32 ULP of the token mean (see
    # test_alpha_is_one_without_degenerate_groups; flagged in the audit report).
    assert _metric(trainer, "loss") == pytest.approx(loss, abs=1e-6)
    _assert_grads_match(trainer.grads[0], grads)


def _fake_trainer(G: int, mode: str = "token_truncate"):
    accelerator = types.SimpleNamespace(process_index=0, num_processes=1, gather=lambda t: t.reshape(1))
    return types.SimpleNamespace(
        num_generations=G, accelerator=accelerator, _tokenizer=types.SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None, vllm_importance_sampling_mode=mode, _name="GPG",
    )  # fmt: skip


def _round_output(round_index: int, width: int, n: int, ratio_width: int) -> dict:
    ids = torch.arange(n * width).reshape(n, width) + 100 * (round_index + 1)  # nonzero: 0 is the pad id
    return {
        "prompt_ids": torch.full((n, 3), round_index + 1), "prompt_mask": torch.ones(n, 3, dtype=torch.long),
        "completion_ids": ids, "completion_mask": torch.ones(n, width, dtype=torch.long),
        "importance_sampling_ratio": torch.full((n, ratio_width), 0.5 + round_index),
        "advantages": torch.full((n,), float(round_index)), "num_items_in_batch": torch.tensor(n * width),
    }  # fmt: skip


@pytest.mark.parametrize("widths", [(1, 3), (3, 1), (2, 2)])
@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
def test_merge_rounds_pads_every_round_to_the_widest(widths, mode):
    """Padding used to be skipped whenever round 0 was 1 token wide: widths (1, 3) crashed in ``torch.stack``. The
    sequence-level importance-sampling ratio is (n, 1) at any width and must pass through unpadded."""
    G, n = 2, 4  # two groups per round
    per_token = mode.startswith("token")
    outputs = [_round_output(k, w, n, w if per_token else 1) for k, w in enumerate(widths)]
    plan = [(0, 0), (1, 1)]  # slot 0: round-0 group 0; slot 1: round-1 group 1
    merged = GRPOFamilyTrainer._merge_round_outputs(_fake_trainer(G, mode), outputs, plan)
    width = max(widths)
    assert merged["completion_ids"].shape == (n, width) and merged["completion_mask"].shape == (n, width)
    for rows, (k, g) in zip((slice(0, 2), slice(2, 4)), plan):
        w, source = widths[k], outputs[k]
        assert torch.equal(merged["completion_ids"][rows, :w], source["completion_ids"][g * G : (g + 1) * G])
        assert not merged["completion_ids"][rows, w:].any() and not merged["completion_mask"][rows, w:].any()
        assert merged["completion_mask"][rows, :w].all()
        assert torch.equal(merged["prompt_ids"][rows], source["prompt_ids"][g * G : (g + 1) * G])
        assert (merged["advantages"][rows] == k).all()
        ratio = merged["importance_sampling_ratio"][rows]
        assert ratio.shape == ((G, width) if per_token else (G, 1))
        assert (ratio[:, : w if per_token else 1] == 0.5 + k).all() and not ratio[:, w if per_token else 1 :].any()
    assert merged["num_items_in_batch"].item() == G * widths[0] + G * widths[1]


# ---------------------------------------------------------------------------------------------------- 2 processes
@scenario("gpg_grads", TINY_MODEL)
def test_two_process_gradients_equal_single_process_with_global_alpha(tiny_model_dir, dist_output):
    for case, expected_alpha in [("whole", 2.0), ("straddle", 1.5), ("resample", None)]:
        ranks = [torch.load(dist_output / f"{case}_rank{r}.pt", weights_only=False) for r in (0, 1)]
        records = [r["records"][0] for r in ranks]
        assert torch.equal(records[0]["rewards"], records[1]["rewards"]), case
        assert records[0]["alpha"] == records[1]["alpha"], case  # P15: alpha identical on every process
        loss, alpha, advantages, grads = reference_step(tiny_model_dir, records, 4)
        assert records[0]["alpha"] == alpha, case
        if expected_alpha is not None:
            assert alpha == expected_alpha, case
        assert torch.equal(torch.cat([r["advantages"] for r in records]).double(), advantages), case
        for rank in ranks:
            # tol: fp32 trainer vs fp64 reference loss, a handful of float32 ULP of the token mean (see
            # test_alpha_is_one_without_degenerate_groups; flagged in the audit report).
            assert rank["logs"][0]["loss"] == pytest.approx(loss, abs=1e-6), case
            _assert_grads_match(rank["grads"][0], grads)
        degenerate = degenerate_groups(records[0]["rewards"])
        if case == "whole":  # rank 1 held only degenerate groups; per-rank alphas would have been 1 and 1
            assert degenerate.tolist() == [False, False, True, True]
        if case == "resample":
            rounds = [r["logs"][0]["gpg/rounds"] for r in ranks]
            assert rounds[0] == rounds[1] > 1  # both processes ran the same rounds
            assert 1 - degenerate.float().mean().item() >= 0.75


def test_resampling_survives_an_all_masked_batch(tiny_model_dir, tiny_tokenizer, tmp_path):
    """TRL's all-masked shape: ``mask_truncated_completions=True`` and every completion truncated (EOS suppressed), so
    the loss mask of every round is all zero. Merging the rounds used to trim the completions to width 0; the forward
    then passed ``logits_to_keep=0`` ("keep every position") and the loss failed with a size mismatch. Like stock TRL
    and GPG without ``beta_th``, the step now trains with loss 0 and leaves the weights unchanged."""
    eos = tiny_tokenizer.eos_token_id
    trainer = _train(
        tiny_model_dir, tmp_path, constant_reward, flat=lambda i: True, processing_class=tiny_tokenizer,
        beta_th=0.5, max_generation_rounds=2, mask_truncated_completions=True, max_completion_length=3,
        generation_kwargs={"suppress_tokens": [eos]},
    )  # fmt: skip
    record = trainer.records[0]
    assert _metric(trainer, "gpg/rounds") == 2
    assert record["completion_mask"].sum() == 0 and record["completion_ids"].size(1) > 0
    assert _metric(trainer, "loss") == 0.0
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).state_dict()
    assert all(torch.equal(initial[k], v) for k, v in trainer.model.state_dict().items())
