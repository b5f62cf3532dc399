"""Advantage estimators by name: the registry the trainers' advantage stage and the composing methods draw from.

An estimator maps the gathered rewards ``(num_prompts, G)`` (NaN = unscorable) to one advantage per completion,
``(num_prompts, G)``, with keyword options of its own and an optional ``generator`` for sampled draws (ignored by
deterministic estimators). Methods that filter or reweight advantages rather than define them (D3S's row and token
selection, CW-GRPO's token weights) take any registered estimator by name (``d3s_base_estimator``,
``cw_base_estimator``) and its options as a mapping (``d3s_estimator_options``, ``cw_estimator_options``).

Registered: ``grpo`` (``algorithms.grpo.group_advantages``; option ``scale``), ``ms_grpo``
(``algorithms.ms_grpo.multiscale_advantages``; options as ``MSGRPOConfig``'s fields ``tau_min``, ``weights``, ``std``,
``eps``, ``num_scales``, ``subgroups_per_scale``, ``partition``, ``selection``, ``draw``, ``permute_labels``) and
``gpg`` (``algorithms.gpg.gpg_advantages``; options ``f_norm``, default ``"none"`` as in GPG, and ``tol``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .gpg import F_NORMS, gpg_advantages
from .grpo import group_advantages
from .ms_grpo import MultiscaleCache, multiscale_advantages, validate_multiscale_options


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
        check = validate or _option_names_check(name, function)
        ESTIMATORS[name] = Estimator(name, function, check, sampled, new_cache)
        return function

    return decorate


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator {name!r}; registered: {tuple(ESTIMATORS)}.")
    return ESTIMATORS[name]


def validate_estimator(name: str, num_generations: int, options: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` if ``name`` is not registered or ``options`` do not fit it (names, values, group size)."""
    get_estimator(name).validate(num_generations, **dict(options or {}))


def _option_names_check(name: str, function: Callable[..., torch.Tensor]) -> Callable[..., None]:
    allowed = [p for p in inspect.signature(function).parameters if p not in ("rewards", "generator", "cache")]

    def validate(num_generations: int, **options: Any) -> None:
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"Unknown option(s) {unknown} for the {name!r} estimator; it takes {allowed}.")

    return validate


def _validate_grpo(num_generations: int, **options: Any) -> None:
    _option_names_check("grpo", grpo_estimator)(num_generations, **options)
    if options.get("scale", "group") not in ("group", "batch", "none"):
        raise ValueError(f"The 'grpo' estimator's scale must be 'group', 'batch' or 'none', got {options['scale']!r}.")


def _validate_gpg(num_generations: int, **options: Any) -> None:
    _option_names_check("gpg", gpg_estimator)(num_generations, **options)
    if options.get("f_norm", "none") not in F_NORMS:
        raise ValueError(f"The 'gpg' estimator's f_norm must be one of {F_NORMS}, got {options['f_norm']!r}.")
    tol = options.get("tol", 0.0)
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol >= 0):
        raise ValueError(f"The 'gpg' estimator's tol must be a finite number >= 0, got {tol!r}.")


@register_estimator("grpo", lambda num_generations, **options: _validate_grpo(num_generations, **options))
def grpo_estimator(rewards: torch.Tensor, *, scale: str = "group", generator=None) -> torch.Tensor:
    return group_advantages(rewards, scale=scale)


def _validate_multiscale(num_generations: int, **options: Any) -> None:
    _option_names_check("ms_grpo", multiscale_advantages)(num_generations, **options)
    validate_multiscale_options(num_generations, **options)


@register_estimator("ms_grpo", _validate_multiscale, sampled=True, new_cache=MultiscaleCache)
def ms_grpo_estimator(rewards: torch.Tensor, *, generator=None, cache=None, **options: Any) -> torch.Tensor:
    return multiscale_advantages(rewards, generator=generator, cache=cache, **options)


@register_estimator("gpg", lambda num_generations, **options: _validate_gpg(num_generations, **options))
def gpg_estimator(rewards: torch.Tensor, *, f_norm: str = "none", tol: float = 0.0, generator=None) -> torch.Tensor:
    return gpg_advantages(rewards, f_norm=f_norm, tol=tol)


__all__ = ["ESTIMATORS", "Estimator", "get_estimator", "register_estimator", "validate_estimator"]
