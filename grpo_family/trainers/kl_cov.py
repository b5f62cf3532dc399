"""KL-Cov on TRL's ``GRPOTrainer``: GRPO's advantages, an unclipped surrogate, and a KL penalty on the tokens whose
log-probability/advantage covariance is largest (Cui et al., 2025; maths in :mod:`grpo_family.algorithms.kl_cov`,
``docs/methods/kl_cov.md``). The method is the registered loss term ``kl_cov`` on the base class's stages."""

from __future__ import annotations

import math
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..algorithms import kl_cov  # noqa: F401 - registers the "kl_cov" loss term
from ..bounds import AnyOf, Bound, Float, OneOf
from .base import GRPOFamilyConfig, GRPOFamilyTrainer


@dataclass
class KLCovConfig(GRPOFamilyConfig):
    """``GRPOConfig`` plus the options of KL-Cov (Cui et al., 2025, "The Entropy Mechanism of Reinforcement Learning
    for Reasoning Language Models", arXiv 2505.22617; ``docs/methods/kl_cov.md`` §4). KL-Cov has no ratio clipping,
    so ``epsilon`` defaults to ``inf`` here; its penalty replaces the clip on the tokens that matter."""

    loss_term: ClassVar[str] = "kl_cov"  # its preconditions: algorithms/kl_cov.py's registration
    field_bounds: ClassVar[dict[str, Bound]] = {  # read by grpo_family.bounds.check_bounds
        "epsilon": AnyOf((Float(0, 1, max_open=True), OneOf((math.inf,)))),
        "kl_cov_ratio": Float(0, 1, min_open=True),
        "kl_cov_coef": Float(0),
    }

    epsilon: float = field(
        default=math.inf,
        metadata={
            "help": "Ratio clip of the surrogate. Default inf: no clipping, as in KL-Cov (the paper's loss and "
            "verl's kl_cov); a finite value clips as well (not in the paper).",
        },
    )
    kl_cov_ratio: float = field(
        default=2e-4,
        metadata={
            "help": "k: share of the loss call's valid tokens (at least one) with the largest log-prob/advantage "
            "covariance that get the KL penalty, in (0, 1]. Default 2e-4, the paper's value for Qwen2.5-32B and verl's "
            "default; the paper uses 2e-3 for Qwen2.5-7B (its authors' recipe/entropy/7b_kl_cov.sh).",
        },
    )
    kl_cov_coef: float = field(
        default=1.0,
        metadata={
            "help": "beta: weight of |logp - logp_old| on the selected tokens, >= 0. Default 1.0 (the paper's and verl's).",
        },
    )

    def __post_init__(self):
        super().__post_init__()  # single values (field_bounds) and the loss term's preconditions (GRPOFamilyConfig)
        if self.steps_per_generation == self.gradient_accumulation_steps and self.num_iterations == 1:
            warnings.warn(
                "KL-Cov with one update per generation batch: logp == logp_old on it, so the penalty and its gradient "
                "are 0 and this trains GRPO without the clip (docs/methods/kl_cov.md §3). For the paper's method set "
                "steps_per_generation to a multiple of gradient_accumulation_steps, or num_iterations > 1.",
                UserWarning,
                stacklevel=2,
            )


class KLCovTrainer(GRPOFamilyTrainer):
    """KL-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", 2025,
    arXiv 2505.22617): ``-A_t r_t`` on every token, plus ``kl_cov_coef * |logp_t - logp_old,t|`` on the
    ``kl_cov_ratio`` share of tokens with the largest covariance between log-probability and advantage, chosen over
    the loss call's rows on every process. Metrics: ``kl_cov/selected_tokens``, ``kl_cov/abs_kl``.
    """

    method_name = "kl_cov"
    loss_term = KLCovConfig.loss_term
    summary = "no ratio clip, and a KL penalty \\|logp - logp_old\\| on the few tokens whose log-prob/advantage covariance is largest"
    reported_result = (
        "Qwen2.5 7B and 32B on math: the entropy no longer collapses and accuracy ends above GRPO's (the abstract)"
    )
    _tag_names = ["trl", "grpo", "grpo_family", "kl_cov"]
    _name = "KL-Cov"
    _paper = {
        "title": "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
        "id": "2505.22617",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{cui2025entropy,
                title        = {{The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models}},
                author       = {Ganqu Cui and Yuchen Zhang and Jiacheng Chen and Lifan Yuan and Zhi Wang and Yuxin Zuo and Haozhan Li and Yuchen Fan and Huayu Chen and Weize Chen and Zhiyuan Liu and Hao Peng and Lei Bai and Wanli Ouyang and Yu Cheng and Bowen Zhou and Ning Ding},
                year         = 2025,
                eprint       = {arXiv:2505.22617},
            }"""),
    }

    def loss_term_options(self) -> dict[str, Any]:
        return {"ratio": self.args.kl_cov_ratio, "coef": self.args.kl_cov_coef}


__all__ = ["KLCovConfig", "KLCovTrainer"]
