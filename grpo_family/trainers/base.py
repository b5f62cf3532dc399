"""``GRPOFamilyTrainer``: TRL's ``GRPOTrainer`` plus the extension points every method builds on.

TRL 1.16 computes advantages inline in ``_generate_and_score_completions``. Rather than copy that method, the
base class lets it run, keeps the globally gathered rewards it computed (``_calculate_rewards`` is the one place
they pass through), and runs the named stages of :class:`GRPOFamilyTrainer` on them (the advantages, the rows kept,
per-token weights, the loss inputs). The default stages are TRL's own maths (``algorithms.grpo``), so ``grpo``
here trains bit-for-bit like stock TRL.

The base class also contains trouble instead of letting it corrupt a run; each part lives in its own module:

* rows with an empty prompt, or reward functions that need a missing column, stop the run at init
  (:mod:`.setup_checks`), before any generation;
* reward functions (sync or async) are guarded (:mod:`.reward_guards`): an exception or a non-finite or
  non-numeric value on some completions turns them into "unscorable" (NaN reward, zero advantage) with a warning
  and a ``reward_errors/<name>`` metric; so does a non-finite value of a reward model; a function that fails on
  *every* completion of the first batch (or returns the wrong number of values, or no number at all) is a set-up
  bug and stops the run before any update, with its name in the message;
* runs that cannot learn stop or warn (:mod:`.unlearnable`);
* a step whose gradients are not finite is skipped (no parameter changes) and counted in ``skipped_steps``
  (:mod:`.nonfinite_guard`);
* checkpoints resume exactly (:mod:`.resume`), the hub token never reaches disk (:mod:`.redaction`), and the
  model card lists the method's hyperparameters (:mod:`.model_card`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch
from accelerate.utils import gather, pad_across_processes
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import is_async_callable, nanstd

from ..algorithms.estimators import get_estimator
from ..algorithms.grpo import group_advantages, normalize_then_sum_advantages, weighted_reward_sum, zero_std_mask
from ..bounds import check_bounds
from ..launch import check_distributed_launch
from ..models import resolve_model
from ..preflight import check_enough_rows
from ..rewards.timeout import with_timeout
from ..run_folder import PlainLogHistoryMixin
from .model_card import ModelCardMixin
from .nonfinite_guard import NonFiniteStepGuardMixin
from .redaction import _UnpickledSecret
from .resume import COMPLETE_MARKER, EpochAlignedSampler, ResumableTrainerMixin, latest_complete_checkpoint
from .reward_guards import AsyncGuardedReward, GuardedReward, RewardFunctionError
from .setup_checks import check_prompts, check_reward_columns, is_empty_prompt
from .stages import GenerationStage, local_rows, padded_local_rows, stage_generator
from .unlearnable import LearnablePolicyMixin, UnlearnableRunError
from .vllm_cpu import check_vllm_settings, install_cpu_weight_sync

logger = logging.getLogger(__name__)

# The public names that lived here before their modules were split off stay importable from here.
__all__ = [
    "COMPLETE_MARKER",
    "FORWARD_KEYS",
    "AsyncGuardedReward",
    "EpochAlignedSampler",
    "GRPOFamilyConfig",
    "GRPOFamilyTrainer",
    "GuardedReward",
    "RewardFunctionError",
    "UnlearnableRunError",
    "is_empty_prompt",
    "latest_complete_checkpoint",
]


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


class GRPOFamilyTrainer(
    ResumableTrainerMixin,
    LearnablePolicyMixin,
    NonFiniteStepGuardMixin,
    ModelCardMixin,
    PlainLogHistoryMixin,
    GRPOTrainer,
):
    """GRPO (Shao et al., 2024) through the grpo_family extension points; the base of every method.

    A method is a set of named stages (``trainers/stages.py``), called in this order: :meth:`_compute_advantages`
    (advantages from the gathered rewards; :meth:`_estimate` gives any registered estimator's),
    :meth:`_select_rows` (rows to train on; a method that selects rows is scored before TRL's no-grad forwards, which
    then cover its kept rows only), :meth:`_weight_advantages` (per-token advantages from TRL's batch),
    :meth:`_finish_generation_batch` (per-row extras), :meth:`_micro_batches_stage` (per micro-step entries),
    :meth:`_loss_inputs_stage` (per loss call) and :meth:`_loss_forward_stage` (the loss forward's log-probs and
    entropies, before TRL's loss reads them). Methods override stages, never TRL's private helpers; a method whose
    loss is not TRL's overrides :meth:`compute_loss`.
    """

    method_name = "grpo"
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
        timeout = self._family_arg("reward_timeout")
        for i, func in enumerate(self.reward_funcs):
            if not isinstance(func, torch.nn.Module):
                if timeout and not hasattr(func, "reward_deadline"):
                    func = with_timeout(func, timeout)
                guard = AsyncGuardedReward if is_async_callable(func) else GuardedReward
                self.reward_funcs[i] = guard(func, self.reward_func_names[i], self._on_reward_error)
        self._reward_context: dict[str, Any] | None = None
        # Stage state of the generation batch / loss call in progress (see trainers/stages.py).
        self._generation_inputs: list | None = None
        self._generation_rows: torch.Tensor | None = None
        self._early_rewards: torch.Tensor | None = None
        self._stage: GenerationStage | None = None
        self._pending_loss_inputs: dict[str, Any] | None = None
        self._streaks = {"unscorable": 0, "degenerate": 0}
        self._skip_nonfinite_steps = self.is_deepspeed_enabled is False
        if getattr(self.args, "hub_token", None) and not isinstance(self.args.hub_token, _UnpickledSecret):
            # transformers pickles the whole config into training_args.bin of every checkpoint and of the final
            # model (and uploads it with push_to_hub): keep the token usable in memory, never written to disk.
            self.args.hub_token = _UnpickledSecret(self.args.hub_token)

    def _family_arg(self, name: str) -> Any:
        """A :class:`GRPOFamilyConfig` field of ``self.args``, or its default for a plain ``GRPOConfig``."""
        return getattr(self.args, name, _FAMILY_DEFAULTS[name])

    # ------------------------------------------------------------------ metrics
    @property
    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def log_method_metric(self, name: str, value: float) -> None:
        """Record a method metric; it reaches ``report_to`` backends as ``<method>/<name>``."""
        self._metrics[self._mode][f"{self.method_name}/{name}"].append(float(value))

    # ------------------------------------------------------------------ forwards over a generation batch
    @staticmethod
    def _loss_mask(batch: dict[str, Any]) -> torch.Tensor:
        """The mask TRL's loss uses: ``completion_mask`` x ``tool_mask``."""
        mask = batch["completion_mask"]
        return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]

    def _batch_logps_and_entropies(
        self, model, batch: dict[str, Any], *, batch_size: int | None = None, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """TRL's per-token log-probs (and entropies) of a generation batch's completions: the same helper, hence
        the same temperature scaling, as TRL's own forwards, with the multimodal inputs passed on as TRL does."""
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
            batch["completion_ids"].size(1),
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            **{key: batch.get(key) for key in FORWARD_KEYS},
        )
        return logps, entropies

    @torch.no_grad()
    def _no_grad_logps_and_entropies(
        self, batch: dict[str, Any], *, batch_size: int, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One extra no-grad forward of the current policy over ``batch``, as TRL makes its old log-probs."""
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            return self._batch_logps_and_entropies(
                self.model, batch, batch_size=batch_size, compute_entropy=compute_entropy
            )

    def _on_reward_error(self, name: str, count: int, reason: str) -> None:
        logger.warning("Reward function '%s' could not score %d completion(s): %s", name, count, reason)
        self._metrics[self._mode][f"reward_errors/{name}"].append(float(count))

    # ------------------------------------------------------------------ stages (see trainers/stages.py)
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._early_rewards is not None:  # scored before TRL's forwards (a method that selects rows)
            rewards_per_func, self._early_rewards = self._early_rewards, None
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
        self._reward_context = {
            "inputs": inputs,
            "prompts": prompts,
            "completions": completions,
            "completion_ids_list": completion_ids_list,
            "rewards_per_func": rewards_per_func,
        }
        return rewards_per_func

    def _compute_advantages(self, rewards: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """The advantage stage: advantages for the globally gathered ``rewards`` ``(num_prompts, num_generations)``.

        NaN marks an unscorable completion. ``batch`` holds the local ``inputs``/``prompts``/``completions``, the
        gathered ``rewards_per_func``, ``num_generations`` and ``mode`` and, except for a method that selects rows
        (scored before TRL's forwards), this process's slice of the generation batch (``completion_mask``,
        ``old_per_token_logps``, ...). A method that changes the rewards themselves stores the new ``(num_prompts,
        num_generations)`` tensor in ``batch["rewards"]`` so the logged reward metrics describe what was trained on,
        and names a scorer of its own that failed on every completion it was asked to score in
        ``batch["stage_extras"]["failing"]`` (the policy for runs that cannot learn counts it like a failing reward
        function).
        Return ``(num_prompts, num_generations)`` or, for per-token advantages, ``(num_prompts, num_generations,
        T)`` zero-padded on the right.
        """
        if self.multi_objective_aggregation == "normalize_then_sum":
            per_func = batch["rewards_per_func"].view(*rewards.shape, -1)
            return normalize_then_sum_advantages(per_func, self.reward_weights).view_as(rewards)
        return group_advantages(rewards, scale=self.scale_rewards)

    def _estimate(self, name: str, rewards: torch.Tensor, batch: dict[str, Any], options: dict[str, Any]):
        """Advantages of the registered estimator ``name`` (``algorithms.estimators``) with ``options``, for methods
        that filter or reweight any estimator's advantages. ``grpo`` without options is this class's own stage (TRL's
        maths: ``scale_rewards``, ``multi_objective_aggregation``); a sampled estimator draws from
        :meth:`_stage_generator`."""
        if name == "grpo" and not options:
            return GRPOFamilyTrainer._compute_advantages(self, rewards, batch)
        estimator = get_estimator(name)
        generator = self._stage_generator(name) if estimator.sampled else None
        return estimator(rewards, generator=generator, **options)

    def _stage_generator(self, name: str) -> torch.Generator:
        """The generator of a stage's sampled draws (:func:`~grpo_family.trainers.stages.stage_generator`), keyed by
        ``(name, args.seed, global_step, slot)``: ``slot`` is 0 in evaluation and ``1 + self._step`` in training (TRL's
        micro-step counter at generation time tells apart generation batches that share an optimizer step, and it is
        part of every checkpoint), so every process draws alike and a resumed run draws what the uninterrupted one
        drew, with no state of its own; an evaluation consumes nothing that training draws from."""
        slot = 1 + self._step if self._mode == "train" else 0
        return stage_generator(name, self.args.seed, self.state.global_step, slot)

    # A method that overrides _select_rows sets this: its batches are scored before TRL's no-grad forwards.
    selects_rows = False

    def _select_rows(self, advantages: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor | None:
        """The row-selection stage: sorted global flat indices (``b * G + i``) of the rows to train on, from the
        flat global ``advantages``; None trains on every row. ``batch`` is the advantage stage's, plus
        ``masked_rows``: gathered (P * G,) bools, True where TRL masks the whole completion out of the loss
        (``mask_truncated_completions``), and ``stage_extras``, the dict that becomes the stage's ``extras`` (what the
        later stages of this batch need from the selection)."""
        return None

    def _weight_advantages(self, stage: GenerationStage, batch: dict[str, Any]) -> torch.Tensor:
        """The token-weight stage: the flat global advantages trained on, from the advantage stage's ``stage.advantages``
        and this process's generation ``batch`` (TRL's output: ``completion_mask``, ``old_per_token_logps``, ... plus
        the reward context and ``mode``). Return ``(P * G,)`` or per token ``(P * G, T)``. Default: unchanged."""
        return stage.advantages

    def _finish_generation_batch(self, output: dict[str, Any], stage: GenerationStage) -> None:
        """The batch-finish stage: per-row extras of this process's trained rows (``output``, after selection)."""

    def _micro_batches_stage(self, chunks: list[dict[str, Any]]) -> None:
        """The micro-batch stage: called once per generation batch with the micro-steps TRL split it into (shuffled;
        one chunk in evaluation), before the first loss call; may add per-chunk entries (e.g. loss denominators)."""

    def _prepare_inputs(self, generation_batch):
        previous = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self._mode == "train":
            if self._buffered_inputs is not previous:  # a new generation batch was split into micro-steps
                self._micro_batches_stage(self._buffered_inputs)
        else:
            self._micro_batches_stage([inputs])
        return inputs

    def _advantage_stage(self, batch: dict[str, Any], early: bool) -> GenerationStage:
        """Run the advantage and row-selection stages on one generation batch's gathered rewards."""
        mode = batch["mode"]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        rewards_per_func = batch["rewards_per_func"]
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = weighted_reward_sum(rewards_per_func, weights).view(-1, num_generations)
        batch["num_generations"] = num_generations
        extras = batch["stage_extras"] = {}
        advantages = torch.nan_to_num(self._compute_advantages(rewards, batch), nan=0.0)
        flat = advantages.reshape(rewards.numel(), *advantages.shape[2:])
        keep = self._select_rows(flat, batch) if self.selects_rows else None
        return GenerationStage(
            rewards=rewards,
            rewards_per_func=rewards_per_func,
            trained_rewards=batch.get("rewards", rewards),
            advantages=flat,
            num_generations=num_generations,
            mode=mode,
            keep=keep,
            early=early,
            extras=extras,
        )

    def _generate(self, prompts):
        # TRL computes its old and reference log-probs right after generating, before any reward exists (TRL 1.16,
        # GRPOTrainer._generate_and_score_completions). A method that selects rows is scored here instead, between
        # the generation and those forwards, so that they run over the rows it keeps (``_get_per_token_logps_and_
        # entropies`` below); TRL's own ``_calculate_rewards`` call then gets these rewards back.
        result = super()._generate(prompts)
        inputs = self._generation_inputs
        if inputs is None or not self.selects_rows:
            return result
        self._generation_inputs = None  # scored once per generation round
        _, completion_ids_list, _, completions, _, extra_fields, _, _ = result
        for i, row in enumerate(inputs):  # what TRL merges into the reward inputs after its forwards
            for key, values in (extra_fields or {}).items():
                if isinstance(values, list) and i < len(values):
                    row[key] = values[i]
                elif not isinstance(values, list):
                    row[key] = values
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = self._mode
        masked = [len(ids) == 0 for ids in completion_ids_list]
        if self.mask_truncated_completions:
            ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
            masked = [m or ids[-1] not in ends for m, ids in zip(masked, completion_ids_list)]
        device = self.accelerator.device
        masked_rows = gather(torch.tensor(masked, dtype=torch.int32, device=device)).bool()
        batch = {**self._reward_context, "mode": mode, "masked_rows": masked_rows}
        self._stage = self._advantage_stage(batch, early=True)
        self._early_rewards = rewards_per_func
        if self._stage.keep is not None:
            num_local, processes = len(completion_ids_list), self.accelerator.num_processes
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:  # sharded forwards are collective: equal counts
                rows, _ = padded_local_rows(
                    self._stage.keep.to(device), num_local, processes, self.accelerator.process_index, 1
                )
            else:
                rows = local_rows(self._stage.keep.to(device), num_local, self.accelerator.process_index)
            self._generation_rows = rows
        return result

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        rows = self._generation_rows
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
        inputs = self._pending_loss_inputs
        if inputs is not None and entropies is not None:  # the policy forward of the loss call in progress
            self._pending_loss_inputs = None
            logps, entropies = self._loss_forward_stage(inputs, logps, entropies)
        return logps, entropies, aux

    def _loss_inputs_stage(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The loss-inputs stage: what one loss call hands to TRL's loss (default: ``inputs`` as they are)."""
        return inputs

    def _loss_forward_stage(
        self, inputs: dict[str, Any], logps: torch.Tensor, entropies: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss-forward stage: the per-token log-probs and entropies of the loss call's own policy forward, before
        TRL's loss reads them and ``inputs["advantages"]`` (which this stage may replace). Default: unchanged."""
        return logps, entropies

    def _needs_loss_forward(self, inputs: dict[str, Any]) -> str | None:
        """Why this loss call cannot train without :meth:`_loss_forward_stage` (the error message), or None."""
        return None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = self._loss_inputs_stage(inputs)
        self._pending_loss_inputs = inputs
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            missed, self._pending_loss_inputs = self._pending_loss_inputs, None
        if missed is not None and (message := self._needs_loss_forward(missed)):
            raise RuntimeError(message)
        return loss

    def _next_round_inputs(self, rounds: list[tuple[dict[str, Any], GenerationStage]]) -> list | None:
        """The generation-rounds stage: this process's inputs for one more generation round of the same batch (e.g.
        GPG's resampling of degenerate groups), given the rounds scored so far as ``(output, stage)``; None when the
        batch is complete (default: one round). Must decide alike on every process (from global stage results)."""
        return None

    def _merge_generation_rounds(
        self, rounds: list[tuple[dict[str, Any], GenerationStage]]
    ) -> tuple[dict[str, Any], GenerationStage]:
        """The batch trained on, assembled from several generation rounds: this process's output and the global
        stage (rewards, ``rewards_per_func``, advantages) of the assembled batch."""
        raise NotImplementedError(f"{type(self).__name__} asked for several generation rounds but cannot merge them.")

    def _degenerate_share(self, rewards: torch.Tensor) -> float:
        """The logged ``frac_reward_zero_std`` of ``rewards`` assembled from several rounds."""
        return zero_std_mask(rewards, scale=self.scale_rewards).float().mean().item()

    def _score_round(self, inputs) -> tuple[dict[str, Any], GenerationStage]:
        """One generation round: TRL's generation and scoring, then the advantage, row-selection (scored early for a
        method that selects rows) and token-weight stages; this process's advantages written into the output."""
        self._generation_inputs, self._stage = inputs, None
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._generation_inputs, self._generation_rows, self._early_rewards = None, None, None
        stage, self._stage = self._stage, None
        context, self._reward_context = self._reward_context, None
        batch = {**output, **context, "mode": self._mode}
        if stage is None:
            stage = self._advantage_stage(batch, early=False)
        stage.advantages = self._weight_advantages(stage, batch)
        self._write_advantages(output, stage)
        self._fix_logged_batch(stage.advantages, stage.trained_rewards, output, stage.mode)
        if stage.mode == "train":
            signals = self._batch_signals(stage.rewards, stage.advantages)
            signals["failing"] = [*signals["failing"], *stage.extras.get("failing", [])]
            stage.extras["signals"] = signals
        return output, stage

    def _write_advantages(self, output: dict[str, Any], stage: GenerationStage) -> None:
        """This process's slice of the stage's global advantages, as ``output["advantages"]``."""
        num_local = output["completion_ids"].size(0)
        start = self.accelerator.process_index * num_local
        local = stage.advantages[start : start + num_local]
        if local.dim() == 2:  # per-token: match this process's completion length
            width = output["completion_ids"].size(1)
            local = torch.nn.functional.pad(local[:, :width], (0, max(0, width - local.size(1))))
        output["advantages"] = local.to(output["completion_ids"].device)

    def _log_merged_rewards(self, stage: GenerationStage, logged: dict[str, int]) -> None:
        """Make the step's reward metrics describe the batch assembled from several rounds (written once), in place
        of the entries TRL and :meth:`_fix_logged_batch` wrote for each round (``logged``: the entry counts after
        the first round)."""
        metrics = self._metrics[stage.mode]
        keys = ["reward", "reward_std", "frac_reward_zero_std"]
        keys += [f"rewards/{name}/{stat}" for name in self.reward_func_names for stat in ("mean", "std")]
        for key in keys:  # drop this step's entries, the first round's included (``logged`` counts them)
            del metrics[key][max(0, logged.get(key, 0) - 1) :]
        flat = stage.trained_rewards.reshape(-1)
        metrics["reward"].append(torch.nanmean(flat).item())
        metrics["reward_std"].append(nanstd(flat).item())
        metrics["frac_reward_zero_std"].append(self._degenerate_share(stage.trained_rewards))
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(stage.rewards_per_func[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(stage.rewards_per_func[:, i]).item())

    def _generate_and_score_completions(self, inputs):
        rounds = [self._score_round(inputs)]
        logged = {k: len(v) for k, v in self._metrics[rounds[0][1].mode].items()}
        while (more := self._next_round_inputs(rounds)) is not None:
            rounds.append(self._score_round(more))
        output, stage = rounds[0]
        if len(rounds) > 1:
            output, stage = self._merge_generation_rounds(rounds)
            self._write_advantages(output, stage)
            self._log_merged_rewards(stage, logged)
        stage.extras["rounds"] = len(rounds)
        if stage.mode == "train":  # the policy for runs that cannot learn, on the batch trained on
            signals = [s.extras["signals"] for _, s in rounds]
            failing = [name for name in signals[0]["failing"] if all(name in x["failing"] for x in signals)]
            self._apply_learnable_policy(
                {
                    "unscorable": bool(torch.isnan(stage.rewards).all()),
                    "failing": failing,
                    "degenerate": not bool(stage.advantages.abs().gt(0).any()),
                }
                if len(rounds) > 1
                else signals[0]
            )
        if stage.keep is not None:
            self._keep_rows(output, stage)
        self._finish_generation_batch(output, stage)
        return output

    def _keep_rows(self, output: dict[str, Any], stage: GenerationStage) -> None:
        """Keep this process's selected rows of ``output`` (every row-aligned tensor and list).

        TRL's collectives need equal local batches split into ``steps_per_generation`` equal chunks, so every process
        is padded to the same row count with inert rows (a copy of a local row whose completion mask is zeroed: no
        gradient, no count, no metric). ``output["kept_rows_global"]`` holds each row's global flat index (-1 for padding); completion columns that
        only held dropped rows' padding are trimmed. ``stage.extras`` gets ``generated_tokens`` (this process's valid
        completion tokens before selection) and ``padding_rows``.
        """
        if any(output.get(k) is not None for k in FORWARD_KEYS if k not in ("token_type_ids", "mm_token_type_ids")):
            raise NotImplementedError(
                f"{self._name} drops rollouts from the batch; multimodal batches are not supported."
            )
        device = output["completion_ids"].device
        num_local = output["completion_ids"].size(0)
        stage.extras["generated_tokens"] = output["completion_mask"].sum()  # this process's, before selection
        chunks = self.args.steps_per_generation if stage.mode == "train" else 1
        process = self.accelerator.process_index
        index, real = padded_local_rows(
            stage.keep.to(device), num_local, self.accelerator.num_processes, process, chunks
        )
        for key, value in output.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == num_local:
                output[key] = value[index]
            elif isinstance(value, list) and len(value) == num_local:
                output[key] = [value[i] for i in index.tolist()]
        output["completion_mask"] = output["completion_mask"] * real[:, None].to(output["completion_mask"].dtype)
        if stage.early:  # the kept-rows forwards left NaN on inert rows and past the kept rows' longest completion
            for key in ("old_per_token_logps", "ref_per_token_logps"):
                if output.get(key) is not None:  # masked positions: a finite value keeps TRL's masked sums finite
                    output[key] = torch.nan_to_num(output[key], nan=0.0)
        stage.extras["padding_rows"] = int((~real).sum())
        output["kept_rows_global"] = torch.where(real, process * num_local + index, -1)
        adv = output["advantages"]
        output["advantages"] = adv * real.view(-1, *([1] * (adv.dim() - 1))).to(adv.dtype)
        self._trim_completion_columns(output)

    def _trim_completion_columns(self, output: dict[str, Any]) -> None:
        """Drop trailing completion columns that only held dropped rollouts' tokens (right padding: the positions of
        the remaining tokens, hence their log-probs, do not change)."""
        mask = output["completion_mask"]
        width = mask.size(1)
        used = mask.any(0).nonzero()
        new = int(used.max()) + 1 if used.numel() else 1
        if self.pad_to_multiple_of:
            new = min(width, -(-new // self.pad_to_multiple_of) * self.pad_to_multiple_of)
        if new >= width:
            return
        for key, value in output.items():
            if key.startswith("prompt") or not isinstance(value, torch.Tensor) or value.dim() < 2:
                continue
            if value.size(1) == width:
                output[key] = value[:, :new]

    def _fix_logged_batch(self, advantages: torch.Tensor, rewards: torch.Tensor, output: dict, mode: str) -> None:
        """Make TRL's logged advantages and reward statistics describe what was trained on."""
        if advantages.dim() == 2:  # per-token: log each completion's mean over its valid tokens
            mask = gather(pad_across_processes(output["completion_mask"], dim=1)).to(advantages.dtype)
            width = min(mask.size(1), advantages.size(1))
            mask, tokens = mask[:, :width], advantages[:, :width]
            advantages = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1)
        logged = self._logs["advantages"]
        for _ in range(min(len(logged), advantages.numel())):
            logged.pop()
        logged.extend(advantages.tolist())
        metrics = self._metrics[mode]
        flat = rewards.reshape(-1)
        is_std_zero = zero_std_mask(rewards, scale=self.scale_rewards)
        if self.multi_objective_aggregation == "normalize_then_sum":
            is_std_zero = torch.isclose(nanstd(flat), torch.zeros(())).expand_as(flat)
        metrics["reward"][-1] = torch.nanmean(flat).item()
        metrics["reward_std"][-1] = nanstd(flat).item()
        metrics["frac_reward_zero_std"][-1] = is_std_zero.float().mean().item()
