"""``GRPOFamilyTrainer``: TRL's ``GRPOTrainer`` plus the extension points every method builds on.

TRL 1.16 computes advantages inline in ``_generate_and_score_completions``. Rather than copy that method, the
base class lets it run, keeps the globally gathered rewards it computed (``_calculate_rewards`` is the one place
they pass through), and then replaces the advantages in the returned batch with ``_compute_advantages``. The
default hook is TRL's own maths (``algorithms.grpo``), so ``grpo`` here trains bit-for-bit like stock TRL.

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

from ..algorithms.grpo import group_advantages, normalize_then_sum_advantages, zero_std_mask
from ..rewards.timeout import with_timeout
from .model_card import ModelCardMixin
from .nonfinite_guard import NonFiniteStepGuardMixin
from .redaction import _UnpickledSecret
from .resume import COMPLETE_MARKER, EpochAlignedSampler, ResumableTrainerMixin, latest_complete_checkpoint
from .reward_guards import AsyncGuardedReward, GuardedReward, RewardFunctionError
from .setup_checks import check_prompts, check_reward_columns, is_empty_prompt
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
        super().__post_init__()
        for name in ("max_unscorable_batches", "max_degenerate_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0 disables the check), got {value!r}.")
        if self.on_unlearnable not in ("stop", "warn"):
            raise ValueError(f"on_unlearnable must be 'stop' or 'warn', got {self.on_unlearnable!r}.")
        if self.reward_timeout is not None and not (0 <= self.reward_timeout < math.inf):
            raise ValueError(f"reward_timeout must be a number of seconds >= 0 or None, got {self.reward_timeout!r}.")


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
    ResumableTrainerMixin, LearnablePolicyMixin, NonFiniteStepGuardMixin, ModelCardMixin, GRPOTrainer
):
    """GRPO (Shao et al., 2024) through the grpo_family extension points; the base of every method.

    Subclasses override :meth:`_compute_advantages` (what the policy is trained on) and, where the loss itself
    changes, :meth:`compute_loss` (preferably by editing ``inputs`` and delegating to ``super()``).
    """

    method_name = "grpo"
    _tag_names = ["trl", "grpo", "grpo_family"]
    _card_base_config = GRPOFamilyConfig

    def __init__(self, *args: Any, **kwargs: Any):
        # GRPOTrainer(model, reward_funcs, args, ...): vLLM settings that cannot work fail before vLLM starts.
        check_vllm_settings(kwargs["args"] if "args" in kwargs else args[2] if len(args) > 2 else None)
        super().__init__(*args, **kwargs)
        install_cpu_weight_sync(self)
        check_prompts(self.train_dataset, self.eval_dataset)
        check_reward_columns(self.train_dataset, self.reward_funcs, self.reward_func_names)
        timeout = self._family_arg("reward_timeout")
        for i, func in enumerate(self.reward_funcs):
            if not isinstance(func, torch.nn.Module):
                if timeout and not hasattr(func, "reward_deadline"):
                    func = with_timeout(func, timeout)
                guard = AsyncGuardedReward if is_async_callable(func) else GuardedReward
                self.reward_funcs[i] = guard(func, self.reward_func_names[i], self._on_reward_error)
        self._reward_context: dict[str, Any] | None = None
        self._streaks = {"unscorable": 0, "degenerate": 0}
        self._defer_learnable_policy = False  # GPG judges its assembled batch, not each generation round
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

    # ------------------------------------------------------------------ advantage hook
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
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
        """Advantages for the globally gathered ``rewards`` ``(num_prompts, num_generations)``.

        NaN marks an unscorable completion. ``batch`` holds this process's slice of the generation batch
        (``completion_mask``, ``old_per_token_logps``, ...), the local ``inputs``/``prompts``/``completions``,
        the gathered ``rewards_per_func`` and ``num_generations``. A method that changes the rewards themselves
        stores the new ``(num_prompts, num_generations)`` tensor in ``batch["rewards"]`` so the logged reward
        metrics describe what was trained on. Return ``(num_prompts, num_generations)`` or, for per-token
        advantages, ``(num_prompts, num_generations, T)`` zero-padded on the right.
        """
        if self.multi_objective_aggregation == "normalize_then_sum":
            per_func = batch["rewards_per_func"].view(*rewards.shape, -1)
            return normalize_then_sum_advantages(per_func, self.reward_weights).view_as(rewards)
        return group_advantages(rewards, scale=self.scale_rewards)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        context, self._reward_context = self._reward_context, None
        mode = self._mode
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        rewards_per_func = context["rewards_per_func"]
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        rewards = rewards.view(-1, num_generations)

        batch = {**output, **context, "num_generations": num_generations, "mode": mode}
        advantages = torch.nan_to_num(self._compute_advantages(rewards, batch), nan=0.0)
        trained_rewards = batch.get("rewards", rewards)

        num_local = len(context["prompts"])
        start = self.accelerator.process_index * num_local
        flat = advantages.reshape(rewards.numel(), *advantages.shape[2:])
        local = flat[start : start + num_local]
        if local.dim() == 2:  # per-token: match this process's completion length
            width = output["completion_ids"].size(1)
            local = torch.nn.functional.pad(local[:, :width], (0, max(0, width - local.size(1))))
        output["advantages"] = local.to(output["completion_ids"].device)
        self._fix_logged_batch(flat, trained_rewards, output, mode)
        if mode == "train":
            self._last_signals = self._batch_signals(rewards, flat)
            if not self._defer_learnable_policy:
                self._apply_learnable_policy(self._last_signals)
        return output

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
