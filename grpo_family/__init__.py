"""grpo_family: GRPO-family RL trainers (MS-GRPO, CW-GRPO, D3S, SGPO, GPG, KL-Cov, Clip-Cov,
GMPO) on TRL's GRPOTrainer.

``METHODS`` maps a method name to its ``(Config, Trainer)`` pair; ``examples/train.py --method NAME`` uses it. It is
the one list of methods: the command line, the documentation's tables, the tests and the benchmarks read it, so a
method is added by its own files (algorithm, trainer, document, tests, recipes) and one line of
``_METHOD_CLASSES`` below (``docs/architecture.md``, "Add a method").

The trainers (and with them TRL, transformers and torch) are imported on first access of one of the names below
(PEP 562 module ``__getattr__``), so that ``import grpo_family.rewards`` -- which imports this package first --
stays light: the reward functions and the scoring worker subprocesses never pay for TRL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Method name -> (module, Config class, Trainer class); ``METHODS`` holds the classes once one is asked for.
_METHOD_CLASSES: dict[str, tuple[str, str, str]] = {
    "grpo": (".trainers.base", "GRPOFamilyConfig", "GRPOFamilyTrainer"),
    "ms_grpo": (".trainers.ms_grpo", "MSGRPOConfig", "MSGRPOTrainer"),
    "cw_grpo": (".trainers.cw_grpo", "CWGRPOConfig", "CWGRPOTrainer"),
    "d3s": (".trainers.d3s", "D3SConfig", "D3STrainer"),
    "sgpo": (".trainers.sgpo", "SGPOConfig", "SGPOTrainer"),
    "gpg": (".trainers.gpg", "GPGConfig", "GPGTrainer"),
    "kl_cov": (".trainers.kl_cov", "KLCovConfig", "KLCovTrainer"),
    "clip_cov": (".trainers.clip_cov", "ClipCovConfig", "ClipCovTrainer"),
    "gmpo": (".trainers.gmpo", "GMPOConfig", "GMPOTrainer"),
}

# Public name -> (module, attribute), imported on first access.
_LAZY: dict[str, tuple[str, str]] = {
    "GRPOConfig": ("trl", "GRPOConfig"),
    "RewardFunctionError": (".errors", "RewardFunctionError"),
    "UnlearnableRunError": (".errors", "UnlearnableRunError"),
    **{name: (module, name) for module, *classes in _METHOD_CLASSES.values() for name in classes},
}

if TYPE_CHECKING:  # what static tools see (the shared names); at run time __getattr__ imports them on first use
    from trl import GRPOConfig  # noqa: F401 - exported through __all__, which is built from _LAZY

    from .errors import RewardFunctionError, UnlearnableRunError  # noqa: F401
    from .trainers.base import GRPOFamilyConfig, GRPOFamilyTrainer  # noqa: F401

    METHODS: dict[str, tuple[type, type]]


def __getattr__(name: str) -> Any:
    if name == "METHODS":
        value: Any = {method: (__getattr__(c), __getattr__(t)) for method, (_, c, t) in _METHOD_CLASSES.items()}
    elif name in _LAZY:
        module_name, attr = _LAZY[name]
        value = getattr(importlib.import_module(module_name, __name__), attr)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups find it without calling __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def get_method(name: str) -> tuple[type, type]:
    """``(Config, Trainer)`` for ``name``; a ValueError lists the valid names otherwise."""
    methods = globals()["METHODS"] if "METHODS" in globals() else __getattr__("METHODS")
    if name not in methods:
        raise ValueError(f"Unknown method {name!r}. Valid methods: {', '.join(sorted(methods))}.")
    return methods[name]


__all__ = sorted({"METHODS", "get_method", *_LAZY})
