"""Surrogates by name: the policy objective of one loss call (ratio, clipping and the per-token objective), the
registry beside the loss terms (:mod:`.losses`) and the advantage estimators (:mod:`.estimators`).

A surrogate is a pure function over this process's rows of one loss call:

    surrogate(logps, old_logps, advantages, mask, *, importance_sampling_ratio=None, **options) -> SurrogateOutput

* ``logps`` ``(N, T)``: the current policy's per-token log-probs of the sampled tokens (differentiable);
* ``old_logps`` ``(N, T)``: the rollout policy's (detached; equal to ``logps`` in value on the first pass);
* ``advantages`` ``(N,)`` or per token ``(N, T)``; ``mask`` ``(N, T)`` bool, the tokens the loss counts;
* ``importance_sampling_ratio``: TRL's vLLM importance-sampling correction, ``(N, T)`` or ``(N, 1)``, None when off;
  each surrogate says whether it applies it;
* ``options``: the method's (``GRPOFamilyTrainer.surrogate_options``; by default TRL's ``epsilon_low`` and
  ``epsilon_high``).

It returns the per-token policy loss ``(N, T)`` that replaces TRL's (``-min(r A, clip(r) A)`` for the clipped-ratio
loss types), which the trainer aggregates as TRL aggregates its own for the configured ``loss_type``
(:func:`.losses.aggregate_token_loss`), the tokens its clip cut below and above, ``(N, T)`` bool, which replace
TRL's ``clip_ratio/*`` metrics, and per-completion metrics ``(N,)`` (logged as ``<method>/<name>``, their mean over
every process's rows). TRL's KL penalty, entropy bonus, auxiliary loss, gradient-accumulation scaling and
other metrics stay TRL's (``docs/architecture.md`` §3, the surrogate stage).

A surrogate is per row: a statistic across rows (a covariance, a top-k) belongs in a loss term, which sees every
process's rows. Registered here: ``clipped_ratio`` (TRL 1.16's own objective for its clipped-ratio loss types; the
trainers leave it to TRL and it is registered so that the seam can be checked against TRL); by their modules:
``gmpo`` (:mod:`.gmpo`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .losses import LOSS_TYPES

# TRL 1.16's loss types whose policy objective is the clipped ratio -min(r A, clip(r) A) (the others: cispo, sapo,
# vespo); tests/test_trl_contract.py pins TRL's formulas.
CLIPPED_RATIO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


@dataclasses.dataclass
class SurrogateOutput:
    """``per_token_loss`` ``(N, T)``: the policy loss per token, aggregated by the trainer as TRL aggregates its own;
    ``clipped_low`` / ``clipped_high`` ``(N, T)`` bool: the tokens whose clip cut the objective below / above (logged
    as TRL's ``clip_ratio/low_*``, ``clip_ratio/high_*``, ``clip_ratio/region_mean``); ``metrics``: ``(N,)``
    detached values per completion, logged as ``<method>/<name>`` (mean over every process's rows)."""

    per_token_loss: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    metrics: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Surrogate:
    """A registered surrogate; ``loss_types`` are TRL's loss types whose aggregation its per-token loss is written
    for (a sequence-level objective broadcast over its tokens needs a per-sequence mean: ``grpo``, ``sapo``)."""

    name: str
    function: Callable[..., SurrogateOutput]
    loss_types: tuple[str, ...] = LOSS_TYPES

    def __call__(self, logps, old_logps, advantages, mask, **options: Any) -> SurrogateOutput:
        return self.function(logps, old_logps, advantages, mask, **options)


SURROGATES: dict[str, Surrogate] = {}


def register_surrogate(name: str, *, loss_types: tuple[str, ...] = LOSS_TYPES):
    """Decorator: register ``function`` as the surrogate ``name`` (see the module docstring for its signature);
    a second, different function under the same name is refused."""
    unknown = set(loss_types) - set(LOSS_TYPES)
    if unknown:
        raise ValueError(f"Surrogate {name!r}: unknown loss types {sorted(unknown)}; TRL 1.16's are {LOSS_TYPES}.")

    def decorate(function: Callable[..., SurrogateOutput]) -> Callable[..., SurrogateOutput]:
        if name in SURROGATES and SURROGATES[name].function is not function:
            raise ValueError(f"A surrogate named {name!r} is already registered.")
        SURROGATES[name] = Surrogate(name, function, tuple(loss_types))
        return function

    return decorate


def get_surrogate(name: str) -> Surrogate:
    if name not in SURROGATES:
        raise ValueError(f"Unknown surrogate {name!r}; registered: {tuple(SURROGATES)}.")
    return SURROGATES[name]


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    return advantages if advantages.dim() == 2 else advantages[:, None]


@register_surrogate("clipped_ratio", loss_types=CLIPPED_RATIO_LOSS_TYPES)
def clipped_ratio_surrogate(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> SurrogateOutput:
    """PPO's clipped objective per token, as TRL 1.16 computes it for its clipped-ratio loss types at
    ``importance_sampling_level="token"``: ``r = exp(logp - logp_old)``, loss ``-min(r A, clip(r, 1 - eps_low,
    1 + eps_high) A)`` with ``r`` capped at ``delta`` first when given (two-sided clipping), times the vLLM
    importance-sampling ratio when given. ``(N, T)``."""
    advantages = _per_token(advantages)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    low = (ratio < 1 - epsilon_low) & (advantages < 0)  # TRL's clip_ratio metrics read the delta-capped ratio
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    if importance_sampling_ratio is not None:
        per_token = per_token * importance_sampling_ratio
    return SurrogateOutput(per_token, low.expand_as(per_token), high.expand_as(per_token))


__all__ = [
    "CLIPPED_RATIO_LOSS_TYPES",
    "SURROGATES",
    "Surrogate",
    "SurrogateOutput",
    "clipped_ratio_surrogate",
    "get_surrogate",
    "register_surrogate",
]
