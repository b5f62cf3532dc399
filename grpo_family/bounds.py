"""Every config field's type and allowed values, declared once, and one validator that checks them all.

``BOUNDS`` maps a field name to a :class:`Bound`: the fields of TRL's ``GRPOConfig`` (with transformers'
``TrainingArguments``), of ``GRPOFamilyConfig``, of TRL's ``ModelConfig`` and ``DatasetMixtureConfig``, and the
script arguments of ``examples/train.py``: the fields every method shares. A method's own fields are bounded in its
own file (``field_bounds`` below). :func:`check_bounds` checks every field of
a config against it and raises :class:`BoundsError` naming each flag, the allowed values and the value given. Every
method's config calls it first thing in ``__post_init__`` (``GRPOFamilyConfig``), so a bad value is refused before
TRL's own ``__post_init__`` uses it (``num_generations=0`` used to be a ``ZeroDivisionError`` there) and before any
model or data loads; ``examples/train.py`` also checks its script and model arguments.

A config subclass of your own declares its new fields' bounds beside them, in the class attribute ``field_bounds``
(``field_bounds: ClassVar[dict[str, Bound]] = {"my_field": Int(min=1)}``; read through the class's MRO, before
``BOUNDS``), so that a method's bounds live in its own file, as every bundled method's do. Not in the fields' metadata: transformers'
``HfArgumentParser`` (TRL's ``TrlParser``) passes every metadata key but ``aliases`` to ``argparse.add_argument``,
which refuses unknown keywords. A field that mirrors another config's field names that field's flag
(``metadata={"flag": "judge_type"}``, on a dataclass no parser reads), whose bound and name it then takes.
``tests/test_bounds.py`` walks every field of every config in ``grpo_family.METHODS`` and fails for a field with no
bound. A field whose values cannot be bounded here is declared :class:`Unchecked` with the reason.

A method that inherits an option it does not use declares it in the class attribute ``unused_options``
(``unused_options: ClassVar[dict[str, Unused]] = {"epsilon": Unused("GPG's loss has no ratio to clip.", 0.1)}``,
read through the MRO like ``field_bounds``): :func:`check_unused` refuses a value other than the field's default
with the reason, instead of training as if it had not been given. ``Unused(..., unless=("judge_type", ("openai",)))``
names the setting under which the option is used after all. ``tests/test_bounds.py`` sets each declared option of
every method to its ``example`` and expects the refusal.

Bounds say what a single value may be; checks across fields (``tau_min <= num_generations``, batch divisibility, ...)
stay in the configs' ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Any
from urllib.parse import urlparse

from .errors import BoundsError

__all__ = [
    "BOUNDS",
    "AnyOf",
    "Bound",
    "BoundsError",
    "Flag",
    "Float",
    "Int",
    "ListOf",
    "Mapping",
    "OneOf",
    "Text",
    "Unchecked",
    "Unused",
    "Url",
    "bound_for",
    "check_bounds",
    "check_unused",
    "unused_options",
]


_NOT_A_VALUE = object()


def _plain(value: Any) -> Any:
    """An Enum member as its value (transformers turns strategy strings into Enums in ``__post_init__``)."""
    return value.value if isinstance(value, Enum) else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Bound:
    """What one field may hold. ``optional``: None is allowed too. ``secret``: the value is never shown. ``hint``: a
    sentence added to the error (e.g. the paper's value, or what to do instead)."""

    optional: bool = dataclasses.field(default=False, kw_only=True)
    secret: bool = dataclasses.field(default=False, kw_only=True)
    hint: str = dataclasses.field(default="", kw_only=True)

    def accepts(self, value: Any) -> bool:
        return (value is None and self.optional) or (value is not None and self._accepts(value))

    def _accepts(self, value: Any) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        """The allowed values in words, e.g. ``an integer >= 2``."""
        text = self._describe()
        return f"{text}, or None" if self.optional else text

    def _describe(self) -> str:
        raise NotImplementedError

    def bad_values(self) -> list:
        """Values this bound refuses (the generated test tries each of them on every field)."""
        bad = [v for v in self._bad_values() if not self.accepts(v)]
        return bad if self.optional else [*bad, None]

    def _bad_values(self) -> list:
        raise NotImplementedError


def _range_words(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return ""


@dataclasses.dataclass(frozen=True)
class Int(Bound):
    """An integer (not a bool) in ``[min, max]``; ``text``: a string of decimal digits counts too (a flag TRL types
    ``int | str`` reaches the config as text from the command line)."""

    min: int | None = None
    max: int | None = None
    text: bool = dataclasses.field(default=False, kw_only=True)

    def _accepts(self, value):
        if self.text and isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            value = int(value)
        if not _is_int(value):
            return False
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def _describe(self):
        words = _range_words(self.min, self.max, False, False)
        return f"an integer {words}".rstrip()

    def _bad_values(self):
        bad = [1.5, "x", True]
        if self.min is not None:
            bad.append(self.min - 1)
        if self.max is not None:
            bad.append(self.max + 1)
        return bad


@dataclasses.dataclass(frozen=True)
class Float(Bound):
    """A finite number (``infinite``: +inf too) in the range; integers count as numbers, bools do not."""

    min: float | None = None
    max: float | None = None
    min_open: bool = dataclasses.field(default=False, kw_only=True)
    max_open: bool = dataclasses.field(default=False, kw_only=True)
    infinite: bool = dataclasses.field(default=False, kw_only=True)

    def _accepts(self, value):
        if not _is_number(value) or math.isnan(value) or value == -math.inf:
            return False
        if value == math.inf and not self.infinite:
            return False
        if self.min is not None and (value < self.min or (self.min_open and value == self.min)):
            return False
        return not (self.max is not None and (value > self.max or (self.max_open and value == self.max)))

    def _describe(self):
        words = _range_words(self.min, self.max, self.min_open, self.max_open)
        kind = "a number; inf allowed" if self.infinite else "a finite number"
        return f"{words} ({kind})" if words else kind

    def _bad_values(self):
        bad = ["x", True, math.nan, -math.inf]
        if not self.infinite:
            bad.append(math.inf)
        if self.min is not None:
            bad.append(self.min if self.min_open else self.min - 1)
        if self.max is not None:
            bad.append(self.max if self.max_open else self.max + 1)
        return bad


@dataclasses.dataclass(frozen=True)
class Flag(Bound):
    """``True`` or ``False``."""

    def _accepts(self, value):
        return isinstance(value, bool)

    def _describe(self):
        return "true or false"

    def _bad_values(self):
        return ["yes", 1]


@dataclasses.dataclass(frozen=True)
class OneOf(Bound):
    """One of ``choices`` (compared with its type: ``True`` is not ``1``); ``choices`` may be a callable giving them
    (a registry that grows, e.g. the methods)."""

    choices: tuple | Callable[[], Iterable] = ()

    def values(self) -> tuple:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def _accepts(self, value):
        value = _plain(value)
        return any(type(c) is type(value) and c == value for c in self.values())

    def _describe(self):
        values = self.values()
        return repr(values[0]) if len(values) == 1 else f"one of {values!r}"

    def _bad_values(self):
        return ["__not_a_choice__", 12345, 0.5]


@dataclasses.dataclass(frozen=True)
class Text(Bound):
    """A string; ``nonempty``: with a non-blank character; ``pattern``: matching this regular expression whole
    (``pattern_words`` says what it means; ``bad`` holds strings that break it, for the generated test); ``file``: the
    path of an existing file (``~`` expanded)."""

    nonempty: bool = dataclasses.field(default=False, kw_only=True)
    file: bool = dataclasses.field(default=False, kw_only=True)
    pattern: str | None = dataclasses.field(default=None, kw_only=True)
    pattern_words: str = dataclasses.field(default="", kw_only=True)
    bad: tuple = dataclasses.field(default=(), kw_only=True)

    def _accepts(self, value):
        if not isinstance(value, str) or (self.nonempty and not value.strip()):
            return False
        if self.file and not os.path.isfile(os.path.expanduser(value)):
            return False
        return self.pattern is None or re.fullmatch(self.pattern, value) is not None

    def _describe(self):
        if self.file:
            return "the path of an existing file"
        if self.pattern:
            return self.pattern_words or f"a string matching {self.pattern!r}"
        return "a non-empty string" if self.nonempty else "a string"

    def _bad_values(self):
        return [3, ["a"], *([""] if self.nonempty else []), *(["/no/such/file.txt"] if self.file else []), *self.bad]


@dataclasses.dataclass(frozen=True)
class Url(Bound):
    """An ``http://`` or ``https://`` URL with a host."""

    def _accepts(self, value):
        if not isinstance(value, str):
            return False
        try:
            parsed = urlparse(value)
            parsed.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError:
            return False
        return parsed.scheme in ("http", "https") and bool(parsed.hostname)

    def _describe(self):
        return "an http:// or https:// URL with a host (e.g. http://localhost:8000/v1)"

    def _bad_values(self):
        return ["not a url", "ftp://host/x", "http://", 3]


@dataclasses.dataclass(frozen=True)
class Mapping(Bound):
    """A dict, or (the command line's form) a string holding a JSON object; ``path``: or the path of an existing
    file (a DeepSpeed / FSDP / accelerator config); ``objects``: or an instance of a class of one of these names."""

    path: bool = dataclasses.field(default=False, kw_only=True)
    objects: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)

    def _accepts(self, value):
        if isinstance(value, dict) or type(value).__name__ in self.objects:
            return True
        if not isinstance(value, str):
            return False
        if value.startswith("{"):
            return _json_object(value) is not None
        return self.path and os.path.isfile(value)

    def _describe(self):
        text = "a JSON object (a mapping in Python or YAML; e.g. '{\"key\": 1}')"
        return f"{text} or the path of a JSON file" if self.path else text

    def _bad_values(self):
        return ["{not json", '{"a": 1', "[1, 2]", 3, ["a"]]


def _json_object(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclasses.dataclass(frozen=True)
class ListOf(Bound):
    """A list (or tuple) of values each within ``item``, at least ``min_items`` long. ``single``: a bare value counts
    as a list of one; ``split``: a string is split on this separator first (transformers' space-separated forms)."""

    item: Bound = dataclasses.field(default_factory=lambda: Text())
    min_items: int = dataclasses.field(default=0, kw_only=True)
    single: bool = dataclasses.field(default=False, kw_only=True)
    split: str | None = dataclasses.field(default=None, kw_only=True)

    def _items(self, value) -> list | None:
        if self.split is not None and isinstance(value, str):
            return value.split(self.split) if value.strip() else []
        if isinstance(value, list | tuple):
            return list(value)
        return [value] if self.single else None

    def _accepts(self, value):
        items = self._items(value)
        return items is not None and len(items) >= self.min_items and all(self.item.accepts(i) for i in items)

    def _describe(self):
        least = f"at least {self.min_items} " if self.min_items else ""
        text = f"a list of {least}values, each {self.item.describe()}"
        if self.split is not None:
            text += f" (or one string of them separated by {self.split!r})"
        elif self.single:
            text += " (or one such value)"
        return text

    def _bad_values(self):
        bad = [3.5, {"a": 1}, [v for v in self.item.bad_values() if v is not None][:1]]
        if not self.single and self.split is None:
            bad.append("a bare string")
        if self.min_items:
            bad.append([])
        return bad


@dataclasses.dataclass(frozen=True)
class AnyOf(Bound):
    """Any value one of ``alternatives`` accepts (``optional`` is decided here, not by the alternatives)."""

    alternatives: tuple[Bound, ...] = ()

    def _accepts(self, value):
        return any(b.accepts(value) for b in self.alternatives)

    def _describe(self):
        return " or ".join(b.describe() for b in self.alternatives)

    def _bad_values(self):
        return [v for b in self.alternatives for v in b.bad_values() if v is not None]


@dataclasses.dataclass(frozen=True)
class Unchecked(Bound):
    """A field this module does not bound; ``reason`` says why and who checks it instead."""

    reason: str = ""

    def accepts(self, value):
        return True

    def _describe(self):
        return f"unchecked here: {self.reason}"

    def bad_values(self):
        return []


# ---------------------------------------------------------------------------------------------------- the table
def _enum_values(module: str, name: str) -> Callable[[], tuple]:
    """The values of an Enum of transformers', read when first needed (this module stays cheap to import)."""

    def values() -> tuple:
        import importlib

        return tuple(e.value for e in getattr(importlib.import_module(module), name))

    return values


def _report_targets() -> tuple:
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    return ("none", "all", *INTEGRATION_TO_CALLBACK)


def _difficulties() -> tuple:
    from .tasks.arithmetic import DIFFICULTIES

    return tuple(DIFFICULTIES)


def _presets() -> tuple:
    from .collator import PRESETS

    return ("auto", *PRESETS)


_PORT = Int(1, 65535)
_STEPS_OR_RATIO = Float(0, min_open=True)  # transformers: an integer count, or a float in (0, 1): a ratio of all steps
_COLUMN = Text(nonempty=True)
_NAMES = ListOf(Text(nonempty=True), single=True, optional=True)
_SEED = Int(0, 2**32 - 1)  # numpy's seed range
_LOG_LEVELS = ("detail", "debug", "info", "warning", "error", "critical", "passive")

# transformers' TrainingArguments (what GRPOConfig inherits).
TRAINING_ARGUMENTS: dict[str, Bound] = {
    "output_dir": Text(nonempty=True, optional=True),
    "per_device_train_batch_size": Int(1),
    "num_train_epochs": Float(0, min_open=True),
    "max_steps": AnyOf((OneOf((-1,)), Int(1))),  # -1: num_train_epochs decides; 0 used to train one step
    "learning_rate": Float(0, min_open=True),
    "lr_scheduler_type": OneOf(_enum_values("transformers.trainer_utils", "SchedulerType")),
    "lr_scheduler_kwargs": Mapping(optional=True),
    "warmup_steps": Float(0),
    "optim": OneOf(_enum_values("transformers.training_args", "OptimizerNames")),
    "optim_args": Text(optional=True),
    "weight_decay": Float(0),
    "adam_beta1": Float(0, 1, max_open=True),
    "adam_beta2": Float(0, 1, max_open=True),
    "adam_epsilon": Float(0, min_open=True),
    "optim_target_modules": AnyOf((Text(nonempty=True), ListOf(Text(nonempty=True))), optional=True),
    "gradient_accumulation_steps": Int(1),
    "average_tokens_across_devices": Flag(),
    "max_grad_norm": Float(0),  # 0: no clipping
    "label_smoothing_factor": Float(0, 1, max_open=True),
    "bf16": Flag(optional=True),
    "fp16": Flag(),
    "bf16_full_eval": Flag(),
    "fp16_full_eval": Flag(),
    "tf32": Flag(optional=True),
    "activation_checkpointing": Flag(optional=True),
    "activation_checkpointing_kwargs": Mapping(optional=True),
    "gradient_checkpointing": Flag(optional=True),
    "gradient_checkpointing_kwargs": Mapping(optional=True),
    "torch_compile": Flag(),
    "torch_compile_backend": Text(nonempty=True, optional=True),
    "torch_compile_mode": OneOf(
        ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"), optional=True
    ),
    "use_liger_kernel": Flag(),
    "liger_kernel_config": Mapping(optional=True),
    "use_cache": Flag(),
    "neftune_noise_alpha": Float(0, min_open=True, optional=True),
    "torch_empty_cache_steps": Int(1, optional=True),
    "auto_find_batch_size": Flag(),
    "logging_strategy": OneOf(_enum_values("transformers.trainer_utils", "IntervalStrategy")),
    "logging_steps": _STEPS_OR_RATIO,
    "logging_first_step": Flag(),
    "log_on_each_node": Flag(),
    "logging_nan_inf_filter": Flag(),
    "include_num_input_tokens_seen": OneOf(("no", "all", "non_padding", True, False)),
    "log_level": OneOf(_LOG_LEVELS),
    "log_level_replica": OneOf(_LOG_LEVELS),
    "disable_tqdm": Flag(optional=True),
    "report_to": ListOf(OneOf(_report_targets), single=True, optional=True),
    "run_name": Text(optional=True),
    "project": Text(nonempty=True),
    "trackio_space_id": Text(nonempty=True, optional=True),
    "trackio_bucket_id": Text(nonempty=True, optional=True),
    "trackio_static_space_id": AnyOf((Text(nonempty=True), OneOf((False,))), optional=True),
    "eval_strategy": OneOf(_enum_values("transformers.trainer_utils", "IntervalStrategy")),
    "eval_steps": Float(0, min_open=True, optional=True),
    "eval_delay": Float(0),
    "per_device_eval_batch_size": Int(1),
    "prediction_loss_only": Flag(),
    "eval_on_start": Flag(),
    "eval_do_concat_batches": Flag(),
    "eval_use_gather_object": Flag(),
    "eval_accumulation_steps": Int(1, optional=True),
    "include_for_metrics": ListOf(OneOf(("inputs", "loss"))),
    "batch_eval_metrics": Flag(),
    "save_only_model": Flag(),
    "save_strategy": OneOf(_enum_values("transformers.trainer_utils", "SaveStrategy")),
    "save_steps": _STEPS_OR_RATIO,
    "save_on_each_node": Flag(),
    "save_total_limit": Int(1, optional=True),
    "enable_jit_checkpoint": Flag(),
    "push_to_hub": Flag(),
    "hub_token": Text(optional=True, secret=True),
    "hub_private_repo": Flag(optional=True),
    "hub_model_id": Text(nonempty=True, optional=True),
    "hub_strategy": OneOf(_enum_values("transformers.trainer_utils", "HubStrategy")),
    "hub_always_push": Flag(),
    "hub_revision": Text(nonempty=True, optional=True),
    "load_best_model_at_end": Flag(),
    "metric_for_best_model": Text(nonempty=True, optional=True),
    "greater_is_better": Flag(optional=True),
    "ignore_data_skip": Flag(),
    "restore_callback_states_from_checkpoint": Flag(),
    "full_determinism": Flag(),
    "seed": _SEED,
    "data_seed": Int(0, 2**32 - 1, optional=True),
    "use_cpu": Flag(),
    "accelerator_config": Mapping(path=True, objects=("AcceleratorConfig",), optional=True),
    "parallelism_config": Unchecked(
        reason="an accelerate ParallelismConfig object, given in Python only (it has no command-line form); "
        "accelerate checks it when it builds the mesh, and GRPOConfig refuses the sequence-parallel settings"
    ),
    "dataloader_drop_last": Flag(),
    "dataloader_num_workers": Int(0),
    "dataloader_pin_memory": Flag(),
    "dataloader_persistent_workers": Flag(),
    "dataloader_prefetch_factor": Int(1, optional=True),
    "dataloader_multiprocessing_context": OneOf(("fork", "spawn", "forkserver"), optional=True),
    "dataloader_in_order": Flag(),
    "remove_unused_columns": Flag(optional=True),
    "label_names": ListOf(Text(nonempty=True), optional=True),
    "train_sampling_strategy": OneOf(("random", "sequential", "group_by_length", "batch_rebalance")),
    "length_column_name": _COLUMN,
    "ddp_find_unused_parameters": Flag(optional=True),
    "ddp_bucket_cap_mb": Int(1, optional=True),
    "ddp_broadcast_buffers": Flag(optional=True),
    "ddp_static_graph": Flag(optional=True),
    "ddp_backend": OneOf(("nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"), optional=True),
    "ddp_timeout": Int(1),
    "fsdp": AnyOf(
        (ListOf(OneOf(_enum_values("transformers.trainer_utils", "FSDPOption")), split=" "), Flag()), optional=True
    ),
    "fsdp_config": Mapping(path=True, optional=True),
    "deepspeed": Mapping(path=True, optional=True),
    "debug": ListOf(OneOf(_enum_values("transformers.debug_utils", "DebugOption")), split=" ", optional=True),
    "skip_memory_metrics": Flag(),
    "do_train": Flag(),
    "do_eval": Flag(),
    "do_predict": Flag(),
    "resume_from_checkpoint": Text(nonempty=True, optional=True),
    "local_rank": Int(-1),
}

# TRL's GRPOConfig, on top of TrainingArguments.
GRPO_CONFIG: dict[str, Bound] = {
    "model_init_kwargs": Mapping(optional=True),
    "trust_remote_code": Flag(),
    "router_aux_loss_coef": Float(0, optional=True),
    "disable_dropout": Flag(),
    "cast_lm_head_to_fp32": Flag(),
    "num_generations": Int(2),  # GRPO needs 2 completions per prompt; 0 was a ZeroDivisionError in TRL
    "num_generations_eval": Int(1, optional=True),
    "max_completion_length": Int(1, optional=True),
    "ds3_gather_for_generation": Flag(),
    "shuffle_dataset": Flag(optional=True),
    "pad_to_multiple_of": AnyOf((Int(1, text=True), OneOf(("auto", "none", "null"))), optional=True),
    "generation_batch_size": Int(1, optional=True),
    "steps_per_generation": Int(1, optional=True),
    "temperature": Float(0, min_open=True),  # the logits are divided by it
    "top_p": Float(0, 1, min_open=True),
    "top_k": Int(0),  # 0: off
    "min_p": Float(0, 1, optional=True),
    "generation_kwargs": Mapping(optional=True),
    "chat_template_kwargs": Mapping(optional=True),
    "repetition_penalty": Float(0, min_open=True),
    "cache_implementation": Text(nonempty=True, optional=True),
    "use_vllm": Flag(),
    "vllm_mode": OneOf(("server", "colocate")),
    "vllm_model_impl": OneOf(("vllm", "transformers")),
    "vllm_enable_sleep_mode": Flag(),
    "vllm_structured_outputs_regex": Text(nonempty=True, optional=True),
    "vllm_server_base_url": Url(optional=True),
    "vllm_server_host": Text(nonempty=True),
    "vllm_server_port": _PORT,
    "vllm_server_timeout": Float(0, min_open=True),
    "vllm_group_port": _PORT,
    "vllm_gpu_memory_utilization": Float(0, 1, min_open=True),
    "vllm_max_model_length": Int(1, optional=True),
    "vllm_tensor_parallel_size": Int(1),
    "beta": Float(0),  # KL coefficient
    "num_iterations": Int(1),  # 0 used to train nothing and "save the model"
    "epsilon": Float(0, 1, max_open=True),  # the ratio is clipped to [1 - epsilon, ...]
    "delta": Float(1, min_open=True, optional=True),  # two-sided clipping's upper bound on the ratio
    "epsilon_high": Float(0, optional=True),
    "sapo_temperature_neg": Float(0, min_open=True),
    "sapo_temperature_pos": Float(0, min_open=True),
    "vespo_k_pos": Float(0),
    "vespo_lambda_pos": Float(0),
    "vespo_k_neg": Float(0),
    "vespo_lambda_neg": Float(0),
    "importance_sampling_level": OneOf(("token", "sequence")),
    "reward_weights": ListOf(Float(), min_items=1, optional=True),
    "multi_objective_aggregation": OneOf(("sum_then_normalize", "normalize_then_sum")),
    "scale_rewards": OneOf(("group", "batch", "none", True, False)),
    "loss_type": OneOf(("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")),
    "mask_truncated_completions": Flag(),
    "sync_ref_model": Flag(),
    "ref_model_mixup_alpha": Float(0, 1),
    "ref_model_sync_steps": Int(1),
    "top_entropy_quantile": Float(0, 1),
    "entropy_coef": Float(),  # any sign: a bonus (> 0) or a penalty (< 0) on entropy
    "use_adaptive_entropy": Flag(),
    "entropy_coef_min": Float(0),
    "entropy_coef_max": Float(0),
    "entropy_coef_delta": Float(0, min_open=True),
    "entropy_target": Float(0),
    "max_tool_calling_iterations": Int(0, optional=True),
    "vllm_importance_sampling_correction": Flag(),
    "vllm_importance_sampling_mode": OneOf(("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")),
    "vllm_importance_sampling_clip_max": Float(0, min_open=True, optional=True),
    "vllm_importance_sampling_clip_min": Float(0, optional=True),
    "off_policy_mask_threshold": Float(0, min_open=True, optional=True),
    "use_bias_correction_kl": Flag(),
    "log_completions": Flag(),
    "log_multimodal": Flag(),
    "num_completions_to_print": Int(0, optional=True),
    "log_unique_prompts": Flag(),
    "log_completions_hub_repo": Text(nonempty=True, optional=True),
    "use_transformers_continuous_batching": Flag(),
    "transformers_continuous_batching_config": Mapping(optional=True),
    "use_transformers_paged": Flag(),
    "vllm_importance_sampling_cap": Float(0, min_open=True, optional=True),
}

# GRPOFamilyConfig (every method's base).
FAMILY_CONFIG: dict[str, Bound] = {
    "max_unscorable_batches": Int(0),  # 0: check off
    "max_degenerate_batches": Int(0),
    "on_unlearnable": OneOf(("stop", "warn")),
    "reward_timeout": Float(0, optional=True),  # None or 0: no deadline
}

# TRL's ModelConfig and DatasetMixtureConfig (examples/train.py parses them).
MODEL_CONFIG: dict[str, Bound] = {
    "model_name_or_path": Text(nonempty=True, optional=True),
    "model_revision": Text(nonempty=True),
    "dtype": OneOf(("auto", "bfloat16", "float16", "float32"), optional=True),
    "attn_implementation": Text(nonempty=True, optional=True),
    "use_peft": Flag(),
    "lora_r": Int(1),
    "lora_alpha": Int(1),
    "lora_dropout": Float(0, 1, max_open=True),
    "lora_target_modules": _NAMES,
    "lora_target_parameters": _NAMES,
    "lora_modules_to_save": _NAMES,
    "lora_task_type": OneOf(
        ("CAUSAL_LM", "SEQ_CLS", "SEQ_2_SEQ_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION")
    ),
    "use_rslora": Flag(),
    "use_dora": Flag(),
    "load_in_8bit": Flag(),
    "load_in_4bit": Flag(),
    "bnb_4bit_quant_type": OneOf(("fp4", "nf4")),
    "use_bnb_nested_quant": Flag(),
    "bnb_4bit_quant_storage": OneOf(("float32", "float16", "bfloat16", "uint8", "int8"), optional=True),
    # DatasetMixtureConfig
    "datasets": ListOf(Mapping(objects=("DatasetConfig",))),
    "streaming": Flag(),
    "test_split_size": AnyOf((Float(0, 1, min_open=True, max_open=True), Int(1)), optional=True),
}

# examples/train.py's script arguments (TRL's ScriptArguments and its own).
SCRIPT_ARGUMENTS: dict[str, Bound] = {
    "dataset_name": Text(nonempty=True, optional=True),
    "dataset_config": Text(nonempty=True, optional=True),
    "dataset_train_split": _COLUMN,
    "dataset_test_split": _COLUMN,
    "dataset_streaming": Flag(),
    "ignore_bias_buffers": Flag(),
    "reward_funcs": ListOf(Text(nonempty=True), min_items=1),
    "reward_model_name_or_path": Text(nonempty=True, optional=True),
    "max_unreadable_golds": Float(0, 1),
    "dataset_preset": OneOf(_presets),
    "question_column": Text(nonempty=True, optional=True),
    "answer_column": Text(nonempty=True, optional=True),
    "solution_column": Text(nonempty=True, optional=True),
    "options_column": Text(nonempty=True, optional=True),
    "system_prompt": Text(optional=True),
    "user_instruction": Text(optional=True),
    "dataset_filters": Mapping(optional=True),
    "dataset_options": Mapping(optional=True),  # reasoning_gym/<task> only (preflight.load_data says so otherwise)
    "num_eval_examples": Int(1),  # 0 used to report an accuracy of 0.000 over no examples
    "eval_max_new_tokens": Int(1, optional=True),
    "held_out_every": Int(0),  # 0: before and after training only
    "held_out_samples": Int(0),
    "task_difficulty": OneOf(_difficulties),
}

BOUNDS: dict[str, Bound] = {
    **TRAINING_ARGUMENTS,
    **GRPO_CONFIG,
    **FAMILY_CONFIG,
    **MODEL_CONFIG,
    **SCRIPT_ARGUMENTS,
}


def _flag_of(field: dataclasses.Field) -> str:
    """The flag a field is set by: its name, or ``metadata["flag"]`` for a field that mirrors another config's field
    (``grpo_family.judges.JudgeConfig.type`` is ``--judge_type``)."""
    return field.metadata.get("flag", field.name)


def _bound_of(config_or_class: Any, field: dataclasses.Field) -> Bound | None:
    """``field_bounds`` of the nearest class in the MRO that declares the field there, else ``BOUNDS[flag]``."""
    cls = config_or_class if isinstance(config_or_class, type) else type(config_or_class)
    for klass in cls.__mro__:
        declared = vars(klass).get("field_bounds", {}).get(field.name)
        if declared is not None:
            return declared
    return BOUNDS.get(_flag_of(field))


def bound_for(config_or_class: Any, name: str) -> Bound | None:
    """The bound of field ``name``: its class's ``field_bounds[name]`` if declared, else ``BOUNDS[name]``; None if
    neither."""
    field = next((f for f in dataclasses.fields(config_or_class) if f.name == name), None)
    return BOUNDS.get(name) if field is None else _bound_of(config_or_class, field)


def _shown(value: Any, bound: Bound) -> str:
    return "a value that is not shown (it may be a secret)" if bound.secret else f"{value!r:.200}"


def problems(config: Any, names: Sequence[str] | None = None) -> list[str]:
    """One line per field of ``config`` (a dataclass instance) outside its bound: the flag, what it may be, the value."""
    out = []
    for field in dataclasses.fields(config):
        if names is not None and field.name not in names:
            continue
        bound = _bound_of(config, field)
        value = getattr(config, field.name, _NOT_A_VALUE)
        if bound is None or value is _NOT_A_VALUE or bound.accepts(value):
            continue
        hint = f" {bound.hint}" if bound.hint else ""
        out.append(f"--{_flag_of(field)} must be {bound.describe()}; got {_shown(value, bound)}.{hint}")
    return out


def check_bounds(config: Any, names: Sequence[str] | None = None) -> None:
    """Check every field of ``config`` (or only ``names``) against its bound; :class:`BoundsError` lists every field
    outside it (flag, allowed values, value given)."""
    found = problems(config, names)
    if len(found) == 1:
        raise BoundsError(found[0])
    if found:
        raise BoundsError(f"{len(found)} settings are out of bounds:\n  " + "\n  ".join(found))


@dataclasses.dataclass(frozen=True)
class Unused:
    """An inherited option the method does not use: any value but the field's default is refused, with ``reason``.
    ``example``: a non-default value (the generated test sets it and expects the refusal); ``unless``: (field,
    values) under which the option is used after all."""

    reason: str
    example: Any
    unless: tuple[str, tuple] | None = None


def unused_options(config_or_class: Any) -> dict[str, Unused]:
    """Every ``unused_options`` declaration along the class's MRO (the nearest class's wins)."""
    cls = config_or_class if isinstance(config_or_class, type) else type(config_or_class)
    out: dict[str, Unused] = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass).get("unused_options", {}))
    return out


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else _NOT_A_VALUE


def check_unused(config: Any) -> None:
    """Refuse a non-default value of an option ``config``'s class declares unused (:class:`Unused`): the run would
    train as if it had not been given. Call before anything rewrites the fields (TRL's ``__post_init__``)."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    found = []
    for name, decl in unused_options(config).items():
        default = _default(fields[name])
        value = getattr(config, name)
        if value == default or (decl.unless is not None and getattr(config, decl.unless[0]) in decl.unless[1]):
            continue
        found.append(
            f"--{name} {value!r:.100} is not used by {type(config).__name__}: {decl.reason} Leave it at its "
            f"default ({default!r})."
        )
    if found:
        raise BoundsError("\n".join(found))
