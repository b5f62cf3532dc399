"""D3S: dynamic dual-level down-sampling on top of GRPO (``docs/methods/d3s.md``).

A filter between the advantages and the policy loss; the maths is ``algorithms.d3s``. It uses the base class's
stages (``trainers/stages.py``) and overrides none of TRL's helpers. Where each piece happens:

* **advantages** (``compute_advantages``): the base estimator's (``d3s_base_estimator``: any registered in
  ``algorithms.estimators``, e.g. ``grpo``, ``ms_grpo``, ``gpg``), on the full groups of the gathered batch. They are
  never recomputed.
* **sample level** (``select_rows``): the max-variance subset is chosen on the *gathered* advantages
  (``select_rollouts``: pooled over the batch by default, per group as an option), identically on every process.
  Because D3S selects rows, the base class scores its batches right after generation, *before* TRL's no-grad
  forwards: the old log-probs (vLLM importance-sampling correction, ``num_iterations > 1``, ``steps_per_generation >
  gradient_accumulation_steps``) and the reference log-probs (``beta > 0``) are computed for the kept rollouts only;
  dropped rollouts never reach any forward. The base class then keeps each process's own selected rows
  (``_keep_rows``): processes may keep different numbers of rows, but TRL's collectives need equal local batches
  split into ``steps_per_generation`` equal chunks, so every process is padded to the same row count (a multiple of
  ``steps_per_generation``) with inert rows: a copy of a local row whose completion mask is zeroed, which receives
  no gradient and enters no count or metric. Completion columns that only held padding of dropped rows are trimmed.
* **token level** (``transform_loss_forward``, the forward of TRL's loss): the keep mask is the top
  ``ceil(K n)`` valid tokens by ``|A| * H``, ties to the earlier (global rollout index, position) (the index is
  carried through TRL's row shuffle as the per-row value ``rollout_index``). Scopes: ``"batch"`` (default, docs/methods/d3s.md §11 #5) = one
  ranking over the kept rollouts of the whole generation batch on all processes with the sampling policy's
  entropies: with one micro-step per generation batch those of the first loss forward (no extra pass; the mask is
  kept for the next ``num_iterations``), else those of one no-grad forward over the kept rows when the batch is
  split (``_batch_token_keep``); ``"micro"`` = every row of one loss call on all processes, entropies of that
  forward; ``"sequence"`` = per rollout. Unkept tokens get no gradient from any term of TRL's loss (surrogate, KL,
  entropy bonus): the returned log-probs keep their values but carry the gradient ``w * d logp`` with ``w = 0`` off
  the mask, and ``w`` = the normalisation's per-token weight on it. With ``importance_sampling_level="token"`` every
  term of TRL's loss is a per-token function of these log-probs (the bias-corrected KL is ``KL_t * w_t``), so the
  gradient is exactly the one of ``sum w * l / D``. With ``"sequence"`` the surrogate's gradient is the
  GSPO-token one of docs/methods/d3s.md §2.6, but TRL's bias-corrected KL (``KL_t * s_i``, ``use_bias_correction_kl``, TRL's default) would
  carry unkept tokens' KL into the kept tokens through ``s_i``; the config therefore requires
  ``use_bias_correction_kl=False`` there when ``beta != 0`` (the KL is then per-token and masked).
* **normalisation** (``transform_loss_forward``): TRL's token-sum losses (``loss_type`` dapo/cispo/vespo) divide by
  ``num_items_in_batch``; D3S replaces it, per loss call, by the denominator of ``d3s_loss_normalization`` over the
  optimizer step the call belongs to (default: the kept tokens of all its micro-steps on all processes, docs/methods/d3s.md §2.6),
  rescaled for TRL's ``accumulation / steps_per_generation`` factor, so micro-batching, padding rows and
  ``steps_per_generation != gradient_accumulation_steps`` do not change the gradient. The counts are made once per
  generation batch (``prepare_micro_batches``); an optimizer step must not span two generation batches
  (``steps_per_generation x num_iterations`` a multiple of ``gradient_accumulation_steps``, checked in the config).
  The logged loss is the D3S loss for the normalisations whose weight is 1 on kept tokens
  (token_mean_kept, literal_eq10, mask_only_token) with token-level ratios, plus ``beta`` x the KL of unkept tokens
  (a value without gradient, so that TRL's ``kl`` metric stays the policy's KL over all tokens); for the
  per-rollout normalisations it is the kept-token mean (their gradient is still exact).
* **truncated completions** (``mask_truncated_completions``): they count in the group statistics but take no
  selection slot (docs/methods/d3s.md §6).
* **schedule**: ``algorithms.d3s.schedule`` of ``state.global_step / state.max_steps`` when the batch is generated;
  a pure function of the trainer state, so a checkpoint resume restores it with ``global_step``.

Not covered: multimodal batches (image tensors are not row-indexable here) raise ``NotImplementedError`` (their
old/reference log-probs are computed over every rollout before that).
"""

from __future__ import annotations

import logging
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..algorithms.d3s import (
    chunk_count_table,
    default_samples_start,
    normalization_weights,
    planned_kept_tokens,
    schedule,
    select_rollouts,
    step_counts,
    token_keep_mask,
    token_keep_mask_in_rollout_order,
    token_keep_mask_over_parts,
)
from ..algorithms.estimators import estimator_names, validate_estimator
from ..algorithms.losses import TOKEN_SUM_LOSS_TYPES  # "token sum / num_items_in_batch": the denominator D3S controls
from ..bounds import Bound, Flag, Float, Int, Mapping, OneOf
from .base import GRPOFamilyConfig, GRPOFamilyTrainer
from .stages import GenerationBatch, LossCall, MicroBatch, estimator_options, gather_padded

logger = logging.getLogger(__name__)

SAMPLE_SCOPES = ("pooled", "group")
TOKEN_SCOPES = ("batch", "micro", "sequence")


@dataclass
class D3SConfig(GRPOFamilyConfig):
    """``GRPOConfig`` plus D3S's options (docs/methods/d3s.md §4.1). ``loss_type`` must be a token-sum one (default "dapo")."""

    field_bounds: ClassVar[dict[str, Bound]] = {  # read by grpo_family.bounds.check_bounds
        "d3s_samples_start": Int(2, optional=True),
        "d3s_samples_end": Int(2, optional=True),
        "d3s_token_ratio_start": Float(0, 1, min_open=True),
        "d3s_token_ratio_end": Float(0, 1, min_open=True),
        "d3s_sample_scope": OneOf(("pooled", "group")),
        "d3s_drop_degenerate_groups": Flag(),
        "d3s_token_scope": OneOf(("batch", "micro", "sequence")),
        "d3s_loss_normalization": OneOf(
            (
                "token_mean_kept",
                "literal_eq10",
                "seq_mean_kept",
                "seq_mean_kept_all",
                "mask_only_seq",
                "mask_only_token",
            )
        ),
        "d3s_base_estimator": OneOf(estimator_names),
        "d3s_estimator_options": Mapping(optional=True),
    }

    d3s_samples_start: int | None = field(
        default=None,
        metadata={
            "help": "N_init: rollouts kept per prompt at the start of training (p = 0); an average per prompt with "
            "pooled selection. None (default) = num_generations / 4 rounded (the paper: 8 of G = 32). At least 2, at "
            "most num_generations."
        },
    )
    d3s_samples_end: int | None = field(
        default=None,
        metadata={
            "help": "N_final: rollouts kept per prompt at the end of training (p = 1). None (default) = "
            "num_generations, i.e. no sample-level down-sampling at the end (the paper: 32 of 32)."
        },
    )
    d3s_token_ratio_start: float = field(
        default=0.05,
        metadata={
            "help": "K_init: share of tokens of the kept rollouts that get gradient at p = 0, in (0, 1]. "
            "Default 0.05 (the paper)."
        },
    )
    d3s_token_ratio_end: float = field(
        default=0.20,
        metadata={"help": "K_final: the same share at p = 1, in (0, 1]. Default 0.20 (the paper)."},
    )
    d3s_sample_scope: str = field(
        default="pooled",
        metadata={
            "help": "'pooled' (default, the paper's cross-group D3S): one max-variance subset of num_prompts * N_s "
            "rollouts over the whole generation batch (all processes), so a prompt keeps 0..G rollouts; 'group' "
            "(the paper's D3S-I): N_s rollouts inside each group, which the paper found better on models not aligned "
            "to math."
        },
    )
    d3s_drop_degenerate_groups: bool = field(
        default=False,
        metadata={
            "help": "'group' scope only: groups whose advantages are all equal keep no rollout. Default False "
            "(the paper keeps them)."
        },
    )
    d3s_token_scope: str = field(
        default="batch",
        metadata={
            "help": "Ranking scope of the token filter: 'batch' (default, docs/methods/d3s.md §11 #5) = one ranking over every valid "
            "token of the kept rollouts of the whole generation batch (all processes), with the sampling policy's "
            "entropies, reused for every update on the batch (from the first loss forward when the batch is one "
            "micro-step, else from one extra no-grad forward over the kept rows); 'micro' = every valid token of "
            "the rollouts in one loss call, over all processes, with that forward's entropies (no extra pass; equal "
            "to 'batch' when steps_per_generation = num_iterations = 1); 'sequence' = a separate top-K inside each "
            "rollout (entropies of the loss forward)."
        },
    )
    d3s_loss_normalization: str = field(
        default="token_mean_kept",
        metadata={
            "help": "'token_mean_kept' (default): sum over kept tokens / number of kept tokens of the generation "
            "batch; 'literal_eq10': additionally / number of kept rollouts (paper Eq. 10); 'seq_mean_kept': mean over "
            "each rollout's kept tokens, then over rollouts with a kept token (counted per loss call with "
            "d3s_token_scope='micro'); 'seq_mean_kept_all': the same, rollouts without one count as 0; "
            "'mask_only_seq': GRPO denominators (each rollout's length, then the number of rollouts); "
            "'mask_only_token': / all valid tokens of the kept rollouts."
        },
    )
    d3s_base_estimator: str = field(
        default="grpo",
        metadata={
            "help": "Advantage estimator D3S filters, by its name in grpo_family.algorithms.estimators: 'grpo' "
            "(default; TRL's group normalisation, scale_rewards applies), 'ms_grpo' (multi-scale advantages) or "
            "'gpg' (group-mean baseline, f_norm 'none' unless set). Its options go in d3s_estimator_options."
        },
    )
    d3s_estimator_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Options of d3s_base_estimator, as a mapping (a JSON object on the command line), named as the "
            'estimator\'s method names them: e.g. {"num_scales": 4, "subgroups_per_scale": 8} for \'ms_grpo\' (its '
            'MSGRPOConfig fields), {"f_norm": "group", "tol": 1e-6} for \'gpg\', {"scale": "batch"} for \'grpo\'. '
            "Default None: the estimator's defaults."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        G = self.num_generations
        # Single values are checked by grpo_family.bounds (GRPOFamilyConfig.__post_init__); here, across fields.
        for name in ("d3s_samples_start", "d3s_samples_end"):
            value = getattr(self, name)
            if value is not None and value > G:
                raise ValueError(
                    f"{name} must be None (default) or an integer in [2, num_generations={G}], got {value!r}; a "
                    "single kept rollout has zero advantage variance (docs/methods/d3s.md §6)."
                )
        if self.d3s_drop_degenerate_groups and self.d3s_sample_scope != "group":
            raise ValueError(
                "d3s_drop_degenerate_groups needs d3s_sample_scope='group' (pooled selection already "
                "leaves zero-advantage groups out)."
            )
        if self.loss_type not in TOKEN_SUM_LOSS_TYPES:
            raise ValueError(
                f"D3S normalises the loss itself (d3s_loss_normalization), through TRL's token-sum losses; loss_type "
                f"must be one of {TOKEN_SUM_LOSS_TYPES} (default 'dapo', the clipped surrogate), got "
                f"{self.loss_type!r}. For GRPO's per-sequence denominators use "
                "d3s_loss_normalization='mask_only_seq'."
            )
        if self.top_entropy_quantile != 1.0:
            raise ValueError(
                "top_entropy_quantile must be 1.0 with D3S: its token filter (|A| x entropy, d3s_token_ratio_*) "
                "replaces TRL's entropy mask, and both together would mask tokens twice."
            )
        if self.importance_sampling_level == "sequence" and self.beta != 0.0 and self.use_bias_correction_kl:
            raise ValueError(
                "importance_sampling_level='sequence' with beta != 0 needs use_bias_correction_kl=False with D3S: "
                "TRL multiplies each token's KL by the sequence ratio s_i, whose gradient reaches every token of the "
                "rollout, so the KL of unkept tokens would train the kept ones (docs/methods/d3s.md §2.4, Eq. 10 masks the KL). "
                "Set use_bias_correction_kl=False, or importance_sampling_level='token', or beta=0."
            )
        if (self.steps_per_generation * self.num_iterations) % self.gradient_accumulation_steps != 0:
            raise ValueError(
                f"D3S divides each optimizer step's loss by the kept tokens of that step (docs/methods/d3s.md §2.6), which must all "
                f"come from one generation batch: steps_per_generation x num_iterations "
                f"({self.steps_per_generation} x {self.num_iterations}) must be a multiple of "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}). Set steps_per_generation to a "
                "multiple of gradient_accumulation_steps (the default is equal)."
            )
        self.d3s_estimator_options = estimator_options(self.d3s_estimator_options, "d3s_estimator_options")
        validate_estimator(self.d3s_base_estimator, G, self.d3s_estimator_options)
        options = self.d3s_estimator_options
        knob, scale = ("scale_rewards", options.get("scale", self.scale_rewards))
        if self.d3s_base_estimator == "gpg":
            knob, scale = "f_norm", options.get("f_norm", "none")
        if self.d3s_base_estimator != "ms_grpo" and scale != "group":
            warnings.warn(
                f"D3S over {self.d3s_base_estimator!r} with {knob}={scale!r}: pooled selection assumes per-group "
                "standardised advantages and will favour groups by their raw reward spread (docs/methods/d3s.md §2.6).",
                UserWarning,
                stacklevel=2,
            )


def d3s_schedule(args: D3SConfig, step: int, total: int, num_generations: int) -> tuple[int, float, float]:
    """``(N_s, K, p)`` at optimizer step ``step`` of ``total`` (docs/methods/d3s.md §2.5): a pure function of the
    trainer state, so a checkpoint resume restores it with ``global_step``."""
    start = args.d3s_samples_start if args.d3s_samples_start is not None else default_samples_start(num_generations)
    end = args.d3s_samples_end if args.d3s_samples_end is not None else num_generations
    n_s, ratio = schedule(
        step,
        total,
        num_generations=num_generations,
        samples_start=start,
        samples_end=end,
        token_ratio_start=args.d3s_token_ratio_start,
        token_ratio_end=args.d3s_token_ratio_end,
    )
    progress = 1.0 if total <= 0 else min(max(step / total, 0.0), 1.0)
    return n_s, ratio, progress


class D3STrainer(GRPOFamilyTrainer):
    """D3S: "Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient Policy
    Optimization" (Chao Wang, Tao Yang, Hongtao Tian, Yunsheng Shi, Qiyao Ma, Xiaotao Liu, Ting Yao, Wenbo Ding).

    Trains on the subset of rollouts whose (full-group) advantages have the largest variance, and inside it only on
    the tokens with the largest ``|A| x entropy``; both subsets grow linearly over training (8 -> 32 of 32 rollouts,
    5 % -> 20 % of tokens in the paper). Metrics (``d3s/``): ``samples_per_prompt`` and ``token_ratio`` (the
    schedule), ``progress``, ``kept_rollouts`` and ``kept_rollout_frac`` (real rollouts trained on),
    ``padding_rows`` (inert rows added to balance processes), ``degenerate_batch`` (1 when every advantage is 0),
    ``kept_tokens``, ``kept_token_frac`` (of the kept rollouts' valid tokens) and ``trained_token_frac`` (of every
    generated valid token).
    """

    method_name = "d3s"
    summary = "trains on the rollouts with the largest advantage variance and the tokens with the largest \\|A\\|·entropy, on a schedule"
    reported_result = (
        "Qwen2.5-Math-7B, 7 math benchmarks: average pass@1 34.3 vs GRPO 29.8, on a fraction of rollouts/tokens"
    )
    selects_rows = True
    _tag_names = ["trl", "grpo", "grpo_family", "d3s"]
    _name = "D3S"
    _paper = {
        "title": "Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient Policy "
        "Optimization",
        "id": None,
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @misc{wang2025d3s,
                title        = {{Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient Policy Optimization}},
                author       = {Chao Wang and Tao Yang and Hongtao Tian and Yunsheng Shi and Qiyao Ma and Xiaotao Liu and Ting Yao and Wenbo Ding},
            }"""),
    }

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, D3SConfig):
            raise TypeError(f"D3STrainer needs a D3SConfig (its d3s_* options), got {type(self.args).__name__}.")
        self._d3s_warned_degenerate = False
        self.d3s_last_selection: dict[str, Any] = {}  # the last batch's selection and schedule, for inspection

    # ------------------------------------------------------------------ advantages (full groups, global)
    def compute_advantages(self, batch: GenerationBatch) -> torch.Tensor:
        a = self.args
        advantages = self.estimate_advantages(a.d3s_base_estimator, batch, a.d3s_estimator_options)
        if advantages.dim() != 2:
            raise ValueError("D3S ranks rollouts by one advantage each; the base estimator returned per-token ones.")
        return advantages

    # ------------------------------------------------------------------ sample level
    def select_rows(self, batch: GenerationBatch) -> torch.Tensor:
        """The max-variance subset of the gathered full-group advantages (docs/methods/d3s.md §2.3), identical on every
        process; it runs before TRL's old/reference log-prob forwards, which then cover the kept rows only."""
        num_generations, advantages = batch.num_generations, batch.advantages
        n_s, ratio, progress = d3s_schedule(self.args, self.state.global_step, self.state.max_steps, num_generations)
        a = self.args
        kept = select_rollouts(
            advantages,
            num_generations,
            n_s,
            scope=a.d3s_sample_scope,
            drop_degenerate_groups=a.d3s_drop_degenerate_groups,
            # Masked completions count in the group statistics but take no slot (docs/methods/d3s.md §6).
            eligible=~batch.masked_rows if self.mask_truncated_completions else None,
        )
        degenerate = not bool(advantages.any())
        if degenerate and not self._d3s_warned_degenerate:  # docs/methods/d3s.md §6: still step (KL only), in sync
            self._d3s_warned_degenerate = True
            logger.warning(
                "D3S: every advantage of a generation batch is 0; its selection is arbitrary and only the "
                "KL term (if any) trains on it. Counted in d3s/degenerate_batch."
            )
        selection = self.d3s_last_selection = {
            "advantages": advantages.detach().cpu(),
            "kept": kept.cpu(),
            "samples_per_prompt": n_s,
            "token_ratio": ratio,
            "progress": progress,
            "global_step": self.state.global_step,
            "mode": batch.mode,
        }
        for name in ("samples_per_prompt", "token_ratio", "progress"):
            batch.log(name, selection[name])
        batch.log("kept_rollouts", kept.numel())
        batch.log("kept_rollout_frac", kept.numel() / max(advantages.numel(), 1))
        batch.log("degenerate_batch", float(degenerate))
        return kept

    def finish_generation_batch(self, batch: GenerationBatch) -> None:
        device = batch.completion_mask.device
        # Global flat index b*G + i of each row (-1 for padding): TRL shuffles the rows before splitting them into
        # micro-steps, and token ties are broken by this index (docs/methods/d3s.md §2.4), not by the shuffled row order.
        batch.set("rollout_index", batch.kept_rows)
        counts = [batch.generated_tokens, batch.completion_mask.sum(), batch.padding_rows]
        stats = torch.tensor([float(count) for count in counts], dtype=torch.float64, device=device)
        generated_tokens, _, padding_rows = self.accelerator.reduce(stats, reduction="sum").tolist()
        # The schedule's token ratio when the rows were selected (a pure function of the same step).
        _, ratio, _ = d3s_schedule(self.args, self.state.global_step, self.state.max_steps, batch.num_generations)
        batch.set("token_ratio", torch.tensor(ratio, dtype=torch.float64, device=device))
        batch.set("generated_tokens", torch.tensor(generated_tokens, dtype=torch.float64, device=device))
        batch.log("padding_rows", padding_rows)

    # ------------------------------------------------------------------ loss denominators, once per generation batch
    @torch.no_grad()
    def prepare_micro_batches(self, micro_batches: list[MicroBatch]) -> None:
        """Per-micro-step counts of the generation batch (global over processes), for the loss denominators.

        Stores in every micro-batch ``chunk_stats``: a (chunks, 4) table of [valid tokens, kept tokens, kept rollouts,
        rollouts with a kept token (-1 = known only in the loss call)]. With ``d3s_token_scope="batch"`` and several
        micro-steps the keep masks are made here (one ranking over the whole batch, entropies of one no-grad forward
        of the sampling policy over the kept rows) and stored as ``keep``; with one micro-step the first loss call
        ranks the whole batch and stores its mask for the next iterations.
        """
        a = self.args
        chunks = micro_batches
        ratio = float(chunks[0].get("token_ratio"))
        if a.d3s_token_scope == "batch" and len(chunks) > 1:
            self._batch_token_keep(chunks, ratio)
        valid = [chunk.loss_mask.sum(1).double() for chunk in chunks]
        if "keep" in chunks[0]:  # the batch scope's masks, made above
            kept = [chunk.get("keep").sum(1).double() for chunk in chunks]
        elif a.d3s_token_scope == "sequence":
            kept = [planned_kept_tokens(counts, ratio) for counts in valid]
        else:
            kept = [None] * len(chunks)
        local = chunk_count_table(valid, kept, [chunk.get("rollout_index") for chunk in chunks])
        table = self.accelerator.reduce(local, reduction="sum")
        if kept[0] is None:  # one ranking per loss call: the kept count is known, the rows with a kept token are not
            table[:, 1] = planned_kept_tokens(table[:, 0], ratio)
            table[:, 3] = -1.0
        for chunk in chunks:
            chunk.set("chunk_stats", table.clone())
            chunk.set("token_ratio", ratio)  # a Python float from here on: every loss call reads it without a sync
        kept_tokens, valid_tokens = float(table[:, 1].sum()), float(table[:, 0].sum())
        generated = float(chunks[0].get("generated_tokens"))
        chunks[0].log("kept_tokens", kept_tokens)
        chunks[0].log("kept_token_frac", kept_tokens / max(valid_tokens, 1.0))
        chunks[0].log("trained_token_frac", kept_tokens / max(generated, 1.0))

    def _window_denominators(self, call: LossCall) -> dict[str, torch.Tensor]:
        """The loss denominator D of the optimizer step this loss call belongs to (docs/methods/d3s.md §2.6), as TRL's
        ``num_items_in_batch``, and the step's counts the per-token weights need.

        TRL's token-sum losses compute ``sum(mask * l) / (num_items / processes * accumulation / steps_per_generation)``;
        with DDP's mean over processes and the sum over the micro-steps of the optimizer step, ``num_items = D *
        steps_per_generation / accumulation`` gives ``sum_step(w l) / D``. The step's micro-steps are TRL's
        micro-step window; the config check makes them all come from one generation batch. D is the normalisation's
        own denominator when its weights are 1 on the kept tokens (the logged loss is then the D3S loss); for the
        per-rollout normalisations D = |T| and the per-rollout factors go into the weights.
        """
        table = call.get("chunk_stats")
        if call.mode == "train":
            spg, accumulation = self.args.steps_per_generation, self.args.gradient_accumulation_steps
            first = call.micro_step - call.micro_step % accumulation
            calls = [step % spg for step in range(first, first + accumulation)]
            scale = spg / self.current_gradient_accumulation_steps
        else:
            calls, scale = list(range(table.size(0))), 1.0
        denominator, kept_tokens, num_rollouts, rows_with_tokens = step_counts(
            table, calls, self.args.d3s_loss_normalization
        )
        return {
            "denominator": (denominator.clamp_min(1.0) * scale).float(),
            "kept_tokens": kept_tokens,
            "num_rollouts": num_rollouts,
            "rows_with_tokens": rows_with_tokens,
            "loss_calls": torch.tensor(float(len(calls)), dtype=torch.float64, device=table.device),
        }

    # ------------------------------------------------------------------ token level
    def transform_loss_forward(self, call: LossCall) -> None:
        # The loss call's advantages are its own (TRL reuses the buffered micro-batch when num_iterations > 1); the
        # "batch" scope's mask of the first loss call on a one-micro-step batch is kept in the buffered micro-batch.
        counts = self._window_denominators(call)
        call.num_items_in_batch = counts["denominator"]
        super().transform_loss_forward(call)
        logps, entropies = call.logps, call.entropies
        keep, weight = self._token_weights(call, entropies.detach(), counts)
        weight = weight.to(logps.dtype)
        # Values unchanged; gradient scaled by the weight, exactly 0 off the mask (the graph stays connected, so a
        # process without kept tokens still takes part in DDP's gradient reduction).
        call.logps = logps.detach() + weight * (logps - logps.detach())
        call.entropies = entropies.detach() + keep.to(entropies.dtype) * (entropies - entropies.detach())
        if self.importance_sampling_level == "token":
            # Only the logged loss value changes (unkept tokens contribute 0 to it, as to the gradient). Not for the
            # sequence ratio: there every valid token carries the rollout's surrogate, which yields GSPO-token.
            advantages = call.advantages
            advantages = advantages[:, None] if advantages.dim() == 1 else advantages
            call.advantages = advantages * keep.to(advantages.dtype)

    @torch.no_grad()
    def _token_weights(
        self, call: LossCall, entropies: torch.Tensor, counts: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep mask T (docs/methods/d3s.md §2.4) and per-token gradient weights ``w = D * omega`` of one loss call (§2.6), where
        ``omega`` is the normalisation's weight in ``sum omega * l`` over the optimizer step."""
        a = self.args
        valid = call.loss_mask.bool()
        advantages = call.advantages
        ratio = float(call.get("token_ratio"))
        if a.d3s_token_scope == "sequence":
            keep = token_keep_mask(advantages, entropies, valid, ratio, scope="sequence")
        elif call.get("keep") is not None:
            keep = call.get("keep")
        else:
            keep = self._global_token_keep(advantages, entropies, valid, ratio, call.get("rollout_index"))
            if a.d3s_token_scope == "batch" and call.mode == "train":
                call.buffered.set("keep", keep)
        rows_with_tokens = counts["rows_with_tokens"]
        if a.d3s_loss_normalization == "seq_mean_kept" and rows_with_tokens < 0:
            # One ranking per loss call: rollouts with a kept token per call (all processes), mean over the calls.
            per_call = self.accelerator.reduce((keep.sum(1) > 0).double().sum().reshape(1), reduction="sum")
            rows_with_tokens = per_call * counts["loss_calls"]
        return keep, normalization_weights(
            keep,
            valid,
            a.d3s_loss_normalization,
            kept_tokens=counts["kept_tokens"],
            num_rollouts=counts["num_rollouts"],
            rows_with_tokens=rows_with_tokens,
        )

    def _gather_rows(self, advantages, entropies, valid, rollout_index):
        """Rows of every process (rank-major, widths padded): advantages, entropies, valid mask, rollout index."""
        rows = (advantages.float(), entropies.float(), valid.to(torch.int32), rollout_index)
        return tuple(gather_padded(tensor) for tensor in rows)

    def _global_token_keep(self, advantages, entropies, valid, ratio, rollout_index) -> torch.Tensor:
        """``token_keep_mask`` over the rows of this loss call on every process."""
        keep = token_keep_mask_in_rollout_order(*self._gather_rows(advantages, entropies, valid, rollout_index), ratio)
        rows, width = valid.shape
        start = self.accelerator.process_index * rows
        return keep[start : start + rows, :width]

    def _batch_token_keep(self, chunks: list[MicroBatch], ratio: float) -> None:
        """The "batch" scope over several micro-steps: one no-grad forward of the sampling policy over the kept rows for
        the entropies, one ranking over every chunk of every process, each chunk's mask stored as ``keep``."""
        gathered = []
        for chunk in chunks:
            _, entropies = self.policy_logps(
                chunk, batch_size=self.args.per_device_train_batch_size, compute_entropy=True
            )
            valid = chunk.loss_mask.bool()
            gathered.append(self._gather_rows(chunk.advantages, entropies, valid, chunk.get("rollout_index")))
        keep = token_keep_mask_over_parts(gathered, ratio)
        offset = 0
        for chunk, g in zip(chunks, gathered):
            rows, local_width = chunk.completion_ids.shape
            start = offset + self.accelerator.process_index * rows
            chunk.set("keep", keep[start : start + rows, :local_width].clone())
            offset += g[1].size(0)


__all__ = ["D3SConfig", "D3STrainer", "d3s_schedule", "default_samples_start", "planned_kept_tokens"]
