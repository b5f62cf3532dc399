"""``GRPOFamilyTrainer``: TRL's ``GRPOTrainer`` plus the stages every method builds on.

TRL 1.16 computes advantages inline in ``_generate_and_score_completions``. Rather than copy that method, the base
class lets it run, keeps the globally gathered rewards it computed (``_calculate_rewards`` is the one place they
pass through), and runs the stages of :data:`~grpo_family.trainers.stages.STAGES` on them: public methods of
:class:`GRPOFamilyTrainer` that receive a context object (:class:`~grpo_family.trainers.stages.GenerationBatch`,
:class:`~grpo_family.trainers.stages.MicroBatch`, :class:`~grpo_family.trainers.stages.LossCall`). The default stages
are TRL's own maths (``algorithms.grpo``), so ``grpo`` here trains bit-for-bit like stock TRL. This module and its
mixins (``generation_rounds``, ``kept_rows``, ``round_reports``, ``loss_term_stage``) are the one place that reads and
writes TRL's batch keys, metrics and counters; ``docs/architecture.md`` walks through them.

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
* a process that fails tells the others, which stop instead of waiting (:mod:`~grpo_family.runtime.peers`);
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
from accelerate.utils import gather
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import is_async_callable

from ..algorithms.estimators import get_estimator
from ..algorithms.grpo import group_advantages, normalize_then_sum_advantages, weighted_reward_sum
from ..algorithms.losses import aggregate_token_loss
from ..integrations.vllm_cpu import check_vllm_settings, install_cpu_weight_sync
from ..models import resolve_model
from ..preflight import check_enough_rows
from ..rewards.timeout import with_timeout
from ..runtime.model_card import training_details
from ..runtime.nonfinite_guard import NonFiniteGradientGuard
from ..runtime.peers import PeerFailureMixin
from ..runtime.redaction import UnpickledSecret
from ..runtime.resume import ResumableTrainerMixin
from ..runtime.reward_guards import AsyncGuardedReward, GuardedReward
from ..runtime.run_folder import PlainLogHistoryMixin
from ..runtime.setup_checks import check_prompts, check_reward_columns
from ..runtime.unlearnable import UnlearnableRunPolicy
from .batch_keys import FORWARD_KEYS, LEFT_PADDED, PER_ROW, RIGHT_PADDED
from .config import _FAMILY_DEFAULTS, GRPOFamilyConfig
from .generation_rounds import GenerationRoundsMixin
from .kept_rows import KeptRowsMixin
from .loss_term_stage import LossTermStageMixin
from .round_reports import RoundReportsMixin
from .stages import GenerationBatch, LossCall, MicroBatch, RoundAssembly, local_rows, padded_local_rows
from .surrogate_stage import apply_surrogate, check_surrogate, log_surrogate_clips

logger = logging.getLogger(__name__)

# FORWARD_KEYS and the padding sets live in batch_keys.py, GRPOFamilyConfig in config.py; importable from here too.
__all__ = ["FORWARD_KEYS", "GRPOFamilyConfig", "GRPOFamilyTrainer", "LEFT_PADDED", "PER_ROW", "RIGHT_PADDED"]


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


class GRPOFamilyTrainer(
    PeerFailureMixin,
    ResumableTrainerMixin,
    PlainLogHistoryMixin,
    GenerationRoundsMixin,
    KeptRowsMixin,
    RoundReportsMixin,
    LossTermStageMixin,
    GRPOTrainer,
):
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
        unlearnable_options = ("max_unscorable_batches", "max_degenerate_batches", "on_unlearnable")
        self._unlearnable = UnlearnableRunPolicy(*map(self._family_arg, unlearnable_options))
        if self.is_deepspeed_enabled is False:  # DeepSpeed steps inside its engine, with its own overflow handling
            self.add_callback(NonFiniteGradientGuard(lambda: self.record_metric("skipped_steps", 1.0, mode="train")))
        if getattr(self.args, "hub_token", None) and not isinstance(self.args.hub_token, UnpickledSecret):
            # transformers pickles the whole config into training_args.bin of every checkpoint and of the final
            # model (and uploads it with push_to_hub): keep the token usable in memory, never written to disk.
            self.args.hub_token = UnpickledSecret(self.args.hub_token)

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
