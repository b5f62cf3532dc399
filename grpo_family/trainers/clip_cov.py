"""Clip-Cov on TRL's ``GRPOTrainer``: GRPO's clipped surrogate, with a random few of the tokens whose
log-probability/advantage covariance lies in a band detached (Cui et al., 2025; maths in
:mod:`grpo_family.algorithms.clip_cov`, ``docs/methods/clip_cov.md``). The method is the registered loss term
``clip_cov`` on the base class's stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..algorithms import clip_cov  # noqa: F401 - registers the "clip_cov" loss term
from ..bounds import Bound, Float, Unused
from .base import GRPOFamilyConfig, GRPOFamilyTrainer
from .kl_cov import KLCovTrainer


@dataclass
class ClipCovConfig(GRPOFamilyConfig):
    """``GRPOConfig`` plus the options of Clip-Cov (Cui et al., 2025, "The Entropy Mechanism of Reinforcement
    Learning for Reasoning Language Models", arXiv 2505.22617; ``docs/methods/clip_cov.md`` §4). The surrogate's
    clip is TRL's ``epsilon`` / ``epsilon_high``, which also decides which tokens are already clipped (never
    detached again)."""

    loss_term: ClassVar[str] = "clip_cov"  # its preconditions: algorithms/clip_cov.py's registration
    field_bounds: ClassVar[dict[str, Bound]] = {  # read by grpo_family.bounds.check_bounds
        "clip_cov_ratio": Float(0, 1, min_open=True),
        "clip_cov_lower": Float(),
        "clip_cov_upper": Float(),
    }
    unused_options: ClassVar[dict[str, Unused]] = {  # read by grpo_family.bounds.check_unused
        "delta": Unused("Clip-Cov's surrogate clips the ratio with --epsilon / --epsilon_high only.", 2.0),
    }

    clip_cov_ratio: float = field(
        default=2e-4,
        metadata={
            "help": "r: tokens detached per loss call, as a share of its valid tokens (at least one), in (0, 1]. "
            "Default 2e-4 (the paper's and verl's).",
        },
    )
    clip_cov_lower: float = field(
        default=1.0,
        metadata={
            "help": "omega_low: a token is a candidate when its covariance is > this. Default 1.0 (the paper's and verl's).",
        },
    )
    clip_cov_upper: float = field(
        default=5.0,
        metadata={"help": "omega_high: ... and < this (> clip_cov_lower). Default 5.0 (the paper's and verl's)."},
    )

    def __post_init__(self):
        super().__post_init__()  # single values (field_bounds) and the loss term's preconditions (GRPOFamilyConfig)
        if not self.clip_cov_lower < self.clip_cov_upper:
            raise ValueError(
                f"clip_cov_lower < clip_cov_upper is needed (default 1.0 < 5.0), got "
                f"{(self.clip_cov_lower, self.clip_cov_upper)!r}; an empty band would detach nothing."
            )


class ClipCovTrainer(GRPOFamilyTrainer):
    """Clip-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", 2025,
    arXiv 2505.22617): TRL's clipped surrogate, except that ``max(1, int(clip_cov_ratio * N))`` tokens drawn at
    random among those with ``clip_cov_lower < cov < clip_cov_upper`` (not already clipped) train with advantage 0:
    no loss, no gradient. Chosen over the loss call's rows on every process, from a generator seeded by the step
    (every process draws alike; a resumed run draws the same). Metrics: ``clip_cov/detached_tokens``,
    ``clip_cov/detached_frac``.
    """

    method_name = "clip_cov"
    loss_term = ClipCovConfig.loss_term
    summary = "the clipped surrogate with a random few tokens whose log-prob/advantage covariance lies in a band detached (no gradient)"
    reported_result = "Qwen2.5 7B and 32B on math: the entropy no longer collapses and accuracy ends above GRPO's (the abstract); CW-GRPO's paper: 53.6 vs GRPO 52.6 (1.5B)"
    _tag_names = ["trl", "grpo", "grpo_family", "clip_cov"]
    _name = "Clip-Cov"
    _paper = KLCovTrainer._paper  # one paper, one citation

    def loss_term_options(self) -> dict[str, Any]:
        a = self.args
        return {
            "ratio": a.clip_cov_ratio,
            "lower": a.clip_cov_lower,
            "upper": a.clip_cov_upper,
            "clip_low": self.epsilon_low,
            "clip_high": self.epsilon_high,
        }


__all__ = ["ClipCovConfig", "ClipCovTrainer"]
