"""CW-GRPO: covariance-weighted GRPO (Wang et al., 2026; spec ``specs/cw_grpo.md``).

Per generation batch, every completion token gets a Gaussian-kernel weight of its covariance term
``c = (logp - mean logp) * (A - mean A)`` (``algorithms.cw_grpo.covariance_weights``), and the trainer trains on
the per-token advantage ``A_i * w_it`` inside TRL's clipped surrogate. Rewards, group advantages, ratio, clipping,
KL and loss aggregation are TRL's, unchanged.

Where the pieces come from (spec §3.2):

* the weights are computed in the advantage hook, once per generation batch, before TRL shuffles and splits it,
  on the log-probs, masks and advantages of **every** completion gathered from all processes (a prompt's G
  completions can straddle processes), so each group's statistics are the group's; every process computes the
  same weights and keeps its own rows;
* the log-probs are the rollout policy's: TRL's ``old_per_token_logps`` when it computed them, else the sampler's
  (vLLM's ``sampling_per_token_logps``, with ``cw_logps_source="auto"``), else one extra no-grad forward pass of
  the policy over the generation batch. With TRL's defaults (``num_iterations=1``, ``steps_per_generation =
  gradient_accumulation_steps``, no vLLM) that extra forward is what CW-GRPO costs (see
  ``benchmarks/results/cw_grpo.md``).
"""

from __future__ import annotations

import logging
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather, pad_across_processes
from trl import GRPOConfig
from trl.models.utils import disable_gradient_checkpointing

from ..algorithms.cw_grpo import ADV_CENTERS, SCOPES, covariance_stats, covariance_weights
from .base import GRPOFamilyTrainer

logger = logging.getLogger(__name__)

LOGPS_SOURCES = ("auto", "policy")

# Multimodal inputs TRL's generation batch may carry; the extra forward passes them like TRL's own forwards do.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


@dataclass
class CWGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus CW-GRPO's options (spec §4.1). The paper has none: its defaults are these."""

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
            "for ablations only; kappa -> inf recovers GRPO."
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
        default="auto",
        metadata={
            "help": "Rollout log-probs the weights use: 'auto' (default) = TRL's old_per_token_logps if it computed "
            "them, else vLLM's sampling log-probs if present (the sampler's, not the training model's), else one "
            "extra no-grad forward of the policy; 'policy' = never the sampler's (the spec's choice, §2.4 step 1): "
            "old_per_token_logps or the extra forward."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.cw_scope not in SCOPES:
            raise ValueError(f"cw_scope must be one of {SCOPES} (default 'group'), got {self.cw_scope!r}.")
        if self.cw_adv_center not in ADV_CENTERS:
            raise ValueError(
                f"cw_adv_center must be one of {ADV_CENTERS} (default 'token'), got {self.cw_adv_center!r}."
            )
        if self.cw_std_ddof not in (0, 1):
            raise ValueError(f"cw_std_ddof must be 0 (population std, default) or 1, got {self.cw_std_ddof!r}.")
        if not self.cw_bandwidth_scale > 0:
            raise ValueError(
                f"cw_bandwidth_scale must be > 0 (1.0 = the paper), got {self.cw_bandwidth_scale!r}; to train plain "
                "GRPO use method 'grpo'."
            )
        if not self.cw_eps > 0:
            raise ValueError(f"cw_eps must be > 0 (default 1e-8), got {self.cw_eps!r}.")
        if self.cw_logps_source not in LOGPS_SOURCES:
            raise ValueError(
                f"cw_logps_source must be one of {LOGPS_SOURCES} (default 'auto'), got {self.cw_logps_source!r}."
            )
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
    the std of the group's ``c`` (spec §2.4). Extreme-covariance tokens are damped; the paper reports steadier
    policy entropy and better pass@1 than GRPO. Metrics: ``cw_grpo/weight_min``, ``weight_max``, ``weight_std``,
    ``frac_weight_lt_0.5`` (over the valid tokens of the gathered batch), ``sigma_mean``, ``cov_mean``,
    ``degenerate_frac`` (share of scopes trained as GRPO) and ``extra_forward`` (1 when the rollout log-probs
    needed an extra forward pass).
    """

    method_name = "cw_grpo"
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

    # ------------------------------------------------------------------ rollout log-probs
    @torch.no_grad()
    def _rollout_logps(self, batch: dict[str, Any]) -> tuple[torch.Tensor, bool]:
        """This process's (B, T) rollout log-probs of the sampled tokens, and whether an extra forward made them.

        The choice depends only on the config (TRL computes ``old_per_token_logps`` or not for every process
        alike), except for non-finite sampler log-probs, which are checked across processes.
        """
        old = batch.get("old_per_token_logps")
        if old is not None:
            return old.detach(), False
        sampler = batch.get("sampling_per_token_logps")
        if sampler is not None and self.args.cw_logps_source == "auto":
            valid = self._loss_mask(batch).bool()
            bad = (~torch.isfinite(sampler) & valid).any().to(torch.float32).reshape(1)
            if not bool(gather(bad).any()):  # vLLM may return NaN for tokens it could not score
                if not self._warned_sampler_logps:
                    logger.warning(
                        "CW-GRPO weights use the sampler's (vLLM) log-probs, not the training model's; set "
                        "cw_logps_source='policy' to use the policy's (one extra forward pass per generation batch)."
                    )
                    self._warned_sampler_logps = True
                return sampler.detach(), False
        # One extra no-grad forward pass; the same helper as TRL's, so the same temperature scaling.
        prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        mode = batch["mode"]
        size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                completion_ids.size(1),
                batch_size=size,
                **{k: batch.get(k) for k in _FORWARD_KEYS},
            )
        return logps.detach(), True

    @staticmethod
    def _loss_mask(batch: dict[str, Any]) -> torch.Tensor:
        """The mask TRL's loss uses: completion_mask x tool_mask (spec A15)."""
        mask = batch["completion_mask"]
        return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]

    def _covariance_weights(self, logps, advantages, mask, num_generations) -> torch.Tensor:
        """The weights of the gathered batch (a method of its own so that tests can observe its inputs)."""
        return covariance_weights(
            logps, advantages, mask, num_generations, normalize=self.args.cw_normalize, **self.cw_kwargs
        )

    # ------------------------------------------------------------------ advantage hook
    def _compute_advantages(self, rewards: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """GRPO advantages times the CW weights: (P, G, T) per-token advantages on the gathered batch."""
        advantages = super()._compute_advantages(rewards, batch)  # (P, G), TRL's GRPO maths
        num_prompts, num_generations = rewards.shape
        flat = torch.nan_to_num(advantages, nan=0.0).reshape(-1).float()
        if not flat.any():
            # Every group is degenerate (or unscorable): A * w = 0 whatever w is, so skip the log-probs. The
            # advantages are global, so every process skips alike (a forward under ZeRO-3 is collective).
            self._log_degenerate_batch()
            return advantages
        logps, extra_forward = self._rollout_logps(batch)
        mask = self._loss_mask(batch)
        # Pad every process's tensors to the widest completion, then gather: rows in TRL's global order.
        logps = gather(pad_across_processes(logps.float().contiguous(), dim=1, pad_index=0))
        mask = gather(pad_across_processes(mask.contiguous(), dim=1, pad_index=0)).to(rewards.device)
        logps = logps.to(rewards.device)
        # Unscorable completions (NaN reward) are trained with advantage 0; keep them out of the statistics.
        mask = mask.bool() & ~torch.isnan(rewards).reshape(-1, 1)
        weights = self._covariance_weights(logps, flat, mask, num_generations)
        self._log_weights(logps, flat, mask, weights, num_generations, extra_forward)
        return (flat[:, None] * weights).reshape(num_prompts, num_generations, logps.size(1))

    def _log_degenerate_batch(self) -> None:
        for name, value in (
            ("weight_min", 1.0),
            ("weight_max", 1.0),
            ("weight_std", 0.0),
            ("frac_weight_lt_0.5", 0.0),
        ):
            self.log_method_metric(name, value)
        self.log_method_metric("degenerate_frac", 1.0)
        self.log_method_metric("extra_forward", 0.0)

    @torch.no_grad()
    def _log_weights(self, logps, advantages, mask, weights, num_generations, extra_forward: bool) -> None:
        valid = weights[mask]
        stats = covariance_stats(logps, advantages, mask, num_generations, **self.cw_kwargs)
        if valid.numel():
            self.log_method_metric("weight_min", valid.min().item())
            self.log_method_metric("weight_max", valid.max().item())
            self.log_method_metric("weight_std", valid.std(correction=0).item())
            self.log_method_metric("frac_weight_lt_0.5", (valid < 0.5).float().mean().item())
        live = ~stats.degenerate & (stats.num_tokens > 0)
        if live.any():
            self.log_method_metric("sigma_mean", stats.sigma[live].mean().item())
            self.log_method_metric("cov_mean", stats.covariance[live].mean().item())
        nonempty = stats.num_tokens > 0
        if nonempty.any():
            self.log_method_metric("degenerate_frac", stats.degenerate[nonempty].double().mean().item())
        self.log_method_metric("extra_forward", float(extra_forward))


__all__ = ["CWGRPOConfig", "CWGRPOTrainer"]
