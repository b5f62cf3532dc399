"""``GRPOFamilyTrainer``: TRL's ``GRPOTrainer`` plus the stages every method builds on.

TRL 1.16 computes advantages inline in ``_generate_and_score_completions``. Rather than copy that method, the base
class lets it run, keeps the globally gathered rewards it computed (``_calculate_rewards`` is the one place they
pass through), and runs the stages of :data:`~grpo_family.trainers.stages.STAGES` on them: public methods of
:class:`GRPOFamilyTrainer` that receive a context object (:class:`~grpo_family.trainers.stages.GenerationBatch`,
:class:`~grpo_family.trainers.stages.MicroBatch`, :class:`~grpo_family.trainers.stages.LossCall`). The default stages
are TRL's own maths (``algorithms.grpo``), so ``grpo`` here trains bit-for-bit like stock TRL. This module is the one
place that reads and writes TRL's batch keys, metrics and counters; ``docs/architecture.md`` walks through it.

The base class also contains trouble instead of letting it corrupt a run (:mod:`grpo_family.runtime`):

* rows with an empty prompt, or reward functions that need a missing column, stop the run at init
  (:mod:`~grpo_family.runtime.setup_checks`), before any generation;
* reward functions (sync or async) are guarded (:mod:`~grpo_family.runtime.reward_guards`): an exception or a
  non-finite or non-numeric value on some completions turns them into "unscorable" (NaN reward, zero advantage)
  with a warning and a ``reward_errors/<name>`` metric; so does a non-finite value of a reward model; a function that
  fails on *every* completion of the first batch (or returns the wrong number of values, or no number at all) is a
  set-up bug and stops the run before any update, with its name in the message;
* runs that cannot learn stop or warn (:mod:`~grpo_family.runtime.unlearnable`);
* a step whose gradients are not finite is skipped (no parameter changes) and counted in ``skipped_steps``
  (:class:`~grpo_family.runtime.nonfinite_guard.NonFiniteGradientGuard`, a TRL callback);
* checkpoints resume exactly (:mod:`~grpo_family.runtime.resume`), the hub token never reaches disk
  (:mod:`~grpo_family.runtime.redaction`), and the model card lists the method's hyperparameters
  (:mod:`~grpo_family.runtime.model_card`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.utils import gather, pad_across_processes
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import is_async_callable, nanstd

from ..algorithms.estimators import get_estimator
from ..algorithms.grpo import group_advantages, normalize_then_sum_advantages, weighted_reward_sum, zero_std_mask
from ..algorithms.losses import LOSS_TYPES, aggregate_token_loss, get_loss_term
from ..bounds import check_bounds, check_unused
from ..integrations.vllm_cpu import check_vllm_settings, install_cpu_weight_sync
from ..launch import check_distributed_launch
from ..models import resolve_model
from ..preflight import check_enough_rows
from ..rewards.timeout import with_timeout
from ..run_folder import PlainLogHistoryMixin
from ..runtime.model_card import training_details
from ..runtime.nonfinite_guard import NonFiniteGradientGuard
from ..runtime.redaction import _UnpickledSecret
from ..runtime.resume import ResumableTrainerMixin
from ..runtime.reward_guards import AsyncGuardedReward, GuardedReward
from ..runtime.setup_checks import check_prompts, check_reward_columns
from ..runtime.unlearnable import UnlearnableRunPolicy
from .stages import (
    GenerationBatch,
    LossCall,
    MicroBatch,
    RoundAssembly,
    gather_padded,
    local_rows,
    padded_local_rows,
)
from .surrogate_stage import apply_surrogate, check_surrogate, log_surrogate_clips

logger = logging.getLogger(__name__)

__all__ = ["FORWARD_KEYS", "GRPOFamilyConfig", "GRPOFamilyTrainer"]


@dataclasses.dataclass
class GRPOFamilyConfig(GRPOConfig):
    """``GRPOConfig`` plus what every grpo_family trainer shares: the policy for runs that cannot learn and the
    default deadline of reward calls. Every method's config derives from it (``grpo`` uses it as is); a plain
    ``GRPOConfig`` still works with these defaults.

    The policy counts *generation batches* (one per optimizer step unless ``steps_per_generation >
    gradient_accumulation_steps`` or ``num_iterations > 1``; for GPG with ``beta_th``, one per assembled batch, however
    many rounds it took), judged on the rewards and advantages gathered from every process, so every process takes the
    same decision. With ``on_unlearnable="stop"`` the run raises :class:`UnlearnableRunError` before training on the
    batch that reaches the limit; with ``"warn"`` it logs a warning at the limit (and again every further limit's
    worth of batches) and trains on.
    """

    max_unscorable_batches: int = dataclasses.field(
        default=3,
        metadata={
            "help": "Generation batches in a row in which no completion could be scored (every reward function "
            "returned None/NaN or failed), or one reward function (or SGPO's judge) failed (raised, timed out, returned "
            "NaN/inf or a non-number) on every completion it was asked to score, before on_unlearnable applies. 0 "
            "disables the check."
        },
    )
    max_degenerate_batches: int = dataclasses.field(
        default=20,
        metadata={
            "help": "Generation batches in a row in which every advantage is zero (every group degenerate: all its "
            "completions got the same reward, so the policy gradient is zero) before on_unlearnable applies. Early "
            "batches of a weak model on a hard task can be all wrong, hence the larger default. 0 disables the check."
        },
    )
    on_unlearnable: str = dataclasses.field(
        default="stop",
        metadata={
            "help": "What a run that cannot learn does: 'stop' (raise UnlearnableRunError with the reason and the "
            "fix, before the next update) or 'warn' (log a warning and train on)."
        },
    )
    reward_timeout: float | None = dataclasses.field(
        default=600.0,
        metadata={
            "help": "Deadline in seconds for every call of a reward function (not a reward model): a call past it "
            "leaves that batch unscored by the function, with a warning and the reward_errors/<name> metric, as "
            "grpo_family.rewards.with_timeout does (a synchronous function then runs in a helper thread). Functions "
            "already wrapped by with_timeout keep their own deadline. None or 0: no deadline."
        },
    )

    def __post_init__(self):
        check_bounds(self)  # every field, TRL's included, before TRL's __post_init__ uses any (grpo_family.bounds)
        check_unused(self)  # options the method inherits but does not use (its unused_options)
        super().__post_init__()
        check_distributed_launch(self)  # several processes launched, one seen: they would train independently


# GRPOFamilyConfig's own fields with their defaults: what a trainer given a plain GRPOConfig uses.
_FAMILY_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(GRPOFamilyConfig) if f.name not in GRPOConfig.__dataclass_fields__
}


# Multimodal inputs TRL's generation batch may carry; forwards over a batch pass them like TRL's own forwards do.
FORWARD_KEYS = (
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
# Per-row tensors of TRL's generation output padded on the left (prompt side) / on the right (completion side), and
# per-row values without a width: how rows of several generation rounds are merged into one batch.
LEFT_PADDED = {"prompt_ids", "prompt_mask"}
RIGHT_PADDED = {
    "completion_ids", "completion_mask", "tool_mask", "old_per_token_logps", "sampling_per_token_logps",
    "ref_per_token_logps", "importance_sampling_ratio",
}  # fmt: skip
PER_ROW = {"advantages"}


@dataclasses.dataclass(eq=False)
class _Round:
    """What one generation round carries between TRL's calls (``_generate`` -> the no-grad forwards ->
    ``_calculate_rewards`` -> the end of ``_generate_and_score_completions``): the base class's one piece of state
    while a round is in progress."""

    inputs: list
    scored_early: bool = False  # a row-selecting method scored the round in _generate
    scores: tuple | None = None  # (inputs, prompts, completions, completion_ids, rewards_per_func)
    early_rewards: torch.Tensor | None = None  # handed back to TRL's own _calculate_rewards call
    forward_rows: torch.Tensor | None = None  # this process's kept rows, for TRL's no-grad forwards
    batch: GenerationBatch | None = None


class GRPOFamilyTrainer(ResumableTrainerMixin, PlainLogHistoryMixin, GRPOTrainer):
    """GRPO (Shao et al., 2024) through the grpo_family stages; the base of every method.

    A method overrides some of the stage methods of :data:`~grpo_family.trainers.stages.STAGES`, in the order the
    base class calls them: :meth:`transform_rewards`, :meth:`compute_advantages`, :meth:`select_rows` (with
    ``selects_rows = True``), :meth:`weight_advantages`, :meth:`next_generation_round` and
    :meth:`assemble_generation_rounds`, :meth:`finish_generation_batch`, :meth:`prepare_micro_batches`,
    :meth:`transform_loss_forward`, and the registered loss term named by ``loss_term``. Methods never override TRL's
    private helpers (a test checks it); a method whose loss is not TRL's overrides :meth:`compute_loss`.

    Helpers a stage may call: :meth:`estimate_advantages` (any registered estimator), :meth:`policy_logps` (an extra
    no-grad forward of the policy), :meth:`policy_forward` (the policy forward of a loss of the method's own) and
    :meth:`log_method_metric`.
    """

    method_name = "grpo"
    # What the method changes, and the paper's headline result at its own scale: one line each, for the tables the
    # documentation and the benchmarks write from METHODS (docs/generate.py, benchmarks/learning.py).
    summary = (
        "nothing: the baseline, bit-for-bit TRL's `GRPOTrainer` (except two float edge cases, docs/methods/grpo.md §3)"
    )
    reported_result = "the baseline every paper compares against"
    selects_rows = False  # a method that overrides select_rows sets it: its batches are scored before TRL's forwards
    loss_term: str | None = None  # a registered loss term (algorithms.losses) applied in every loss call
    surrogate: str | None = None  # a registered surrogate (algorithms.surrogates) in place of TRL's objective
    loss_forward_fix = "Use the TRL version this package pins (tests/test_trl_contract.py checks it)."
    _tag_names = ["trl", "grpo", "grpo_family"]
    _card_base_config = GRPOFamilyConfig

    def __init__(self, *args: Any, **kwargs: Any):
        # GRPOTrainer(model, reward_funcs, args, ...): vLLM settings that cannot work fail before vLLM starts.
        check_vllm_settings(kwargs["args"] if "args" in kwargs else args[2] if len(args) > 2 else None)
        if "model" in kwargs:  # a local alias ("smollm2-135m-instruct") -> its converted checkpoint
            kwargs["model"] = resolve_model(kwargs["model"])
        elif args:
            args = (resolve_model(args[0]), *args[1:])
        super().__init__(*args, **kwargs)
        install_cpu_weight_sync(self)
        check_prompts(self.train_dataset, self.eval_dataset)
        check_enough_rows(self.train_dataset, self.args)
        check_reward_columns(self.train_dataset, self.reward_funcs, self.reward_func_names)
        self._check_loss_term()
        if self.surrogate is not None:
            check_surrogate(self)
        timeout = self._family_arg("reward_timeout")
        for i, func in enumerate(self.reward_funcs):
            if not isinstance(func, torch.nn.Module):
                if timeout and not hasattr(func, "reward_deadline"):
                    func = with_timeout(func, timeout)
                guard = AsyncGuardedReward if is_async_callable(func) else GuardedReward
                self.reward_funcs[i] = guard(func, self.reward_func_names[i], self._on_reward_error)
        self._round: _Round | None = None  # the generation round in progress
        self._loss_call: LossCall | None = None  # the loss call in progress
        self._estimator_caches: dict[str, Any] = {}  # work an estimator may reuse across calls, per run
        self._unlearnable = UnlearnableRunPolicy(
            self._family_arg("max_unscorable_batches"),
            self._family_arg("max_degenerate_batches"),
            self._family_arg("on_unlearnable"),
        )
        if self.is_deepspeed_enabled is False:  # DeepSpeed steps inside its engine, with its own overflow handling
            self.add_callback(NonFiniteGradientGuard(lambda: self.record_metric("skipped_steps", 1.0, mode="train")))
        if getattr(self.args, "hub_token", None) and not isinstance(self.args.hub_token, _UnpickledSecret):
            # transformers pickles the whole config into training_args.bin of every checkpoint and of the final
            # model (and uploads it with push_to_hub): keep the token usable in memory, never written to disk.
            self.args.hub_token = _UnpickledSecret(self.args.hub_token)

    def _family_arg(self, name: str) -> Any:
        """A :class:`GRPOFamilyConfig` field of ``self.args``, or its default for a plain ``GRPOConfig``."""
        return getattr(self.args, name, _FAMILY_DEFAULTS[name])

    # ================================================================== the stages (defaults; see stages.STAGES)
    def transform_rewards(self, batch: GenerationBatch) -> None:
        """Change the rewards the advantages are computed from (``batch.rewards``, ``batch.rewards_per_func``).
        Default: unchanged."""

    def compute_advantages(self, batch: GenerationBatch) -> torch.Tensor:
        """Advantages for ``batch.rewards`` ``(P, G)`` (NaN = unscorable): ``(P, G)`` or, per token, ``(P, G, T)``
        zero-padded on the right. Default: TRL's GRPO (``scale_rewards``, ``multi_objective_aggregation``)."""
        rewards = batch.rewards
        if self.multi_objective_aggregation == "normalize_then_sum":
            per_func = batch.rewards_per_func.view(*rewards.shape, -1)
            return normalize_then_sum_advantages(per_func, self.reward_weights).view_as(rewards)
        return group_advantages(rewards, scale=self.scale_rewards)

    def select_rows(self, batch: GenerationBatch) -> torch.Tensor | None:
        """Sorted global flat indices (``b * G + i``) of the rows to train on, from ``batch.advantages``; None trains
        on every row. Called only when ``selects_rows`` is True."""
        return None

    def weight_advantages(self, batch: GenerationBatch) -> torch.Tensor:
        """The flat global advantages trained on, ``(P * G,)`` or per token ``(P * G, T)``, from
        ``batch.advantages`` and this process's generation output. Default: unchanged."""
        return batch.advantages

    def next_generation_round(self, rounds: list[GenerationBatch]) -> list | None:
        """This process's inputs for one more generation round of the same batch, given the rounds so far; None when
        the batch is complete (default: one round). Must decide alike on every process (from global values)."""
        return None

    def assemble_generation_rounds(self, rounds: list[GenerationBatch]) -> RoundAssembly:
        """Which group of which round fills each group slot of the batch trained on."""
        raise NotImplementedError(f"{type(self).__name__} asked for several generation rounds but cannot merge them.")

    def finish_generation_batch(self, batch: GenerationBatch) -> None:
        """Per-row values of this process's trained rows for the loss (``batch.set``). Default: none."""

    def prepare_micro_batches(self, micro_batches: list[MicroBatch]) -> None:
        """Per-micro-batch values, once per generation batch, before its first loss call. Default: none."""

    def transform_loss_forward(self, call: LossCall) -> None:
        """Change the loss call's ``logps``, ``entropies``, ``advantages`` or ``num_items_in_batch`` right after the
        loss's policy forward. Default: unchanged."""

    def loss_term_options(self) -> dict[str, Any]:
        """Options of the loss term named by ``loss_term`` (from the config)."""
        return {}

    def surrogate_options(self) -> dict[str, Any]:
        """Options of the surrogate named by ``surrogate``: TRL's clip range by default."""
        return {"epsilon_low": self.epsilon_low, "epsilon_high": self.epsilon_high}

    # ================================================================== helpers for the stages
    @property
    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def log_method_metric(self, name: str, value: float) -> None:
        """Record a method metric; it reaches ``report_to`` backends as ``<method>/<name>``."""
        self._metrics[self._mode][f"{self.method_name}/{name}"].append(float(value))

    def record_metric(self, name: str, value: float, *, mode: str | None = None) -> None:
        """Record a metric under a name of its own (e.g. TRL's ``entropy``, for a method whose loss is its own)."""
        self._metrics[mode or self._mode][name].append(float(value))

    def estimate_advantages(self, name: str, batch: GenerationBatch, options: dict[str, Any]) -> torch.Tensor:
        """Advantages of the registered estimator ``name`` (``algorithms.estimators``) with ``options``, for methods
        that filter or reweight any estimator's advantages. ``grpo`` without options is this class's own stage (TRL's
        maths: ``scale_rewards``, ``multi_objective_aggregation``); a sampled estimator draws from
        ``batch.generator(name)``; an estimator that can reuse work across calls gets this run's cache."""
        if name == "grpo" and not options:
            return GRPOFamilyTrainer.compute_advantages(self, batch)
        estimator = get_estimator(name)
        generator = batch.generator(name) if estimator.sampled else None
        extra = {}
        if estimator.new_cache is not None:
            extra["cache"] = self._estimator_caches.setdefault(name, estimator.new_cache())
        return estimator(batch.rewards, generator=generator, **options, **extra)

    def policy_logps(
        self, rows: GenerationBatch | MicroBatch, *, batch_size: int, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One extra no-grad forward of the current policy over ``rows`` (a generation batch's output or a
        micro-batch), as TRL makes its old log-probs: per-token log-probs and, if asked, entropies ``(n, T)``."""
        data = rows.output if isinstance(rows, GenerationBatch) else rows._data
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            return self._forward(self.model, data, batch_size=batch_size, compute_entropy=compute_entropy)

    def policy_forward(self, model, rows: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy forward of a loss of the method's own (with gradient): per-token log-probs and entropies."""
        return self._forward(model, rows._data, compute_entropy=True)

    def generation_batch(self, rewards: torch.Tensor, **fields: Any) -> GenerationBatch:
        """A :class:`~grpo_family.trainers.stages.GenerationBatch` of ``rewards`` ``(P, G)`` in the trainer's current
        state (mode, step, seed, metrics), as the stages receive it; ``fields`` set the other attributes
        (``rewards_per_func`` defaults to ``rewards`` as one column). For tests and notebooks that call a stage."""
        values = dict(
            mode=self._mode,
            num_generations=rewards.size(1),
            rewards_per_func=rewards.reshape(-1, 1),
            raw_rewards=rewards,
            rewards=rewards,
            global_step=self.state.global_step,
            micro_step=self._step,
            seed=self.args.seed,
            method=self.method_name,
            logger=self.log_method_metric,
        )
        return GenerationBatch(**{**values, **fields})

    def micro_batch(self, inputs: dict[str, Any]) -> MicroBatch:
        """The context of one of TRL's micro-batches (for a method's own loss)."""
        return MicroBatch(inputs, self.method_name, self.log_method_metric, self._mode)

    def _forward(self, model, data: dict[str, Any], *, batch_size: int | None = None, compute_entropy: bool = False):
        """TRL's per-token log-probs (and entropies) of a batch's completions: the same helper, hence the same
        temperature scaling, as TRL's own forwards, with the multimodal inputs passed on as TRL does."""
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([data["prompt_ids"], data["completion_ids"]], dim=1),
            torch.cat([data["prompt_mask"], data["completion_mask"]], dim=1),
            data["completion_ids"].size(1),
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            **{key: data.get(key) for key in FORWARD_KEYS},
        )
        return logps, entropies

    def _on_reward_error(self, name: str, count: int, reason: str) -> None:
        logger.warning("Reward function '%s' could not score %d completion(s): %s", name, count, reason)
        self._metrics[self._mode][f"reward_errors/{name}"].append(float(count))

    # ================================================================== generation: the bridge to TRL's calls
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        state = self._round
        if state is not None and state.early_rewards is not None:  # scored in _generate (a row-selecting method)
            rewards_per_func, state.early_rewards = state.early_rewards, None
            return rewards_per_func
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # Guarded functions never return inf or NaN by accident, but a reward *model*'s logits can: its non-finite
        # values become "unscorable" too (an inf would otherwise turn a whole group's advantages into NaN).
        models = [i for i, f in enumerate(self.reward_funcs) if isinstance(f, torch.nn.Module)]
        if models:
            bad = ~torch.isfinite(rewards_per_func[:, models])
            if bool(bad.any()):
                for column, i in enumerate(models):
                    if bool(bad[:, column].any()):
                        self._on_reward_error(
                            self.reward_func_names[i], int(bad[:, column].sum()), "non-finite reward"
                        )
                rewards_per_func = rewards_per_func.clone()
                rewards_per_func[:, models] = rewards_per_func[:, models].masked_fill(bad, math.nan)
        if state is not None:
            state.scores = (inputs, prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _advantage_stages(self, scores: tuple, *, early: bool, masked_rows=None, output=None) -> GenerationBatch:
        """The reward-transform, advantage and row-selection stages on one generation round's gathered rewards."""
        inputs, prompts, completions, completion_ids, rewards_per_func = scores
        num_generations = self.num_generations if self._mode == "train" else self.num_generations_eval
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = weighted_reward_sum(rewards_per_func, weights).view(-1, num_generations)
        batch = self.generation_batch(
            rewards,
            rewards_per_func=rewards_per_func,
            inputs=inputs,
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids,
            masked_rows=masked_rows,
            early=early,
            output=output,
        )
        self.transform_rewards(batch)
        advantages = torch.nan_to_num(self.compute_advantages(batch), nan=0.0)
        batch.advantages = advantages.reshape(rewards.numel(), *advantages.shape[2:])
        batch.keep = self.select_rows(batch) if self.selects_rows else None
        return batch

    def _generate(self, prompts):
        # TRL computes its old and reference log-probs right after generating, before any reward exists (TRL 1.16,
        # GRPOTrainer._generate_and_score_completions). A method that selects rows is scored here instead, between
        # the generation and those forwards, so that they run over the rows it keeps (``_get_per_token_logps_and_
        # entropies`` below); TRL's own ``_calculate_rewards`` call then gets these rewards back.
        result = super()._generate(prompts)
        state = self._round
        if state is None or not self.selects_rows or state.scored_early:
            return result
        state.scored_early = True  # scored once per generation round
        inputs = state.inputs
        _, completion_ids_list, _, completions, _, extra_fields, _, _ = result
        for i, row in enumerate(inputs):  # what TRL merges into the reward inputs after its forwards
            for key, values in (extra_fields or {}).items():
                if isinstance(values, list) and i < len(values):
                    row[key] = values[i]
                elif not isinstance(values, list):
                    row[key] = values
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        masked = [len(ids) == 0 for ids in completion_ids_list]
        if self.mask_truncated_completions:
            ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
            masked = [m or ids[-1] not in ends for m, ids in zip(masked, completion_ids_list)]
        device = self.accelerator.device
        masked_rows = gather(torch.tensor(masked, dtype=torch.int32, device=device)).bool()
        state.batch = self._advantage_stages(state.scores, early=True, masked_rows=masked_rows)
        state.early_rewards = rewards_per_func
        keep = state.batch.keep
        if keep is not None:
            num_local, processes = len(completion_ids_list), self.accelerator.num_processes
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:  # sharded forwards are collective: equal counts
                rows, _ = padded_local_rows(keep.to(device), num_local, processes, self.accelerator.process_index, 1)
            else:
                rows = local_rows(keep.to(device), num_local, self.accelerator.process_index)
            state.forward_rows = rows
        return result

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        rows = self._round.forward_rows if self._round is not None else None
        if (
            rows is not None
            and not kwargs.get("compute_entropy")
            and not any(kwargs.get(k) is not None for k in FORWARD_KEYS)
        ):
            # One of TRL's no-grad forwards of a generation batch whose rows were selected: forward the kept rows
            # only, trimmed to their longest completion; dropped rows get NaN (TRL's importance-sampling ratio
            # treats a NaN log-prob as "no correction"; the rows are dropped before anything trains on them, and
            # _keep_rows zeroes what is left of the NaN, on masked positions only).
            if rows.numel() == 0:  # this process keeps nothing (never under ZeRO-3: equal counts there)
                return torch.full((input_ids.size(0), logits_to_keep), math.nan, device=input_ids.device), None, None
            completion_mask = attention_mask[rows, -logits_to_keep:]
            used = completion_mask.any(0).nonzero()
            width = int(used.max()) + 1 if used.numel() else 1
            cut = input_ids.size(1) - logits_to_keep + width
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                model, input_ids[rows, :cut], attention_mask[rows, :cut], width, *args, **kwargs
            )
            full = logps.new_full((input_ids.size(0), logits_to_keep), math.nan)
            full[rows, :width] = logps
            return full, entropies, aux
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        call = self._loss_call
        if call is not None and kwargs.get("compute_entropy"):  # the policy forward of the loss call in progress
            self._loss_call = None
            call.logps, call.entropies = logps, entropies
            self.transform_loss_forward(call)
            if self.loss_term is not None:
                self._apply_loss_term(call)
            if self.surrogate is not None:
                apply_surrogate(call, self.surrogate, self.surrogate_options())
            call.forwarded = True
            return call.logps, call.entropies, aux
        return logps, entropies, aux

    def _score_round(self, inputs) -> GenerationBatch:
        """One generation round: TRL's generation and scoring, then the advantage, row-selection (scored early for a
        method that selects rows) and token-weight stages; this process's advantages written into the output."""
        state = self._round = _Round(inputs)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._round = None
        batch = state.batch
        if batch is None:
            batch = self._advantage_stages(state.scores, early=False, output=output)
        batch.output = output
        batch.advantages = self.weight_advantages(batch)
        self._write_advantages(batch)
        self._fix_logged_batch(batch)
        if batch.mode == "train":
            signals = self._learnability_signals(batch.raw_rewards, batch.advantages)
            signals["failing"] = [*signals["failing"], *batch.failed_scorers]
            batch.signals = signals
        return batch

    def _generate_and_score_completions(self, inputs):
        rounds = [self._score_round(inputs)]
        logged = {k: len(v) for k, v in self._metrics[rounds[0].mode].items()}
        while (more := self.next_generation_round(rounds)) is not None:
            rounds.append(self._score_round(more))
        batch = rounds[0]
        if len(rounds) > 1:
            batch, assembly = self._assemble_rounds(rounds)
            self._write_advantages(batch)
            self._log_merged_rewards(batch, logged, assembly.degenerate_share)
        batch.rounds = len(rounds)
        if batch.mode == "train":  # the policy for runs that cannot learn, on the batch trained on
            signals = [b.signals for b in rounds]
            failing = [name for name in signals[0]["failing"] if all(name in x["failing"] for x in signals)]
            self._unlearnable.update(
                {
                    "unscorable": bool(torch.isnan(batch.raw_rewards).all()),
                    "failing": failing,
                    "degenerate": not bool(batch.advantages.abs().gt(0).any()),
                }
                if len(rounds) > 1
                else signals[0]
            )
        if batch.keep is not None:
            self._keep_rows(batch)
        self.finish_generation_batch(batch)
        return batch.output

    def _learnability_signals(self, rewards: torch.Tensor, advantages: torch.Tensor) -> dict[str, Any]:
        """What the policy for runs that cannot learn judges, from the gathered ``rewards`` and ``advantages`` of one
        generation round and each reward function's failures (summed over processes): the same on every process."""
        guarded = [(f.__name__, f) for f in self.reward_funcs if isinstance(f, GuardedReward)]
        failing = []
        if guarded:
            local = torch.tensor([[float(f.failed) for _, f in guarded]], device=self.accelerator.device)
            failed = self.accelerator.gather(local).sum(dim=0)
            failing = [name for (name, _), count in zip(guarded, failed.tolist()) if count >= rewards.numel()]
        return {
            "unscorable": bool(torch.isnan(rewards).all()),
            "failing": failing,
            "degenerate": not bool(advantages.abs().gt(0).any()),
        }

    def _write_advantages(self, batch: GenerationBatch) -> None:
        """This process's slice of the batch's global advantages, as TRL's ``advantages``."""
        output = batch.output
        num_local = output["completion_ids"].size(0)
        start = self.accelerator.process_index * num_local
        local = batch.advantages[start : start + num_local]
        if local.dim() == 2:  # per-token: match this process's completion length
            width = output["completion_ids"].size(1)
            local = torch.nn.functional.pad(local[:, :width], (0, max(0, width - local.size(1))))
        output["advantages"] = local.to(output["completion_ids"].device)

    # ------------------------------------------------------------------ several generation rounds
    def _assemble_rounds(self, rounds: list[GenerationBatch]) -> tuple[GenerationBatch, RoundAssembly]:
        """The batch trained on, assembled as :meth:`assemble_generation_rounds` plans it: this process's rows,
        the global rewards, and the advantages of the assembled rewards."""
        assembly = self.assemble_generation_rounds(rounds)
        G = assembly.rewards.size(1)
        per_func = torch.cat([rounds[k].rewards_per_func[g * G : (g + 1) * G] for k, g in assembly.plan])
        batch = self.generation_batch(assembly.rewards, rewards_per_func=per_func)
        batch.output = self._merge_round_outputs([b.output for b in rounds], assembly.plan)
        batch.advantages = torch.nan_to_num(self.compute_advantages(batch), nan=0.0).reshape(-1)
        return batch, assembly

    def _merge_round_outputs(self, outputs: list[dict[str, Any]], plan: list[tuple[int, int]]) -> dict[str, Any]:
        """This process's rows of the assembled batch, taken from the rounds' local outputs (padded alike)."""
        G, rank = self.num_generations, self.accelerator.process_index
        per_process = len(plan) // self.accelerator.num_processes
        first = outputs[0]
        # TRL's sequence-level vLLM importance-sampling ratio is (n, 1) whatever the completion width: never padded.
        sequence_level_is = self.vllm_importance_sampling_mode in ("sequence_mask", "sequence_truncate")
        per_sequence = {"importance_sampling_ratio"} if sequence_level_is else set()
        unknown = set(first) - LEFT_PADDED - RIGHT_PADDED - PER_ROW - {"num_items_in_batch"}
        if unknown:
            raise NotImplementedError(
                f"{self._name} cannot merge generation rounds of batches with {sorted(unknown)} (multimodal or tool "
                "inputs); use one generation round per batch."
            )
        rows = []  # (round, local row) of every local slot, in slot order
        for k, g in plan[rank * per_process : (rank + 1) * per_process]:
            local_group = g - rank * per_process
            rows.extend((k, local_group * G + i) for i in range(G))
        merged: dict[str, Any] = {}
        pad_id = self._tokenizer.pad_token_id
        for key, value in first.items():
            if key == "num_items_in_batch" or value is None:
                continue
            values = [out[key] for out in outputs]
            if key in PER_ROW or key in per_sequence or values[0].dim() < 2 or len({v.size(1) for v in values}) == 1:
                stacked = values  # nothing to pad (any round's width, e.g. a 1-token one, may be the narrowest)
            else:
                width = max(v.size(1) for v in values)
                fill = pad_id if key in ("prompt_ids", "completion_ids") else (1 if key == "tool_mask" else 0)
                side = (1, 0) if key in LEFT_PADDED else (0, 1)
                stacked = [F.pad(v, tuple(s * (width - v.size(1)) for s in side), value=fill) for v in values]
            merged[key] = torch.stack([stacked[k][i] for k, i in rows])
        if self.pad_to_multiple_of is None:  # drop columns that are padding on every kept row (as TRL pads)
            keep = merged["prompt_mask"].bool().any(dim=0)
            start = int(keep.float().argmax()) if keep.any() else keep.numel()
            for key in LEFT_PADDED:
                merged[key] = merged[key][:, start:]
            used = merged["completion_mask"].bool().any(dim=0)
            width = merged["completion_ids"].size(1)
            # An all-masked batch (e.g. mask_truncated_completions with every completion truncated) keeps its width,
            # as TRL's own batch does: width 0 would make the forward pass logits_to_keep=0, "keep every position".
            end = int(used.nonzero().max()) + 1 if used.any() else width
            for key in (RIGHT_PADDED & set(merged)) - per_sequence:
                if merged[key].dim() == 2 and merged[key].size(1) == width:
                    merged[key] = merged[key][:, :end]
        mask = merged["completion_mask"]
        loss_mask = mask if merged.get("tool_mask") is None else mask * merged["tool_mask"]
        merged["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return merged

    def _log_merged_rewards(self, batch: GenerationBatch, logged: dict[str, int], share: float | None) -> None:
        """Make the step's reward metrics describe the batch assembled from several rounds (written once), in place
        of the entries TRL and :meth:`_fix_logged_batch` wrote for each round (``logged``: the entry counts after
        the first round)."""
        metrics = self._metrics[batch.mode]
        keys = ["reward", "reward_std", "frac_reward_zero_std"]
        keys += [f"rewards/{name}/{stat}" for name in self.reward_func_names for stat in ("mean", "std")]
        for key in keys:  # drop this step's entries, the first round's included (``logged`` counts them)
            del metrics[key][max(0, logged.get(key, 0) - 1) :]
        flat = batch.rewards.reshape(-1)
        if share is None:
            share = zero_std_mask(batch.rewards, scale=self.scale_rewards).float().mean().item()
        metrics["reward"].append(torch.nanmean(flat).item())
        metrics["reward_std"].append(nanstd(flat).item())
        metrics["frac_reward_zero_std"].append(share)
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(batch.rewards_per_func[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(batch.rewards_per_func[:, i]).item())

    # ------------------------------------------------------------------ the rows kept
    def _keep_rows(self, batch: GenerationBatch) -> None:
        """Keep this process's selected rows of the output (every row-aligned tensor and list).

        TRL's collectives need equal local batches split into ``steps_per_generation`` equal chunks, so every process
        is padded to the same row count with inert rows (a copy of a local row whose completion mask is zeroed: no
        gradient, no count, no metric). ``batch.kept_rows`` holds each row's global flat index (-1 for padding);
        completion columns that only held dropped rows' padding are trimmed. ``batch.generated_tokens`` is this
        process's valid completion tokens before selection.
        """
        output = batch.output
        if any(output.get(k) is not None for k in FORWARD_KEYS if k not in ("token_type_ids", "mm_token_type_ids")):
            raise NotImplementedError(
                f"{self._name} drops rollouts from the batch; multimodal batches are not supported."
            )
        device = output["completion_ids"].device
        num_local = output["completion_ids"].size(0)
        batch.generated_tokens = output["completion_mask"].sum()  # this process's, before selection
        chunks = self.args.steps_per_generation if batch.mode == "train" else 1
        process = self.accelerator.process_index
        index, real = padded_local_rows(
            batch.keep.to(device), num_local, self.accelerator.num_processes, process, chunks
        )
        for key, value in output.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == num_local:
                output[key] = value[index]
            elif isinstance(value, list) and len(value) == num_local:
                output[key] = [value[i] for i in index.tolist()]
        output["completion_mask"] = output["completion_mask"] * real[:, None].to(output["completion_mask"].dtype)
        if batch.early:  # the kept-rows forwards left NaN on inert rows and past the kept rows' longest completion
            for key in ("old_per_token_logps", "ref_per_token_logps"):
                if output.get(key) is not None:  # masked positions: a finite value keeps TRL's masked sums finite
                    output[key] = torch.nan_to_num(output[key], nan=0.0)
        batch.padding_rows = int((~real).sum())
        batch.kept_rows = torch.where(real, process * num_local + index, -1)
        adv = output["advantages"]
        output["advantages"] = adv * real.view(-1, *([1] * (adv.dim() - 1))).to(adv.dtype)
        self._trim_completion_columns(output)

    def _trim_completion_columns(self, output: dict[str, Any]) -> None:
        """Drop trailing completion columns that only held dropped rollouts' tokens (right padding: the positions of
        the remaining tokens, hence their log-probs, do not change).

        At least two columns stay: TRL 1.16's loss reads a one-column tensor as one value per sequence and then
        ignores the mask (``global_masked_mean``), so a process whose rows are all inert padding would log their KL
        and entropy as if they were real tokens."""
        mask = output["completion_mask"]
        width = mask.size(1)
        used = mask.any(0).nonzero()
        new = max(int(used.max()) + 1 if used.numel() else 1, 2)
        if self.pad_to_multiple_of:
            new = min(width, -(-new // self.pad_to_multiple_of) * self.pad_to_multiple_of)
        if new >= width:
            return
        for key, value in output.items():
            if key.startswith("prompt") or not isinstance(value, torch.Tensor) or value.dim() < 2:
                continue
            if value.size(1) == width:
                output[key] = value[:, :new]

    def _fix_logged_batch(self, batch: GenerationBatch) -> None:
        """Make TRL's logged advantages and reward statistics describe what was trained on."""
        advantages, rewards, output = batch.advantages, batch.rewards, batch.output
        if advantages.dim() == 2:  # per-token: log each completion's mean over its valid tokens
            mask = gather(pad_across_processes(output["completion_mask"], dim=1)).to(advantages.dtype)
            width = min(mask.size(1), advantages.size(1))
            mask, tokens = mask[:, :width], advantages[:, :width]
            advantages = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1)
        logged = self._logs["advantages"]
        for _ in range(min(len(logged), advantages.numel())):
            logged.pop()
        logged.extend(advantages.tolist())
        metrics = self._metrics[batch.mode]
        flat = rewards.reshape(-1)
        is_std_zero = zero_std_mask(rewards, scale=self.scale_rewards)
        if self.multi_objective_aggregation == "normalize_then_sum":
            is_std_zero = torch.isclose(nanstd(flat), torch.zeros(())).expand_as(flat)
        metrics["reward"][-1] = torch.nanmean(flat).item()
        metrics["reward_std"][-1] = nanstd(flat).item()
        metrics["frac_reward_zero_std"][-1] = is_std_zero.float().mean().item()

    # ================================================================== micro-batches and the loss
    def _prepare_inputs(self, generation_batch):
        previous = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self._mode == "train":
            if self._buffered_inputs is not previous:  # a new generation batch was split into micro-steps
                self.prepare_micro_batches([self.micro_batch(chunk) for chunk in self._buffered_inputs])
        else:
            self.prepare_micro_batches([self.micro_batch(inputs)])
        return inputs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = self._mode
        generations = self.num_generations if mode == "train" else self.num_generations_eval
        call = LossCall(
            self.micro_batch(inputs),
            micro_step=self._step,
            global_step=self.state.global_step,
            seed=self.args.seed,
            num_generations=generations,
            num_processes=self.accelerator.num_processes,
        )
        self._loss_call = call
        try:
            loss = super().compute_loss(model, call._data, return_outputs, num_items_in_batch)
        finally:
            self._loss_call = None
        if not call.forwarded and (
            self._overrides("transform_loss_forward") or self.loss_term is not None or self.surrogate is not None
        ):
            raise RuntimeError(
                f"{getattr(self, '_name', self.method_name)}: TRL's loss did not make its policy forward before reading "
                "the advantages, so the method's loss-forward stage could not run and the loss would train on "
                f"unchanged advantages. {self.loss_forward_fix}"
            )
        if call.extra_loss is not None:
            train = mode == "train"
            loss = loss + aggregate_token_loss(
                call.extra_loss,
                call.loss_mask,
                self.loss_type,
                num_items_in_batch=call.num_items_in_batch,
                num_processes=self.accelerator.num_processes,
                accumulation=self.current_gradient_accumulation_steps if train else 1.0,
                steps_per_generation=self.args.steps_per_generation if train else 1,
                max_completion_length=self.max_completion_length,
            )
        if call.surrogate_clips is not None:
            log_surrogate_clips(self, call)
        return loss

    def _overrides(self, stage: str) -> bool:
        return getattr(type(self), stage) is not getattr(GRPOFamilyTrainer, stage)

    # ------------------------------------------------------------------ the loss-term stage
    def _check_loss_term(self) -> None:
        """A loss term is added to TRL's per-token loss as TRL aggregates it; refuse the settings where TRL would
        also multiply the per-token loss by a mask the term does not see."""
        if self.loss_term is None:
            return
        get_loss_term(self.loss_term)  # registered
        problems = []
        if self.loss_type not in LOSS_TYPES:
            problems.append(f"loss_type={self.loss_type!r} (one of {LOSS_TYPES})")
        if self.top_entropy_quantile != 1.0:
            problems.append(f"top_entropy_quantile={self.top_entropy_quantile} (1.0)")
        if self.off_policy_mask_threshold is not None:
            problems.append(f"off_policy_mask_threshold={self.off_policy_mask_threshold} (None)")
        if problems:
            raise ValueError(
                f"{self.method_name} adds its loss term to TRL's per-token loss; these settings mask that loss in "
                f"ways the term does not follow: {', '.join(problems)}. Use the values in brackets."
            )

    def _apply_loss_term(self, call: LossCall) -> None:
        """The registered loss term over the rows of this loss call on every process (gathered; this process's rows
        carry the gradient), its result sliced back to this process's rows."""
        term = get_loss_term(self.loss_term)
        logps = call.logps
        rows, width = logps.shape
        old = call.old_logps if call.old_logps is not None else logps.detach()
        every = gather_padded(logps.detach().float())
        start = self.accelerator.process_index * rows
        mine = F.pad(logps.float(), (0, every.size(1) - width))
        every = torch.cat([every[:start], mine, every[start + rows :]])  # this process's rows with their gradient
        advantages = call.advantages
        out = term(
            every,
            gather_padded(old.detach().float()),
            gather_padded(advantages.detach()),
            gather_padded(call.loss_mask.to(torch.int32)).bool(),
            generator=call.generator(self.loss_term) if term.sampled else None,
            **self.loss_term_options(),
        )
        if out.advantages is not None:
            call.advantages = out.advantages[start : start + rows, :width].to(advantages.dtype)
        if out.per_token_loss is not None:
            extra = out.per_token_loss[start : start + rows, :width].to(logps.dtype)
            ratio = call.importance_sampling_ratio
            if ratio is not None and self.loss_type != "vespo":  # as TRL weighs its per-token policy loss
                extra = extra * ratio
            call.extra_loss = extra
        for name, value in out.metrics.items():
            self.log_method_metric(name, float(value))

    # ================================================================== run lifecycle
    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card (method name, tags, paper title, id and citation) plus hyperparameters and final metrics."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        path = os.path.join(self.args.output_dir, "README.md")
        if not self.is_world_process_zero() or not os.path.exists(path):
            return
        section = training_details(
            self.args,
            self._card_base_config,
            self.state.log_history,
            name=self._name,
            method_name=self.method_name,
            paper=self._paper,
        )
        with open(path, "a") as f:
            f.write(section)
