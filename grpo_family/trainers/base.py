"""``GRPOFamilyTrainer``: TRL's ``GRPOTrainer`` plus the extension points every method builds on.

TRL 1.16 computes advantages inline in ``_generate_and_score_completions``. Rather than copy that method, the
base class lets it run, keeps the globally gathered rewards it computed (``_calculate_rewards`` is the one place
they pass through), and then replaces the advantages in the returned batch with ``_compute_advantages``. The
default hook is TRL's own maths (``algorithms.grpo``), so ``grpo`` here trains bit-for-bit like stock TRL.

The base class also contains trouble instead of letting it corrupt a run:

* rows with an empty prompt stop the run at init (:func:`is_empty_prompt`), before any generation;
* reward functions (sync or async) are guarded: an exception or a non-finite or non-numeric value on some
  completions turns them into "unscorable" (NaN reward, zero advantage) with a warning and a
  ``reward_errors/<name>`` metric; so does a non-finite value of a reward model; a function that fails on *every*
  completion of the first batch (or returns the wrong number of values, or no number at all) is a set-up bug and
  stops the run before any update, with its name in the message;
* a step whose gradients are not finite is skipped (no parameter changes) and counted in ``skipped_steps``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import re
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import gather, pad_across_processes
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import is_async_callable, nanstd

from ..algorithms.estimators import get_estimator
from ..algorithms.grpo import group_advantages, normalize_then_sum_advantages, zero_std_mask
from ..rewards.timeout import RewardTimeoutError, with_timeout
from .stages import GenerationStage, local_rows, padded_local_rows, stage_generator
from .vllm_cpu import check_vllm_settings, install_cpu_weight_sync

logger = logging.getLogger(__name__)

# Per-process file in each checkpoint with what `GRPOFamilyTrainer._resume_state` returns.
_RESUME_STATE_FILE = "grpo_family_state_{}.pt"
# Written into a checkpoint once every process has finished writing it: a checkpoint without it was cut short.
COMPLETE_MARKER = "grpo_family_checkpoint_complete"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def latest_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` folder of ``output_dir`` that was written completely, or None.

    Complete means it holds :data:`COMPLETE_MARKER`; folders written before the marker existed (no folder of
    ``output_dir`` has one) count as complete when they hold ``trainer_state.json``, the Trainer's last write. Newer
    incomplete folders (a run killed while saving) are skipped with a warning."""
    if not os.path.isdir(output_dir):
        return None
    found = sorted(
        ((int(m.group(1)), os.path.join(output_dir, name)) for name in os.listdir(output_dir)
         if (m := _CHECKPOINT_RE.match(name)) and os.path.isdir(os.path.join(output_dir, name))),
        reverse=True,
    )  # fmt: skip
    marked = any(os.path.exists(os.path.join(path, COMPLETE_MARKER)) for _, path in found)
    required = COMPLETE_MARKER if marked else "trainer_state.json"
    for _, path in found:
        if os.path.exists(os.path.join(path, required)):
            return path
        logger.warning(
            "Skipping %s: it was not written completely (no %s; the run was probably stopped while saving). Resuming "
            "from the newest complete checkpoint instead; delete the folder to silence this.", path, required
        )  # fmt: skip
    return None


# Keyword arguments TRL passes to every reward function that do not come from dataset columns.
_TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}


class _UnpickledSecret(str):
    """A token string that works as one in memory but is pickled as ``""`` and shown as ``'<redacted>'``.

    Copies (``copy``/``deepcopy``) are the object itself, so only serialisation drops the value."""

    def __reduce__(self):
        return (str, ("",))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        return "'<redacted>'"


def _card_value(value: Any) -> Any:
    """A config value as a public model card may show it: credentials in a URL (``https://user:key@host``, e.g. a
    judge's ``judge_base_url``) are masked."""
    return re.sub(r"(?<=://)[^/@\s]+@", "***@", value) if isinstance(value, str) else value


def _blank_content(content: Any) -> bool:
    if content is None:
        return True
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):  # content parts: an image (or any non-text part) is content
        return all(
            isinstance(part, dict) and part.get("type", "text") == "text" and not str(part.get("text") or "").strip()
            for part in content
        )
    return False


def is_empty_prompt(prompt: Any) -> bool:
    """Whether a ``prompt`` column entry asks nothing: a blank string, or a message list whose user messages (all
    messages when there is no user message) have no text and no image. Other types are not judged (False)."""
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        messages = [m for m in prompt if isinstance(m, dict)]
        users = [m for m in messages if m.get("role") == "user"]
        return all(_blank_content(m.get("content")) for m in users or messages)
    return False


class RewardFunctionError(RuntimeError):
    """A reward function is unusable (it fails on every completion, or returns the wrong number of values)."""


class UnlearnableRunError(RuntimeError):
    """A run cannot learn: for ``max_unscorable_batches`` / ``max_degenerate_batches`` generation batches in a row
    nothing could be scored, or every advantage was zero (see :class:`GRPOFamilyConfig`)."""


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


class GuardedReward:
    """Wraps a synchronous TRL reward function so one bad completion cannot stop a run.

    If the function raises on the batch (or, after the first batch, returns the wrong number of values), it is
    called again one completion at a time and only the completions that still fail become ``None`` ("cannot
    score"). A call past its :func:`~grpo_family.rewards.with_timeout` deadline leaves the whole batch ``None``
    without that retry. Values that are not finite numbers (NaN, inf, a string, a list, ...) also become ``None``, and every
    value passed on is a plain ``float``. On the first generation batch (``strict``) a function that fails on
    every completion, returns the wrong number of values, or returns no number at all is a set-up bug: a
    :class:`RewardFunctionError` names it before any update.
    """

    def __init__(self, func: Callable, name: str, on_error: Callable[[str, int, str], None]):
        self.func = func
        self.__name__ = name
        self.on_error = on_error
        self.strict = True
        self.failed = 0  # completions the last call failed on (raised, timed out, non-finite or non-numeric)

    @staticmethod
    def _row_kwargs(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
        return {k: (v[i : i + 1] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}

    @staticmethod
    def _single(value: Any) -> Any:
        """The one value of a one-completion call, or None."""
        try:
            return value[0] if value is not None and len(value) == 1 else None
        except TypeError:  # not a sequence
            return None

    def _call_rows(self, completions: list, kwargs: dict[str, Any]) -> list:
        n = len(completions)
        out = []
        for i in range(n):
            try:
                out.append(
                    self._single(self.func(completions=completions[i : i + 1], **self._row_kwargs(kwargs, i, n)))
                )
            except Exception:  # noqa: BLE001 - a reward function may raise anything
                out.append(None)
        return out

    def _counted(self, values: Any, n: int) -> list:
        """``values`` as a list of ``n``; a :class:`RewardFunctionError` otherwise."""
        try:
            values = list(values) if values is not None else None
        except TypeError:  # e.g. a bare float
            values, got = None, type(values).__name__
        else:
            got = "None" if values is None else len(values)
        if values is None or len(values) != n:
            raise RewardFunctionError(
                f"Reward function '{self.__name__}' returned {got} values for {n} completions; it must return "
                "one value (a float, or None for 'cannot score') per completion."
            )
        return values

    def _after_failure(self, error: Exception, values: list, n: int) -> None:
        """Report the completions a batch-level failure left unscored; on the first batch, a total failure stops."""
        failures = sum(v is None for v in values)
        self.failed += failures
        if self.strict and failures == n:
            raise RewardFunctionError(
                f"Reward function '{self.__name__}' failed on every completion of the first batch "
                f"({type(error).__name__}: {error}). Fix the function (or the dataset columns it reads) before "
                "training."
            ) from error
        self.on_error(self.__name__, failures, f"{type(error).__name__}: {error}")

    def _clean(self, values: list) -> list[float | None]:
        """Plain floats; ``None`` for None, non-finite and non-numeric values (counted and reported)."""
        cleaned: list[float | None] = []
        nonfinite, nonnumeric = 0, []
        for value in values:
            number = None
            if value is not None:
                try:
                    if isinstance(value, str | bytes):  # float("nan") / float("1") would accept text
                        raise TypeError
                    number = float(value)
                except Exception:  # noqa: BLE001 - a list, a dict, a multi-element tensor, ...
                    nonnumeric.append(type(value).__name__)
                else:
                    if not math.isfinite(number):
                        number, nonfinite = None, nonfinite + 1
            cleaned.append(number)
        if nonnumeric and self.strict and len(nonnumeric) == len(values):
            raise RewardFunctionError(
                f"Reward function '{self.__name__}' returned no number on the first batch (values of type "
                f"{sorted(set(nonnumeric))}); it must return a float, or None for 'cannot score', per completion."
            )
        self.failed += len(nonnumeric) + nonfinite
        if nonnumeric:
            self.on_error(self.__name__, len(nonnumeric), f"non-numeric reward ({', '.join(sorted(set(nonnumeric)))})")
        if nonfinite:
            self.on_error(self.__name__, nonfinite, "non-finite reward")
        self.strict = False
        return cleaned

    def _timed_out(self, error: RewardTimeoutError, n: int) -> list:
        """A call past its :func:`~grpo_family.rewards.with_timeout` deadline: the batch is unscored, not retried
        row by row (every row could hang as well), and never fatal (a slow service is not a set-up bug)."""
        self.on_error(self.__name__, n, str(error))
        self.failed += n
        return [None] * n

    def __call__(self, completions: list, **kwargs: Any) -> list:
        n, self.failed = len(completions), 0
        try:
            values = self._counted(self.func(completions=completions, **kwargs), n)
        except RewardTimeoutError as error:
            values = self._timed_out(error, n)
        except Exception as error:  # noqa: BLE001 - contained below
            if isinstance(error, RewardFunctionError) and self.strict:
                raise
            values = self._call_rows(completions, kwargs)
            self._after_failure(error, values, n)
        return self._clean(values)


class AsyncGuardedReward(GuardedReward):
    """:class:`GuardedReward` for an ``async`` reward function (TRL awaits it on its event loop)."""

    async def _call_rows_async(self, completions: list, kwargs: dict[str, Any]) -> list:
        n = len(completions)
        out = []
        for i in range(n):
            try:
                value = await self.func(completions=completions[i : i + 1], **self._row_kwargs(kwargs, i, n))
                out.append(self._single(value))
            except Exception:  # noqa: BLE001
                out.append(None)
        return out

    async def __call__(self, completions: list, **kwargs: Any) -> list:
        n, self.failed = len(completions), 0
        try:
            values = self._counted(await self.func(completions=completions, **kwargs), n)
        except RewardTimeoutError as error:
            values = self._timed_out(error, n)
        except Exception as error:  # noqa: BLE001 - contained below
            if isinstance(error, RewardFunctionError) and self.strict:
                raise
            values = await self._call_rows_async(completions, kwargs)
            self._after_failure(error, values, n)
        return self._clean(values)


def _to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside (nested dicts, lists, tuples) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_device(v, device) for v in value)
    return value


class EpochAlignedSampler(torch.utils.data.Sampler):
    """TRL's ``RepeatSampler`` made resumable: pass ``e`` over the data always uses the ``e``-th shuffle.

    ``RepeatSampler`` draws one permutation per pass from a generator seeded once, so epoch ``e`` of an uninterrupted
    run uses the ``e``-th draw. A run resumed in epoch ``e`` builds a new sampler, and transformers 5 no longer replays
    the skipped epochs, so it would shuffle like epoch 0 and train on other prompts than the uninterrupted run. Before
    each pass this wrapper starts (and abandons) one pass of the wrapped sampler for every epoch it has not seen -- a
    pass draws its permutation first -- so the order is TRL's in both cases. The epoch comes from the trainer state
    (``floor(state.epoch)``; restored from the checkpoint before the dataloader is iterated), which works wherever
    accelerate wraps or skips the batch sampler.
    """

    def __init__(self, sampler: torch.utils.data.Sampler, current_epoch: Callable[[], int]):
        self.sampler = sampler
        self.current_epoch = current_epoch
        self.passes = 0
        if hasattr(sampler, "generator"):  # the same object: accelerate may synchronise it across processes
            self.generator = sampler.generator

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        while self.passes < self.current_epoch():
            next(iter(self.sampler), None)
            self.passes += 1
        self.passes += 1
        yield from self.sampler


class GRPOFamilyTrainer(GRPOTrainer):
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

    def __init__(self, *args: Any, **kwargs: Any):
        # GRPOTrainer(model, reward_funcs, args, ...): vLLM settings that cannot work fail before vLLM starts.
        check_vllm_settings(kwargs["args"] if "args" in kwargs else args[2] if len(args) > 2 else None)
        super().__init__(*args, **kwargs)
        install_cpu_weight_sync(self)
        self._check_prompts()
        self._check_reward_columns()
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

    # ------------------------------------------------------------------ runs that cannot learn
    def _batch_signals(self, rewards: torch.Tensor, advantages: torch.Tensor) -> dict[str, Any]:
        """What the policy for runs that cannot learn judges, from the gathered ``rewards`` and ``advantages`` of one
        generation batch and each reward function's failures (summed over processes): the same on every process."""
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

    def _apply_learnable_policy(self, signals: dict[str, Any]) -> None:
        """Count generation batches in a row that cannot teach anything; at the configured limit stop the run
        (:class:`UnlearnableRunError`) or warn, as ``on_unlearnable`` says."""
        unscorable = signals["unscorable"] or bool(signals["failing"])
        self._streaks["unscorable"] = self._streaks["unscorable"] + 1 if unscorable else 0
        self._streaks["degenerate"] = self._streaks["degenerate"] + 1 if signals["degenerate"] else 0
        message = None
        limit, streak = self._family_arg("max_unscorable_batches"), self._streaks["unscorable"]
        if limit and streak and streak % limit == 0:
            what = (
                f"reward function(s) {', '.join(repr(n) for n in signals['failing'])} failed on every completion "
                "it was asked to score"
                if signals["failing"]
                else "no completion could be scored (every reward function returned None/NaN or failed)"
            )
            message = (
                f"The run cannot learn: for {streak} generation batches in a row {what}. Check the reward functions "
                "against the dataset columns they read (the reward_errors/<name> metric and the warnings above name "
                "the error), or the service a reward calls; raise max_unscorable_batches, or set "
                "on_unlearnable='warn' to train on regardless."
            )
        limit, streak = self._family_arg("max_degenerate_batches"), self._streaks["degenerate"]
        if message is None and limit and streak and streak % limit == 0:
            message = (
                f"The run cannot learn: for {streak} generation batches in a row every group was degenerate (all "
                "completions of a prompt got the same reward, so every advantage is zero and the policy gradient "
                "vanishes). Use easier prompts or a stronger starting model, a reward with partial credit, more "
                "generations per prompt (num_generations) or a higher temperature; raise max_degenerate_batches, or "
                "set on_unlearnable='warn' to train on regardless."
            )
        if message is None:
            return
        if self._family_arg("on_unlearnable") == "stop":
            raise UnlearnableRunError(message)
        logger.warning(message)

    # ------------------------------------------------------------------ validation before training
    def _check_prompts(self) -> None:
        """Fail at start on rows with an empty prompt (see :func:`is_empty_prompt`).

        TRL would generate from a chat template with no question in it, or from zero tokens, which crashes
        ``generate`` whenever a whole batch is empty: a random crash hours into a run. Streamed datasets cannot be
        scanned up front and are not checked.
        """
        named = [("training set", self.train_dataset)]
        if isinstance(self.eval_dataset, dict):
            named += [(f"evaluation set {key!r}", value) for key, value in self.eval_dataset.items()]
        elif self.eval_dataset is not None:
            named.append(("evaluation set", self.eval_dataset))
        for name, dataset in named:
            if "prompt" not in (getattr(dataset, "column_names", None) or ()) or not hasattr(dataset, "_fingerprint"):
                continue
            empty = [i for i, prompt in enumerate(dataset["prompt"]) if is_empty_prompt(prompt)]
            if empty:
                shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
                raise ValueError(
                    f"{len(empty)} of {len(dataset)} rows of the {name} have an empty prompt (no question text; rows "
                    f"{shown}). Drop them before training: `dataset = dataset.filter(lambda row: not "
                    "is_empty_prompt(row['prompt']))` with `from grpo_family.trainers.base import is_empty_prompt`, "
                    "or point the collator's question_column= at the column that holds the questions."
                )

    def _check_reward_columns(self) -> None:
        """Fail at start if a reward function needs a column the training set does not have."""
        dataset = self.train_dataset
        columns = getattr(dataset, "column_names", None)
        if columns is None:
            return
        for func, name in zip(self.reward_funcs, self.reward_func_names):
            if isinstance(func, torch.nn.Module):
                continue
            try:
                params = inspect.signature(func).parameters.values()
            except (TypeError, ValueError):
                continue
            for param in params:
                required = param.default is inspect.Parameter.empty and param.kind in (
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    inspect.Parameter.KEYWORD_ONLY,
                )
                if required and param.name not in _TRL_REWARD_KWARGS and param.name not in columns:
                    raise ValueError(
                        f"Reward function '{name}' needs the dataset column '{param.name}', but the training set "
                        f"has only {sorted(columns)}. Rename or map a column to '{param.name}' (for example "
                        f"`dataset.rename_column('<your column>', '{param.name}')`, or the collator's "
                        "answer_column=/question_column= options)."
                    )

    # ------------------------------------------------------------------ resuming
    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every process's files (RNG, optimizer shards) are written
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.args.should_save and os.path.isdir(folder):
            with open(os.path.join(folder, COMPLETE_MARKER), "w") as f:
                f.write(f"global_step {self.state.global_step}\n")

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Transformers' ``train``; ``resume_from_checkpoint=True`` picks the newest *complete* checkpoint of
        ``output_dir`` (:func:`latest_complete_checkpoint`) rather than the newest folder."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = latest_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"No complete checkpoint in {self.args.output_dir} to resume from. Start without "
                    "resume_from_checkpoint, or pass a checkpoint folder."
                )
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # A checkpoint holds the model, optimizer, scheduler, RNG states and TrainerState. On top of that each process saves
    # `_resume_state()` next to its RNG file and a resumed run hands it to `_restore_resume_state()`, so the run
    # continues as if it had not stopped. Transformers calls `_load_rng_state` before the first resumed training step.
    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        return EpochAlignedSampler(sampler, lambda: math.floor(self.state.epoch or 0))

    def _resume_state(self) -> dict[str, Any]:
        """This process's state a resumed run needs beyond the Trainer's checkpoint; methods add their own entries
        (calling ``super()``) and read them back in :meth:`_restore_resume_state`. Values must be what
        ``torch.load(weights_only=True)`` reads: tensors, numbers, strings, None, lists and dicts of them.

        TRL's own: the micro-step counter and, when the checkpoint falls inside a generation batch
        (``steps_per_generation > gradient_accumulation_steps`` or ``num_iterations > 1``), the buffered generations
        the next steps train on. Without them a resumed run would generate again at the wrong step.
        """
        generate_every = self.args.steps_per_generation * self.num_iterations
        state: dict[str, Any] = {"step": self._step, "generate_every": generate_every}
        if self._buffered_inputs is not None and self._step % generate_every:
            state["buffered_inputs"] = self._buffered_inputs
        return state

    def _restore_resume_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`_resume_state` saved."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        if state.get("generate_every") != generate_every:
            logger.warning(
                "The checkpoint was written with steps_per_generation x num_iterations = %s, this run uses %s: its "
                "buffered generations are dropped and the run generates afresh.", state.get("generate_every"),
                generate_every,
            )  # fmt: skip
            return
        self._step = state["step"]
        if "buffered_inputs" in state:
            self._buffered_inputs = state["buffered_inputs"]

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        path = os.path.join(output_dir, _RESUME_STATE_FILE.format(self.args.process_index))
        torch.save(self._resume_state(), path)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        path = os.path.join(checkpoint, _RESUME_STATE_FILE.format(self.args.process_index)) if checkpoint else None
        if path is None or not os.path.isfile(path):
            if checkpoint is not None:
                logger.warning("No %s in %s: method state starts afresh.", os.path.basename(path), checkpoint)
            return
        # Loaded on the CPU, then moved: map_location=accelerator.device fails for tensors saved on "cpu:0" (MULTI_CPU).
        state = torch.load(path, map_location="cpu", weights_only=True)
        self._restore_resume_state(_to_device(state, self.accelerator.device))

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
        num_generations)`` tensor in ``batch["rewards"]`` so the logged reward metrics describe what was trained on.
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
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        rewards = rewards.view(-1, num_generations)
        batch["num_generations"] = num_generations
        advantages = torch.nan_to_num(self._compute_advantages(rewards, batch), nan=0.0)
        flat = advantages.reshape(rewards.numel(), *advantages.shape[2:])
        extras = batch["stage_extras"] = {}
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
            stage.extras["signals"] = self._batch_signals(stage.rewards, stage.advantages)
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

    # ------------------------------------------------------------------ model card
    # The GRPO knobs a reader needs to reproduce a run; the method's own config fields are added to these.
    _CARD_HYPERPARAMETERS = (
        "learning_rate", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
        "max_completion_length", "temperature", "beta", "epsilon", "loss_type", "scale_rewards", "max_steps",
        "num_train_epochs", "seed",
    )  # fmt: skip

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card (method name, tags, paper title, id and citation) plus hyperparameters and final metrics."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        path = os.path.join(self.args.output_dir, "README.md")
        if not self.is_world_process_zero() or not os.path.exists(path):
            return
        base_fields = {f.name for f in dataclasses.fields(GRPOFamilyConfig)}
        method_fields = [f.name for f in dataclasses.fields(self.args) if f.name not in base_fields]
        rows = [
            (name, _card_value(getattr(self.args, name))) for name in (*method_fields, *self._CARD_HYPERPARAMETERS)
        ]
        final = {}
        for entry in self.state.log_history:  # the last value of each metric (secrets never reach the logs)
            final.update({k: v for k, v in entry.items() if isinstance(v, int | float)})
        section = [
            f"\n## {self._name} training details (grpo_family)\n",
            f"Method: `{self.method_name}` ({self._name}); paper: {self._paper.get('title', 'n/a')}.\n",
            "| hyperparameter | value |\n|---|---|",
            *(f"| {name} | {value} |" for name, value in rows),
            "\nFinal training metrics:\n\n| metric | value |\n|---|---|",
            *(f"| {k} | {v:.6g} |" for k, v in sorted(final.items())),
        ]
        with open(path, "a") as f:
            f.write("\n".join(section) + "\n")

    # ------------------------------------------------------------------ containment of non-finite updates
    def create_optimizer(self, *args: Any, **kwargs: Any):
        optimizer = super().create_optimizer(*args, **kwargs)
        if self._skip_nonfinite_steps and not getattr(optimizer, "_grpo_family_guard", False):
            optimizer.register_step_pre_hook(self._drop_nonfinite_gradients)
            optimizer._grpo_family_guard = True
        return optimizer

    def _drop_nonfinite_gradients(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        # Gradients are already all-reduced here, so every process takes the same decision. Setting them to None
        # makes torch optimizers skip the parameters: a NaN/inf step leaves the weights (and Adam's moments) as
        # they were. DeepSpeed has its own overflow handling and is left alone.
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        norms = torch._foreach_norm(grads)
        if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        logger.warning("Skipped an optimizer step: non-finite gradients (weights unchanged).")
        self._metrics["train"]["skipped_steps"].append(1.0)
