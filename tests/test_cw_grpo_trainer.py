"""CWGRPOTrainer (grpo_family/trainers/cw_grpo.py): config validation, the per-token advantages that reach the loss
(GRPO advantage x covariance weight of an independently recomputed rollout batch), nothing else in the loss
changing, where the rollout log-probs come from, and a 2-process run whose weights are the gathered batch's."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import digit_share_reward
from dist_suite import TESTS, TINY_MODEL, scenario
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from grpo_family import GRPOFamilyTrainer
from grpo_family.algorithms.cw_grpo import covariance_weights
from grpo_family.algorithms.grpo import group_advantages
from grpo_family.trainers.cw_grpo import CWGRPOConfig, CWGRPOTrainer

TIMING_KEYS = ("time", "runtime", "per_second")


def build(trainer_cls, model_dir, config, dataset, reward=digit_share_reward):
    # The character-level tokenizer explicitly: from the path alone AutoTokenizer builds a Qwen2Tokenizer that
    # drops newlines of this vocabulary.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    return trainer_cls(
        model=model_dir, reward_funcs=[reward], args=config, train_dataset=dataset, processing_class=tokenizer
    )


# ---------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("cw_scope", "microbatch", r"cw_scope must be one of \('group', 'batch'\)"),
        ("cw_adv_center", "median", r"cw_adv_center must be one of \('token', 'sequence'\)"),
        ("cw_std_ddof", 2, r"cw_std_ddof must be one of \(0, 1\)"),
        ("cw_bandwidth_scale", 0.0, "cw_bandwidth_scale must be > 0"),
        ("cw_bandwidth_scale", -1.0, "cw_bandwidth_scale must be > 0"),
        ("cw_bandwidth_scale", float("nan"), "cw_bandwidth_scale must be > 0"),
        ("cw_bandwidth_scale", -float("inf"), "cw_bandwidth_scale must be > 0"),
        ("cw_eps", 0.0, "cw_eps must be > 0"),
        ("cw_logps_source", "auto", r"cw_logps_source must be one of \('policy', 'sampler'\)"),
    ],
)
def test_invalid_options_fail_at_config_time(config_kwargs, option, value, message):
    with pytest.raises(ValueError, match=message):
        CWGRPOConfig(**config_kwargs(**{option: value}))


def test_defaults_are_the_specs_and_sequence_level_warns(config_kwargs):
    config = CWGRPOConfig(**config_kwargs())
    assert (config.cw_scope, config.cw_adv_center, config.cw_std_ddof) == ("group", "token", 0)
    assert (config.cw_bandwidth_scale, config.cw_eps, config.cw_normalize) == (1.0, 1e-8, True)
    # docs/methods/cw_grpo.md §2.4 step 1: the policy's (pi_old) log-probs, never the inference engine's; the sampler's are opt-in.
    assert config.cw_logps_source == "policy"
    assert CWGRPOConfig(**config_kwargs(cw_bandwidth_scale=float("inf"))).cw_bandwidth_scale == float("inf")
    with pytest.warns(UserWarning, match="importance_sampling_level='sequence'"):
        CWGRPOConfig(**config_kwargs(importance_sampling_level="sequence"))


# ---------------------------------------------------------------------------------------------------- training
class Recording(CWGRPOTrainer):
    """Records the hook's rewards, the unshuffled batch it returns, and what each loss call receives."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rewards, self.batches, self.loss_inputs = [], [], []

    def compute_advantages(self, batch):
        self.rewards.append(batch.rewards.clone())
        return super().compute_advantages(batch)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.batches.append({k: v.clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
        return out

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)  # the loss-time path writes the weighted advantages during it
        self.loss_inputs.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return loss


def independent_logps(model_dir, batch, temperature):
    """log pi(sampled token) of the initial model, with plain transformers (no TRL helper)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("reuse", [False, True], ids=["extra_forward", "loss_logps"])
def test_loss_gets_grpo_advantage_times_weights_of_the_rollout_batch(
    tiny_model_dir, arithmetic_train, config_kwargs, reuse
):
    """Weights made in the hook (an extra forward) or in the loss (its own log-probs): either way the loss
    trains on A_i * w_it, w from covariance_weights on the rollout batch."""
    temperature = 0.7
    kwargs = config_kwargs(max_steps=1, max_completion_length=16, temperature=temperature, bf16=False)
    config = CWGRPOConfig(**kwargs, cw_reuse_loss_logps=reuse)
    trainer = build(Recording, tiny_model_dir, config, arithmetic_train)
    trainer.train()
    (rewards,), (batch,) = trainer.rewards, trainer.batches
    mask = batch["completion_mask"].bool()

    # Independent recomputation: TRL's GRPO advantages, the initial model's log-probs (max_steps=1: the rollout
    # policy), the pure weight function.
    advantages = group_advantages(rewards).reshape(-1)
    logps = independent_logps(tiny_model_dir, batch, temperature)
    weights = covariance_weights(logps, advantages, mask, 4)
    expected = torch.where(mask, advantages[:, None] * weights, 0.0)
    # The test can fail: the weights are far from 1 on some tokens, and the unweighted advantages differ.
    assert (weights[mask] - 1).abs().max() > 0.2
    assert (expected - advantages[:, None] * mask).abs().max() > 0.05
    if reuse:  # the generation batch carries GRPO's advantages; the loss weights them
        assert torch.equal(batch["advantages"], advantages) and "cw_grpo/row" in batch
    else:
        # tol: the trainer's log-probs come from its own forward (another batch shape, padding and kernel order than
        # independent_logps): float32 logits of the 2-layer, width-32 tiny model differ by ~k ULP (k ~ the 32-64-term
        # sums per layer) x |logit| <= ~10, i.e. ~1e-5; the weights exp(-c^2/2 sigma^2) renormalised, O(1) and smooth
        # in the logps, times |A| <= 2, carry that ~1e-5: 1e-4 is a 10x margin over rounding.
        torch.testing.assert_close(batch["advantages"], expected, atol=1e-4, rtol=1e-4)

    # What the loss trains on, rows shuffled by TRL.
    (inputs,) = trainer.loss_inputs
    key = lambda b, i: (tuple(b["prompt_ids"][i].tolist()), tuple(b["completion_ids"][i].tolist()))  # noqa: E731
    rows = {key(batch, i): expected[i] for i in range(len(mask))}
    assert inputs["advantages"].shape == mask.shape
    for i in range(inputs["advantages"].size(0)):
        # tol: as above (rows of the same A_i * w_it): two forwards' float32 rounding, ~1e-5 on O(1) values, 10x
        # margin.
        torch.testing.assert_close(inputs["advantages"][i], rows[key(inputs, i)], atol=1e-4, rtol=1e-4)

    logs = trainer.state.log_history[0]
    valid = weights[mask]
    assert logs["cw_grpo/extra_forward"] == (0.0 if reuse else 1.0)  # TRL's defaults compute no old logps
    # tol: the logged weight statistics are the trainer's own-forward weights vs independent_logps' (float32 rounding
    # ~1e-5 on O(1) weights, see above): 1e-4.
    assert logs["cw_grpo/weight_min"] == pytest.approx(valid.min().item(), abs=1e-4)
    # tol: as weight_min: float32 forward rounding ~1e-5 on O(1) weights, 1e-4.
    assert logs["cw_grpo/weight_max"] == pytest.approx(valid.max().item(), abs=1e-4)
    # tol: as weight_min: the std of O(1) weights moves by at most the weights' ~1e-5 rounding, 1e-4.
    assert logs["cw_grpo/weight_std"] == pytest.approx(valid.std(correction=0).item(), abs=1e-4)
    # tol: the fraction is k/N (a count of weights under 0.5, averaged in float32: one rounding of a value <= 1,
    # 2^-24); 1e-6 holds as long as no weight lies within the forwards' ~1e-5 rounding of 0.5 (then the count itself
    # could differ by one).
    assert logs["cw_grpo/frac_weight_lt_0.5"] == pytest.approx((valid < 0.5).float().mean().item(), abs=1e-6)


def test_weights_from_the_loss_equal_weights_from_an_extra_forward(tiny_model_dir, arithmetic_train, config_kwargs):
    """Two optimizer steps, each with 2 accumulation micro-steps generating their own batch
    (steps_per_generation=1) and a KL term: the same training either way, up to float rounding."""
    # Adam's first step is lr * g / (|g| + eps), whose slope at g ~ 0 is lr / eps: with the default eps 1e-8 the float32
    # rounding of a gradient entry that nearly cancels is amplified up to a whole step (one entry of 2048 moved 1.4e-5
    # apart in a loaded 2-thread run). eps = 1 makes the step ~ lr * g, so the two paths' rounding stays rounding.
    kwargs = config_kwargs(
        max_steps=2, gradient_accumulation_steps=2, steps_per_generation=1, beta=0.04, adam_epsilon=1.0
    )
    runs = {}
    for reuse in (False, True):
        trainer = build(Recording, tiny_model_dir, CWGRPOConfig(**kwargs, cw_reuse_loss_logps=reuse), arithmetic_train)
        trainer.train()
        runs[reuse] = trainer
    hook, loss = runs[False], runs[True]
    assert len(hook.loss_inputs) == len(loss.loss_inputs) == 4
    for a, b in zip(hook.loss_inputs, loss.loss_inputs):
        assert torch.equal(a["completion_ids"], b["completion_ids"])  # same samples, same shuffle
        # tol: the two paths compute the same log-probs in two forwards of another batch layout (float32, ~1e-5 on
        # logps <= ~10 in magnitude, see the test above); the advantages A_i * w_it are O(1): 1e-5 absolute + 1e-5
        # relative is ~100 float32 ULP of values near 1.
        torch.testing.assert_close(a["advantages"], b["advantages"], atol=1e-5, rtol=1e-5)
    assert all(h["cw_grpo/extra_forward"] == 1.0 for h in hook.state.log_history if "cw_grpo/extra_forward" in h)
    assert all(h["cw_grpo/extra_forward"] == 0.0 for h in loss.state.log_history if "cw_grpo/extra_forward" in h)
    for name, p in hook.model.named_parameters():
        # tol: two Adam steps (eps 1, so each ~ lr * g with lr 1e-2) move each parameter by <= ~2e-2 x |g|; the two
        # paths' gradients differ only by float32 forward rounding (relative ~1e-6..1e-5), so the updates differ by
        # ~2e-2 x 1e-5 = 2e-7, far under 1e-5 + 1e-4 x |p|.
        torch.testing.assert_close(p, loss.model.get_parameter(name), atol=1e-5, rtol=1e-4)


def test_weights_from_the_loss_are_reused_on_every_iteration(tiny_model_dir, arithmetic_train, config_kwargs):
    """num_iterations=2 with steps_per_generation=1 and gradient_accumulation_steps=2: TRL computes no
    old_per_token_logps and hands the same buffered batch to both passes. The weights are made once, in the
    first pass's loss (docs/methods/cw_grpo.md §2.6, §6: fixed for all mu passes); the second pass trains on the same (B, T)
    advantages, not on weights applied a second time."""
    temperature = 0.7
    kwargs = config_kwargs(
        max_steps=1, gradient_accumulation_steps=2, steps_per_generation=1, num_iterations=2, temperature=temperature
    )
    calls = []

    class Spy(Recording):
        def _covariance_weights(self, logps, advantages, mask, num_generations):
            calls.append(advantages.shape)
            return super()._covariance_weights(logps, advantages, mask, num_generations)

    trainer = build(Spy, tiny_model_dir, CWGRPOConfig(**kwargs), arithmetic_train)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    (rewards,), (batch,) = trainer.rewards, trainer.batches
    assert "old_per_token_logps" not in batch and "cw_grpo/row" in batch  # the in-loss path
    mask = batch["completion_mask"].bool()
    assert calls == [(mask.size(0),)]  # weights made once, from GRPO's (B,) advantages

    first, second = trainer.loss_inputs
    assert first["advantages"].shape == second["advantages"].shape == mask.shape
    assert torch.equal(second["advantages"], first["advantages"])
    # ... and they are A_i * w_it of the rollout batch (independent recomputation, rows shuffled by TRL).
    advantages = group_advantages(rewards).reshape(-1)
    weights = covariance_weights(independent_logps(tiny_model_dir, batch, temperature), advantages, mask, 4)
    assert (weights[mask] - 1).abs().max() > 0.2
    expected = torch.where(mask, advantages[:, None] * weights, 0.0)
    key = lambda b, i: (tuple(b["prompt_ids"][i].tolist()), tuple(b["completion_ids"][i].tolist()))  # noqa: E731
    rows = {key(batch, i): expected[i] for i in range(len(mask))}
    for i in range(mask.size(0)):
        # tol: the same derivation as the loss-path test above: the weights from independent_logps vs the trainer's
        # forward differ by float32 rounding (~1e-5 on O(1) values), 1e-4.
        torch.testing.assert_close(second["advantages"][i], rows[key(second, i)], atol=1e-4, rtol=1e-4)

    logs = trainer.state.log_history[0]
    assert math.isfinite(logs["loss"]) and logs["loss"] != 0.0
    after = dict(trainer.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(after[n], before[n]) for n in before)


@pytest.mark.parametrize("steps_per_generation", [1, 2], ids=["loss_logps", "extra_forward"])
def test_infinite_bandwidth_trains_exactly_grpo(tiny_model_dir, arithmetic_train, config_kwargs, steps_per_generation):
    """cw_bandwidth_scale=inf (docs/methods/cw_grpo.md §9 ablation; kappa -> inf recovers GRPO): every weight is exactly 1, so the
    run equals grpo's, with finite CW metrics."""
    kwargs = config_kwargs(
        max_steps=2, beta=0.04, gradient_accumulation_steps=2, steps_per_generation=steps_per_generation
    )
    grpo, grpo_logs = _train(GRPOFamilyTrainer, tiny_model_dir, arithmetic_train, CWGRPOConfig(**kwargs))
    config = CWGRPOConfig(**kwargs, cw_bandwidth_scale=float("inf"))
    cw, cw_logs = _train(Recording, tiny_model_dir, arithmetic_train, config)
    assert cw_logs == grpo_logs
    expected = grpo.model.state_dict()
    assert all(torch.equal(expected[k], v) for k, v in cw.model.state_dict().items())
    for inputs in cw.loss_inputs:
        assert inputs["advantages"].shape == inputs["completion_mask"].shape
    metrics = [v for h in cw.state.log_history for k, v in h.items() if k.startswith("cw_grpo/")]
    assert metrics and all(math.isfinite(v) for v in metrics)
    assert any(h.get("cw_grpo/degenerate_frac", 1.0) < 1.0 for h in cw.state.log_history)  # weights were made


def test_loss_that_reads_advantages_first_is_an_error(tiny_model_dir, arithmetic_train, config_kwargs):
    """If TRL's loss stopped computing the log-probs before reading the advantages, CW-GRPO must not silently
    train on unweighted advantages."""

    class NoForward(CWGRPOTrainer):
        def _compute_loss(self, model, inputs):
            return inputs["advantages"].sum() * 0.0

    trainer = build(NoForward, tiny_model_dir, CWGRPOConfig(**config_kwargs(max_steps=1)), arithmetic_train)
    with pytest.raises(RuntimeError, match="cw_reuse_loss_logps=False"):
        trainer.train()


class UnitWeights(CWGRPOTrainer):
    def _covariance_weights(self, logps, advantages, mask, num_generations):
        return mask.float()


def _train(trainer_cls, model_dir, dataset, config):
    trainer = build(trainer_cls, model_dir, config, dataset)
    trainer.train()
    logs = [
        {k: v for k, v in h.items() if not any(t in k for t in TIMING_KEYS) and not k.startswith("cw_grpo/")}
        for h in trainer.state.log_history
    ]
    return trainer, logs


def test_with_unit_weights_training_is_grpo(tiny_model_dir, arithmetic_train, config_kwargs):
    """Nothing but the advantage changes: with every weight forced to 1 the run equals grpo's, KL and
    gradient accumulation included; with the real weights it does not."""
    kwargs = config_kwargs(max_steps=2, beta=0.04, gradient_accumulation_steps=2)
    grpo, grpo_logs = _train(GRPOFamilyTrainer, tiny_model_dir, arithmetic_train, CWGRPOConfig(**kwargs))
    unit, unit_logs = _train(UnitWeights, tiny_model_dir, arithmetic_train, CWGRPOConfig(**kwargs))
    assert grpo_logs == unit_logs
    assert any(h.get("loss", 0.0) != 0.0 for h in grpo_logs)
    expected, got = grpo.model.state_dict(), unit.model.state_dict()
    assert all(torch.equal(expected[k], got[k]) for k in expected)

    cw, cw_logs = _train(CWGRPOTrainer, tiny_model_dir, arithmetic_train, CWGRPOConfig(**kwargs))
    assert any(not torch.equal(expected[k], v) for k, v in cw.model.state_dict().items())


def test_rollout_logps_source(tiny_model_dir, arithmetic_train, config_kwargs):
    """old_per_token_logps when TRL has them, else a forward of the policy (default), or the sampler's when asked
    for ('sampler' only, finite only)."""
    # fp32, to compare with plain transformers
    trainer = build(CWGRPOTrainer, tiny_model_dir, CWGRPOConfig(**config_kwargs(bf16=False)), arithmetic_train)
    g = torch.Generator().manual_seed(0)
    batch = {
        "prompt_ids": torch.randint(3, 90, (4, 5), generator=g),
        "prompt_mask": torch.tensor([[0, 0, 1, 1, 1]] * 2 + [[1] * 5] * 2),  # left padding, as TRL's
        "completion_ids": torch.randint(3, 90, (4, 6), generator=g),
        "completion_mask": torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 6, [1] * 2 + [0] * 4]),
    }

    def rollout_logps(output):  # the token-weight stage's view of one generation batch with this output
        return trainer._rollout_logps(trainer.generation_batch(torch.zeros(1, 4), mode="train", output=output))

    forward, extra = rollout_logps(batch)
    assert extra and forward.shape == (4, 6)
    valid = batch["completion_mask"].bool()
    # tol: assert_close's float32 defaults (rtol 1.3e-6 ~ 11 ULP, atol 1e-5) on log-probs <= ~10 in magnitude from the
    # same fp32 tiny model in two forwards of the same shapes: each differs by a few ULP of the 32/64-term sums.
    torch.testing.assert_close(forward[valid], independent_logps(tiny_model_dir, batch, 1.0)[valid])

    sampler = torch.full((4, 6), -0.5)
    old = torch.full((4, 6), -0.25)
    # Default 'policy': the sampler's log-probs are never used, not even when TRL has no old ones.
    logps, extra = rollout_logps({**batch, "sampling_per_token_logps": sampler})
    assert extra and torch.equal(logps, forward)
    assert torch.equal(
        rollout_logps({**batch, "old_per_token_logps": old, "sampling_per_token_logps": sampler})[0], old
    )
    trainer.args.cw_logps_source = "sampler"
    assert torch.equal(rollout_logps({**batch, "sampling_per_token_logps": sampler})[0], sampler)
    assert torch.equal(
        rollout_logps({**batch, "old_per_token_logps": old, "sampling_per_token_logps": sampler})[0], old
    )
    nan_on_padding = sampler.clone()
    nan_on_padding[3, 5] = float("nan")  # NaN where the mask is 0 does not matter
    logps, extra = rollout_logps({**batch, "sampling_per_token_logps": nan_on_padding})
    assert not extra and torch.equal(logps.nan_to_num(), nan_on_padding.nan_to_num())
    nan_on_token = sampler.clone()
    nan_on_token[0, 0] = float("nan")
    logps, extra = rollout_logps({**batch, "sampling_per_token_logps": nan_on_token})
    assert extra and torch.equal(logps, forward)


def test_old_logps_from_trl_are_used_without_extra_forward(tiny_model_dir, arithmetic_train, config_kwargs):
    """num_iterations=2: TRL computes old_per_token_logps itself; the weights are built on them."""
    config = CWGRPOConfig(**config_kwargs(max_steps=1, num_iterations=2))
    seen = []

    class Spy(CWGRPOTrainer):
        def _covariance_weights(self, logps, advantages, mask, num_generations):
            seen.append(logps.clone())
            return super()._covariance_weights(logps, advantages, mask, num_generations)

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append(out["old_per_token_logps"].clone())
            return out

    trainer = build(Spy, tiny_model_dir, config, arithmetic_train)
    trainer.train()
    assert trainer.state.log_history[0]["cw_grpo/extra_forward"] == 0.0
    used, old = seen
    assert torch.equal(used, old.float())


def test_all_groups_degenerate_skips_the_log_probs(tiny_model_dir, arithmetic_train, config_kwargs):
    """Equal rewards in every group: every advantage is 0, so no weights (and no extra forward) are needed."""

    def constant_reward(completions, **kwargs):
        return [1.0] * len(completions)

    calls = []

    class Spy(CWGRPOTrainer):
        def _rollout_logps(self, batch):
            calls.append(1)
            return super()._rollout_logps(batch)

    config = CWGRPOConfig(**config_kwargs(max_steps=1))
    trainer = build(Spy, tiny_model_dir, config, arithmetic_train, reward=constant_reward)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert calls == []
    assert logs["cw_grpo/extra_forward"] == 0.0 and logs["cw_grpo/degenerate_frac"] == 1.0
    assert logs["cw_grpo/weight_min"] == logs["cw_grpo/weight_max"] == 1.0


# ---------------------------------------------------------------------------------------------------- 2 processes
@scenario("cw_grpo_weights", TINY_MODEL)
def test_two_process_weights_equal_single_process_weights_of_the_gathered_batch(dist_output):
    rank0, rank1 = (torch.load(dist_output / f"rank{r}.pt") for r in (0, 1))
    straddling_differs = False
    for mode in ("hook", "loss"):
        assert len(rank0[mode]) == len(rank1[mode]) == 2, mode
        for r0, r1 in zip(rank0[mode], rank1[mode]):
            for key in ("logps", "advantages", "mask", "weights"):
                assert torch.equal(r0[key], r1[key]), key  # every process saw the same gathered batch
            logps, advantages, mask = r0["logps"], r0["advantages"], r0["mask"]
            assert logps.shape[0] == 12
            # Single-process recomputation on the gathered batch.
            weights = covariance_weights(logps, advantages, mask, 4)
            expected = advantages[:, None] * weights
            for r, rec in enumerate((r0, r1)):
                if mode == "hook":  # rows 6r..6r+5, unshuffled
                    rows, local = torch.arange(6 * r, 6 * r + 6), rec["local"]
                else:  # shuffled rows tagged with their global index
                    rows, local = rec["loss_rows"], rec["loss_advantages"]
                assert sorted(rows.tolist()) == list(range(6 * r, 6 * r + 6))
                width = local.size(1)
                assert torch.equal(local, expected[rows, :width])
                assert not expected[rows, width:].any()  # wider columns are the other process's padding
            # Group 1 (rows 4..7) straddles the processes: statistics over one process's rows would differ.
            part = slice(4, 6)
            local_only = covariance_weights(logps[part], advantages[part], mask[part], 2)
            if mask[part].any() and advantages[4:8].unique().numel() > 1:
                # tol: a difference counts only above 1e-3 (+ 1e-5 relative), ~100x the float32 rounding of O(1)
                # weights over 12 rows (~1e-5), so rounding alone cannot make the straddling group look different: the
                # bound makes the test harder to pass, not easier.
                straddling_differs |= not torch.allclose(local_only, weights[part], atol=1e-3)
    assert straddling_differs, "the straddling group's weights do not depend on the other process: test is vacuous"


# ---------------------------------------------------------------------------------------------------- recipes
RECIPES = sorted((TESTS.parent / "examples" / "recipes").glob("cw_grpo_*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipes_parse_with_the_papers_settings(path):
    import sys

    from trl import ModelConfig, TrlParser

    sys.path.insert(0, str(TESTS.parent / "examples"))
    from train import TrainScriptArguments

    parser = TrlParser((TrainScriptArguments, CWGRPOConfig, ModelConfig))
    script, config, model = parser.parse_args_and_config(
        ["--config", str(path), "--bf16", "false", "--use_cpu", "true"]
    )
    assert script.method == "cw_grpo"
    # R1-Distill's chat template pre-fills `<think>`, so its completions open with no tag (docs/recipes.md)
    prefilled = "r1_distill" in path.name
    assert script.reward_funcs == [
        "math_accuracy",
        "think_prefilled_answer_format" if prefilled else "think_answer_format",
    ]
    paper = dict(num_generations=12, per_device_train_batch_size=12, gradient_accumulation_steps=4, learning_rate=1e-6)
    assert {k: getattr(config, k) for k in paper} == paper
    assert (config.temperature, config.warmup_steps, config.beta, config.loss_type) == (0.7, 0.1, 0.04, "grpo")
    if "small" not in path.name:
        assert script.dataset_name == "knoveleng/open-rs" and config.max_completion_length == 4096
        assert config.max_steps == 100
        assert model.model_name_or_path in (
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
            "Qwen/Qwen2.5-Math-7B-Instruct",
        )


def test_there_are_paper_and_small_recipes():
    assert {p.name for p in RECIPES} >= {
        "cw_grpo_r1_distill_1.5b.yaml",
        "cw_grpo_qwen2.5_math_7b.yaml",
        "cw_grpo_small.yaml",
    }
