"""Advantage estimators by name: the registry the trainers' advantage stage and the composing methods draw from.

An estimator maps the gathered rewards ``(num_prompts, G)`` (NaN = unscorable) to one advantage per completion,
``(num_prompts, G)``, with keyword options of its own and an optional ``generator`` for sampled draws (ignored by
deterministic estimators). Methods that filter or reweight advantages rather than define them (D3S's row and token
selection, CW-GRPO's token weights) take any registered estimator by name (``d3s_base_estimator``,
``cw_base_estimator``) and its options as a mapping (``d3s_estimator_options``, ``cw_estimator_options``).

An estimator registers itself in its method's module (``@register_estimator``, like loss terms and surrogates; a
second function under a taken name is refused): ``grpo`` (``algorithms/grpo.py``, ``group_advantages``; option
``scale``), ``ms_grpo`` (``algorithms/ms_grpo.py``, ``multiscale_advantages``; options as ``MSGRPOConfig``'s fields
``tau_min``, ``weights``, ``std``, ``eps``, ``num_scales``, ``subgroups_per_scale``, ``partition``, ``selection``,
``draw``, ``permute_labels``) and ``gpg`` (``algorithms/gpg.py``, ``gpg_advantages``; options ``f_norm``, default
``"none"`` as in GPG, and ``tol``). ``grpo_family.algorithms`` imports those modules, so the three are registered
whenever any part of it is imported.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Estimator:
    """A registered estimator: ``function(rewards, *, generator=None, **options) -> (num_prompts, G)``;
    ``validate(num_generations, **options)`` raises ``ValueError`` on options the function would reject."""

    name: str
    function: Callable[..., torch.Tensor]
    validate: Callable[..., None]
    sampled: bool = False  # draws from ``generator`` (for some options)
    new_cache: Callable[[], Any] | None = None  # a cache the caller keeps and passes back as ``cache=`` (one per run)

    def __call__(self, rewards: torch.Tensor, *, generator: torch.Generator | None = None, **options: Any):
        """``options`` may include ``cache`` (a ``new_cache()`` object) for an estimator that takes one."""
        return self.function(rewards, generator=generator, **options)


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(
    name: str,
    validate: Callable[..., None] | None = None,
    *,
    sampled: bool = False,
    new_cache: Callable[[], Any] | None = None,
):
    """Decorator: register ``function`` under ``name`` (``validate`` defaults to a check of the option names). An
    estimator that can reuse work across calls names ``new_cache``: its caller keeps one cache per run and passes it
    as ``cache=``; algorithms/ itself keeps no state between calls."""

    def decorate(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if name in ESTIMATORS and ESTIMATORS[name].function is not function:
            raise ValueError(f"An advantage estimator named {name!r} is already registered.")
        check = validate or option_names_check(name, function)
        ESTIMATORS[name] = Estimator(name, function, check, sampled, new_cache)
        return function

    return decorate


def estimator_names() -> tuple[str, ...]:
    """The registered estimators' names (the values ``d3s_base_estimator`` / ``cw_base_estimator`` may take)."""
    return tuple(sorted(ESTIMATORS))


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator {name!r}; registered: {tuple(ESTIMATORS)}.")
    return ESTIMATORS[name]


def validate_estimator(name: str, num_generations: int, options: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` if ``name`` is not registered or ``options`` do not fit it (names, values, group size)."""
    get_estimator(name).validate(num_generations, **dict(options or {}))


def option_names_check(name: str, function: Callable[..., torch.Tensor]) -> Callable[..., None]:
    """A ``validate`` that refuses option names ``function`` does not take (the default check of an estimator)."""
    allowed = [p for p in inspect.signature(function).parameters if p not in ("rewards", "generator", "cache")]

    def validate(num_generations: int, **options: Any) -> None:
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"Unknown option(s) {unknown} for the {name!r} estimator; it takes {allowed}.")

    return validate


__all__ = [
    "ESTIMATORS",
    "Estimator",
    "estimator_names",
    "get_estimator",
    "option_names_check",
    "register_estimator",
    "validate_estimator",
]
