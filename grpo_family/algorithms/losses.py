"""Loss terms by name: the registry the trainers' loss-term stage draws from, beside the advantage estimators
(:mod:`.estimators`).

A loss term changes the policy loss of one loss call. It is a pure function over the rows of that call:

    term(logps, old_logps, advantages, mask, *, generator=None, **options) -> LossTermOutput

* ``logps`` ``(N, T)``: the current policy's per-token log-probs of the sampled tokens (differentiable);
* ``old_logps`` ``(N, T)``: the rollout policy's (detached; equal to ``logps`` in value on the first pass);
* ``advantages`` ``(N,)`` or per token ``(N, T)``; ``mask`` ``(N, T)`` bool, the tokens the loss counts;
* ``generator``: for a term registered with ``sampled=True``.

It returns per-token advantages the clipped surrogate trains on instead (:attr:`LossTermOutput.advantages`), and/or
a per-token loss added to the surrogate's (:attr:`LossTermOutput.per_token_loss`, aggregated like it, see
:func:`aggregate_token_loss`), and metrics. The trainers call it on the rows of a loss call gathered from every
process, with the calling process's own rows carrying the gradient, so every statistic a term takes (a
covariance's means, a top-k) is global; verl calls its policy losses per micro-batch on each rank.

Registered by their modules: ``kl_cov`` (:mod:`.kl_cov`) and ``clip_cov`` (:mod:`.clip_cov`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

# TRL 1.16's loss types, by how they aggregate a per-token loss (tests/test_trl_contract.py checks the formulas).
SEQUENCE_MEAN_LOSS_TYPES = ("grpo", "sapo")  # mean over each sequence's tokens, then over sequences
TOKEN_SUM_LOSS_TYPES = ("dapo", "cispo", "vespo")  # sum over the tokens / the generation batch's token count
LOSS_TYPES = (*SEQUENCE_MEAN_LOSS_TYPES, "bnpo", "dr_grpo", *TOKEN_SUM_LOSS_TYPES, "luspo")
# Those whose per-token objective is TRL's clipped ratio surrogate -A min(r, clip(r)) (cispo, sapo and vespo are not).
CLIPPED_RATIO_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "luspo")


@dataclasses.dataclass
class LossTermOutput:
    """What a loss term changes: ``advantages`` ``(N, T)`` the surrogate trains on instead (None: unchanged),
    ``per_token_loss`` ``(N, T)`` added to the surrogate's per-token loss (None: nothing), and scalar ``metrics``
    (0-dim tensors, logged as ``<method>/<name>``)."""

    advantages: torch.Tensor | None = None
    per_token_loss: torch.Tensor | None = None
    metrics: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LossTerm:
    """A registered loss term; ``sampled`` terms draw from the ``generator`` they are given. Its preconditions on
    the run's settings, declared at registration and checked once for every method that applies it (a config that
    names it in ``loss_term``, :func:`loss_term_problems`): ``token_level``, it reads per-token ratios
    (``importance_sampling_level='token'``); ``loss_types``, the ``loss_type`` values whose surrogate it works on."""

    name: str
    function: Callable[..., LossTermOutput]
    sampled: bool = False
    token_level: bool = False
    loss_types: tuple[str, ...] = LOSS_TYPES

    def __call__(self, logps, old_logps, advantages, mask, *, generator=None, **options: Any) -> LossTermOutput:
        if self.sampled:
            options["generator"] = generator
        return self.function(logps, old_logps, advantages, mask, **options)


LOSS_TERMS: dict[str, LossTerm] = {}


def register_loss_term(
    name: str, *, sampled: bool = False, token_level: bool = False, loss_types: tuple[str, ...] = LOSS_TYPES
):
    """Decorator: register ``function`` as the loss term ``name`` (see the module docstring for its signature), with
    its preconditions (:class:`LossTerm`)."""

    def decorate(function: Callable[..., LossTermOutput]) -> Callable[..., LossTermOutput]:
        if name in LOSS_TERMS and LOSS_TERMS[name].function is not function:
            raise ValueError(f"A loss term named {name!r} is already registered.")
        unknown = sorted(set(loss_types) - set(LOSS_TYPES))
        if unknown:
            raise ValueError(f"Loss term {name!r}: unknown loss types {unknown}; TRL's are {LOSS_TYPES}.")
        LOSS_TERMS[name] = LossTerm(name, function, sampled, token_level, tuple(loss_types))
        return function

    return decorate


def loss_term_problems(name: str, *, loss_type: str, importance_sampling_level: str) -> list[str]:
    """One sentence per setting the registered loss term ``name`` cannot work with (its declared preconditions),
    naming the setting, what it must be and the value given; empty when the settings fit."""
    term = get_loss_term(name)
    problems = []
    if term.token_level and importance_sampling_level != "token":
        problems.append(
            f"The {name} loss term works on tokens one by one: importance_sampling_level must be 'token' (the "
            f"default), got {importance_sampling_level!r}."
        )
    if loss_type not in term.loss_types:
        clipped = " TRL's clipped-ratio losses" if term.loss_types == CLIPPED_RATIO_LOSS_TYPES else ""
        problems.append(
            f"The {name} loss term works on the surrogate of some loss types: loss_type must be one of{clipped} "
            f"{term.loss_types}, got {loss_type!r}."
        )
    return problems


def get_loss_term(name: str) -> LossTerm:
    if name not in LOSS_TERMS:
        raise ValueError(f"Unknown loss term {name!r}; registered: {tuple(LOSS_TERMS)}.")
    return LOSS_TERMS[name]


def aggregate_token_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    num_items_in_batch: torch.Tensor | float | None = None,
    num_processes: int = 1,
    accumulation: float = 1.0,
    steps_per_generation: int = 1,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """A per-token loss ``(B, T)`` of one loss call aggregated as TRL 1.16 aggregates its policy loss for
    ``loss_type``, scaled for gradient accumulation as TRL scales it, so that adding the result to TRL's loss adds
    the term to every token's loss.

    ``accumulation`` is TRL's ``current_gradient_accumulation_steps`` in training (1 in evaluation);
    ``steps_per_generation`` the config's in training (1 in evaluation); ``num_items_in_batch`` the batch's
    (token-sum losses); ``max_completion_length`` the config's (``dr_grpo``).
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if loss_type in SEQUENCE_MEAN_LOSS_TYPES:
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0) / accumulation
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token.size(0) * max_completion_length) / accumulation
    if loss_type in TOKEN_SUM_LOSS_TYPES:
        items = torch.as_tensor(num_items_in_batch, dtype=per_token.dtype, device=per_token.device)
        return masked.sum() / (items.clamp(min=1.0) / num_processes * accumulation / steps_per_generation)
    if loss_type == "luspo":
        return masked.sum(-1).mean() / accumulation
    raise ValueError(f"Unknown loss type {loss_type!r}; TRL 1.16's are {LOSS_TYPES}.")


def covariance(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred cross product ``(A_t - mean A) * (logp_t - mean logp)``, the means over the ``mask``ed
    tokens (Cui et al., 2025, Eq. 8's summand), ``(N, T)``, detached; 0 off the mask."""
    mask = mask.bool()
    advantages = advantages.detach()
    advantages = (advantages if advantages.dim() == 2 else advantages[:, None]).expand_as(logps).to(torch.float64)
    logps = logps.detach().to(torch.float64)
    count = mask.sum().clamp(min=1)
    mean_adv = torch.where(mask, advantages, 0.0).sum() / count
    mean_logp = torch.where(mask, logps, 0.0).sum() / count
    return torch.where(mask, (advantages - mean_adv) * (logps - mean_logp), 0.0)


__all__ = [
    "CLIPPED_RATIO_LOSS_TYPES",
    "LOSS_TERMS",
    "LOSS_TYPES",
    "LossTerm",
    "LossTermOutput",
    "aggregate_token_loss",
    "covariance",
    "get_loss_term",
    "loss_term_problems",
    "register_loss_term",
]
