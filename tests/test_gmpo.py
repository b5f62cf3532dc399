"""GMPO (Zhao et al., 2025, arXiv 2507.20673): worked numbers, the surrogate against TRL 1.16's own GMPO loss
(``trl.experimental.gmpo.GMPOTrainer._compute_loss``) on the same inputs, the whole trainer's loss against it, and
the config.

Float tolerance: both sides compute the same per-completion value ``c_i = -A_i exp(m_i)`` with the same operations;
ours then broadcasts it over the completion's ``n_i`` tokens and takes TRL's per-sequence mean (a sum of ``n_i``
equal float32 values, then a division), and both average over ``B`` rows. A float32 sum of ``n`` terms is off by at
most ``(n - 1) u`` relative to their absolute sum (``u = 2^-24``), each division by ``u``: the two losses differ by
at most ``(T + B + 4) u max|c_i|``, and their gradients by ``(T + 4) u max|grad|``.
"""

from __future__ import annotations

import collections
import math
import types

import pytest
import torch
from conftest import digit_share_reward
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.experimental.gmpo import GMPOTrainer as TRLGMPOTrainer

from grpo_family import GMPOConfig, GMPOTrainer
from grpo_family.algorithms.gmpo import gmpo_clipped_log_ratio, gmpo_sequence_loss, gmpo_surrogate
from grpo_family.algorithms.losses import aggregate_token_loss

U = 2.0**-24  # float32 unit roundoff


# tol(defaults): assert_close's float64 defaults (rtol 1e-7, atol 1e-7) on float64 worked numbers that carry a few
# float64 roundings (~1e-16 each), far inside them.


def test_worked_numbers():
    # One completion of 3 tokens, log-ratios (0.5, -0.1, 0.2), range (e^-0.4, e^0.4).
    # A = +1: min(log r, clamp) = (0.4, -0.1, 0.2), mean 1/6, loss -e^(1/6); token 0 clipped above.
    # A = -1: max(log r, clamp) = (0.5, -0.1, 0.2), mean 0.2, loss +e^0.2; nothing clipped (no log r < -0.4).
    old = torch.zeros(2, 3, dtype=torch.float64)
    logps = torch.tensor([[0.5, -0.1, 0.2]] * 2, dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss = gmpo_sequence_loss(logps, old, advantages, mask, epsilon_low=0.4, epsilon_high=0.4)
    torch.testing.assert_close(loss, torch.tensor([-math.exp(1 / 6), math.exp(0.2)], dtype=torch.float64))
    _, low, high = gmpo_clipped_log_ratio(logps, old, advantages, epsilon_low=0.4, epsilon_high=0.4)
    assert high.tolist() == [[True, False, False], [False, False, False]] and not low.any()
    # Padding does not count: the same row with a padded 4th token of any log-ratio.
    padded = torch.cat([logps, torch.full((2, 1), 9.0, dtype=torch.float64)], 1)
    out = gmpo_surrogate(
        padded, torch.zeros_like(padded), advantages, torch.cat([mask, torch.zeros(2, 1, dtype=torch.bool)], 1),
        epsilon_low=0.4, epsilon_high=0.4,
    )  # fmt: skip
    torch.testing.assert_close(out.per_token_loss, loss[:, None].expand(2, 4))
    torch.testing.assert_close(out.metrics["ratio"], torch.tensor([math.exp(1 / 6), math.exp(0.2)]).double())
    # TRL's vLLM correction per sequence (N, 1) weighs each completion's loss; a per-token one is refused.
    weights = torch.tensor([[0.5], [2.0]], dtype=torch.float64)
    weighted = gmpo_surrogate(logps, old, advantages, mask, epsilon_low=0.4, epsilon_high=0.4,
                              importance_sampling_ratio=weights)  # fmt: skip
    torch.testing.assert_close(weighted.per_token_loss, (loss * weights[:, 0])[:, None].expand(2, 3))
    with pytest.raises(ValueError, match="must be per sequence"):
        gmpo_surrogate(logps, old, advantages, mask, epsilon_low=0.4, epsilon_high=0.4,
                       importance_sampling_ratio=torch.ones(2, 3))  # fmt: skip


def trl_gmpo_loss(logps, old, advantages, mask, epsilon_low, epsilon_high, accumulation):
    """TRL 1.16's GMPOTrainer._compute_loss itself, on a stand-in trainer whose forward returns ``logps``."""
    rows, width = logps.shape
    stand_in = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logps, torch.zeros_like(logps), None),
        top_entropy_quantile=1.0, epsilon_low=epsilon_low, epsilon_high=epsilon_high, beta=0.0,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=accumulation,
        accelerator=types.SimpleNamespace(reduce=lambda x, reduction: x, gather=lambda x: x),
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
    )  # fmt: skip
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long), "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, width, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": advantages, "old_per_token_logps": old,
    }  # fmt: skip
    return TRLGMPOTrainer._compute_loss(stand_in, None, inputs), stand_in._metrics["train"]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6), st.integers(1, 12), st.floats(0.05, 2.0), st.floats(0.05, 2.0), st.integers(1, 4),
    st.floats(0.0, 1.5), st.integers(0, 2**31 - 1),
)  # fmt: skip
def test_equals_trls_gmpo_loss_and_gradient(rows, width, eps_low, eps_high, accumulation, spread, seed):
    """Value and gradient of TRL's GMPO loss and of ours (the surrogate aggregated as the trainer aggregates it,
    TRL's per-sequence mean over ``loss_type='grpo'`` scaled for accumulation), float32, on the same inputs."""
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(rows, width, generator=g)
    logps = (old + spread * torch.randn(rows, width, generator=g)).requires_grad_()
    advantages = torch.randn(rows, generator=g)
    mask = torch.rand(rows, width, generator=g) < 0.8
    mask[:, 0] = True  # TRL's loss counts -A (geometric mean 1) for a row without tokens; ours 0 (no gradient)
    expected, metrics = trl_gmpo_loss(logps, old, advantages, mask, eps_low, eps_high, accumulation)
    out = gmpo_surrogate(logps, old, advantages, mask, epsilon_low=eps_low, epsilon_high=eps_high)
    got = aggregate_token_loss(out.per_token_loss, mask, "grpo", accumulation=accumulation)
    per_row = gmpo_sequence_loss(logps, old, advantages, mask, epsilon_low=eps_low, epsilon_high=eps_high)
    scale = float(per_row.detach().abs().max()) / accumulation
    assert abs(got.item() - expected.item()) <= (width + rows + 4) * U * scale + 1e-38
    (grad_expected,) = torch.autograd.grad(expected, logps)
    (grad_got,) = torch.autograd.grad(got, logps)
    tol = (width + 4) * U * float(grad_expected.abs().max()) + 1e-38
    assert float((grad_got - grad_expected).abs().max()) <= tol
    # TRL's clip metrics count the same tokens.
    valid = mask.float()
    assert metrics["clip_ratio/low_mean"] == [float((out.clipped_low * valid).sum() / valid.sum())]
    assert metrics["clip_ratio/high_mean"] == [float((out.clipped_high * valid).sum() / valid.sum())]


def test_rows_without_tokens_have_no_gradient_in_both():
    old = torch.zeros(2, 3)
    logps = (old + 0.3).requires_grad_()
    mask = torch.tensor([[True, True, False], [False, False, False]])
    advantages = torch.tensor([1.0, 2.0])
    expected, _ = trl_gmpo_loss(logps, old, advantages, mask, 0.4, 0.4, 1)
    got = aggregate_token_loss(gmpo_surrogate(logps, old, advantages, mask, epsilon_low=0.4, epsilon_high=0.4)
                               .per_token_loss, mask, "grpo")  # fmt: skip
    # TRL counts the empty row's -A * e^0 = -2 in the loss's value (a constant); ours counts 0.
    # tol: float32 losses of magnitude <= 3, each a few roundings (2^-23 each): 1e-6 relative is ~8 ULP of the difference.
    assert math.isclose(float(expected) - float(got), -2.0 / 2, rel_tol=1e-6)
    (grad_expected,) = torch.autograd.grad(expected, logps)
    (grad_got,) = torch.autograd.grad(got, logps)
    torch.testing.assert_close(grad_got, grad_expected, rtol=8 * U, atol=0.0)  # tol: 8 float32 ULP, two op orders
    assert not grad_got[1].any()


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_trainer_loss_equals_trls_gmpo_loss(tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, beta):
    """The whole seam: GMPOTrainer.compute_loss (TRL's _compute_loss with the gmpo surrogate, TRL's KL and
    accumulation) against TRL's GMPOTrainer._compute_loss run by the same trainer, on one hand-built micro-batch
    whose old log-probs put tokens on both sides of the clip; value and gradient w.r.t. the policy's log-probs."""
    captured = {}

    class Capturing(GMPOTrainer):
        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if kwargs.get("compute_entropy"):
                captured["logps"] = out[0]
            return out

    config = GMPOConfig(**config_kwargs(beta=beta, gradient_accumulation_steps=2))
    trainer = Capturing(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config,
        train_dataset=arithmetic_train, processing_class=tiny_tokenizer,
    )  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    g = torch.Generator().manual_seed(0)
    rows, width = 8, 6
    completion_mask = torch.ones(rows, width, dtype=torch.long)
    completion_mask[::2, 4:] = 0
    inputs = {
        "prompt_ids": torch.randint(0, 100, (rows, 4), generator=g), "prompt_mask": torch.ones(rows, 4, dtype=torch.long),
        "completion_ids": torch.randint(0, 100, (rows, width), generator=g), "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=g), "num_items_in_batch": completion_mask.sum(),
    }  # fmt: skip
    with torch.no_grad():
        logps, _ = trainer.policy_forward(trainer.model, trainer.micro_batch(dict(inputs)))
    inputs["old_per_token_logps"] = logps + 0.6 * torch.randn(rows, width, generator=g)
    if beta:
        inputs["ref_per_token_logps"] = logps + 0.3 * torch.randn(rows, width, generator=g)

    got = trainer.compute_loss(trainer.model, dict(inputs))
    (grad_got,) = torch.autograd.grad(got, captured["logps"])
    expected = TRLGMPOTrainer._compute_loss(trainer, trainer.model, dict(inputs))
    (grad_expected,) = torch.autograd.grad(expected, captured["logps"])

    old = inputs["old_per_token_logps"]
    per_row = gmpo_sequence_loss(logps, old, inputs["advantages"], completion_mask.bool(), epsilon_low=0.4,
                                 epsilon_high=0.4)  # fmt: skip
    _, low, high = gmpo_clipped_log_ratio(logps, old, inputs["advantages"], epsilon_low=0.4, epsilon_high=0.4)
    assert (low & completion_mask.bool()).any() and (high & completion_mask.bool()).any()  # both clips in play
    # The KL adds per-row means of the same values in both, summed in another order: the same bound over both terms.
    kl = 0.0
    if beta:
        diff = inputs["ref_per_token_logps"] - logps
        kl = float((torch.exp(diff) - diff - 1).max())
    scale = (float(per_row.abs().max()) + beta * kl) / 2
    assert abs(got.item() - expected.item()) <= (width + rows + 4) * U * scale
    tol = (width + 4) * U * float(grad_expected.abs().max())
    assert float((grad_got - grad_expected).abs().max()) <= tol
    assert grad_got.abs().max() > 0
    logged = trainer._metrics["train"]
    assert (
        logged["clip_ratio/high_mean"][0] > 0
        and logged["clip_ratio/high_mean"][0] == logged["clip_ratio/high_mean"][1]
    )
    assert logged["gmpo/ratio"]


def test_defaults_are_the_papers(config_kwargs):
    config = GMPOConfig(**config_kwargs())
    assert (config.epsilon, config.epsilon_high, config.loss_type, config.beta) == (0.4, None, "grpo", 0.0)
    assert config.use_bias_correction_kl is False
    assert GMPOTrainer.surrogate == "gmpo"


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(epsilon=0.0), "epsilon must be > 0"),
        (dict(delta=3.0), r"delta=3.0 \(None"),
        (dict(vllm_importance_sampling_mode="token_truncate"), "vllm_importance_sampling_mode='token_truncate'"),
    ],
)
def test_bad_options_fail_at_config_time(config_kwargs, bad, message):
    with pytest.raises(ValueError, match=message):
        GMPOConfig(**config_kwargs(**bad))


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(loss_type="dapo"), r"loss_type='dapo' \(one of \('grpo', 'sapo'\)\)"),
        (dict(top_entropy_quantile=0.5), r"top_entropy_quantile=0.5 \(1.0\)"),
        (dict(importance_sampling_level="sequence"), "importance_sampling_level='sequence'"),
        (dict(use_bias_correction_kl=True, beta=0.1), "use_bias_correction_kl=True"),
    ],
)
def test_settings_the_surrogate_does_not_follow_fail_before_training(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, bad, message
):
    config = GMPOConfig(**config_kwargs(**bad))
    with pytest.raises(ValueError, match=message):
        GMPOTrainer(model=tiny_model_dir, reward_funcs=[digit_share_reward],
                    args=config, train_dataset=arithmetic_train, processing_class=tiny_tokenizer)  # fmt: skip
