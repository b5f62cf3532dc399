"""GMPO on TRL's ``GRPOTrainer``: GRPO's advantages, and the geometric mean of the token-level ratios, clipped in
log space, in place of their arithmetic mean (Zhao et al., 2025; maths in :mod:`grpo_family.algorithms.gmpo`,
``docs/methods/gmpo.md``). The method is the registered surrogate ``gmpo`` on the base class's stages."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import ClassVar

from ..algorithms import gmpo  # noqa: F401 - registers the "gmpo" surrogate
from ..bounds import Bound, Float
from .base import GRPOFamilyConfig, GRPOFamilyTrainer


@dataclass
class GMPOConfig(GRPOFamilyConfig):
    """``GRPOConfig`` with the defaults of GMPO (Zhao et al., 2025, "Geometric-Mean Policy Optimization", arXiv
    2507.20673; ``docs/methods/gmpo.md``). ``epsilon`` and ``epsilon_high`` are in log space: the token ratios are
    clipped to ``(e^-epsilon, e^epsilon_high)``, the paper's ``(e^-0.4, e^0.4)`` by default, as TRL's
    ``trl.experimental.gmpo.GMPOConfig``. TRL options that reshape the clipped-ratio objective GMPO replaces are
    refused (``delta``, ``importance_sampling_level``, ``top_entropy_quantile``, ``off_policy_mask_threshold``,
    ``use_bias_correction_kl`` with ``beta != 0``; the last defaults to False here); TRL's vLLM importance-sampling
    correction is applied per completion (its ``sequence_*`` modes), which TRL's GMPOTrainer does not do."""

    field_bounds: ClassVar[dict[str, Bound]] = {  # read by grpo_family.bounds.check_bounds
        "epsilon": Float(0, min_open=True),
        "epsilon_high": Float(0, min_open=True, optional=True),
    }

    epsilon: float = field(
        default=0.4,
        metadata={
            "help": "Lower clip in log space: a token's ratio is clipped below at e^-epsilon (where its advantage is "
            "negative), > 0. Default 0.4, the paper's (e^-0.4, e^0.4) range.",
        },
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clip in log space: a token's ratio is clipped above at e^epsilon_high (where its advantage "
            "is positive), > 0. Default None: equal to epsilon (the paper's symmetric range).",
        },
    )
    loss_type: str = field(
        default="grpo",
        metadata={
            "help": "Aggregation: GMPO's objective is one value per completion, averaged over completions, which is "
            "TRL's per-sequence mean ('grpo', the default here, or 'sapo'); the others are refused.",
        },
    )
    use_bias_correction_kl: bool = field(
        default=False,
        metadata={
            "help": "Must stay False with beta != 0: GMPO's KL is the plain per-completion mean of TRL's estimator "
            "(as TRL's GMPOTrainer), not weighted by TRL's token ratio, which the gmpo surrogate replaces. TRL's "
            "default is True.",
        },
    )

    def __post_init__(self):
        super().__post_init__()  # single values: field_bounds and grpo_family.bounds.BOUNDS
        problems = []
        if self.delta is not None:
            problems.append(f"delta={self.delta} (None: TRL's cap of the ratio; GMPO clips in log space)")
        if self.vllm_importance_sampling_correction and not self.vllm_importance_sampling_mode.startswith("sequence"):
            problems.append(
                f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r} ('sequence_mask' or "
                "'sequence_truncate': GMPO weighs a whole completion, so its correction is per sequence)"
            )
        if problems:
            raise ValueError(
                f"GMPO does not use these TRL options: {', '.join(problems)}. Use the values in brackets."
            )


class GMPOTrainer(GRPOFamilyTrainer):
    """GMPO (Zhao et al., "Geometric-Mean Policy Optimization", 2025, arXiv 2507.20673): per completion
    ``-A * exp(mean_t clip(log r_t))``, each token's log-ratio clipped one-sidedly by the advantage's sign to
    ``(-epsilon, epsilon_high)``, averaged over completions; TRL's KL (``beta``, sequence-averaged through
    ``loss_type='grpo'``), accumulation and metrics unchanged. Metric: ``gmpo/ratio`` (the clipped geometric-mean
    ratio); TRL's ``clip_ratio/*`` count the log-space clip.
    """

    method_name = "gmpo"
    surrogate = "gmpo"
    summary = "the geometric mean of the token ratios, each clipped in log space to (e^-0.4, e^0.4), instead of their arithmetic mean"
    reported_result = (
        "DeepSeek-R1-Distill-Qwen-7B and Qwen2.5-Math-7B on math: steadier updates and higher Pass@1 than GRPO "
        "(the abstract)"
    )
    _tag_names = ["trl", "grpo", "grpo_family", "gmpo"]
    _name = "GMPO"
    _paper = {
        "title": "Geometric-Mean Policy Optimization",
        "id": "2507.20673",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{zhao2025geometric,
                title        = {{Geometric-Mean Policy Optimization}},
                author       = {Yuzhong Zhao and Yue Liu and Junpeng Liu and Jingye Chen and Xun Wu and Yaru Hao and Tengchao Lv and Shaohan Huang and Lei Cui and Qixiang Ye and Fang Wan and Furu Wei},
                year         = 2025,
                eprint       = {arXiv:2507.20673},
            }"""),
    }


__all__ = ["GMPOConfig", "GMPOTrainer"]
