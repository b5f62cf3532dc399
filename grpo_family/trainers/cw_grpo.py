"""CW-GRPO: covariance-weighted GRPO (Wang et al., 2026; ``docs/methods/cw_grpo.md``).

Per generation batch, every completion token gets a Gaussian-kernel weight of its covariance term
``c = (logp - mean logp) * (A - mean A)`` (``algorithms.cw_grpo.covariance_weights``), and the trainer trains on
the per-token advantage ``A_i * w_it`` inside TRL's clipped surrogate. Rewards, group advantages, ratio, clipping,
KL and loss aggregation are TRL's, unchanged.

Where the pieces come from (docs/methods/cw_grpo.md §3.2):

* the advantages are those of ``cw_base_estimator`` (any registered in ``algorithms.estimators``; GRPO's by
  default, the paper's);
* the weights are computed once per generation batch, in the token-weight stage (``weight_advantages``) before TRL
  shuffles and splits it (or in the loss, below), on the log-probs, masks and advantages of **every** completion gathered from all
  processes (a prompt's G completions can straddle processes), so each group's statistics are the group's; every
  process computes the same weights and keeps its own rows;
* the log-probs are the rollout policy's, from the training model (docs/methods/cw_grpo.md §2.4 step 1): TRL's
  ``old_per_token_logps`` when it computed them, else one extra no-grad forward pass of the policy over the
  generation batch; never the sampler's (vLLM's ``sampling_per_token_logps``) unless ``cw_logps_source="sampler"``
  asks for them. With gradient accumulation and TRL's defaults otherwise (``steps_per_generation =
  gradient_accumulation_steps > 1``, ``num_iterations=1``, no vLLM) that extra forward is what CW-GRPO costs
  (see ``benchmarks/results/cw_grpo.md``);
* except when every loss call sees a whole generation batch (``steps_per_generation = 1`` or evaluation) and TRL
  has no ``old_per_token_logps`` (it then uses the loss's own log-probs as the old ones: the policy has not moved
  since the rollout). The weights are then computed inside the loss, from the log-probs its forward just made,
  gathered across processes and put back in global row order, before TRL reads the advantages: no extra forward.
  TRL's ``_compute_loss`` is not copied; the base class's loss-forward stage (``transform_loss_forward``) receives the
  loss's log-probs, and a loss that did not make its forward before reading the advantages raises instead of
  training unweighted. The weighted advantages are
  written into TRL's buffered batch and its row tags removed, so with ``num_iterations > 1`` the later passes over
  that batch train on the same weighted advantages (docs/methods/cw_grpo.md §6: the weights stay fixed for all passes).
"""

from __future__ import annotations

import logging
import math
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from accelerate.utils import gather, pad_across_processes

from ..algorithms.cw_grpo import covariance_stats, covariance_weights
from ..algorithms.estimators import estimator_names, validate_estimator
from ..bounds import Bound, Flag, Float, Mapping, OneOf
from .base import GRPOFamilyConfig, GRPOFamilyTrainer
from .stages import GenerationBatch, LossCall, estimator_options

logger = logging.getLogger(__name__)

LOGPS_SOURCES = ("policy", "sampler")


@dataclass
class CWGRPOConfig(GRPOFamilyConfig):
    """``GRPOConfig`` plus CW-GRPO's options (docs/methods/cw_grpo.md §4.1). The paper has none: its defaults are these."""

    field_bounds: ClassVar[dict[str, Bound]] = {  # read by grpo_family.bounds.check_bounds
        "cw_scope": OneOf(("group", "batch")),
        "cw_adv_center": OneOf(("token", "sequence")),
        "cw_std_ddof": OneOf((0, 1)),
        "cw_bandwidth_scale": Float(
            0, min_open=True, infinite=True, hint="1.0 = the paper; to train plain GRPO use method 'grpo' (or inf)."
        ),
        "cw_eps": Float(0, min_open=True),
        "cw_normalize": Flag(),
        "cw_logps_source": OneOf(("policy", "sampler")),
        "cw_reuse_loss_logps": Flag(),
        "cw_base_estimator": OneOf(estimator_names),
        "cw_estimator_options": Mapping(optional=True),
    }

    cw_scope: str = field(
        default="group",
        metadata={
            "help": "Set of tokens over which the centring means, the bandwidth sigma and the mean-1 normalisation "
            "are taken: 'group' (default, the paper's N = sum of the G completions' lengths) = every valid token of "
            "one prompt's G completions, gathered across processes; 'batch' = every valid token of the gathered "
            "generation batch."
        },
    )
    cw_adv_center: str = field(
        default="token",
        metadata={
            "help": "How the mean advantage is taken: 'token' (default) = token-weighted mean over the scope's valid "
            "tokens, so the mean of c is Cov(logp, A); 'sequence' = plain mean of the G advantages. The paper says "
            "only 'means over responses'."
        },
    )
    cw_std_ddof: int = field(
        default=0,
        metadata={"help": "ddof of sigma, the std of c: 0 (default, population std) or 1. The paper does not say."},
    )
    cw_bandwidth_scale: float = field(
        default=1.0,
        metadata={
            "help": "kappa > 0: the kernel is exp(-c^2 / 2 (kappa sigma)^2). Not in the paper (1.0 = the paper); "
            "for ablations only; inf gives every token weight 1 (GRPO, the kappa -> inf limit)."
        },
    )
    cw_eps: float = field(
        default=1e-8,
        metadata={"help": "A scope whose sigma is <= cw_eps (> 0) gets weight 1 on every token (GRPO). Default 1e-8."},
    )
    cw_normalize: bool = field(
        default=True,
        metadata={
            "help": "Rescale the weights to mean 1 per scope (default True, the paper). False trains on the raw "
            "kernel values in (0, 1] (an ablation, not in the paper)."
        },
    )
    cw_logps_source: str = field(
        default="policy",
        metadata={
            "help": "Rollout log-probs the weights use. 'policy' (default, the docs/methods/cw_grpo.md §2.4 step 1): the training "
            "model's temperature-scaled log-probs of the rollout policy, the ones TRL's ratio uses: TRL's "
            "old_per_token_logps if it computed them, else the loss's own forward (see cw_reuse_loss_logps) or one "
            "extra no-grad forward. 'sampler' (opt-in, deviates from docs/methods/cw_grpo.md §2.4): vLLM's sampling log-probs when TRL "
            "has no old_per_token_logps, which saves the extra forward but weights with the inference engine's "
            "numbers, which may differ from the policy's (kernels, precision, and raw rather than "
            "temperature-scaled log-probs depending on the vLLM logprobs mode); non-finite ones fall back to "
            "'policy'."
        },
    )

    cw_reuse_loss_logps: bool = field(
        default=True,
        metadata={
            "help": "When TRL computes no old_per_token_logps and each loss call sees a whole generation batch "
            "(steps_per_generation = 1, or evaluation), take the rollout log-probs from the loss's own forward "
            "(equal in value: the policy has not changed since the rollout) instead of an extra no-grad forward. "
            "Default True; False always makes the extra forward. Same weights either way."
        },
    )

    cw_base_estimator: str = field(
        default="grpo",
        metadata={
            "help": "Advantage estimator whose per-rollout advantages the covariance weights reweight, by its name in "
            "grpo_family.algorithms.estimators: 'grpo' (default, the paper; TRL's group normalisation, scale_rewards "
            "applies), 'ms_grpo' (multi-scale advantages) or 'gpg'. Its options go in cw_estimator_options."
        },
    )
    cw_estimator_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Options of cw_base_estimator, as a mapping (a JSON object on the command line), named as the "
            'estimator\'s method names them: e.g. {"num_scales": 4, "subgroups_per_scale": 8} for \'ms_grpo\'. '
            "Default None: the estimator's defaults."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self.cw_estimator_options = estimator_options(self.cw_estimator_options, "cw_estimator_options")
        validate_estimator(self.cw_base_estimator, self.num_generations, self.cw_estimator_options)
        if self.importance_sampling_level != "token":
            warnings.warn(
                "CW-GRPO weights tokens; with importance_sampling_level='sequence' the ratio is per sequence while "
                "the weighted advantages stay per token (the paper is token-level).",
                UserWarning,
                stacklevel=2,
            )


class CWGRPOTrainer(GRPOFamilyTrainer):
    """CW-GRPO: "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting"
    (Cheng Wang, Qin Liu, Wenxuan Zhou, Muhao Chen; arXiv 2605.11538).

    GRPO whose token advantages are ``A_i * w_it``, with ``w_it = exp(-c_it^2 / 2 sigma^2)`` rescaled to mean 1 per
    prompt group, ``c_it`` the token's covariance term between its rollout log-prob and its advantage and ``sigma``
    the std of the group's ``c`` (docs/methods/cw_grpo.md §2.4). Extreme-covariance tokens are damped; the paper reports steadier
    policy entropy and better pass@1 than GRPO. Metrics: ``cw_grpo/weight_min``, ``weight_max``, ``weight_std``,
    ``frac_weight_lt_0.5`` (over the valid tokens of the gathered batch), ``sigma_mean``, ``cov_mean``,
    ``degenerate_frac`` (share of scopes trained as GRPO) and ``extra_forward`` (1 when the rollout log-probs
    needed an extra forward pass).
    """

    method_name = "cw_grpo"
    summary = "a Gaussian kernel down-weights tokens whose log-prob/advantage covariance is extreme"
    reported_result = "R1-Distill-Qwen-1.5B, 5 math benchmarks: average 55.3 vs GRPO 52.6; steadier entropy (Figure 1)"
    _tag_names = ["trl", "grpo", "grpo_family", "cw_grpo"]
    _name = "CW-GRPO"
    _paper = {
        "title": "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting",
        "id": "2605.11538",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{wang2026taming,
                title        = {{Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting}},
                author       = {Cheng Wang and Qin Liu and Wenxuan Zhou and Muhao Chen},
                year         = 2026,
                eprint       = {arXiv:2605.11538},
            }"""),
    }

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._warned_sampler_logps = False

    @property
    def cw_kwargs(self) -> dict[str, Any]:
        a = self.args
        return dict(
            scope=a.cw_scope,
            adv_center=a.cw_adv_center,
            std_ddof=a.cw_std_ddof,
            bandwidth_scale=a.cw_bandwidth_scale,
            eps=a.cw_eps,
        )

    @property
    def loss_forward_fix(self) -> str:
        if self.args.cw_reuse_loss_logps:
            return "Set cw_reuse_loss_logps=False (one extra forward pass)."
        return GRPOFamilyTrainer.loss_forward_fix

    # ------------------------------------------------------------------ rollout log-probs
    @torch.no_grad()
    def _rollout_logps(self, batch: GenerationBatch) -> tuple[torch.Tensor, bool]:
        """This process's (B, T) rollout log-probs of the sampled tokens, and whether an extra forward made them.

        The choice depends only on the config (TRL computes ``old_per_token_logps`` or not for every process
        alike), except for non-finite sampler log-probs, which are checked across processes.
        """
        old = batch.old_logps
        if old is not None:
            return old.detach(), False
        sampler = batch.sampling_logps
        if sampler is not None and self.args.cw_logps_source == "sampler":
            valid = batch.loss_mask.bool()
            bad = (~torch.isfinite(sampler) & valid).any().to(torch.float32).reshape(1)
            if not bool(gather(bad).any()):  # vLLM may return NaN for tokens it could not score
                if not self._warned_sampler_logps:
                    logger.warning(
                        "CW-GRPO weights use the sampler's (vLLM) log-probs, not the training model's "
                        "(cw_logps_source='sampler', not the documented default); the default 'policy' uses the policy's."
                    )
                    self._warned_sampler_logps = True
                return sampler.detach(), False
        # One extra no-grad forward pass; the same helper as TRL's, so the same temperature scaling.
        size = self.args.per_device_train_batch_size if batch.mode == "train" else self.args.per_device_eval_batch_size
        logps, _ = self.policy_logps(batch, batch_size=size)
        return logps.detach(), True

    def _covariance_weights(self, logps, advantages, mask, num_generations) -> torch.Tensor:
        """The weights of the gathered batch (a method of its own so that tests can observe its inputs)."""
        return covariance_weights(
            logps, advantages, mask, num_generations, normalize=self.args.cw_normalize, **self.cw_kwargs
        )

    def _defers_to_loss(self, batch: GenerationBatch) -> bool:
        """Whether the loss's own forward provides the rollout log-probs (same decision on every process)."""
        if not self.args.cw_reuse_loss_logps or batch.old_logps is not None:
            return False
        if batch.sampling_logps is not None and self.args.cw_logps_source == "sampler":
            return False
        return batch.mode == "eval" or self.args.steps_per_generation == 1

    def compute_advantages(self, batch: GenerationBatch) -> torch.Tensor:
        return self.estimate_advantages(self.args.cw_base_estimator, batch, self.args.cw_estimator_options)

    # ------------------------------------------------------------------ token-weight stage
    def weight_advantages(self, batch: GenerationBatch) -> torch.Tensor:
        """GRPO advantages times the CW weights: (P * G, T) per-token advantages on the gathered batch (or the (P * G,)
        GRPO advantages that the loss's own forward weights, see :meth:`transform_loss_forward`)."""
        rewards, flat = batch.raw_rewards, batch.advantages.float()
        num_generations = batch.num_generations
        if not flat.any():
            # Every group is degenerate (or unscorable): A * w = 0 whatever w is, so skip the log-probs. The
            # advantages are global, so every process skips alike (a forward under ZeRO-3 is collective).
            self._log_degenerate_batch(batch.log)
            return batch.advantages
        # Unscorable completions (NaN reward) are trained with advantage 0; keep them out of the statistics.
        scored = ~torch.isnan(rewards).reshape(-1)
        if self._defers_to_loss(batch):
            # Weights come in the loss: tag every row with its global index (TRL shuffles the rows).
            n = batch.num_local_rows
            device = batch.completion_mask.device
            rows = torch.arange(n, device=device) + self.accelerator.process_index * n
            batch.set("row", rows)
            batch.set("scored", scored.to(device)[rows])
            return batch.advantages
        logps, extra_forward = self._rollout_logps(batch)
        mask = batch.loss_mask
        # Pad every process's tensors to the widest completion, then gather: rows in TRL's global order.
        logps = gather(pad_across_processes(logps.float().contiguous(), dim=1, pad_index=0)).to(rewards.device)
        mask = gather(pad_across_processes(mask.contiguous(), dim=1, pad_index=0)).to(rewards.device)
        mask = mask.bool() & scored[:, None]
        weights = self._covariance_weights(logps, flat, mask, num_generations)
        self._log_weights(batch.log, logps, flat, mask, weights, num_generations, extra_forward)
        return flat[:, None] * weights

    # ------------------------------------------------------------------ weights from the loss's log-probs
    def transform_loss_forward(self, call: LossCall) -> None:
        if "row" in call:  # the loss's policy forward: weight the advantages before TRL reads them
            weighted = self._weigh_in_loss(call, call.logps.detach())
            call.advantages = weighted
            # With num_iterations > 1 the next passes get the buffered micro-batch again: store the weighted
            # advantages there and drop the row tags, so that they train on them as they are (weights computed once
            # per generation batch, docs/methods/cw_grpo.md §2.6/§6) instead of weighting them again.
            call.buffered.advantages = weighted
            call.buffered.pop("row")
            call.buffered.pop("scored")

    @torch.no_grad()
    def _weigh_in_loss(self, call: LossCall, logps: torch.Tensor) -> torch.Tensor:
        """(B, T) per-token advantages of this process's (shuffled) rows, from the whole gathered batch."""
        rows, advantages = call.get("row"), call.advantages.float()
        mask = call.loss_mask.bool() & call.get("scored")[:, None]
        all_rows = gather(rows)
        order = torch.argsort(all_rows)
        if not torch.equal(all_rows[order], torch.arange(all_rows.numel(), device=all_rows.device)):
            raise RuntimeError(
                "CW-GRPO: the loss does not see the whole generation batch; set cw_reuse_loss_logps=False."
            )
        all_logps = gather(pad_across_processes(logps.float().contiguous(), dim=1, pad_index=0))[order]
        all_mask = gather(pad_across_processes(mask.contiguous(), dim=1, pad_index=0))[order].bool()
        all_advantages = gather(advantages)[order]
        num_generations = call.num_generations
        weights = self._covariance_weights(all_logps, all_advantages, all_mask, num_generations)
        self._log_weights(call.log, all_logps, all_advantages, all_mask, weights, num_generations, False)
        return (all_advantages[:, None] * weights)[rows, : logps.size(1)].to(call.advantages.dtype)

    @staticmethod
    def _log_degenerate_batch(log) -> None:
        for name, value in (
            ("weight_min", 1.0),
            ("weight_max", 1.0),
            ("weight_std", 0.0),
            ("frac_weight_lt_0.5", 0.0),
        ):
            log(name, value)
        log("degenerate_frac", 1.0)
        log("extra_forward", 0.0)

    @torch.no_grad()
    def _log_weights(self, log, logps, advantages, mask, weights, num_generations, extra_forward: bool) -> None:
        valid = weights[mask]
        stats = covariance_stats(logps, advantages, mask, num_generations, **self.cw_kwargs)
        if valid.numel():
            log("weight_min", valid.min().item())
            log("weight_max", valid.max().item())
            log("weight_std", valid.std(correction=0).item())
            log("frac_weight_lt_0.5", (valid < 0.5).float().mean().item())
        live = ~stats.degenerate & (stats.num_tokens > 0)
        if live.any():
            if math.isfinite(self.args.cw_bandwidth_scale):  # kappa = inf: the bandwidth is inf, not a metric
                log("sigma_mean", stats.sigma[live].mean().item())
            log("cov_mean", stats.covariance[live].mean().item())
        nonempty = stats.num_tokens > 0
        if nonempty.any():
            log("degenerate_frac", stats.degenerate[nonempty].double().mean().item())
        log("extra_forward", float(extra_forward))


__all__ = ["CWGRPOConfig", "CWGRPOTrainer"]
