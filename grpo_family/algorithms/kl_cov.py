"""KL-Cov: a KL penalty on the tokens of largest covariance (Cui et al., 2025, "The Entropy Mechanism of Reinforcement
Learning for Reasoning Language Models", arXiv 2505.22617; ``docs/methods/kl_cov.md``).

Under policy-gradient updates a token's contribution to the change of the policy entropy is minus the covariance
between its log-probability and its advantage (the paper's Sec. 3); the few tokens with the largest covariance drive
the entropy collapse. KL-Cov trains the unclipped surrogate ``-A_t r_t`` (``r_t = exp(logp_t - logp_old,t)``) and
adds ``beta * |logp_t - logp_old,t|`` to the loss of the ``k`` share of the loss call's tokens with the largest

    cov_t = (A_t - mean A) * (logp_t - mean logp)          (means over the call's valid tokens)

``max(1, int(k * N))`` tokens of the ``N`` valid ones, ties to the earlier token (row-major). The same formula as
verl's ``compute_policy_loss_kl_cov`` (``verl/trainer/ppo/core_algos.py``), which evaluates it per micro-batch on each
rank; the trainers call this term on the loss call's rows of every process, so the means and the top-k are global.
"""

from __future__ import annotations

import torch

from .losses import CLIPPED_RATIO_LOSS_TYPES, LossTermOutput, covariance, register_loss_term

__all__ = ["kl_cov_loss_term", "kl_cov_tokens"]


def kl_cov_tokens(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """Bool ``(N, T)``: the ``max(1, int(ratio * n))`` valid tokens (``n`` of them) with the largest covariance
    :func:`~grpo_family.algorithms.losses.covariance`, ties to the earlier token; none when no token is valid.
    ``logps``, ``mask`` ``(N, T)``; ``advantages`` ``(N,)`` or ``(N, T)``."""
    valid = mask.bool()
    selected = torch.zeros_like(valid)
    count = int(valid.sum())
    if count == 0:
        return selected
    k = max(1, int(count * ratio))
    values = covariance(logps, advantages, valid)[valid]  # row-major order of the valid tokens
    top = torch.sort(values, descending=True, stable=True).indices[:k]
    selected.view(-1)[valid.reshape(-1).nonzero().squeeze(1)[top]] = True
    return selected


@register_loss_term("kl_cov", token_level=True, loss_types=CLIPPED_RATIO_LOSS_TYPES)
def kl_cov_loss_term(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float = 2e-4,
    coef: float = 1.0,
) -> LossTermOutput:
    """The per-token loss KL-Cov adds to the unclipped surrogate: ``coef * |logp - logp_old|`` on
    :func:`kl_cov_tokens`, 0 elsewhere (differentiable through ``logps``). Metrics: ``selected_tokens`` and
    ``abs_kl`` (mean ``|logp - logp_old|`` over the valid tokens, verl's ``ppo_kl``)."""
    valid = mask.bool()
    selected = kl_cov_tokens(logps, advantages, valid, ratio)
    abs_kl = (logps - old_logps).abs()
    penalty = torch.where(selected, coef * abs_kl, torch.zeros_like(abs_kl))
    metrics = {
        "selected_tokens": selected.sum(),
        "abs_kl": torch.where(valid, abs_kl.detach(), 0.0).sum() / valid.sum().clamp(min=1),
    }
    return LossTermOutput(per_token_loss=penalty, metrics=metrics)
