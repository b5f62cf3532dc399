"""D3STrainer (grpo_family/trainers/d3s.py): config validation; which rollouts reach the policy forward (the
max-variance subset of the full-group advantages, nothing else); which tokens get gradient (exactly zero elsewhere)
and a parameter gradient equal to a loss written by hand from the kept rows; edge cases; the schedule across a
checkpoint resume; and a 2-process run whose selection, token mask and gradient are the single-process ones."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from conftest import digit_share_reward
from dist_suite import TESTS, TINY_MODEL, scenario
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOConfig

from grpo_family import GRPOFamilyTrainer
from grpo_family.algorithms.d3s import (
    masked_token_loss,
    max_variance_subset,
    schedule,
    select_rollouts,
    token_keep_mask,
)
from grpo_family.algorithms.grpo import group_advantages
from grpo_family.trainers.d3s import D3SConfig, D3STrainer, default_samples_start, planned_kept_tokens

# tol(defaults): assert_close's float32 defaults (rtol 1.3e-6 ~ 11 ULP, atol 1e-5) where both sides run the same few
# float32 operations on the same inputs (entropies of the same fp32 forward, group advantages of the same rewards: a
# mean, a std and a division, <= 3 roundings of values <= ~5); pytest.approx's default rel 1e-6 on float64 schedule
# values computed by the same formula (a few float64 roundings, ~1e-16).


# ---------------------------------------------------------------------------------------------------- recording
class GradCapture(TrainerCallback):
    """Parameter gradients just before each optimizer step (after DDP's reduction)."""

    def __init__(self):
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


class Tap(GRPOFamilyTrainer):
    """Below D3STrainer in the MRO: sees the batch before selection, and TRL's raw log-probs of the loss forward."""

    def _keep_rows(self, batch):
        self.rec["full"].append({k: v.clone() for k, v in batch.output.items() if isinstance(v, torch.Tensor)})
        return super()._keep_rows(batch)

    def transform_loss_forward(self, call):
        # What D3S hands to TRL's loss (its step denominator set), the weights the loss call runs with, and
        # TRL's raw log-probs of the loss forward.
        self.rec["loss_inputs"].append({k: v.clone() for k, v in call._data.items() if isinstance(v, torch.Tensor)})
        self.rec["state"].append({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        logps = call.logps
        if logps.requires_grad:
            logps.retain_grad()  # d loss / d log pi(token), read after the backward
            self.rec["raw_logps"].append(logps)
            self.rec["entropies"].append(call.entropies.detach().clone())
        super().transform_loss_forward(call)


class Recorder(D3STrainer, Tap):
    """D3STrainer recording each loss call's inputs, keep mask, weights and loss, and the gradients."""

    def __init__(self, *args, **kwargs):
        self.rec = defaultdict(list)
        super().__init__(*args, **kwargs)
        self.grad_capture = GradCapture()
        self.add_callback(self.grad_capture)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.rec["inputs"].append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.rec["loss"].append(loss.detach().clone())
        return loss

    def compute_advantages(self, batch):
        self.rec["rewards"].append(batch.rewards.clone())
        return super().compute_advantages(batch)

    def _window_denominators(self, call):
        counts = super()._window_denominators(call)
        self.rec["counts"].append(counts)  # the optimizer step's counts the loss call's weights use
        return counts

    def _token_weights(self, call, entropies, counts):
        keep, weight = super()._token_weights(call, entropies, counts)
        self.rec["keep"].append(keep.clone())
        self.rec["weight"].append(weight.clone())
        return keep, weight


def digit_present_reward(completions, **kwargs):
    """Binary reward: many exact ties among advantages."""
    return [float(any(ch.isdigit() for ch in c[0]["content"])) for c in completions]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def run(model_dir, dataset, config, reward=digit_share_reward, cls=Recorder):
    trainer = cls(model=model_dir, reward_funcs=[reward], args=config, train_dataset=dataset)
    trainer.train()
    return trainer


def row_keys(batch, rows=None):
    """(prompt tokens, completion tokens, advantage) per row: order-free identity of a rollout."""
    rows = range(batch["prompt_ids"].size(0)) if rows is None else rows
    out = []
    for i in rows:
        p = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        c = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        out.append((tuple(p), tuple(c), float(batch["advantages"][i])))
    return sorted(out)


def hand_terms(model, inputs, temperature, epsilon=0.2, level="token", bias_correction_kl=True):
    """Per-token surrogate and KL of ``inputs`` with plain transformers (no TRL helper), and the entropies.

    Surrogate -min(r A, clip(r) A) with ``level="token"``: r = exp(logp - old) (old = sg(logp) when the batch has no
    old log-probs); ``"gspo_token"``: r = sg(s_i) exp(logp - sg(logp)), s_i = exp(mean over the rollout's valid tokens
    of logp - old) (docs/methods/d3s.md §2.6). KL = exp(ref - logp) - (ref - logp) - 1, times the token ratio exp(logp - old) when
    ``bias_correction_kl`` (TRL's use_bias_correction_kl, default True); None without reference log-probs."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1].float() / temperature
    logp_all = logits.log_softmax(-1)
    logps = logp_all.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    entropies = -(logp_all.exp() * logp_all).sum(-1).detach()
    old = inputs.get("old_per_token_logps")
    log_ratio = logps - (logps.detach() if old is None else old)
    if level == "token":
        ratio = torch.exp(log_ratio)
    else:
        mask = inputs["completion_mask"]
        seq = torch.exp((log_ratio * mask).sum(1) / mask.sum(1).clamp_min(1)).detach()
        ratio = seq[:, None] * torch.exp(logps - logps.detach())
    adv = inputs["advantages"][:, None]
    surrogate = -torch.min(ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon) * adv)
    kl = None
    if inputs.get("ref_per_token_logps") is not None:
        d = inputs["ref_per_token_logps"] - logps
        kl = torch.exp(d) - d - 1
        if bias_correction_kl:
            kl = kl * torch.exp(log_ratio)
    return surrogate, kl, entropies


def hand_per_token_loss(model, inputs, temperature, beta, epsilon=0.2):
    """Per-token GRPO loss of ``inputs``: -min(r A, clip(r) A) + beta KL (see ``hand_terms``); also the entropies."""
    surrogate, kl, entropies = hand_terms(model, inputs, temperature, epsilon)
    return (surrogate + beta * kl if beta else surrogate), entropies


def assert_grads_close(actual, expected):
    assert actual.keys() == expected.keys()
    for name in expected:
        # tol: parameter gradients of the same fp32 loss by the trainer and by hand: each is a sum over the batch's
        # tokens and the width-32/64 layers (a few hundred terms) taken in another order, so it differs by <= n ULP x
        # sum|terms|; rtol 1e-5 (~84 float32 ULP) covers the sums, atol 1e-7 the gradients that cancel to ~0 from terms
        # <= ~1e-3.
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)


# ---------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("d3s_samples_start", 1, r"d3s_samples_start must be an integer >= 2, or None"),
        ("d3s_samples_end", 5, r"d3s_samples_end must be None .* in \[2, num_generations=4\]"),
        ("d3s_token_ratio_start", 0.0, r"d3s_token_ratio_start must be in \(0, 1\]"),
        ("d3s_token_ratio_end", 1.5, r"d3s_token_ratio_end must be in \(0, 1\]"),
        ("d3s_sample_scope", "intra", r"d3s_sample_scope must be one of \('pooled', 'group'\)"),
        ("d3s_token_scope", "token", r"d3s_token_scope must be one of \('batch', 'micro', 'sequence'\)"),
        ("d3s_loss_normalization", "mean", "d3s_loss_normalization must be one of"),
        ("d3s_base_estimator", "ppo", r"d3s_base_estimator must be one of \('gpg', 'grpo', 'ms_grpo'"),
        ("d3s_drop_degenerate_groups", True, "needs d3s_sample_scope='group'"),
        ("loss_type", "grpo", r"loss_type must be one of \('dapo', 'cispo', 'vespo'\).*mask_only_seq"),
        ("top_entropy_quantile", 0.2, "top_entropy_quantile must be 1.0 with D3S"),
    ],
)
def test_invalid_options_fail_at_config_time(config_kwargs, option, value, message):
    with pytest.raises(ValueError, match=message):
        D3SConfig(**config_kwargs(**{option: value}))


def test_gspo_with_kl_needs_the_bias_correction_off(config_kwargs):
    """TRL's bias-corrected KL is KL x s_i at the sequence level: s_i carries the gradient of every token of the
    rollout, so unkept tokens' KL would train the kept ones (docs/methods/d3s.md §2.4, Eq. 10)."""
    gspo = dict(importance_sampling_level="sequence", beta=0.04)
    with pytest.raises(
        ValueError, match=r"use_bias_correction_kl=False, or importance_sampling_level='token', or beta"
    ):
        D3SConfig(**config_kwargs(**gspo))
    D3SConfig(**config_kwargs(**gspo, use_bias_correction_kl=False))
    D3SConfig(**config_kwargs(importance_sampling_level="sequence"))  # beta = 0: no KL
    D3SConfig(**config_kwargs(beta=0.04))  # token level: the bias correction is a per-token factor


def test_an_optimizer_step_must_not_span_generation_batches(config_kwargs):
    with pytest.raises(ValueError, match=r"steps_per_generation x num_iterations \(1 x 1\) must be a multiple of"):
        D3SConfig(
            **config_kwargs(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=1)
        )
    D3SConfig(**config_kwargs(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4))
    D3SConfig(
        **config_kwargs(
            per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=1, num_iterations=2
        )
    )


def test_ms_grpo_options_are_validated_and_unscaled_rewards_warn(config_kwargs):
    with pytest.raises(ValueError, match="tau_min"):
        D3SConfig(**config_kwargs(d3s_base_estimator="ms_grpo", d3s_estimator_options={"tau_min": 5}))
    with pytest.warns(UserWarning, match="scale_rewards='none'"):
        D3SConfig(**config_kwargs(scale_rewards="none"))


def test_defaults_are_the_papers_scaled_to_the_group_size(config_kwargs):
    config = D3SConfig(**config_kwargs(num_generations=4))
    assert (config.d3s_token_ratio_start, config.d3s_token_ratio_end) == (0.05, 0.20)
    assert (config.d3s_sample_scope, config.d3s_token_scope, config.d3s_loss_normalization) == (
        "pooled",
        "batch",
        "token_mean_kept",
    )
    assert config.d3s_samples_start is None and config.d3s_samples_end is None and config.loss_type == "dapo"
    # Unset endpoints: G/4 -> G (the paper's 8 -> 32 at G = 32); with G <= 8 the paper's numbers would never drop.
    assert [default_samples_start(g) for g in (4, 8, 16, 32, 64)] == [2, 2, 4, 8, 16]


# ---------------------------------------------------------------------------------------------------- one step
CASES = {
    "default": dict(),
    "sequence_scope_seq_mean_kept": dict(d3s_token_scope="sequence", d3s_loss_normalization="seq_mean_kept"),
    "group_scope_mask_only_seq": dict(d3s_sample_scope="group", d3s_loss_normalization="mask_only_seq"),
    "binary_ties_literal_eq10": dict(d3s_loss_normalization="literal_eq10", reward=digit_present_reward),
    "one_token_completions": dict(max_completion_length=1, d3s_loss_normalization="seq_mean_kept_all"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_step_trains_exactly_the_kept_rollouts_and_tokens(tiny_model_dir, arithmetic_train, config_kwargs, case):
    options = dict(CASES[case])
    reward = options.pop("reward", digit_share_reward)
    options = {"per_device_train_batch_size": 16, "max_steps": 1, "max_grad_norm": 0.0, "bf16": False, **options}
    options.setdefault("d3s_token_ratio_start", 0.3)
    config = D3SConfig(**config_kwargs(**options))
    trainer = run(tiny_model_dir, arithmetic_train, config, reward=reward)
    rec, G = trainer.rec, config.num_generations

    # Sample level: the batch before selection is the full generation batch with full-group advantages.
    full = rec["full"][0]
    advantages = full["advantages"]
    assert advantages.numel() == 16 and advantages.abs().sum() > 0
    n_s, ratio = schedule(0, 1, num_generations=G, samples_start=default_samples_start(G), token_ratio_start=0.3)
    assert (n_s, ratio) == (2, 0.3)
    kept = select_rollouts(advantages, G, n_s, scope=config.d3s_sample_scope)
    assert torch.equal(trainer.d3s_last_selection["kept"], kept) and kept.numel() == 8
    # The loss call gets exactly the kept rollouts (no padding in one process), with their full-group advantages.
    inputs = rec["inputs"][0]
    assert len(rec["inputs"]) == 1 and inputs["completion_ids"].size(0) == 8
    assert row_keys(inputs) == row_keys(full, kept.tolist())
    raw_logps = rec["raw_logps"][0]
    assert raw_logps.size(0) == 8  # the policy forward saw 8 of 16 rollouts

    # Token level: the mask is the top ceil(K n) by |A| x H of TRL's own entropies, ranked over the whole call.
    mask = inputs["completion_mask"].bool()
    entropies = rec["entropies"][0]
    keep = rec["keep"][0]
    scope = "sequence" if config.d3s_token_scope == "sequence" else "batch"
    assert torch.equal(keep, token_keep_mask(inputs["advantages"], entropies, mask, ratio, scope=scope))
    expected_count = planned_kept_tokens(mask.sum(1) if scope == "sequence" else mask.sum(), ratio).sum()
    assert keep.sum() == expected_count == rec["counts"][0]["kept_tokens"]

    # Unkept tokens get exactly zero gradient from every term; kept tokens with A != 0 get some.
    grad = raw_logps.grad
    assert torch.all(grad[~keep] == 0)
    assert torch.all(grad[keep & (inputs["advantages"][:, None] != 0)] != 0)

    # The parameter gradient is the one of the D3S loss written by hand from the kept rows.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    per_token, hand_entropies = hand_per_token_loss(model, inputs, config.temperature, config.beta)
    torch.testing.assert_close(hand_entropies[mask], entropies[mask])
    loss = masked_token_loss(per_token, keep, mask, normalization=config.d3s_loss_normalization)
    loss.backward()
    assert_grads_close(trainer.grad_capture.grads[0], {n: p.grad for n, p in model.named_parameters()})
    if (
        config.d3s_loss_normalization in ("token_mean_kept", "literal_eq10")
        and config.importance_sampling_level == "token"
    ):
        # tol: the logged loss comes from the trainer's forward, the hand loss from another forward of the same fp32
        # model (logps differ by a few ULP of |logp| <= ~10); both are means of ~100 O(1) per-token terms (a rounding
        # each): rtol 1e-4 (~840 ULP) + atol 1e-6 for a loss near 0.
        torch.testing.assert_close(rec["loss"][0], loss.detach(), rtol=1e-4, atol=1e-6)  # logged value = D3S loss


STEP2_CASES = {
    # Step 2 of fresh batches: policy != reference, so the KL and its gradient are not 0. TRL's default bias
    # correction (KL x token ratio) is part of the hand loss.
    "kl_masked": dict(beta=0.5, max_steps=2),
    # Second update on one batch: old != current, so the GSPO-token ratio sg(s_i) exp(logp - sg logp) differs from
    # the token ratio; KL on, without the bias correction (required at the sequence level).
    "gspo_token_kl_sequence_scope": dict(
        importance_sampling_level="sequence",
        beta=0.5,
        use_bias_correction_kl=False,
        num_iterations=2,
        max_steps=2,
        d3s_token_scope="sequence",
        d3s_loss_normalization="seq_mean_kept",
    ),
}


@pytest.mark.parametrize("case", list(STEP2_CASES))
def test_second_step_gradient_is_the_hand_loss_with_masked_kl(tiny_model_dir, arithmetic_train, config_kwargs, case):
    """The parameter gradient of step 2 equals the D3S loss written by hand, with the KL on the kept tokens only
    (Eq. 10) and the GSPO-token ratio; and it differs from the loss with the KL on every valid token and from the
    one with token-level ratios, so the comparison can tell them apart."""
    options = {"per_device_train_batch_size": 16, "max_grad_norm": 0.0, "d3s_token_ratio_start": 0.3}
    options.update(STEP2_CASES[case], d3s_token_ratio_end=0.3)
    config = D3SConfig(**config_kwargs(**options))
    trainer = run(tiny_model_dir, arithmetic_train, config)
    rec = trainer.rec
    assert len(rec["loss_inputs"]) == 2
    inputs, keep = rec["loss_inputs"][1], rec["keep"][1]
    mask = inputs["completion_mask"].bool()
    kept = keep & mask
    norm, level = config.d3s_loss_normalization, config.importance_sampling_level
    gspo = level == "sequence"
    assert torch.all(rec["raw_logps"][1].grad[mask & ~keep] == 0)

    def hand_grads(level="gspo_token" if gspo else "token", kl_mask=kept):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        model.load_state_dict(rec["state"][1])
        surrogate, kl, _ = hand_terms(model, inputs, config.temperature, level=level,
                                      bias_correction_kl=config.use_bias_correction_kl)  # fmt: skip
        loss = masked_token_loss(surrogate, keep, mask, normalization=norm)
        if norm == "token_mean_kept":
            loss = loss + config.beta * torch.where(kl_mask, kl, 0.0).sum() / kept.sum()
        else:
            loss = loss + masked_token_loss(config.beta * kl, keep, kl_mask, normalization=norm)
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}

    if gspo:  # the batch was reused: the step-2 ratio is off-policy
        assert (inputs["old_per_token_logps"] - rec["raw_logps"][1].detach())[mask].abs().max() > 1e-3
    assert (inputs["ref_per_token_logps"] - rec["raw_logps"][1].detach())[mask].abs().max() > 1e-3
    got = trainer.grad_capture.grads[1]
    assert_grads_close(got, hand_grads())
    with pytest.raises(AssertionError):  # the mutation this case guards against
        assert_grads_close(got, hand_grads(level="token") if gspo else hand_grads(kl_mask=mask))


def test_full_schedule_is_grpo_with_token_mean_loss(tiny_model_dir, arithmetic_train, config_kwargs):
    """N_s = G and K = 1 reduce D3S to the base algorithm with TRL's global token mean (docs/methods/d3s.md §10 property 12)."""
    common = dict(max_steps=2, beta=0.04, max_grad_norm=0.0, bf16=False)
    base = run(tiny_model_dir, arithmetic_train, GRPOConfig(**config_kwargs(**common)), cls=GRPOFamilyTrainer)
    config = D3SConfig(
        **config_kwargs(
            **common, d3s_samples_start=4, d3s_samples_end=4, d3s_token_ratio_start=1.0, d3s_token_ratio_end=1.0
        )
    )
    d3s = run(tiny_model_dir, arithmetic_train, config)
    assert [r.size(0) for r in d3s.rec["raw_logps"]] == [8, 8]
    base_weights, d3s_weights = base.model.state_dict(), d3s.model.state_dict()
    for name in base_weights:
        # tol: with every sample and token kept D3S computes GRPO's loss; the two runs' gradients differ only by
        # float32 summation order (relative ~1e-6), and two Adam steps at lr 1e-2 move a parameter by <= ~2e-2, so the
        # weights differ by ~2e-2 x 1e-6 = 2e-8: rtol 1e-5 + atol 1e-7 holds with margin.
        torch.testing.assert_close(d3s_weights[name], base_weights[name], rtol=1e-5, atol=1e-7)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(initial[k], d3s_weights[k]) for k in initial), "training did not move the weights"


def test_reused_batch_is_not_edited_by_the_loss(tiny_model_dir, arithmetic_train, config_kwargs):
    """num_iterations = 2: the second update on the same batch gets it as generated (the loss edits a copy)."""
    config = D3SConfig(**config_kwargs(max_steps=2, num_iterations=2, d3s_token_ratio_start=0.3))
    trainer = run(tiny_model_dir, arithmetic_train, config)
    assert len(trainer.rec["full"]) == 1 and len(trainer.rec["inputs"]) == 2
    first, second = trainer.rec["inputs"]
    assert second["advantages"].dim() == 1 and torch.equal(first["advantages"], second["advantages"])
    first, second = trainer.rec["loss_inputs"]
    assert first["num_items_in_batch"] == second["num_items_in_batch"] == trainer.rec["keep"][1].sum()
    # "batch" scope: ranked once with the sampling policy, the same mask for both updates.
    assert torch.equal(trainer.rec["keep"][0], trainer.rec["keep"][1])


@pytest.mark.parametrize(("spg", "accumulation", "iterations"), [(2, 1, 1), (4, 2, 1), (1, 2, 2)])
def test_each_optimizer_step_divides_by_its_own_kept_tokens(
    tiny_model_dir, arithmetic_train, config_kwargs, spg, accumulation, iterations
):
    """docs/methods/d3s.md §2.6: |T| = the kept tokens of the optimizer step (all its micro-steps), also when one generation batch
    feeds several optimizer steps or one optimizer step takes several updates on a batch. d loss / d logp on a kept
    token is -A r / |T| (0 where the ratio is clipped)."""
    options = dict(per_device_train_batch_size=4, steps_per_generation=spg, gradient_accumulation_steps=accumulation)
    options.update(num_iterations=iterations, max_steps=2, d3s_token_ratio_start=0.2, d3s_token_ratio_end=0.2)
    trainer = run(tiny_model_dir, arithmetic_train, D3SConfig(**config_kwargs(**options)))
    rec = trainer.rec
    assert len(rec["loss_inputs"]) == 2 * accumulation
    for step in range(2):
        calls = range(step * accumulation, (step + 1) * accumulation)
        kept_tokens = sum(int((rec["keep"][c] & rec["inputs"][c]["completion_mask"].bool()).sum()) for c in calls)
        for c in calls:
            inputs, keep, raw = rec["loss_inputs"][c], rec["keep"][c], rec["raw_logps"][c]
            kept = keep & inputs["completion_mask"].bool()
            old = inputs.get("old_per_token_logps")
            ratio = torch.exp(raw.detach() - (raw.detach() if old is None else old))
            adv = inputs["advantages"][:, None].expand_as(ratio)
            clipped = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
            expected = torch.where(clipped, 0.0, -adv * ratio) / kept_tokens
            # tol: the closed-form gradient -A exp(logp - old) / n is 3 float32 roundings of a value <= |A| <= ~2; rtol
            # 1e-5 (~84 ULP) covers them and the loss's own order of operations, atol 1e-8 the zero-advantage tokens.
            torch.testing.assert_close(raw.grad[kept], expected[kept], rtol=1e-5, atol=1e-8)


def test_batch_scope_ranks_the_whole_generation_batch_once(tiny_model_dir, arithmetic_train, config_kwargs):
    """Default "batch" scope over 2 micro-steps (docs/methods/d3s.md §11 #5, §10.11): one ranking over every kept rollout of the
    generation batch with the sampling policy's entropies; every kept token scores >= every unkept valid one."""
    options = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1)
    trainer = run(tiny_model_dir, arithmetic_train, D3SConfig(**config_kwargs(**options, d3s_token_ratio_start=0.2)))
    rec = trainer.rec
    assert len(rec["inputs"]) == 2
    width = max(x["completion_ids"].size(1) for x in rec["inputs"])

    def cat(tensors):
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.size(1))) for t in tensors])

    # No optimizer step between the two micro-steps: their loss forwards are the sampling policy.
    entropies, keep = cat(rec["entropies"]), cat([k.int() for k in rec["keep"]]).bool()
    mask = cat([x["completion_mask"] for x in rec["inputs"]]).bool()
    adv = torch.cat([x["advantages"] for x in rec["inputs"]])
    order = torch.cat([x["d3s/rollout_index"] for x in rec["inputs"]]).argsort()
    expected = torch.empty_like(keep)
    expected[order] = token_keep_mask(adv[order], entropies[order], mask[order], 0.2)
    assert torch.equal(keep, expected)
    assert keep.sum() == planned_kept_tokens(mask.sum(), 0.2) == rec["counts"][0]["kept_tokens"]
    score = adv.abs()[:, None] * entropies
    assert score[keep].min() >= score[mask & ~keep].max() - 1e-6


def test_token_ties_go_to_the_earlier_rollout_not_the_shuffled_row(tiny_model_dir, arithmetic_train, config_kwargs):
    """Constant reward: every score is 0, so the tie rule alone decides (docs/methods/d3s.md §2.4): the first ceil(K n) valid tokens
    in (global rollout index, position) order, whatever order TRL shuffled the rows into."""
    options = dict(max_steps=1, d3s_samples_start=4, d3s_samples_end=4, d3s_token_ratio_start=0.25)
    trainer = run(tiny_model_dir, arithmetic_train, D3SConfig(**config_kwargs(**options)), reward=constant_reward)
    full, inputs, keep = trainer.rec["full"][0], trainer.rec["inputs"][0], trainer.rec["keep"][0]
    index = inputs["d3s/rollout_index"]
    assert sorted(index.tolist()) == list(range(8)) and index.tolist() != sorted(index.tolist()), "not shuffled"
    width = inputs["completion_ids"].size(1)
    assert torch.equal(full["completion_ids"][index, :width], inputs["completion_ids"])  # the index is the row's
    assert torch.equal(full["completion_mask"][index, :width], inputs["completion_mask"])
    mask = full["completion_mask"].bool()
    first = mask.reshape(-1).nonzero().squeeze(1)[: int(planned_kept_tokens(mask.sum(), 0.25))]
    expected = torch.zeros_like(mask).reshape(-1)
    expected[first] = True
    assert torch.equal(keep, expected.reshape(mask.shape)[index, :width])


def test_all_zero_advantages_train_nothing(tiny_model_dir, arithmetic_train, config_kwargs):
    config = D3SConfig(**config_kwargs(max_steps=1))
    trainer = run(tiny_model_dir, arithmetic_train, config, reward=constant_reward)
    assert not trainer.rec["full"][0]["advantages"].any()
    assert trainer.d3s_last_selection["kept"].numel() == 4  # k = 2 per prompt, 2 prompts: still a full-size subset
    assert torch.all(trainer.rec["raw_logps"][0].grad == 0)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert all(torch.equal(initial[k], v) for k, v in trainer.model.state_dict().items())


def test_truncated_completions_leave_the_pool_and_an_empty_selection_still_steps(
    tiny_model_dir, arithmetic_train, config_kwargs
):
    # 2 new tokens: nearly every completion is truncated, hence masked by TRL and ineligible.
    config = D3SConfig(**config_kwargs(max_steps=2, max_completion_length=2, mask_truncated_completions=True))
    trainer = run(tiny_model_dir, arithmetic_train, config)
    for full, inputs, raw in zip(trainer.rec["full"], trainer.rec["inputs"], trainer.rec["raw_logps"]):
        pool = full["completion_mask"].any(1).nonzero().squeeze(1)  # not truncated
        expected = pool[max_variance_subset(full["advantages"][pool], min(4, pool.numel()))]  # k_total = 2 x 2
        real = inputs["completion_mask"].any(1).nonzero().squeeze(1)
        assert row_keys(inputs, real.tolist()) == row_keys(full, expected.tolist())
        assert inputs["completion_ids"].size(0) == max(1, real.numel())  # an empty selection trains one inert row
        assert torch.all(raw.grad[~inputs["completion_mask"].bool()] == 0)
    assert any(not full["completion_mask"].any(1).all() for full in trainer.rec["full"]), "nothing was truncated"
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_schedule_follows_global_step_across_a_checkpoint_resume(tiny_model_dir, arithmetic_train, config_kwargs):
    """The schedule is a pure function of (global_step, max_steps): a resumed run continues where it stopped."""
    options = dict(num_generations=8, max_steps=4, save_strategy="steps", save_steps=2, d3s_token_ratio_start=0.1)
    config = D3SConfig(**config_kwargs(**options))
    trainer = run(tiny_model_dir, arithmetic_train, config, cls=D3STrainer)

    def schedule_log(history):
        return {
            h["step"]: (h["d3s/samples_per_prompt"], h["d3s/token_ratio"]) for h in history if "d3s/token_ratio" in h
        }

    full = schedule_log(trainer.state.log_history)
    expected = {s + 1: schedule(s, 4, num_generations=8, samples_start=2, samples_end=8, token_ratio_start=0.1)
                for s in range(4)}  # fmt: skip
    assert full.keys() == expected.keys()
    for step, (samples, ratio) in full.items():  # pytest >= 9 refuses approx over nested containers
        assert samples == expected[step][0] and ratio == pytest.approx(expected[step][1])
    assert full[3] != full[1]  # the schedule moves: a restart from step 0 would be visible

    resumed = D3STrainer(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train
    )
    resumed.train(resume_from_checkpoint=f"{config.output_dir}/checkpoint-2")
    after = schedule_log(resumed.state.log_history)
    for step in (3, 4):
        assert after[step][0] == full[step][0] and after[step][1] == pytest.approx(full[step][1])


def test_evaluation_applies_the_filters_with_the_eval_group_size(tiny_model_dir, arithmetic_train, config_kwargs):
    config = D3SConfig(**config_kwargs(max_steps=1, per_device_eval_batch_size=8, num_generations_eval=4))
    trainer = Recorder(
        model=tiny_model_dir,
        reward_funcs=[digit_share_reward],
        args=config,
        train_dataset=arithmetic_train,
        eval_dataset=arithmetic_train.select(range(4)),
    )
    trainer.train()
    trainer.state.global_step = 0  # the schedule is a function of the state: back to its start (p = 0)
    metrics = trainer.evaluate()
    selection = trainer.d3s_last_selection
    assert selection["mode"] == "eval" and selection["samples_per_prompt"] == 2  # G_eval = 4: 4/4 -> 2
    num_prompts = selection["advantages"].numel() // 4
    assert selection["kept"].numel() == 2 * num_prompts == metrics["eval_d3s/kept_rollouts"]
    assert math.isfinite(metrics["eval_loss"])


# ---------------------------------------------------------------------------------------------------- recipes
RECIPES = sorted((TESTS.parent / "examples" / "recipes").glob("d3s_*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipes_parse_with_the_papers_settings(path):
    import sys

    from trl import ModelConfig, TrlParser

    sys.path.insert(0, str(TESTS.parent / "examples"))
    from train import TrainScriptArguments

    parser = TrlParser((TrainScriptArguments, D3SConfig, ModelConfig))
    script, config, model = parser.parse_args_and_config(
        ["--config", str(path), "--bf16", "false", "--use_cpu", "true"]
    )
    assert script.method == "d3s" and script.reward_funcs == ["math_accuracy"]
    assert (config.temperature, config.top_p, config.loss_type, config.top_entropy_quantile) == (1.0, 0.9, "dapo", 1.0)
    assert (config.d3s_token_ratio_start, config.d3s_token_ratio_end, config.d3s_sample_scope) == (0.05, 0.2, "pooled")
    G = config.num_generations
    start = config.d3s_samples_start or default_samples_start(G)
    assert (start / G, (config.d3s_samples_end or G) / G) == (0.25, 1.0)  # the paper's 8 -> 32 of 32
    if "small" in path.name:
        assert model.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct" and script.dataset_name == "openai/gsm8k"
    else:
        assert (G, config.learning_rate, config.num_train_epochs) == (32, 5e-7, 1)
        assert model.model_name_or_path == "Qwen/Qwen2.5-Math-7B" and "DeepScaleR" in script.dataset_name


def test_there_are_paper_and_small_recipes():
    assert {p.name for p in RECIPES} >= {"d3s_qwen2.5_math_7b.yaml", "d3s_small.yaml"}


# ---------------------------------------------------------------------------------------------------- 2 processes
@scenario("d3s_select", TINY_MODEL)
def test_two_processes_select_mask_and_step_like_one(tiny_model_dir, dist_output):
    """Same gathered advantages -> same selection on both ranks = select_rollouts single-process; each rank trains
    its own kept rows (padded to equal counts); token ranking over both ranks; the DDP gradient equals the loss
    written by hand over every kept row of both ranks, with two micro-steps per generation batch."""
    ranks = [torch.load(dist_output / f"rank{r}.pt") for r in (0, 1)]
    sel0, sel1 = (r["selection"] for r in ranks)
    assert torch.equal(sel0["advantages"], sel1["advantages"]) and torch.equal(sel0["kept"], sel1["kept"])
    advantages, n_s, ratio = sel0["advantages"], sel0["samples_per_prompt"], sel0["token_ratio"]
    assert advantages.numel() == 12 and n_s == 2
    assert torch.equal(ranks[0]["rewards"], ranks[1]["rewards"])
    torch.testing.assert_close(advantages, group_advantages(ranks[0]["rewards"]).reshape(-1))
    kept = select_rollouts(advantages, 4, n_s)
    assert torch.equal(sel0["kept"], kept) and kept.numel() == 6

    # Each rank's micro-steps hold exactly its own kept rollouts, plus inert padding rows to equal counts.
    per_rank_kept = [((kept >= 6 * r) & (kept < 6 * (r + 1))).sum().item() for r in (0, 1)]
    rows = -(-max(per_rank_kept) // 2) * 2
    for r, rank in enumerate(ranks):
        chunks = rank["inputs"]
        assert len(chunks) == 2 and sum(c["completion_ids"].size(0) for c in chunks) == rows
        real = [c["completion_mask"].any(1) for c in chunks]
        got = sorted(k for c, m in zip(chunks, real) for k in row_keys(c, m.nonzero().squeeze(1).tolist()))
        local = [i - 6 * r for i in kept.tolist() if 6 * r <= i < 6 * (r + 1)]
        assert got == row_keys(rank["full"], local)
        assert sum(int((~m).sum()) for m in real) == rows - per_rank_kept[r]
    assert per_rank_kept[0] != per_rank_kept[1], "equal kept counts: the padding path was not exercised"

    # Token level: per micro-step, one ranking over both ranks' rows (rank-major), global count ceil(K n).
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    total_kept = sum(planned_kept_tokens(sum(rk["inputs"][c]["completion_mask"].sum() for rk in ranks), ratio)
                     for c in range(2))  # fmt: skip
    loss = 0.0
    for c in range(2):
        chunk = [rk["inputs"][c] for rk in ranks]
        width = max(x["completion_ids"].size(1) for x in chunk)

        def pad(t, width=width):
            return torch.nn.functional.pad(t, (0, width - t.size(1)))

        ent = torch.cat([pad(rk["entropies"][c]) for rk in ranks])
        mask = torch.cat([pad(x["completion_mask"]) for x in chunk]).bool()
        adv = torch.cat([x["advantages"] for x in chunk])
        order = torch.cat([x["d3s/rollout_index"] for x in chunk]).argsort()  # ties by global rollout index
        keep = torch.empty_like(mask)
        keep[order] = token_keep_mask(adv[order], ent[order], mask[order], ratio)
        assert torch.equal(torch.cat([pad(rk["keep"][c]) for rk in ranks]), keep)
        for r, x in enumerate(chunk):
            per_token, _ = hand_per_token_loss(model, x, 1.0, 0.0)
            rows_r = slice(r * x["completion_ids"].size(0), (r + 1) * x["completion_ids"].size(0))
            local_keep = keep[rows_r, : x["completion_ids"].size(1)] & x["completion_mask"].bool()
            loss = loss + torch.where(local_keep, per_token, 0.0).sum()
    assert ranks[0]["counts"][0]["kept_tokens"] == total_kept
    (loss / total_kept).backward()
    for rank in ranks:
        assert_grads_close(rank["grads"], {n: p.grad for n, p in model.named_parameters()})


@scenario("d3s_logging", TINY_MODEL)
def test_a_process_without_kept_rows_logs_the_true_kl_and_entropy(dist_output):
    """Was: rank 1 kept no rollout, its inert padding rows were trimmed to one completion column, and TRL's loss read
    the one-column KL and entropy as per-sequence values, ignoring the mask: the logged ``kl`` was 0.405 at step 1
    (policy = reference) and ``entropy`` the mean over padding too. Now both are the real tokens' values."""
    ranks = [torch.load(dist_output / f"rank{r}.pt") for r in (0, 1)]
    kept = ranks[0]["kept"]
    assert torch.equal(kept, ranks[1]["kept"]) and kept.numel() > 0
    assert not ((kept >= 8) & (kept < 16)).any(), "rank 1 kept rollouts: the inert-only path was not exercised"
    assert not ranks[1]["calls"][0]["mask"].any()  # rank 1 trains on padding rows only
    (log,) = [h for h in ranks[0]["logs"] if "kl" in h]
    other = next(h for h in ranks[1]["logs"] if "kl" in h)
    assert (log["kl"], log["entropy"]) == (other["kl"], other["entropy"])  # reduced over both ranks
    # tol: policy = reference at step 1, so d = ref - logp is a few float32 ULP of |logp| <= ~10 (~1e-6) and the KL
    # exp(d) - d - 1 is one rounding of 1 (2^-24 = 6e-8) per token, averaged: < 1e-6 (~8 ULP of 1).
    assert abs(log["kl"]) < 1e-6  # step 1: the policy is the reference
    entropy = sum((c["entropies"] * c["mask"]).sum() for r in ranks for c in r["calls"])
    tokens = sum(c["mask"].sum() for r in ranks for c in r["calls"])
    # tol: the entropy mean is a float32 sum over the two ranks' n ~ 100 tokens of entropies <= log(vocab) ~ 5, in
    # another order on each side: <= n x 2^-24 relative (one half-ULP rounding per addition) ~ 6e-6 < 1e-5.
    assert math.isclose(log["entropy"], float(entropy / tokens), rel_tol=1e-5)
