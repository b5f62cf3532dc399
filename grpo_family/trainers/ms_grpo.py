"""MS-GRPO: multi-scale group-relative advantages (only the advantage estimator changes)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig

from ..algorithms.grpo import group_advantages
from ..algorithms.ms_grpo import multiscale_advantages, num_subgroups, validate_multiscale_options
from .base import GRPOFamilyTrainer


@dataclass
class MSGRPOConfig(GRPOConfig):
    """[`GRPOConfig`] plus the options of MS-GRPO's multi-scale advantage (spec `ms_grpo.md`)."""

    tau_min: int = field(
        default=2,
        metadata={"help": "Smallest subgroup size (scale). Default 2, the paper's value; 2 <= tau_min <= G."},
    )
    weights: str = field(
        default="uniform",
        metadata={
            "help": "Scale weights: 'uniform' (paper default), 'global' (larger scales weigh more), 'local' (smaller "
            "scales weigh more), 'flat' (every subgroup equal: the paper's no-hierarchy ablation), or "
            "G - tau_min + 1 comma-separated non-negative floats for scales tau_min..G."
        },
    )
    std: str = field(
        default="population",
        metadata={"help": "Std inside a subgroup: 'population' (1/tau, the paper's definition, default) or 'sample'."},
    )
    eps: float = field(
        default=1e-6,
        metadata={"help": "Added to each subgroup's std. Default 1e-6 (VeRL's; the paper does not report it)."},
    )
    num_scales: int | None = field(
        default=None,
        metadata={
            "help": "M, scales drawn per step by dilated scale sampling (accelerated mode). None = every scale "
            "(exact). The paper uses 4."
        },
    )
    subgroups_per_scale: int | None = field(
        default=None,
        metadata={
            "help": "K, Jaccard-diverse subgroups per drawn scale (accelerated mode). None = every subgroup "
            "(exact). The paper uses 8."
        },
    )
    partition: str = field(
        default="bottom",
        metadata={
            "help": "How DSS cuts the scale range into M intervals: 'bottom' (default; matches the paper's reported "
            "subgroup counts and always keeps the full group) or 'paper' (the printed formula)."
        },
    )
    selection: str = field(
        default="greedy",
        metadata={"help": "Subgroups per scale: 'greedy' Jaccard-diverse (paper) or 'random' (its ablation)."},
    )

    def __post_init__(self):
        super().__post_init__()
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

    def multiscale_kwargs(self, with_scales: bool = True) -> dict[str, Any]:
        """Keyword arguments for `multiscale_advantages` (without the generator)."""
        kwargs = dict(tau_min=self.tau_min, weights=self.weights, std=self.std, eps=self.eps)
        if with_scales:
            kwargs.update(
                num_scales=self.num_scales,
                subgroups_per_scale=self.subgroups_per_scale,
                partition=self.partition,
                selection=self.selection,
            )
        return kwargs


class MSGRPOTrainer(GRPOFamilyTrainer):
    """MS-GRPO (*Multi-Scale Group Relative Policy Optimization for Large Language Models*).

    Each completion's advantage is the weighted average, over scales tau = tau_min..G, of its mean z-score
    within every subgroup of size tau that contains it (or within M sampled scales x K diverse subgroups in
    the accelerated mode). Rewards are the globally gathered ones, so every process computes the same advantages;
    the scale draws come from one generator seeded with `args.seed`, identical on every process and saved with
    checkpoints.
    """

    method_name = "ms_grpo"
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

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.scale_generator = torch.Generator().manual_seed(self.args.seed)

    def _compute_advantages(self, rewards: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        args = self.args
        group_size = rewards.size(1)
        if group_size < args.tau_min:  # eval with num_generations_eval < tau_min: MS-GRPO is undefined, use GRPO
            return group_advantages(rewards, scale=self.scale_rewards)
        advantages = multiscale_advantages(rewards, generator=self.scale_generator, **args.multiscale_kwargs())
        grpo = group_advantages(rewards, scale=self.scale_rewards)
        scales = dict(num_scales=args.num_scales, subgroups_per_scale=args.subgroups_per_scale)
        self.log_method_metric("subgroups_per_prompt", num_subgroups(group_size, tau_min=args.tau_min, **scales))
        self.log_method_metric("abs_diff_to_grpo", (advantages - grpo).abs().mean().item())
        return advantages

    # The scale generator is part of the training state: saved with every checkpoint, restored on resume.
    def _resume_state(self) -> dict[str, Any]:
        return {**super()._resume_state(), "ms_grpo_generator": self.scale_generator.get_state()}

    def _restore_resume_state(self, state: dict[str, Any]) -> None:
        super()._restore_resume_state(state)
        if "ms_grpo_generator" in state:
            self.scale_generator.set_state(state["ms_grpo_generator"].cpu())
