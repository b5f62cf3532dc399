"""Clip-Cov (Cui et al., 2025, arXiv 2505.22617): the loss term against verl's formula (``compute_policy_loss_clip_cov``),
worked numbers, the trainer's config, and a 2-process run whose detached tokens are drawn from the gathered batch."""

# tol(defaults): assert_close's defaults for the dtype compared: float64 (rtol 1e-7, atol 1e-7) for results of a
# few dozen float64 operations on values of order 1-10 (rounding under 100 x 2^-52 x 10 ~ 2e-13); float32
# (rtol 1.3e-6, atol 1e-5) for group statistics over at most 16 values of order 1 (a sum of n terms rounds
# to within n x 2^-23 of its size: 16 x 2^-23 ~ 1.9e-6, under atol). A wrong formula differs by order 1e-1.
from __future__ import annotations

import pytest
import torch
from conftest import digit_share_reward
from dist.loss_term_rows import loss_term_calls
from dist_suite import TINY_MODEL, scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family import ClipCovConfig, ClipCovTrainer
from grpo_family.algorithms.clip_cov import clip_cov_loss_term, clip_cov_tokens
from grpo_family.trainers.stages import stage_generator

BAND = dict(lower=-0.5, upper=0.5)


def verl_per_token_loss(old_logp, logp, advantages, mask, ratio, lower, upper, clip, generator):
    """verl's Clip-Cov per-token policy loss before its aggregation, written out from verl/trainer/ppo/core_algos.py
    (compute_policy_loss_clip_cov): max(-A r, -A clip(r)) times 0 on max(1, int(ratio * N)) tokens drawn (here from
    ``generator``; verl from the global RNG) among the valid, not already clipped tokens with
    lower < (A - mean A)(logp - mean logp) < upper, means over the N valid tokens."""
    r = torch.exp(logp - old_logp)
    loss1, loss2 = -advantages * r, -advantages * torch.clamp(r, 1 - clip, 1 + clip)
    valid = mask > 0
    clipped = (loss2 > loss1) & valid
    a_mean = (advantages * valid).sum() / valid.sum()
    lp_mean = (logp.detach() * valid).sum() / valid.sum()
    cov = (advantages - a_mean) * (logp.detach() - lp_mean)
    cov = cov.masked_fill(~valid | clipped, -torch.inf)
    candidates = torch.nonzero((cov < upper) & (cov > lower) & valid)
    corr = torch.ones_like(advantages)
    if len(candidates):
        pick = candidates[torch.randperm(len(candidates), generator=generator)[: max(1, int(ratio * valid.sum()))]]
        corr[pick[:, 0], pick[:, 1]] = 0
    return torch.maximum(loss1, loss2) * corr


def ours(old_logp, logp, advantages, mask, ratio, lower, upper, clip, generator):
    """TRL's clipped surrogate on the advantages the registered term returns."""
    out = clip_cov_loss_term(
        logp, old_logp, advantages, mask.bool(), ratio=ratio, lower=lower, upper=upper, clip_low=clip,
        clip_high=clip, generator=generator,
    )  # fmt: skip
    a, r = out.advantages, torch.exp(logp - old_logp)
    return torch.maximum(-a * r, -a * torch.clamp(r, 1 - clip, 1 + clip)), out


def test_worked_numbers():
    # As tests/test_kl_cov.py: cov = [[.48, -.32, -1.12], [-1.32, -.12, -]] (the last token is padding). Band
    # (-0.5, 0.5): candidates (0, 0), (0, 1), (1, 1); k = max(1, int(5 * 0.4)) = 2 of them detached, chosen by the
    # generator. Token (0, 1) is clipped by the surrogate (A = 1, r = e^0.3 > 1.2): it is no candidate then.
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    options = dict(ratio=0.4, clip_low=0.2, clip_high=0.2, **BAND)
    chosen = clip_cov_tokens(logp, logp, advantages, mask, generator=torch.Generator().manual_seed(0), **options)
    assert chosen.sum() == 2 and set(map(tuple, chosen.nonzero().tolist())) <= {(0, 0), (0, 1), (1, 1)}
    old = logp.clone()
    old[0, 1] -= 0.3  # ratio e^0.3 ~ 1.35 on a positive advantage: clipped already
    for seed in range(20):
        chosen = clip_cov_tokens(logp, old, advantages, mask, generator=torch.Generator().manual_seed(seed), **options)
        assert set(map(tuple, chosen.nonzero().tolist())) == {(0, 0), (1, 1)}
    out = clip_cov_loss_term(logp, old, advantages, mask, generator=torch.Generator().manual_seed(0), **options)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 1, 1], [-1, 0, -1]], dtype=torch.float64))
    assert out.metrics["detached_tokens"] == 2 and float(out.metrics["detached_frac"]) == 0.4
    # An empty band detaches nothing.
    none = clip_cov_tokens(logp, logp, advantages, mask, ratio=0.4, lower=10, upper=20, clip_low=0.2, clip_high=0.2)
    assert not none.any()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4), st.integers(1, 6), st.sampled_from([2e-4, 0.1, 0.5, 1.0]), st.sampled_from([0.1, 0.2]),
    st.integers(0, 2**31 - 1),
)  # fmt: skip
def test_matches_verl_per_token_loss_and_gradient(rows, width, ratio, clip, seed):
    g = torch.Generator().manual_seed(seed)
    logp = (-3 * torch.rand(rows, width, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.2 * torch.randn(rows, width, generator=g, dtype=torch.float64)
    advantages = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, width)
    mask = torch.rand(rows, width, generator=g) < 0.8
    mask[0, 0] = True
    args = (old, logp, advantages, mask, ratio, -0.5, 0.5, clip)
    expected = verl_per_token_loss(*args, torch.Generator().manual_seed(seed))
    got, _ = ours(*args, torch.Generator().manual_seed(seed))
    torch.testing.assert_close(got[mask], expected[mask])
    (grad_expected,) = torch.autograd.grad(expected[mask].sum(), logp)
    (grad_got,) = torch.autograd.grad(got[mask].sum(), logp)
    torch.testing.assert_close(grad_got, grad_expected)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(clip_cov_ratio=1.5), r"clip_cov_ratio must be in \(0, 1\]"),
        (dict(clip_cov_lower=5.0, clip_cov_upper=1.0), "clip_cov_lower < clip_cov_upper"),
        (dict(importance_sampling_level="sequence"), "importance_sampling_level must be 'token'"),
        (dict(loss_type="vespo"), "loss_type must be one of TRL's clipped-ratio losses"),
    ],
)
def test_bad_options_fail_at_config_time(config_kwargs, bad, message):
    with pytest.raises(ValueError, match=message):
        ClipCovConfig(**config_kwargs(**bad))


def test_training_detaches_the_drawn_tokens(tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs):
    """What TRL's loss trains on is the advantages with 0 on the tokens drawn with the step's generator."""
    seen = []

    class Recording(ClipCovTrainer):
        def _apply_loss_term(self, call):
            old = call.logps if call.old_logps is None else call.old_logps
            inputs = (
                call.logps.detach().clone(),
                old.detach().clone(),
                call.advantages.clone(),
                call.loss_mask.bool(),
            )
            super()._apply_loss_term(call)
            seen.append((inputs, call.advantages.clone(), call.global_step, call.micro_step))

    options = dict(clip_cov_ratio=0.1, clip_cov_lower=-100.0, clip_cov_upper=100.0)
    trainer = Recording(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=ClipCovConfig(**config_kwargs(max_steps=2, **options)),
        train_dataset=arithmetic_train, processing_class=tiny_tokenizer,
    )  # fmt: skip
    trainer.train()
    assert len(seen) == 2
    for (logps, old, advantages, mask), after, step, micro_step in seen:
        chosen = clip_cov_tokens(
            logps, old, advantages, mask, ratio=0.1, lower=-100.0, upper=100.0, clip_low=0.2, clip_high=0.2,
            generator=stage_generator("clip_cov", 0, step, 1 + micro_step),
        )  # fmt: skip
        assert chosen.sum() == max(1, int(0.1 * int(mask.sum())))  # every valid token is a candidate here
        expected = torch.where(chosen, 0.0, advantages[:, None].expand_as(chosen))
        torch.testing.assert_close(after[mask], expected[mask])
    assert trainer.state.log_history[0]["clip_cov/detached_tokens"] >= 1


@scenario(
    "loss_term_rows", "clip_cov", TINY_MODEL, dict(clip_cov_ratio=0.1, clip_cov_lower=-100.0, clip_cov_upper=100.0)
)
def test_two_processes_draw_from_the_gathered_rows(dist_output):
    """Candidates (band, clip) and the draw are made on every rank's rows of the loss call together, with the
    step's generator: each rank's detached tokens are its share of the single-process draw on the union."""
    calls = loss_term_calls(dist_output)
    for call in calls:
        logps, old, advantages, mask, _, out = call["union"]
        generator = stage_generator("clip_cov", 0, call["global_step"], 1 + call["micro_step"])  # seed 0, training
        chosen = clip_cov_tokens(
            logps, old, advantages, mask, ratio=0.1, lower=-100.0, upper=100.0, clip_low=0.2, clip_high=0.2,
            generator=generator,
        )  # fmt: skip
        assert chosen.sum() == max(1, int(0.1 * int(mask.sum())))
        expected = torch.where(chosen, 0.0, advantages[:, None].expand_as(chosen).to(out.dtype))
        torch.testing.assert_close(out[mask], expected[mask])
