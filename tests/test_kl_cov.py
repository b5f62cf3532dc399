"""KL-Cov (Cui et al., 2025, arXiv 2505.22617): the loss term against verl's formula (``compute_policy_loss_kl_cov``),
worked numbers, the trainer's config, and a 2-process run whose token selection is the one of the gathered batch."""

# tol(defaults): assert_close's defaults for the dtype compared: float64 (rtol 1e-7, atol 1e-7) for results of a
# few dozen float64 operations on values of order 1-10 (rounding under 100 x 2^-52 x 10 ~ 2e-13); float32
# (rtol 1.3e-6, atol 1e-5) for group statistics over at most 16 values of order 1 (a sum of n terms rounds
# to within n x 2^-23 of its size: 16 x 2^-23 ~ 1.9e-6, under atol). A wrong formula differs by order 1e-1.
from __future__ import annotations

import math

import pytest
import torch
from conftest import digit_share_reward
from dist.loss_term_rows import loss_term_calls
from dist_suite import TINY_MODEL, scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family import KLCovConfig, KLCovTrainer
from grpo_family.algorithms.kl_cov import kl_cov_loss_term, kl_cov_tokens
from grpo_family.algorithms.losses import get_loss_term


def verl_per_token_loss(old_logp, logp, advantages, mask, ratio, coef):
    """verl's KL-Cov per-token policy loss before its aggregation, written out from verl/trainer/ppo/core_algos.py
    (compute_policy_loss_kl_cov): -A r on every token; on the max(1, int(ratio * N)) valid tokens with the largest
    (A - mean A)(logp - mean logp), means over the N valid tokens, -A r + coef |logp - old|."""
    r = torch.exp(logp - old_logp)
    loss = -advantages * r
    valid = mask > 0
    flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    a, lp = advantages[valid].detach(), logp[valid].detach()
    cov = (a - a.mean()) * (lp - lp.mean())
    top = flat[torch.topk(cov, max(1, int(len(cov) * ratio))).indices]
    rows, cols = top // logp.shape[1], top % logp.shape[1]
    loss = loss.clone()
    loss[rows, cols] = (-advantages * r + coef * (logp - old_logp).abs())[rows, cols]
    return loss


def ours(old_logp, logp, advantages, mask, ratio, coef):
    """TRL's surrogate with epsilon = inf (no clip) plus the registered term, per token."""
    term = get_loss_term("kl_cov")(logp, old_logp, advantages, mask.bool(), ratio=ratio, coef=coef)
    return -advantages * torch.exp(logp - old_logp) + term.per_token_loss


def test_worked_numbers():
    # 2 rows x 3 tokens, the last token of row 1 is padding. mean A = (3 - 2) / 5 = 0.2, mean logp = -8 / 5 = -1.6;
    # cov = [[0.8 * 0.6, 0.8 * -0.4, 0.8 * -1.4], [-1.2 * 1.1, -1.2 * 0.1, -]] = [[.48, -.32, -1.12], [-1.32, -.12, -]];
    # k = max(1, int(5 * 0.4)) = 2: tokens (0, 0) and (1, 1) get 2 * |logp - old| = 2 * 0.1.
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = kl_cov_loss_term(logp, logp + 0.1, advantages, mask, ratio=0.4, coef=2.0)
    torch.testing.assert_close(out.per_token_loss, torch.tensor([[0.2, 0, 0], [0, 0.2, 0]], dtype=torch.float64))
    assert kl_cov_tokens(logp, advantages, mask, 0.4).tolist() == [[True, False, False], [False, True, False]]
    assert out.metrics["selected_tokens"] == 2 and math.isclose(float(out.metrics["abs_kl"]), 0.1)
    # At least one token, none without a valid token.
    assert kl_cov_tokens(logp, advantages, mask, 1e-9).sum() == 1
    assert not kl_cov_tokens(logp, advantages, torch.zeros_like(mask), 0.5).any()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4), st.integers(1, 6), st.sampled_from([2e-4, 0.05, 0.3, 1.0]), st.floats(0.0, 3.0),
    st.integers(0, 2**31 - 1),
)  # fmt: skip
def test_matches_verl_per_token_loss_and_gradient(rows, width, ratio, coef, seed):
    g = torch.Generator().manual_seed(seed)
    logp = (-3 * torch.rand(rows, width, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.2 * torch.randn(rows, width, generator=g, dtype=torch.float64)
    # Per-token advantages (verl's are (bs, T)): no two covariances tie, so verl's torch.topk and the stable sort
    # here choose the same tokens (ties go to the earlier token here, unspecified in torch.topk).
    advantages = torch.randn(rows, width, generator=g, dtype=torch.float64)
    mask = torch.rand(rows, width, generator=g) < 0.8
    mask[0, 0] = True
    expected = verl_per_token_loss(old, logp, advantages, mask, ratio, coef)
    got = ours(old, logp, advantages, mask, ratio, coef)
    torch.testing.assert_close(got[mask], expected[mask])
    (grad_expected,) = torch.autograd.grad(expected[mask].sum(), logp)
    (grad_got,) = torch.autograd.grad(got[mask].sum(), logp)
    torch.testing.assert_close(grad_got, grad_expected)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(kl_cov_ratio=0.0), r"kl_cov_ratio must be in \(0, 1\]"),
        (dict(kl_cov_coef=-1.0), "--kl_cov_coef must be >= 0"),
        (dict(importance_sampling_level="sequence"), "importance_sampling_level must be 'token'"),
        (dict(loss_type="cispo"), "loss_type must be one of TRL's clipped-ratio losses"),
    ],
)
def test_bad_options_fail_at_config_time(config_kwargs, bad, message):
    with pytest.raises(ValueError, match=message):
        KLCovConfig(**config_kwargs(**bad))


def test_defaults_are_the_unclipped_surrogate_and_verls_values(config_kwargs):
    config = KLCovConfig(**config_kwargs())
    assert config.epsilon == math.inf and (config.kl_cov_ratio, config.kl_cov_coef) == (2e-4, 1.0)
    assert KLCovTrainer.loss_term == "kl_cov"


def test_off_policy_updates_train_with_the_penalty(tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs):
    """Two optimizer steps per generation batch: the second one's rollouts are off-policy, so the selected tokens carry
    |logp - logp_old| > 0, and the loss TRL returns is its surrogate plus the aggregated penalty."""
    seen = []

    class Recording(KLCovTrainer):
        def _apply_loss_term(self, call):
            super()._apply_loss_term(call)
            seen.append(call.extra_loss.detach().clone())

    config = KLCovConfig(**config_kwargs(max_steps=2, steps_per_generation=2, kl_cov_ratio=0.05, kl_cov_coef=1.0))
    trainer = Recording(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train,
        processing_class=tiny_tokenizer,
    )  # fmt: skip
    trainer.train()
    assert len(seen) == 2
    assert not seen[0].any()  # the first update: logp == logp_old, no penalty
    assert (seen[1] > 0).sum() >= 1  # the second: the selected tokens are penalised
    logs = trainer.state.log_history
    assert logs[1]["kl_cov/abs_kl"] > 0 and logs[0]["kl_cov/selected_tokens"] >= 1


@scenario("loss_term_rows", "kl_cov", TINY_MODEL, dict(kl_cov_ratio=0.1, steps_per_generation=2))
def test_two_processes_select_over_the_gathered_rows(dist_output):
    """The covariance's means and the top-k are those of every rank's rows of the loss call together (verl takes
    them per rank): each rank's penalised tokens are its share of the selection made single-process on the union."""
    calls = loss_term_calls(dist_output)
    differs = False
    for call in calls:
        logps, old, advantages, mask, extra, _ = call["union"]
        selected = kl_cov_tokens(logps, advantages, mask, 0.1)
        assert selected.sum() == max(1, int(0.1 * int(mask.sum())))
        assert torch.equal(extra != 0, selected & (logps != old))
        per_rank = torch.cat([kl_cov_tokens(lp, a, m, 0.1) for lp, a, m in call["per_rank"]])
        differs |= not torch.equal(per_rank, selected)
    assert any(bool((call["union"][4] != 0).any()) for call in calls), "no loss call was penalised"
    assert differs, "every rank's own top-k equalled the global one: the test could not tell them apart"


def test_the_preconditions_are_declared_at_registration_and_checked_once(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs
):
    """KL-Cov's and Clip-Cov's preconditions are their loss terms' registrations (token-level ratios, TRL's
    clipped-ratio losses), checked by the base config for every config naming the term; a trainer given a config
    that names none (a plain GRPOFamilyConfig) checks them itself before training."""
    from grpo_family import GRPOFamilyConfig
    from grpo_family.algorithms.losses import CLIPPED_RATIO_LOSS_TYPES, loss_term_problems

    for name in ("kl_cov", "clip_cov"):
        term = get_loss_term(name)
        assert term.token_level and term.loss_types == CLIPPED_RATIO_LOSS_TYPES
        assert loss_term_problems(name, loss_type="dapo", importance_sampling_level="token") == []
        assert len(loss_term_problems(name, loss_type="cispo", importance_sampling_level="sequence")) == 2
    assert KLCovTrainer.loss_term == KLCovConfig.loss_term == "kl_cov"
    with pytest.raises(ValueError, match=r"loss_type must be one of TRL's clipped-ratio losses .*got 'sapo'"):
        KLCovConfig(**config_kwargs(loss_type="sapo"))
    plain = GRPOFamilyConfig(**config_kwargs(importance_sampling_level="sequence"))  # names no loss term: accepted
    with pytest.raises(ValueError, match="kl_cov: The kl_cov loss term works on tokens one by one"):
        KLCovTrainer(model=tiny_model_dir, reward_funcs=[digit_share_reward], args=plain,
                     train_dataset=arithmetic_train, processing_class=tiny_tokenizer)  # fmt: skip
