"""grpo_family: GRPO-family RL trainers (MS-GRPO, CW-GRPO, D3S, SGPO, GPG) on TRL's GRPOTrainer.

``METHODS`` maps a method name to its ``(Config, Trainer)`` pair; ``examples/train.py --method NAME`` uses it.
"""

from trl import GRPOConfig

from .trainers.base import GRPOFamilyConfig, GRPOFamilyTrainer, RewardFunctionError, UnlearnableRunError
from .trainers.cw_grpo import CWGRPOConfig, CWGRPOTrainer
from .trainers.d3s import D3SConfig, D3STrainer
from .trainers.gpg import GPGConfig, GPGTrainer
from .trainers.ms_grpo import MSGRPOConfig, MSGRPOTrainer
from .trainers.sgpo import SGPOConfig, SGPOTrainer

METHODS: dict[str, tuple[type, type]] = {
    "grpo": (GRPOFamilyConfig, GRPOFamilyTrainer),
    "ms_grpo": (MSGRPOConfig, MSGRPOTrainer),
    "cw_grpo": (CWGRPOConfig, CWGRPOTrainer),
    "d3s": (D3SConfig, D3STrainer),
    "sgpo": (SGPOConfig, SGPOTrainer),
    "gpg": (GPGConfig, GPGTrainer),
}


def get_method(name: str) -> tuple[type, type]:
    """``(Config, Trainer)`` for ``name``; a ValueError lists the valid names otherwise."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}. Valid methods: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


__all__ = [
    "CWGRPOConfig",
    "CWGRPOTrainer",
    "D3SConfig",
    "D3STrainer",
    "GPGConfig",
    "GPGTrainer",
    "METHODS",
    "GRPOConfig",
    "GRPOFamilyConfig",
    "GRPOFamilyTrainer",
    "MSGRPOConfig",
    "MSGRPOTrainer",
    "RewardFunctionError",
    "SGPOConfig",
    "SGPOTrainer",
    "UnlearnableRunError",
    "get_method",
]
