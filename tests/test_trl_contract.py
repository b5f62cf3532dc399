"""The private TRL (and transformers) facts grpo_family relies on, each pinned to its TRL 1.16.0 value.

The contract is data: :data:`FACTS`, one :class:`Fact` per relied-on fact (a method's signature, the keys of the
generation output, the call order inside ``_compute_loss``, a normaliser formula, padding sides, the sampler
layout, ...), each with what reads it from the installed TRL (``observe``), its pinned value, and who relies on
it. :func:`check` compares the two and says what changed. ``test_trl_fact`` runs every fact, so a TRL release that
changes one fails here first, with a message naming the fact, the code that relies on it, and the old and new
values. The last tests break facts on purpose (in TRL itself, with ``monkeypatch``) and check that the checker
reports them, and that every private TRL name the trainers use is covered by some fact.

Facts are read from the source (an AST) where running the code would need a generation or a GPU, and by running
TRL's code on a stock ``GRPOTrainer`` over the tiny test model (its forward pass stubbed) where the behaviour is
the fact: the loss normalisers, the call order inside the loss, the buffering of generation batches.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import importlib
import inspect
import linecache
import math
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from conftest import digit_share_reward, tiny_config_kwargs
from trl import GRPOConfig, GRPOTrainer
from trl.trainer import grpo_trainer as trl_grpo_module
from trl.trainer.utils import RepeatSampler

from grpo_family.trainers import base as family_base
from grpo_family.trainers import d3s as family_d3s
from tests.tolerances import EPS32

TRAINERS_DIR = Path(family_base.__file__).parent
PACKAGE_DIR = TRAINERS_DIR.parent
# Where grpo_family reaches into TRL's trainer: the trainers and the infrastructure around them.
TRL_USERS = [PACKAGE_DIR / name for name in ("trainers", "runtime", "integrations")]


@dataclasses.dataclass(frozen=True)
class Fact:
    """One relied-on fact: ``observe(trainer)`` reads it from the installed TRL (``trainer`` is a stock
    ``GRPOTrainer`` on the tiny model, for the facts that need one); ``pinned`` is its TRL 1.16.0 value."""

    name: str
    used_by: str
    observe: Callable[[Any], Any]
    pinned: Any
    names: tuple[str, ...] = ()  # the private TRL names this fact covers (see test_every_private_trl_name_is_pinned)


def check(fact: Fact, trainer: Any) -> str | None:
    """None when TRL still has ``fact``; otherwise a message saying what changed and what relies on it."""
    try:
        actual = fact.observe(trainer)
    except Exception as error:  # noqa: BLE001 - a renamed method or a reshaped function is a change too
        actual = f"<cannot be read: {type(error).__name__}: {error}>"
    if actual == fact.pinned:
        return None
    return (
        f"TRL contract broken: {fact.name}\n"
        f"  relied on by: {fact.used_by}\n"
        f"  TRL 1.16.0:   {fact.pinned!r}\n"
        f"  installed:    {actual!r}\n"
        "Adapt the code that relies on it (and this pin) to the installed TRL, or pin TRL to a version that has it."
    )


# ------------------------------------------------------------------------------------------------ readers


def signature(owner: type, name: str) -> tuple[str, ...]:
    """Parameter names, kinds and defaults of ``owner.name`` (annotations left out: they are not the contract)."""
    params = inspect.signature(getattr(owner, name)).parameters.values()
    return tuple(str(p.replace(annotation=inspect.Parameter.empty)) for p in params)


def function_ast(owner: type, name: str) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(owner, name))))
    return next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))


def _is_self_call(node: ast.AST, method: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    )


def output_keys(_trainer: Any) -> tuple[str, ...]:
    """Every key ``_generate_and_score_completions`` may put in its output: the dict literal and ``output[k] = v``."""
    keys = set()
    for node in ast.walk(function_ast(GRPOTrainer, "_generate_and_score_completions")):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id == "output" and isinstance(node.value, ast.Dict):
                keys.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
            elif isinstance(target, ast.Subscript) and ast.unparse(target.value) == "output":
                keys.add(ast.unparse(target.slice).strip("'\""))
    return tuple(sorted(keys))


def padding(_trainer: Any) -> tuple[tuple[str, str, str], ...]:
    """``(tensor, padding_side, padding_value)`` of every ``x = pad(...)`` in ``_generate_and_score_completions``."""
    found = []
    for node in ast.walk(function_ast(GRPOTrainer, "_generate_and_score_completions")):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "to":
            call = call.func.value  # pad(...).to(device)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "pad":
            kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
            found.append((node.targets[0].id, kw.get("padding_side", "<default>"), kw.get("padding_value", "<none>")))
    return tuple(sorted(found))


def assignments(owner: type, method: str, *targets: str) -> dict[str, list[str]]:
    """The source of every assignment to the named local variables in ``owner.method``, in order."""
    found: dict[str, list[str]] = {t: [] for t in targets}
    for node in ast.walk(function_ast(owner, method)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in found:
                    found[target.id].append(ast.unparse(node.value))
    return found


def self_calls(owner: type, method: str, callee: str) -> list[ast.Call]:
    return [node for node in ast.walk(function_ast(owner, method)) if _is_self_call(node, callee)]


def generation_forward_entropy_flags(_trainer: Any) -> tuple[str, ...]:
    """``compute_entropy`` of every forward ``_generate_and_score_completions`` makes (old / reference log-probs)."""
    calls = self_calls(GRPOTrainer, "_generate_and_score_completions", "_get_per_token_logps_and_entropies")
    return tuple(
        next((ast.unparse(k.value) for k in call.keywords if k.arg == "compute_entropy"), "<not passed>")
        for call in calls
    )


def calculate_rewards_calls(_trainer: Any) -> tuple[str, ...]:
    calls = self_calls(GRPOTrainer, "_generate_and_score_completions", "_calculate_rewards")
    return tuple(ast.unparse(call) for call in calls)


def calculate_rewards_returns(_trainer: Any) -> tuple[str, ...]:
    """The last two statements of ``_calculate_rewards``: the gather and the return."""
    return tuple(ast.unparse(statement) for statement in function_ast(GRPOTrainer, "_calculate_rewards").body[-2:])


def metric_appends(_trainer: Any) -> dict[str, int]:
    """How often ``_generate_and_score_completions`` appends each reward metric the base class rewrites, and
    extends ``_logs["advantages"]`` (the base pops and re-extends exactly one generation batch of it)."""
    counts = collections.Counter()
    for node in ast.walk(function_ast(GRPOTrainer, "_generate_and_score_completions")):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = ast.unparse(node.func.value)
            if node.func.attr == "append" and target.startswith("self._metrics[mode]["):
                key = target[len("self._metrics[mode][") : -1]
                if key in ("'reward'", "'reward_std'", "'frac_reward_zero_std'"):
                    counts[f"_metrics[mode][{key}].append"] += 1
            if node.func.attr == "extend" and target == "self._logs['advantages']":
                counts[f"_logs['advantages'].extend({ast.unparse(node.args[0])})"] += 1
    return dict(counts)


def training_step_order(_trainer: Any) -> tuple[str, ...]:
    """The statements of ``training_step`` that call the Trainer's step or count TRL's ``_step``, in order."""
    return tuple(
        ast.unparse(s)
        for s in function_ast(GRPOTrainer, "training_step").body
        if "_step" in ast.unparse(s) and ("super()" in ast.unparse(s) or "self._step +=" in ast.unparse(s))
    )


def current_accumulation_is_set(_trainer: Any) -> bool:
    """D3S reads ``current_gradient_accumulation_steps``, which transformers sets in its training loop."""
    return "self.current_gradient_accumulation_steps =" in inspect.getsource(transformers.trainer)


# Public GRPOTrainer attributes the trainers read.
PUBLIC_ATTRIBUTES = (
    "num_generations", "num_generations_eval", "scale_rewards", "multi_objective_aggregation", "loss_type",
    "num_iterations", "pad_to_multiple_of", "vllm_importance_sampling_mode", "is_deepspeed_enabled", "reward_funcs",
    "beta", "use_vllm", "accelerator", "processing_class",
)  # fmt: skip


def instance_attributes(trainer: Any) -> dict[str, str]:
    """The types of the TRL attributes the trainers read or write, on a freshly built GRPOTrainer."""
    metrics = trainer._metrics
    logs = trainer._logs
    return {
        "_step": repr(trainer._step),
        "_buffered_inputs": repr(trainer._buffered_inputs),
        "_metrics": f"{type(metrics).__name__} {sorted(metrics)} of {type(metrics['train']).__name__}"
        f"[{metrics['train'].default_factory.__name__}]",
        "_logs['advantages']": f"{type(logs['advantages']).__name__}(maxlen=generation_batch_size: "
        f"{logs['advantages'].maxlen == trainer.args.generation_batch_size})",
        "_tokenizer": "the processing class" if trainer._tokenizer is trainer.processing_class else "other",
        "_is_vlm": repr(trainer._is_vlm),
        "reward_weights": f"{type(trainer.reward_weights).__name__} {tuple(trainer.reward_weights.shape)}",
        "reward_func_names": repr(trainer.reward_func_names),
        "public attributes missing": repr([name for name in PUBLIC_ATTRIBUTES if not hasattr(trainer, name)]),
    }


def class_attributes(_trainer: Any) -> dict[str, Any]:
    return {
        "_tag_names": GRPOTrainer._tag_names,
        "_name": GRPOTrainer._name,
        "_paper keys": sorted(GRPOTrainer._paper),
    }


def config_fields(_trainer: Any) -> list[str]:
    """The GRPOConfig fields the trainers read that are missing from the installed GRPOConfig."""
    used = (
        "steps_per_generation", "generation_batch_size", "gradient_accumulation_steps", "num_iterations", "seed",
        "scale_rewards", "loss_type", "beta", "per_device_train_batch_size", "per_device_eval_batch_size",
        "gradient_checkpointing_kwargs", "num_generations", "max_completion_length", "temperature", "epsilon",
        "hub_token", "output_dir", "process_index", "should_save", "multi_objective_aggregation",
    )  # fmt: skip
    fields = {f.name for f in dataclasses.fields(GRPOConfig)} | {n for n in dir(GRPOConfig) if not n.startswith("_")}
    return [name for name in used if name not in fields]


def missing_trl_imports(_trainer: Any) -> list[str]:
    """Every ``from trl... import name`` in grpo_family/ (at any depth) that the installed TRL cannot satisfy."""
    missing = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "trl":
                for alias in node.names:
                    try:
                        getattr(importlib.import_module(node.module), alias.name)
                    except (ImportError, AttributeError) as error:
                        missing.append(f"{path.relative_to(PACKAGE_DIR.parent)}: {node.module}.{alias.name} ({error})")
    return missing


def forward_returns(_trainer: Any) -> list[str]:
    """The return statements of ``_get_per_token_logps_and_entropies``: a ``(logps, entropies, aux_loss)`` triple."""
    return [
        ast.unparse(n)
        for n in ast.walk(function_ast(GRPOTrainer, "_get_per_token_logps_and_entropies"))
        if isinstance(n, ast.Return)
    ]


def vllm_colocate_sync(_trainer: Any) -> dict[str, Any]:
    """What vllm_cpu.install_cpu_weight_sync replaces and reads: TRL's colocated ``VLLMGeneration.sync_weights``
    (an instance attribute set over it is what TRL calls) and its parameter iterator."""
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(trl_grpo_module)
    return {
        "sync_weights": signature(VLLMGeneration, "sync_weights"),
        "_iter_named_params": signature(VLLMGeneration, "_iter_named_params"),
        "_iter_named_params is a generator": inspect.isgeneratorfunction(VLLMGeneration._iter_named_params),
        "GRPOTrainer calls self.vllm_generation.sync_weights()": source.count("self.vllm_generation.sync_weights()"),
        "GRPOTrainer sets vllm_generation and vllm_mode": "self.vllm_generation = VLLMGeneration(" in source
        and "self.vllm_mode = args.vllm_mode" in source,
    }


def sampler_layout(_trainer: Any) -> list[int]:
    """RepeatSampler without shuffling: each prompt ``mini_repeat_count`` times in a row (a group on consecutive
    rows), a chunk of ``batch_size`` prompts repeated ``repeat_count`` times before the next chunk."""
    return list(RepeatSampler(list(range(5)), mini_repeat_count=2, batch_size=2, repeat_count=2, shuffle=False))


def sampler_draws_at_start(_trainer: Any) -> bool:
    """EpochAlignedSampler skips an epoch by starting (and abandoning) one pass: a pass must draw its whole
    permutation from ``generator`` when it starts, so that an abandoned pass advances it like a full one."""
    full = RepeatSampler(list(range(9)), mini_repeat_count=2, batch_size=3, seed=7)
    list(full)
    abandoned = RepeatSampler(list(range(9)), mini_repeat_count=2, batch_size=3, seed=7)
    next(iter(abandoned))
    return list(full) == list(abandoned) and hasattr(abandoned, "generator")


def train_sampler(trainer: Any) -> dict[str, Any]:
    sampler = trainer._get_train_sampler()
    return {
        "type": type(sampler).__name__,
        "mini_repeat_count == num_generations": sampler.mini_repeat_count == trainer.num_generations,
        "batch_size == generation_batch_size / num_generations": sampler.batch_size
        == trainer.args.generation_batch_size // trainer.num_generations,
        "repeat_count == num_iterations * steps_per_generation": sampler.repeat_count
        == trainer.num_iterations * trainer.args.steps_per_generation,
        "seed == args.seed": sampler.seed == trainer.args.seed,
    }


# ------------------------------------------------------------------------------------------------ behaviour


@contextlib.contextmanager
def patched(obj: Any, **values: Any) -> Iterator[None]:
    """Set attributes on ``obj`` for the duration (instance attributes, removed again when they were not there)."""
    missing = object()
    old = {name: obj.__dict__.get(name, missing) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


class RecordingDict(dict):
    """A batch that records which keys the loss reads, in order, into a shared event list."""

    def __init__(self, events: list[str], *args: Any):
        super().__init__(*args)
        self.events = events

    def __getitem__(self, key):
        self.events.append(f"read {key}")
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in self:
            self.events.append(f"read {key}")
        return super().get(key, default)


def loss_batch(events: list[str], rows: int = 2, width: int = 3, *, num_items: float = 6.0, advantages=None):
    return RecordingDict(
        events,
        {
            "prompt_ids": torch.ones(rows, 2, dtype=torch.long),
            "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
            "completion_ids": torch.ones(rows, width, dtype=torch.long),
            "completion_mask": torch.ones(rows, width, dtype=torch.long),
            "old_per_token_logps": torch.full((rows, width), -1.0),
            "advantages": torch.ones(rows) if advantages is None else advantages,
            "num_items_in_batch": torch.tensor(num_items),
        },
    )


def run_loss(trainer: Any, batch: dict, *, loss_type: str, train: bool, accumulation: int, spg: int, events=None):
    """TRL's ``compute_loss`` on ``batch`` with the policy forward stubbed: log-probs -1 (ratio 1 to the old ones)."""
    events = [] if events is None else events

    def forward(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        events.append(f"forward compute_entropy={kwargs.get('compute_entropy')}")
        rows = input_ids.size(0)
        return torch.full((rows, logits_to_keep), -1.0), torch.ones(rows, logits_to_keep), None

    trainer.model.train(train)
    try:
        with (
            patched(trainer, _get_per_token_logps_and_entropies=forward, loss_type=loss_type),
            patched(trainer, current_gradient_accumulation_steps=accumulation),
            patched(trainer.args, steps_per_generation=spg),
        ):
            return float(trainer.compute_loss(trainer.model, batch))
    finally:
        trainer.model.train(False)
        for mode in trainer._metrics.values():
            mode.clear()


def loss_call_order(trainer: Any) -> list[str]:
    """What ``compute_loss`` does, in order, among: the policy forward and reading the advantages. CW-GRPO and D3S
    rewrite ``inputs["advantages"]`` inside the forward, so TRL must run it once, with entropies, before reading
    them, and on the very ``inputs`` dict ``compute_loss`` was given."""
    events: list[str] = []
    run_loss(trainer, loss_batch(events), loss_type="dapo", train=True, accumulation=1, spg=1, events=events)
    return [e for e in events if e.startswith("forward") or e == "read advantages"]


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def num_items_loss_types(trainer: Any) -> list[str]:
    """The loss types whose loss depends on ``num_items_in_batch``: the token-sum losses D3S drives."""
    depends = []
    for loss_type in LOSS_TYPES:
        small, large = (
            run_loss(trainer, loss_batch([], num_items=n), loss_type=loss_type, train=True, accumulation=1, spg=1)
            for n in (6.0, 12.0)
        )
        if small != large:
            depends.append(loss_type)
    return sorted(depends)


def token_sum_normalisers(trainer: Any) -> dict[str, float]:
    """The dapo loss of ``-1`` on each of the 6 valid tokens divided out: the normaliser TRL uses, for
    ``num_items_in_batch`` N=12, one process, accumulation GA=4 and steps_per_generation spg=2. D3S inverts
    ``N / processes * GA / spg`` (train) and ``N / processes`` (eval); token-level ``(B, T)`` advantages are
    used as given (the loss of a batch whose second token column has advantage 0 counts 4 tokens)."""

    def normaliser(train: bool, advantages=None, valid: float = 6.0) -> float:
        loss = run_loss(
            trainer, loss_batch([], num_items=12.0, advantages=advantages), loss_type="dapo", train=train,
            accumulation=4, spg=2,
        )  # fmt: skip
        return round(-valid / loss, 3)  # float32 losses

    per_token = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    return {
        "train: N * GA / spg": normaliser(True),
        "eval: N": normaliser(False),
        "train, (B, T) advantages": normaliser(True, per_token, valid=4.0),
    }


def prepare_inputs_schedule(trainer: Any) -> list[str]:
    """Which micro-steps generate and which buffered chunk each returns, for steps_per_generation=2 and
    num_iterations=2: the base class's resume state and D3S's per-generation-batch preparation rely on it."""
    generated = []

    def generate(inputs):
        generated.append(True)
        return {"rows": torch.arange(8)[:, None], "advantages": torch.zeros(8)}

    schedule = []
    trainer.model.train(True)
    try:
        with (
            patched(trainer, _generate_and_score_completions=generate, num_iterations=2, _buffered_inputs=None),
            patched(trainer.args, steps_per_generation=2),
        ):
            for step in range(8):
                trainer._step = step
                before = len(generated)
                chunk = trainer._prepare_inputs([{}] * 8)
                index = next(i for i, c in enumerate(trainer._buffered_inputs) if c is chunk)
                schedule.append(
                    f"step {step}: {'generate, ' if len(generated) > before else ''}chunk {index} of "
                    f"{len(trainer._buffered_inputs)} ({len(chunk['rows'])} rows)"
                )
    finally:
        trainer._step = 0
        trainer.model.train(False)
    return schedule


# ------------------------------------------------------------------------------------------------ the contract

GEN = "_generate_and_score_completions"

FACTS: tuple[Fact, ...] = (
    # --- methods the trainers override or call, by signature
    Fact(
        "GRPOTrainer._calculate_rewards signature",
        "base: _calculate_rewards override keeps the gathered rewards and masks non-finite reward-model values",
        lambda t: signature(GRPOTrainer, "_calculate_rewards"),
        ("self", "inputs", "prompts", "completions", "completion_ids_list"),
        ("_calculate_rewards",),
    ),
    Fact(
        "GRPOTrainer._generate signature",
        "base: _generate override scores and selects rows (D3S) between generation and TRL's old/reference forwards "
        "(its 8-value return layout and the call order are pinned in tests/test_stages.py)",
        lambda t: signature(GRPOTrainer, "_generate"),
        ("self", "prompts"),
        ("_generate",),
    ),
    Fact(
        "GRPOTrainer._generate_and_score_completions signature",
        "base (advantage hook), CW-GRPO (row tags), D3S (selection), GPG (several calls per step)",
        lambda t: signature(GRPOTrainer, GEN),
        ("self", "inputs"),
        (GEN,),
    ),
    Fact(
        "GRPOTrainer._get_per_token_logps_and_entropies signature",
        "base._batch_logps_and_entropies (passes FORWARD_KEYS by name), CW-GRPO and D3S (wrap it in the loss)",
        lambda t: signature(GRPOTrainer, "_get_per_token_logps_and_entropies"),
        (
            "self",
            "model",
            "input_ids",
            "attention_mask",
            "logits_to_keep",
            "batch_size=None",
            "compute_entropy=False",
            "compute_aux_loss=False",
            *(f"{key}=None" for key in family_base.FORWARD_KEYS),
        ),  # fmt: skip
        ("_get_per_token_logps_and_entropies",),
    ),
    Fact(
        "GRPOTrainer._get_per_token_logps_and_entropies returns (logps, entropies, aux_loss)",
        "base._batch_logps_and_entropies, CW-GRPO and D3S unpack three values; entropies None unless asked for",
        forward_returns,
        ["return (logps, entropies, aux_loss)"],
    ),
    Fact(
        "GRPOTrainer.compute_loss / _compute_loss signatures",
        "CW-GRPO, D3S, GPG override compute_loss and delegate to TRL's",
        lambda t: (signature(GRPOTrainer, "compute_loss"), signature(GRPOTrainer, "_compute_loss")),
        (("self", "model", "inputs", "return_outputs=False", "num_items_in_batch=None"), ("self", "model", "inputs")),
        ("_compute_loss",),
    ),
    Fact(
        "GRPOTrainer._prepare_inputs signature",
        "D3S: prepares each new generation batch when _buffered_inputs changes",
        lambda t: signature(GRPOTrainer, "_prepare_inputs"),
        ("self", "generation_batch"),
        ("_prepare_inputs",),
    ),
    Fact(
        "GRPOTrainer._get_train_sampler signature",
        "base: wraps TRL's RepeatSampler in EpochAlignedSampler (resume)",
        lambda t: signature(GRPOTrainer, "_get_train_sampler"),
        ("self", "dataset=None"),
        ("_get_train_sampler",),
    ),
    Fact(
        "Trainer._save_rng_state / _load_rng_state / _save_checkpoint / _get_output_dir signatures",
        "resume.ResumableTrainerMixin: method state saved next to the RNG state, complete-checkpoint marker",
        lambda t: tuple(
            signature(GRPOTrainer, n)
            for n in ("_save_rng_state", "_load_rng_state", "_save_checkpoint", "_get_output_dir")
        ),
        (("self", "output_dir"), ("self", "checkpoint"), ("self", "model", "trial"), ("self", "trial")),
        ("_save_rng_state", "_load_rng_state", "_save_checkpoint", "_get_output_dir"),
    ),
    Fact(
        "Trainer.train / create_model_card / create_optimizer signatures",
        "resume (train(resume_from_checkpoint=True)), model_card, nonfinite_guard",
        lambda t: (
            signature(GRPOTrainer, "train")[:2],
            signature(GRPOTrainer, "create_model_card"),
            signature(GRPOTrainer, "create_optimizer")[:1],
        ),
        (
            ("self", "resume_from_checkpoint=None"),
            ("self", "model_name=None", "dataset_name=None", "tags=None"),
            ("self",),
        ),
    ),
    # --- what the generation step produces
    Fact(
        "keys of _generate_and_score_completions' output",
        "base._merge_round_outputs (GPG's rounds: pads each known key, refuses unknown ones), base.FORWARD_KEYS (multimodal inputs)",
        output_keys,
        tuple(
            sorted(
                {
                    "prompt_ids",
                    "prompt_mask",
                    "completion_ids",
                    "completion_mask",
                    "advantages",
                    "num_items_in_batch",
                    "old_per_token_logps",
                    "importance_sampling_ratio",
                    "sampling_per_token_logps",
                    "ref_per_token_logps",
                    "tool_mask",
                    *family_base.FORWARD_KEYS,
                }
            )
        ),  # fmt: skip
    ),
    Fact(
        "padding sides and values of the generation output",
        "base._merge_round_outputs: prompts padded on the left, completions on the right, tool_mask with 1",
        padding,
        (
            ("completion_ids", "'right'", "self._tokenizer.pad_token_id"),
            ("completion_mask", "'right'", "0"),
            ("prompt_ids", "'left'", "self._tokenizer.pad_token_id"),
            ("prompt_mask", "'left'", "0"),
            ("sampling_per_token_logps", "'right'", "0.0"),
            ("tool_mask", "'right'", "1"),
        ),
        ("_tokenizer",),
    ),
    Fact(
        "num_items_in_batch formula",
        "base._merge_round_outputs recomputes it for the assembled batch; D3S inverts TRL's use of it",
        lambda t: assignments(GRPOTrainer, GEN, "loss_mask", "num_items_in_batch"),
        {
            "loss_mask": ["completion_mask if tool_mask is None else completion_mask * tool_mask"],
            "num_items_in_batch": ["self.accelerator.gather(loss_mask.sum()).sum()"],
        },
    ),
    Fact(
        "the local slice of the gathered advantages",
        "base._generate_and_score_completions takes this process's rows of its own advantages the same way",
        lambda t: assignments(GRPOTrainer, GEN, "process_slice"),
        {
            "process_slice": [
                "slice(self.accelerator.process_index * len(prompts), (self.accelerator.process_index + 1) * "
                "len(prompts))"
            ]
        },
    ),
    Fact(
        "when TRL computes old_per_token_logps",
        "CW-GRPO uses TRL's old log-probs when present, else one extra forward or the loss's own forward",
        lambda t: [
            ast.unparse(n.test)
            for n in ast.walk(function_ast(GRPOTrainer, GEN))
            if isinstance(n, ast.If) and "generate_every" in ast.unparse(n.test)
        ],
        [
            "self.args.gradient_accumulation_steps % generate_every != 0 or (self.use_vllm and "
            "self.vllm_importance_sampling_correction)"
        ],
    ),
    Fact(
        "generation-side forwards pass no compute_entropy",
        "D3S tells TRL's loss forward (entropies computed) from the old/reference log-prob forwards (entropies None)",
        generation_forward_entropy_flags,
        ("<not passed>", "<not passed>", "<not passed>"),
    ),
    Fact(
        "_generate_and_score_completions calls _calculate_rewards once",
        "base: the rewards and context for the advantage hook are captured in _calculate_rewards",
        calculate_rewards_calls,
        ("self._calculate_rewards(inputs, prompts, completions, completion_ids_list)",),
    ),
    Fact(
        "_calculate_rewards returns the rewards gathered from every process",
        "base: advantages are computed on the global (num_prompts, num_generations) rewards",
        calculate_rewards_returns,
        ("rewards_per_func = gather(rewards_per_func)", "return rewards_per_func"),
    ),
    Fact(
        "reward metrics and logged advantages written once per generation batch",
        "base._fix_logged_batch overwrites _metrics[mode][...][-1] and the last batch of _logs['advantages']; GPG "
        "trims the entries of its extra rounds",
        metric_appends,
        {
            "_metrics[mode]['reward'].append": 1,
            "_metrics[mode]['reward_std'].append": 1,
            "_metrics[mode]['frac_reward_zero_std'].append": 1,
            "_logs['advantages'].extend(all_process_advantages.tolist())": 1,
        },
        ("_metrics", "_logs"),
    ),
    # --- the training loop's counters and buffers
    Fact(
        "training_step counts _step after the Trainer's step",
        "D3S (the loss calls of an optimizer step are the _step window), MS-GRPO, resume state",
        training_step_order,
        ("output = super().training_step(model, inputs, num_items_in_batch)", "self._step += 1"),
        ("_step",),
    ),
    Fact(
        "_prepare_inputs: one generation per steps_per_generation x num_iterations micro-steps, chunk _step % spg",
        "base._resume_state (buffered generations of a checkpoint inside a generation batch), D3S",
        prepare_inputs_schedule,
        [f"step {s}: {'generate, ' if s % 4 == 0 else ''}chunk {s % 2} of 2 (4 rows)" for s in range(8)],
        ("_buffered_inputs",),
    ),
    Fact(
        "transformers sets current_gradient_accumulation_steps in its training loop",
        "D3S._window_denominators rescales num_items_in_batch by it, as TRL's loss does",
        current_accumulation_is_set,
        True,
    ),
    Fact(
        "attributes of a built GRPOTrainer",
        "base (_step, _buffered_inputs, _metrics, _logs, reward_*), GPG (_tokenizer, _is_vlm), every trainer",
        instance_attributes,
        {
            "_step": "0",
            "_buffered_inputs": "None",
            "_metrics": "dict ['eval', 'train'] of defaultdict[list]",
            "_logs['advantages']": "deque(maxlen=generation_batch_size: True)",
            "_tokenizer": "the processing class",
            "_is_vlm": "False",
            "reward_weights": "Tensor (1,)",
            "reward_func_names": "['digit_share_reward']",
            "public attributes missing": "[]",
        },
        ("_is_vlm",),
    ),
    Fact(
        "GRPOTrainer's class attributes for the model card",
        "every trainer sets _tag_names, _name and _paper; model_card reads _name and _paper['title']",
        class_attributes,
        {"_tag_names": ["trl", "grpo"], "_name": "GRPO", "_paper keys": ["citation", "id", "title"]},
        ("_tag_names", "_name", "_paper"),
    ),
    Fact(
        "every TRL name grpo_family imports exists",
        "the modules that import them (helpers such as trl.trainer.utils.nanstd, is_async_callable, "
        "trl.models.utils.disable_gradient_checkpointing live in TRL's internal modules)",
        missing_trl_imports,
        [],
    ),
    Fact(
        "vLLM colocate weight sync",
        "vllm_cpu.install_cpu_weight_sync / reload_weights_sync (vLLM on CPU)",
        vllm_colocate_sync,
        {
            "sync_weights": ("self",),
            "_iter_named_params": ("self",),
            "_iter_named_params is a generator": True,
            "GRPOTrainer calls self.vllm_generation.sync_weights()": 2,
            "GRPOTrainer sets vllm_generation and vllm_mode": True,
        },
        ("_iter_named_params",),
    ),
    Fact(
        "GRPOConfig fields the trainers read",
        "every trainer and config (missing fields listed)",
        config_fields,
        [],
    ),
    # --- the loss
    Fact(
        "inside compute_loss: one policy forward with entropies, then the advantages are read",
        "CW-GRPO and D3S rewrite inputs['advantages'] in the forward of TRL's loss (the same dict)",
        loss_call_order,
        ["forward compute_entropy=True", "read advantages"],
    ),
    Fact(
        "loss types that divide by num_items_in_batch",
        "D3S.TOKEN_SUM_LOSS_TYPES: the losses whose denominator D3S controls",
        num_items_loss_types,
        sorted(family_d3s.TOKEN_SUM_LOSS_TYPES),
    ),
    Fact(
        "token-sum normaliser (dapo/cispo/vespo), N=12, GA=4, spg=2, one process",
        "D3S._window_denominators inverts it; base per-token advantages (B, T) go into the loss as given",
        token_sum_normalisers,
        {"train: N * GA / spg": 24.0, "eval: N": 12.0, "train, (B, T) advantages": 24.0},
    ),
    # --- the sampler
    Fact(
        "RepeatSampler layout",
        "GPG._draw_prompts (extra rounds in TRL's layout), groups on consecutive rows everywhere",
        sampler_layout,
        [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3],
    ),
    Fact(
        "RepeatSampler draws a pass's permutation when the pass starts",
        "resume.EpochAlignedSampler (an abandoned pass per skipped epoch)",
        sampler_draws_at_start,
        True,
    ),
    Fact(
        "GRPOTrainer._get_train_sampler builds TRL's RepeatSampler",
        "resume.EpochAlignedSampler wraps it; GPG draws extra rounds in its layout",
        train_sampler,
        {
            "type": "RepeatSampler",
            "mini_repeat_count == num_generations": True,
            "batch_size == generation_batch_size / num_generations": True,
            "repeat_count == num_iterations * steps_per_generation": True,
            "seed == args.seed": True,
        },
    ),
)


@pytest.fixture(scope="module")
def stock_trainer(tiny_model_dir, tiny_tokenizer, arithmetic_train, tmp_path_factory):
    """TRL's own GRPOTrainer (not a grpo_family one) on the tiny model: the facts are TRL's."""
    config = GRPOConfig(**tiny_config_kwargs(tmp_path_factory.mktemp("contract"), loss_type="dapo"))
    return GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=[digit_share_reward],
        args=config,
        train_dataset=arithmetic_train,
        processing_class=tiny_tokenizer,
    )


@pytest.mark.parametrize("fact", FACTS, ids=lambda fact: fact.name)
def test_trl_fact(fact, stock_trainer):
    problem = check(fact, stock_trainer)
    assert problem is None, problem


# ------------------------------------------------------------------------------------------------ the checker


@pytest.mark.parametrize("fact", FACTS, ids=lambda fact: fact.name)
def test_every_fact_can_fail(fact, stock_trainer):
    """Against any other pinned value, the checker reports the fact by name with both values."""
    changed = dataclasses.replace(fact, pinned=("something else", fact.pinned))
    problem = check(changed, stock_trainer)
    assert problem is not None and fact.name in problem and fact.used_by in problem, problem
    assert repr(changed.pinned) in problem


def broken(stock_trainer) -> list[str]:
    return [fact.name for fact in FACTS if check(fact, stock_trainer) is not None]


def fact(name: str) -> Fact:
    return next(f for f in FACTS if f.name == name)


def change_trl_method(monkeypatch, name: str, *edits: tuple[str, str]) -> None:
    """Replace ``GRPOTrainer.<name>`` by its TRL source with ``edits`` applied (each must apply), compiled in TRL's
    module namespace and registered in ``linecache`` so that ``inspect.getsource`` reads the changed source."""
    source = textwrap.dedent(inspect.getsource(getattr(GRPOTrainer, name)))
    for old, new in edits:
        assert old in source, f"the edit no longer applies to TRL's {name}: {old!r}"
        source = source.replace(old, new)
    filename = f"<TRL's {name}, changed on purpose>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    monkeypatch.setitem(linecache.cache, filename, linecache.cache[filename])
    namespace = dict(vars(trl_grpo_module))
    exec(compile(source, filename, "exec"), namespace)
    monkeypatch.setattr(GRPOTrainer, name, namespace[name])


def test_a_changed_signature_is_reported(stock_trainer, monkeypatch):
    def _calculate_rewards(self, inputs, prompts, completions):  # completion_ids_list dropped
        return None

    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", _calculate_rewards)
    assert "GRPOTrainer._calculate_rewards signature" in broken(stock_trainer)
    message = check(fact("GRPOTrainer._calculate_rewards signature"), stock_trainer)
    assert "installed:    ('self', 'inputs', 'prompts', 'completions')" in message
    assert "relied on by: base: _calculate_rewards override" in message


def test_a_changed_loss_order_is_reported(stock_trainer, monkeypatch):
    """A TRL whose loss reads the advantages before its forward (CW-GRPO's and D3S's edits would come too late)."""
    change_trl_method(
        monkeypatch,
        "_compute_loss",
        (
            "    # Compute the per_token_logps and the entropy",
            "    inputs['advantages']\n    # Compute the per_token_logps and the entropy",
        ),
    )
    assert broken(stock_trainer) == [
        "inside compute_loss: one policy forward with entropies, then the advantages are read"
    ]


def test_a_changed_normaliser_is_reported(stock_trainer, monkeypatch):
    """A TRL that stops rescaling num_items_in_batch to the accumulation window (D3S's inverse would be wrong)."""
    change_trl_method(
        monkeypatch,
        "_compute_loss",
        (
            "normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation",
            "pass",
        ),
    )
    assert broken(stock_trainer) == ["token-sum normaliser (dapo/cispo/vespo), N=12, GA=4, spg=2, one process"]
    message = check(fact(broken(stock_trainer)[0]), stock_trainer)
    assert "'train: N * GA / spg': 12.0" in message  # installed value; pinned 24.0


def test_changed_output_keys_padding_and_counts_are_reported(stock_trainer, monkeypatch):
    change_trl_method(
        monkeypatch,
        "_generate_and_score_completions",
        ('padding_side="left"', 'padding_side="right"'),
        ('"num_items_in_batch": num_items_in_batch,', '"num_items_in_batch": num_items_in_batch, "new_key": 1,'),
        (
            "num_items_in_batch = self.accelerator.gather(loss_mask.sum()).sum()",
            "num_items_in_batch = loss_mask.sum()",
        ),
    )
    assert broken(stock_trainer) == [
        "keys of _generate_and_score_completions' output",
        "padding sides and values of the generation output",
        "num_items_in_batch formula",
    ]
    assert "new_key" in check(fact("keys of _generate_and_score_completions' output"), stock_trainer)


def test_a_changed_sampler_layout_is_reported(stock_trainer, monkeypatch):
    def interleaved(self):  # a group's completions no longer on consecutive rows
        for _ in range(self.mini_repeat_count * self.repeat_count):
            yield from range(self.num_samples // self.batch_size * self.batch_size)

    monkeypatch.setattr(RepeatSampler, "__iter__", interleaved)
    assert "RepeatSampler layout" in broken(stock_trainer)


def test_a_changed_buffering_is_reported(stock_trainer, monkeypatch):
    """A TRL that regenerates every steps_per_generation micro-steps, ignoring num_iterations."""
    change_trl_method(
        monkeypatch,
        "_prepare_inputs",
        (
            "generate_every = self.args.steps_per_generation * self.num_iterations",
            "generate_every = self.args.steps_per_generation",
        ),
    )
    assert broken(stock_trainer) == [
        "_prepare_inputs: one generation per steps_per_generation x num_iterations micro-steps, chunk _step % spg"
    ]


def test_a_moved_helper_is_reported(stock_trainer, monkeypatch):
    """A TRL that moves a helper grpo_family imports from one of its internal modules."""
    import trl.trainer.utils

    monkeypatch.delattr(trl.trainer.utils, "nanstd")
    assert broken(stock_trainer) == ["every TRL name grpo_family imports exists"]
    message = check(fact("every TRL name grpo_family imports exists"), stock_trainer)
    assert "grpo_family/trainers/generation_rounds.py: trl.trainer.utils.nanstd" in message


# ------------------------------------------------------------------------------------------------ completeness


def private_trl_names_used(stock_trainer) -> dict[str, list[str]]:
    """Every ``<anything>._x`` of grpo_family/{trainers,runtime,integrations} whose ``_x`` TRL provides: a ``GRPOTrainer`` method or
    attribute (class or instance), or one of its vLLM generation backend's."""
    from trl.generation.vllm_generation import VLLMGeneration

    provided = set(dir(GRPOTrainer)) | set(vars(stock_trainer)) | set(dir(VLLMGeneration))
    used: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(p for folder in TRL_USERS for p in folder.glob("*.py")):
        for match in re.finditer(r"\.(_(?!_)\w+)", path.read_text(encoding="utf-8")):
            if match.group(1) in provided and path.name not in used[match.group(1)]:
                used[match.group(1)].append(path.name)
    return dict(used)


def test_every_private_trl_name_is_pinned(stock_trainer):
    """A trainer that starts to use another private TRL method or attribute must add a fact for it here."""
    pinned = {name for fact in FACTS for name in fact.names}
    used = private_trl_names_used(stock_trainer)
    assert {"_step", "_metrics", "_calculate_rewards", "_iter_named_params"} <= set(used)  # the scan finds them
    missing = {name: files for name, files in used.items() if name not in pinned}
    assert not missing, (
        f"grpo_family (trainers, runtime, integrations) uses private TRL names that no contract fact pins: {missing}. Add a Fact to FACTS "
        "for each (what the code relies on, and its value in the installed TRL)."
    )


def test_the_gpg_merge_keys_are_the_pinned_output_keys():
    """The merge of generation rounds (GPG) pads by key: its sets must cover every non-multimodal key TRL may return."""
    known = family_base.LEFT_PADDED | family_base.RIGHT_PADDED | family_base.PER_ROW | {"num_items_in_batch"}
    pinned = set(next(f for f in FACTS if f.name.startswith("keys of")).pinned)
    assert pinned - set(family_base.FORWARD_KEYS) == known


# ------------------------------------------------------------------------------------------------ the loss-term seam
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_aggregate_token_loss_is_trls_aggregation(stock_trainer, loss_type, train):
    """A loss term's per-token loss is added to TRL's loss as TRL aggregates its own (algorithms.losses.
    aggregate_token_loss): with the policy at the old one (ratio 1) TRL's loss of per-token advantages A is the
    aggregation of -A, for every clipped-ratio loss type, with accumulation and steps_per_generation in training."""
    from grpo_family.algorithms.losses import aggregate_token_loss

    advantages = torch.tensor([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]])
    batch = loss_batch([], advantages=advantages, num_items=12.0)
    batch["completion_mask"] = torch.tensor([[1, 1, 1], [1, 1, 0]])
    trl = run_loss(stock_trainer, batch, loss_type=loss_type, train=train, accumulation=4, spg=2)
    ours = aggregate_token_loss(
        -advantages,
        batch["completion_mask"],
        loss_type,
        num_items_in_batch=12.0,
        num_processes=1,
        accumulation=4 if train else 1,
        steps_per_generation=2 if train else 1,
        max_completion_length=stock_trainer.max_completion_length,
    )
    # tol: TRL and ours sum the same 5 float32 per-token terms in other orders and normalise them (per row, per
    # batch, by accumulation): at most 16 roundings, each within 2^-23 of a partial result, whose sizes stay within
    # sum |A| = 6.75 of the masked terms against the result's |sum A| = 2.75 (before the same scalings).
    rel_tol = 16 * EPS32 * 6.75 / 2.75
    assert trl != 0 and math.isclose(trl, float(ours), rel_tol=rel_tol), (trl, float(ours))  # tol: just above
