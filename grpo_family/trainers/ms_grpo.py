"""MS-GRPO: multi-scale group-relative advantages (only the advantage estimator changes)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..algorithms.grpo import group_advantages
from ..algorithms.ms_grpo import MULTISCALE_DEFAULTS, num_subgroups, validate_multiscale_options
from ..bounds import AnyOf, Bound, Flag, Float, Int, ListOf, OneOf, Text
from .base import GRPOFamilyConfig, GRPOFamilyTrainer
from .stages import GenerationBatch


@dataclass
class MSGRPOConfig(GRPOFamilyConfig):
    """[`GRPOConfig`] plus the options of MS-GRPO's multi-scale advantage (`docs/methods/ms_grpo.md`)."""

    # Single values (read by grpo_family.bounds.check_bounds; the choices are algorithms/ms_grpo.py's constants,
    # tests/test_bounds.py checks they agree); checks across fields are in __post_init__.
    field_bounds: ClassVar[dict[str, Bound]] = {
        "tau_min": Int(2),
        "weights": AnyOf(
            (
                OneOf(("uniform", "global", "local", "flat")),
                Text(
                    pattern=r"\s*\d+(\.\d*)?([eE][+-]?\d+)?(\s*,\s*\d+(\.\d*)?([eE][+-]?\d+)?)*\s*",
                    pattern_words="comma-separated non-negative numbers (one per scale)",
                    bad=("1,,2", "-1,2"),
                ),
                ListOf(Float(0), min_items=1),
            )
        ),
        "std": OneOf(("population", "sample")),
        "eps": Float(0),
        "num_scales": Int(1, optional=True),
        "subgroups_per_scale": Int(1, optional=True),
        "partition": OneOf(("bottom", "paper")),
        "selection": OneOf(("greedy", "random")),
        "draw": OneOf(("per_group", "per_batch")),
        "permute_labels": Flag(),
    }

    tau_min: int = field(
        default=MULTISCALE_DEFAULTS["tau_min"],
        metadata={"help": "Smallest subgroup size (scale). Default 2, the paper's value; 2 <= tau_min <= G."},
    )
    weights: str = field(
        default=MULTISCALE_DEFAULTS["weights"],
        metadata={
            "help": "Scale weights: 'uniform' (paper default), 'global' (larger scales weigh more), 'local' (smaller "
            "scales weigh more), 'flat' (every subgroup equal: the paper's no-hierarchy ablation), or "
            "G - tau_min + 1 comma-separated non-negative floats for scales tau_min..G."
        },
    )
    std: str = field(
        default=MULTISCALE_DEFAULTS["std"],
        metadata={"help": "Std inside a subgroup: 'population' (1/tau, the paper's definition, default) or 'sample'."},
    )
    eps: float = field(
        default=MULTISCALE_DEFAULTS["eps"],
        metadata={"help": "Added to each subgroup's std. Default 1e-6 (VeRL's; the paper does not report it)."},
    )
    num_scales: int | None = field(
        default=MULTISCALE_DEFAULTS["num_scales"],
        metadata={
            "help": "M, scales drawn per step by dilated scale sampling (accelerated mode). None = every scale "
            "(exact). The paper uses 4."
        },
    )
    subgroups_per_scale: int | None = field(
        default=MULTISCALE_DEFAULTS["subgroups_per_scale"],
        metadata={
            "help": "K, Jaccard-diverse subgroups per drawn scale (accelerated mode). None = every subgroup "
            "(exact). The paper uses 8."
        },
    )
    partition: str = field(
        default=MULTISCALE_DEFAULTS["partition"],
        metadata={
            "help": "How DSS cuts the scale range into M intervals: 'bottom' (default; matches the paper's reported "
            "subgroup counts and always keeps the full group) or 'paper' (the printed formula)."
        },
    )
    selection: str = field(
        default=MULTISCALE_DEFAULTS["selection"],
        metadata={"help": "Subgroups per scale: 'greedy' Jaccard-diverse (paper) or 'random' (its ablation)."},
    )
    draw: str = field(
        default=MULTISCALE_DEFAULTS["draw"],
        metadata={
            "help": "Granularity of the dilated scale draw (accelerated mode, num_scales set): 'per_group' (default, "
            "each prompt draws its own scales) or 'per_batch' (one draw shared by every prompt of the batch)."
        },
    )
    permute_labels: bool = field(
        default=MULTISCALE_DEFAULTS["permute_labels"],
        metadata={
            "help": "Accelerated mode: shuffle the completion labels of each prompt before the index-based subgroups "
            "are applied (docs/methods/ms_grpo.md §2.8b, optional). No effect in the exact mode, which is permutation-equivariant."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "MS-GRPO standardises the weighted sum of the rewards inside every subgroup, so it has no "
                f"per-reward-function normalisation: multi_objective_aggregation={self.multi_objective_aggregation!r} "
                "is not supported. Set multi_objective_aggregation='sum_then_normalize' (the default)."
            )
        if isinstance(self.weights, str) and self.weights not in ("uniform", "global", "local", "flat"):
            try:
                self.weights = tuple(float(w) for w in self.weights.split(","))
            except ValueError:
                raise ValueError(
                    f"weights={self.weights!r}: use 'uniform', 'global', 'local', 'flat' or comma-separated floats."
                ) from None
        elif isinstance(self.weights, list):
            self.weights = tuple(float(w) for w in self.weights)
        validate_multiscale_options(self.num_generations, **self.multiscale_kwargs(with_scales=True))
        # docs/methods/ms_grpo.md §6: a group smaller than tau_min is a configuration error at init; that holds for eval groups too
        # (explicit weights must also fit their number of scales).
        if self.num_generations_eval is not None and self.num_generations_eval != self.num_generations:
            try:
                validate_multiscale_options(self.num_generations_eval, **self.multiscale_kwargs(with_scales=True))
            except ValueError as error:
                raise ValueError(
                    f"num_generations_eval={self.num_generations_eval}: {error}. Set num_generations_eval >= "
                    f"tau_min (and to num_generations with explicit weights), or leave it unset."
                ) from None

    def multiscale_kwargs(self, with_scales: bool = True) -> dict[str, Any]:
        """Keyword arguments for `multiscale_advantages` (without the generator)."""
        names = MULTISCALE_DEFAULTS if with_scales else ("tau_min", "weights", "std", "eps")
        return {name: getattr(self, name) for name in names}


class MSGRPOTrainer(GRPOFamilyTrainer):
    """MS-GRPO (*Multi-Scale Group Relative Policy Optimization for Large Language Models*).

    Each completion's advantage is the weighted average, over scales tau = tau_min..G, of its mean z-score
    within every subgroup of size tau that contains it (or within M sampled scales x K diverse subgroups in
    the accelerated mode). Rewards are the globally gathered ones, so every process computes the same advantages;
    the scale and subgroup draws come from a generator seeded afresh for every call from ``(args.seed,
    global_step)`` and TRL's micro-step counter (:meth:`GenerationBatch.generator`): identical on every process,
    independent of evaluation, and reproduced by a resumed run without any state of its own.
    """

    method_name = "ms_grpo"
    summary = "advantage = average of z-scores over every subgroup (of many sizes) of the group; exact, exact-fast for few-valued rewards, or sampled (M scales, K diverse subgroups)"
    reported_result = "AIME24 pass@1 +5.5 points over GRPO (mean over 6 models); math 5-benchmark average +3.5"
    _tag_names = ["trl", "grpo", "grpo_family", "ms_grpo"]
    _name = "MS-GRPO"
    _paper = {
        "title": "Multi-Scale Group Relative Policy Optimization for Large Language Models",
        "id": None,
        "citation": textwrap.dedent("""\
            @misc{msgrpo,
                title        = {{Multi-Scale Group Relative Policy Optimization for Large Language Models}},
                author       = {Anonymous},
                year         = 2025,
                note         = {Under double-blind review},
            }"""),
    }

    def compute_advantages(self, batch: GenerationBatch) -> torch.Tensor:
        """The ``ms_grpo`` estimator of the registry (``algorithms.estimators``) on the gathered rewards; its scale and
        subgroup draws come from ``batch.generator("ms_grpo")`` (docs/methods/ms_grpo.md §3.4, §11.5)."""
        args = self.args
        # G < tau_min (only reachable if the config check was bypassed): the estimator gives zeros (docs/methods/ms_grpo.md §6).
        advantages = self.estimate_advantages("ms_grpo", batch, args.multiscale_kwargs())
        grpo = group_advantages(batch.rewards, scale=self.scale_rewards)
        scales = dict(
            tau_min=args.tau_min,
            num_scales=args.num_scales,
            subgroups_per_scale=args.subgroups_per_scale,
            partition=args.partition,
            weights=args.weights,
        )
        batch.log("subgroups_per_prompt", num_subgroups(batch.rewards.size(1), **scales))
        batch.log("abs_diff_to_grpo", (advantages - grpo).abs().mean().item())
        return advantages
