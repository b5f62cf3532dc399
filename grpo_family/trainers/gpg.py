"""GPG: Group Policy Gradient (Chu et al., ICLR 2026) on TRL's ``GRPOTrainer``.

Plain on-policy REINFORCE with a group-mean baseline: no reference model, no KL, no importance ratio, no clip.
What this trainer adds to the base class (maths in :mod:`grpo_family.algorithms.gpg`; ``docs/methods/gpg.md``):

* advantages ``r - mean_group`` (``scale_rewards`` is GPG's ``F_norm``, ``"none"`` by default), 0 on degenerate
  groups;
* the AGE factor ``alpha = B / (B - M)``, computed once per optimizer step from the rewards of the whole generation
  batch gathered from every process, and applied by a gradient-scale hook on the autograd path of the loss
  (:func:`~grpo_family.algorithms.gpg.scale_grad`): the logged loss is the unscaled policy loss, the gradients
  carry alpha;
* the paper's per-group token normalisation (Eq. 5) as per-row weights ``1 / (P * T_q)`` computed from the
  gathered completion masks at generation time, so the loss of any rank / micro-step split adds up to the
  single-process full-batch loss;
* ``beta_th``: while the informative share ``rho = (B - M) / B = 1 / alpha`` of the batch that would be assembled
  is below the threshold, more prompts are drawn (deterministically, the same on every process) and generated, and
  their informative groups replace degenerate ones, keeping the generation batch size fixed; degenerate groups of
  the last round fill the slots left over (docs/methods/gpg.md §2.6). These are the base class's generation-rounds
  stages (``next_generation_round``, ``assemble_generation_rounds``); the base class merges the rows, writes the
  step's reward metrics once, for the assembled batch, and judges it for runs that cannot learn.
"""

from __future__ import annotations

import logging
import textwrap
from dataclasses import dataclass, field
from typing import Any, ClassVar

import datasets
import torch
from accelerate.utils import gather, pad_across_processes

from ..algorithms.gpg import (
    assemble_rewards,
    degenerate_groups,
    gpg_advantages,
    gpg_alpha,
    gpg_loss,
    informative_fraction,
    loss_row_weights,
    scale_grad,
)
from ..bounds import Bound, Flag, Float, Int, OneOf, Unused
from .base import GRPOFamilyConfig, GRPOFamilyTrainer
from .stages import GenerationBatch, RoundAssembly, stage_generator

logger = logging.getLogger(__name__)

# loss_aggregation -> gpg_loss's normalization.
_AGGREGATIONS = {"group_token_mean": "group", "global_token_mean": "token", "sequence_mean": "sequence"}


@dataclass
class GPGConfig(GRPOFamilyConfig):
    r"""Configuration for :class:`GPGTrainer` (fields below; every ``GRPOConfig`` field works too).

    GPG has no reference model, no KL term and no importance ratio, so ``beta`` must stay ``0.0``,
    ``num_iterations`` must be 1 and ``steps_per_generation`` must equal ``gradient_accumulation_steps`` (one
    on-policy update per generation batch). ``scale_rewards`` is the paper's ``F_norm`` and defaults to ``"none"``.
    ``loss_type``, ``epsilon*`` and ``delta`` of ``GRPOConfig`` are unused: the loss is ``-A * log pi`` aggregated
    by ``loss_aggregation``.
    """

    field_bounds: ClassVar[dict[str, Bound]] = {  # read by grpo_family.bounds.check_bounds
        "use_alpha": Flag(),
        "beta_th": Float(0, 1, min_open=True, optional=True),
        "max_generation_rounds": Int(1),
        "degenerate_tol": Float(0),
        "max_alpha": Float(1, optional=True),
        "loss_aggregation": OneOf(("group_token_mean", "global_token_mean", "sequence_mean")),
    }
    _NO_RATIO = "GPG's loss is -A * log pi (no importance ratio, so nothing to clip);"
    unused_options: ClassVar[dict[str, Unused]] = {  # read by grpo_family.bounds.check_unused
        "loss_type": Unused(f"{_NO_RATIO} its aggregation is --loss_aggregation.", "grpo"),
        "epsilon": Unused(f"{_NO_RATIO} --epsilon clips a ratio.", 0.1),
        "epsilon_high": Unused(f"{_NO_RATIO} --epsilon_high clips a ratio.", 0.3),
        "delta": Unused(f"{_NO_RATIO} --delta bounds a ratio.", 2.0),
        "importance_sampling_level": Unused(f"{_NO_RATIO} --importance_sampling_level shapes a ratio.", "sequence"),
    }

    beta: float = field(
        default=0.0,
        metadata={"help": "KL coefficient. GPG has no KL term and no reference model: must be 0.0 (paper Sec. 2.2)."},
    )
    scale_rewards: str = field(
        default="none",
        metadata={
            "help": "Advantage normaliser F_norm: 'none' (r - group mean; GPG's default and best, Table 1), 'group' "
            "(divide by the group std + 1e-4, GRPO) or 'batch' (batch std, Table 13 ablation)."
        },
    )
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={
            "help": "Correct the vLLM/trainer sampling mismatch with TRL's importance-sampling ratio. Not in the "
            "paper; off by default (TRL's default is True)."
        },
    )
    use_alpha: bool = field(
        default=True,
        metadata={
            "help": "Apply the AGE correction alpha = B / (B - M) to the gradients (paper Eqs. 7-8; on in the "
            "paper's GPG, off in its Table 1 ablations 'alpha = 1')."
        },
    )
    beta_th: float | None = field(
        default=0.6,
        metadata={
            "help": "Minimum informative share rho = (B - M) / B = 1 / alpha per optimizer step (M: rows of "
            "degenerate groups and unscorable rows); below it more prompts are generated and their informative "
            "groups replace degenerate ones, so that alpha <= 1 / beta_th. None disables resampling. "
            "Default 0.6 (the paper's value; 0.8 in Table 10). Needs whole groups on every process: "
            "per_device_train_batch_size * steps_per_generation divisible by num_generations."
        },
    )
    max_generation_rounds: int = field(
        default=20,
        metadata={
            "help": "Most generation rounds per optimizer step when beta_th is set, the first included; when the "
            "threshold is still not met, training goes on with what was collected (authors' code: 20)."
        },
    )
    degenerate_tol: float = field(
        default=0.0,
        metadata={
            "help": "A group is degenerate when max - min of its rewards <= this (0.0: all equal; ~1e-6 suggested "
            "for continuous rewards)."
        },
    )
    max_alpha: float | None = field(
        default=None,
        metadata={"help": "Optional cap on alpha (not in the paper; default None = no cap)."},
    )
    loss_aggregation: str = field(
        default="group_token_mean",
        metadata={
            "help": "'group_token_mean': each group's token sum over its token count, mean over groups (paper "
            "Eq. 5, default); 'global_token_mean': sum over all tokens of the step over their count (TRL's 'dapo' "
            "normaliser); 'sequence_mean': per-completion token mean, mean over completions (authors' multimodal "
            "code). All are exact over processes and gradient-accumulation micro-steps."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.beta != 0.0:
            raise ValueError(
                f"GPG has no KL term and loads no reference model, so beta must be 0.0 (got {self.beta}). Use the "
                "'grpo' method for a KL-regularised objective."
            )
        if self.num_iterations != 1:
            raise ValueError(
                f"GPG makes exactly one on-policy update per generation batch (no importance ratio corrects reused "
                f"samples), so num_iterations must be 1 (got {self.num_iterations})."
            )
        if self.steps_per_generation != self.gradient_accumulation_steps:
            raise ValueError(
                f"GPG needs one generation batch per optimizer step (later steps would be off-policy and GPG has no "
                f"ratio to correct them, and alpha is defined per optimizer step): steps_per_generation "
                f"({self.steps_per_generation}) must equal gradient_accumulation_steps "
                f"({self.gradient_accumulation_steps}). Leave steps_per_generation and generation_batch_size unset."
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "GPG decides degeneracy and advantages on the weighted sum of the rewards: "
                "multi_objective_aggregation must be 'sum_then_normalize'."
            )
        if self.top_entropy_quantile != 1.0 or self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            raise ValueError(
                "GPG's loss is the plain policy gradient: top_entropy_quantile must be 1.0, entropy_coef 0.0 and "
                "use_adaptive_entropy False."
            )
        if self.off_policy_mask_threshold is not None:
            raise ValueError("GPG is on-policy: off_policy_mask_threshold must be None.")
        if self.beta_th is not None:
            local = self.per_device_train_batch_size * self.steps_per_generation
            if local % self.num_generations:
                raise ValueError(
                    f"beta_th resampling swaps whole groups within each process, so every process must hold whole "
                    f"groups: per_device_train_batch_size * steps_per_generation ({local}) must be divisible by "
                    f"num_generations ({self.num_generations}). Change the batch size, or set beta_th=None."
                )


class GPGTrainer(GRPOFamilyTrainer):
    """GPG (Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning", ICLR 2026).

    The loss ``alpha * sum_i w_i * sum_t -A_i * log pi(o_{i,t})`` with ``w_i = 1 / (P * T_q)`` (Eq. 5) and the
    global ``alpha = B / (B - M)`` (Eq. 8); see :class:`GPGConfig` for the options and the module docstring for
    how it is distributed. Logged per optimizer step: ``gpg/alpha``, ``gpg/M`` (rows that carry no gradient),
    ``gpg/frac_degenerate`` (= M / B), ``gpg/all_degenerate`` (1 when M = B), ``gpg/rounds`` (generation rounds,
    1 without resampling) and, with ``beta_th``, ``gpg/informative_share`` (= (B - M) / B) and
    ``gpg/threshold_met``.
    """

    method_name = "gpg"
    summary = "plain policy gradient (no ratio, clip, KL or reference model) scaled by a batch-level factor alpha"
    reported_result = (
        "R1-Distill-Qwen-1.5B, 5 math benchmarks: average 55.7 vs Open-RS1 (GRPO) 53.1; no critic/reference/KL"
    )
    _tag_names = ["trl", "grpo", "grpo_family", "gpg"]
    _name = "GPG"
    _paper = {
        "title": "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
        "id": "2504.02546",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @inproceedings{chu2026gpg,
                title        = {{GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning}},
                author       = {Xiangxiang Chu and Hailang Huang and Xiao Zhang and Fei Wei and Yong Wang},
                booktitle    = {The Fourteenth International Conference on Learning Representations},
                year         = 2026,
                eprint       = {arXiv:2504.02546},
            }"""),
    }

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, GPGConfig):
            raise TypeError(f"GPGTrainer needs a GPGConfig, got {type(self.args).__name__}.")
        streaming = isinstance(self.train_dataset, (datasets.IterableDataset, torch.utils.data.IterableDataset))
        if self.args.beta_th is not None and streaming:
            raise ValueError(
                "beta_th resampling draws extra prompts by index, so the training set must be a map-style dataset "
                "(not an IterableDataset). Set beta_th=None to train on a stream."
            )
        if self.args.beta_th is not None and self._is_vlm:
            raise ValueError(
                "beta_th resampling merges generation rounds row by row, which is not implemented for image inputs. "
                "Set beta_th=None for vision-language models."
            )
        self._gpg_step_rewards: torch.Tensor | None = None

    # ------------------------------------------------------------------ advantages (one generation round)
    def compute_advantages(self, batch: GenerationBatch) -> torch.Tensor:
        return gpg_advantages(batch.rewards, f_norm=self.args.scale_rewards, tol=self.args.degenerate_tol)

    # ------------------------------------------------------------------ generation rounds (beta_th)
    def next_generation_round(self, rounds: list[GenerationBatch]) -> list | None:
        """More prompts while the informative share ``rho = (B - M) / B`` of the batch that would be assembled is
        below ``beta_th`` (docs/methods/gpg.md §2.6). Every process sees the same gathered rewards, hence decides alike
        and runs the same number of rounds, so the generation and reward gathers stay matched across processes. M is
        counted as alpha counts it (unscorable rows included), so that alpha <= 1 / beta_th whenever rho is met."""
        last = rounds[-1]
        beta_th = self.args.beta_th if rounds[0].mode == "train" else None
        if beta_th is None:
            return None
        tol = self.args.degenerate_tol
        _, assembled = assemble_rewards([b.raw_rewards for b in rounds], self.accelerator.num_processes, tol=tol)
        share = informative_fraction(assembled, tol=tol)
        if (
            share < beta_th
            and len(rounds) < self.args.max_generation_rounds
            and degenerate_groups(assembled, tol=tol).any()  # only unscorable rows hold rho down: more rounds
        ):  # could not change the assembled batch
            return self._draw_prompts(len(rounds))
        last.log("informative_share", share)
        last.log("threshold_met", float(share >= beta_th))
        if share < beta_th:
            logger.warning(
                "GPG: informative share %.3f still below beta_th=%.3f after %d generation rounds; training on "
                "what was collected.", share, beta_th, len(rounds),
            )  # fmt: skip
        return None

    def assemble_generation_rounds(self, rounds: list[GenerationBatch]) -> RoundAssembly:
        """Informative groups of every round replace degenerate ones, in the plan of ``algorithms.gpg.assemble_rewards``;
        the base class merges the rows and computes GPG's advantages on the assembled rewards."""
        tol = self.args.degenerate_tol
        plan, assembled = assemble_rewards([b.raw_rewards for b in rounds], self.accelerator.num_processes, tol=tol)
        share = degenerate_groups(assembled, tol=tol).float().mean().item()
        return RoundAssembly(plan, assembled, degenerate_share=share)

    def _draw_prompts(self, round_index: int) -> list[dict[str, Any]]:
        """This process's inputs for an extra generation round, in TRL's ``RepeatSampler`` layout.

        The prompts are drawn from the one seeding helper (:func:`~grpo_family.trainers.stages.stage_generator`)
        keyed by (seed, optimizer step, round): identical on every process and needing no state for resuming from a
        checkpoint; each process takes its slice of the repeated layout.
        """
        num_groups = self.args.generation_batch_size // self.num_generations
        generator = stage_generator("gpg_resample", self.args.seed, self.state.global_step, round_index)
        size = len(self.train_dataset)
        if size >= num_groups:
            prompts = torch.randperm(size, generator=generator)[:num_groups]
        else:
            prompts = torch.randint(size, (num_groups,), generator=generator)
        layout = prompts.repeat_interleave(self.num_generations).tolist()
        local = len(layout) // self.accelerator.num_processes
        start = self.accelerator.process_index * local
        return [self.train_dataset[int(i)] for i in layout[start : start + local]]

    def finish_generation_batch(self, batch: GenerationBatch) -> None:
        """Alpha and per-row loss weights of the batch actually trained on (all from global tensors)."""
        batch.log("rounds", batch.rounds)
        rewards = batch.raw_rewards
        G = rewards.size(1)
        mask = batch.loss_mask
        n_local = mask.size(0)
        start = self.accelerator.process_index * n_local
        device = mask.device
        # One alpha per optimizer step from the rewards of every process (one generation batch == one step).
        alpha = gpg_alpha(rewards, tol=self.args.degenerate_tol, max_alpha=self.args.max_alpha)
        if not self.args.use_alpha:
            alpha = 1.0
        # Groups can straddle processes: T_q (and T_all) come from the gathered loss masks, not the local ones.
        global_mask = gather(pad_across_processes(mask, dim=1))
        normalization = _AGGREGATIONS[self.args.loss_aggregation]
        weights = loss_row_weights(global_mask, G, normalization=normalization)[start : start + n_local]
        # float64: 1 / (P * T_q) kept exact until the loss casts it to the compute dtype (a (n,) vector, cheap).
        batch.set("row_weights", weights.to(device=device, dtype=torch.float64))
        batch.set("alpha", torch.full((n_local,), alpha, device=device, dtype=torch.float64))
        self._gpg_step_rewards = rewards  # the global rewards of the batch trained on (tests, debugging)
        no_grad_rows = degenerate_groups(rewards, tol=self.args.degenerate_tol)[:, None] | torch.isnan(rewards)
        num_dead = int(no_grad_rows.sum())
        batch.log("alpha", alpha)
        batch.log("M", num_dead)
        batch.log("frac_degenerate", num_dead / rewards.numel())
        batch.log("all_degenerate", float(num_dead == rewards.numel()))

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """``W * sum_i w_i * sum_t -A_i * logp_{i,t}`` on this micro-batch, gradients scaled by alpha.

        The row weights span the whole optimizer step over all processes, so summing the micro-steps (TRL does
        not divide by gradient accumulation) and DDP's / DeepSpeed's mean over the ``W`` processes (cancelled by
        the factor ``W``) give exactly the single-process full-batch loss, hence its gradient.
        """
        if return_outputs:
            raise ValueError("The GPGTrainer does not support returning outputs")
        rows = self.micro_batch(inputs)
        mask = rows.loss_mask
        per_token_logps, entropies = self.policy_forward(model, rows)
        # REINFORCE (no ratio, clip or KL) with the global row weights; TRL's vLLM importance-sampling ratio only with
        # vllm_importance_sampling_correction=True.
        loss = gpg_loss(
            per_token_logps,
            rows.advantages,
            mask,
            self.num_generations,
            row_weights=rows.get("row_weights"),
            token_scale=rows.importance_sampling_ratio,
        )
        loss = loss * self.accelerator.num_processes

        local = torch.stack([(entropies * mask).sum(), mask.sum()]).detach().float()
        totals = self.accelerator.reduce(local, reduction="sum")
        self.record_metric("entropy", (totals[0] / totals[1].clamp(min=1.0)).item())
        if rows.mode == "train":
            # The AGE gradient-scale hook. It sits on the autograd path of the loss -- identity forward, times alpha
            # backward -- because everything after it is linear in the incoming gradient and must see alpha * g:
            # DDP's all-reduce, DeepSpeed ZeRO-3's own parameter hooks and reduce-scatter into its partitioned
            # buffers, gradient accumulation, then gradient clipping (HF's clip_grad_norm_, or inside DeepSpeed's
            # engine.step()) and the optimizer step. A hook on parameters would race ZeRO-3's partitioning and come
            # after its reduction; scaling here needs no extra communication because alpha is already global (one
            # value per optimizer step, from every process's rewards). The returned (and logged) loss is unscaled.
            loss = scale_grad(loss, float(rows.get("alpha")[0]))
        return loss
