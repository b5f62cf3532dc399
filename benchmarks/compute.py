"""Work per optimizer step of every method, counted (not timed), as a ratio to ``grpo`` under the same settings.

    python benchmarks/compute.py --processes     # what benchmarks/results/ holds (~10 min on a loaded 2-core CPU)
    python benchmarks/compute.py                 # the same without the 2-process check
    python benchmarks/compute.py --only d3s      # the settings of one method's recipes
    python benchmarks/compute.py --no-scale      # skip the scale checks (benchmarks/results/scale.md)
    python benchmarks/compute.py --report-only   # rewrite the .md files from the stored .json

Step times of a 0.2M-parameter model on a shared CPU are noise (benchmarks/results/speed.md); what decides a
method's GPU cost is the work it asks for, and that can be counted exactly on any machine. For every method under
every setting of its recipes (``examples/recipes/*.yaml``), the real trainer runs on a tiny random Qwen2 model for
two generation cycles (a cycle is ``lcm(num_iterations x steps_per_generation, gradient_accumulation_steps) /
gradient_accumulation_steps`` optimizer steps, one for every recipe here); the second cycle is counted (the first
warms one-off caches such as MS-GRPO's subgroup tables) and its counts are divided by its steps. D3S is pinned at
the start of its schedule (``d3s_samples_end = d3s_samples_start``, same for the token ratio), where it drops the
most. Per optimizer step this module counts:

* rows and rows x tokens through the policy with grad (the loss forwards), without grad (TRL's old log-probs,
  CW-GRPO's and D3S's own extra forwards), through the reference model, and through the backward (counted when
  the gradient reaches the policy's output, so a forward whose output never gets a gradient is not counted);
* forward rows over rollouts the method drops (generated, but in no loss call), per model;
* generated tokens (valid completion tokens, what a vLLM sampler would produce);
* host-device synchronisations outside generation (see :class:`SyncCounter` for what is counted and the limits of
  counting them on a CPU), and, separately, those of ``transformers``' ``generate`` (absent with vLLM).

Forwards are seen by forward hooks on the policy and the reference model: the input shape is rows x tokens
(prompt + completion), ``torch.is_grad_enabled()`` tells grad from no-grad, and a forward inside TRL's
``_generate_single_turn`` is a sampling step, not counted as a forward. Structure kept from each recipe: G,
per-device batch, gradient accumulation, ``steps_per_generation``, ``num_iterations``, ``beta``, loss type, the
method's own options, and vLLM with its importance-sampling (IS) correction where the recipe uses vLLM (sampler
log-probs simulated: TRL's vLLM code path runs, with ``generate`` standing in for the vLLM engine, as in
``tests/test_vllm_batch.py``). A recipe that uses vLLM is measured as written (every paper recipe turns the IS
correction off) and with the correction on (TRL's default). What is made small: the model, the completion length
(``--completion-length``, every completion exactly that long: ``min_new_tokens`` = max, so counts are closed-form),
the prompts (arithmetic problems of one token length), one process. Not counted: gradient checkpointing (on in
every recipe) recomputes each forward with grad during the backward, the same for every method (add the policy's
with-grad tokens once more). SGPO's judge is the programmatic one (an LLM
judge's work happens on another server and is not the policy's). Rewards: a reward that is different for every
rollout of a group, so no group is degenerate and GPG never resamples (its resampling rounds multiply the generation
and generation-side forwards: see scale.md).

:func:`expected_counts` gives every count in closed form (today's code), :func:`scale_check` measures each method at
two sizes of batch, G, gradient accumulation, completion length and model size (and :func:`processes_check` grpo and
D3S on 2 processes) and compares with the formulas. ``tests/test_compute_benchmark.py`` measures every method at two
accumulation sizes against the formulas and pins the host syncs, and checks the committed results against the
formulas. Writes ``benchmarks/results/compute.md`` (+ ``.json``) and ``benchmarks/results/scale.md`` (+ ``.json``).

When a method's work changes on purpose (e.g. D3S making old and reference log-probs for its kept rollouts only):
change its branch of :func:`expected_counts` and its line in ``FORMULAS``, re-run this script, and update the
pinned host syncs in ``tests/test_compute_benchmark.py`` (the call-site table of compute.md says which moved).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402
from transformers import PreTrainedTokenizerFast, PrinterCallback, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from benchmarks import harness  # noqa: E402
from grpo_family import METHODS  # noqa: E402
from grpo_family.tasks import arithmetic_reward, build_tiny_model, build_tokenizer, make_arithmetic_dataset  # noqa: E402
from grpo_family.trainers.d3s import D3SConfig, default_samples_start  # noqa: E402

D3S_DEFAULTS = {f.name: f.default for f in dataclasses.fields(D3SConfig)}
# Config values of every measured run that do not change the work counted (bf16 off: on CPU it means autocast).
RUN_ARGS = dict(learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True, seed=0, save_strategy="no",
                disable_tqdm=True, bf16=False)  # fmt: skip
RECIPES = ROOT / "examples" / "recipes"
MODEL_SIZES = {  # two tiny Qwen2 configurations (the model-size check)
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2),
    "tiny-x2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4),
}
COUNTS = (
    "policy_grad_rows", "policy_grad_tokens", "policy_nograd_rows", "policy_nograd_tokens", "ref_rows", "ref_tokens",
    "backward_rows", "backward_tokens", "generated_rollouts", "generated_tokens", "dropped_rollouts",
    "dropped_forward_rows", "forward_backward_tokens",
)  # fmt: skip
# Recipe keys that describe the run's structure (taken as written) or only the data, model, logging and hardware
# (ignored). Method options (fields of the method's config that GRPOConfig lacks) are taken, judge access excepted.
STRUCTURE_KEYS = {
    "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
    "num_iterations", "beta", "loss_type", "scale_rewards", "epsilon", "mask_truncated_completions",
    "importance_sampling_level", "vllm_importance_sampling_mode",
}  # fmt: skip
JUDGE_ACCESS_PREFIX = "judge_"


# ---------------------------------------------------------------------------------------------------- host syncs
_SHAPE_FROM_DATA = {  # ops whose output size depends on tensor values: on CUDA the host waits for the device
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.repeat_interleave.Tensor,
}
_BOOL_INDEXED = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default}
_OWN_FILES = ("compute.py",)


def _call_site() -> str:
    """Innermost frame in grpo_family, trl, transformers or accelerate (the line that asked for the value)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace(os.sep, "/")
        if path.endswith(_OWN_FILES) or "/torch/" in path:
            continue
        for package in ("grpo_family/", "trl/", "transformers/", "accelerate/"):
            if package in path:
                return f"{package}{path.split(package, 1)[1]}:{frame.lineno}"
        return f"{Path(path).name}:{frame.lineno}"
    return "?"


class SyncCounter(TorchDispatchMode):
    """Counts the places where a GPU run would make the host wait for the device, in a CPU run.

        Counted: (1) ``aten._local_scalar_dense``, which ``.item()``, ``float()``, ``int()`` and ``bool()`` of a tensor
        reach; (2) ``.tolist()``, ``.cpu()`` and ``.numpy()`` of a tensor: on a CPU tensor these do not reach the
        dispatcher at all (checked: ``tolist`` and ``cpu`` dispatch no op, ``numpy`` only ``detach``), so the tensor
        methods are wrapped, and so is ``.to``: ``.to("cpu")`` (a string) counts as a move to the host, ``.to(device)`` (a
    ``torch.device`` or a tensor's device, in this CPU run the CPU) as a move to the training device; (3) ops whose output size depends on values (``nonzero``, ``masked_select``, ``unique``,
        ``repeat_interleave`` with tensor repeats, indexing or index-assignment with a boolean mask), which on CUDA copy
        a count to the host. A tensor that came from ``.cpu()`` / ``.numpy()`` (or any op on one) is host data: reading
        it again is not counted. Limits of a CPU run: a tensor the code creates on the CPU on purpose (``torch.tensor``
        without a device) is counted when read although on a GPU run it would be host data, and ``.to(torch.device("cpu"))``
        is taken for a move to the training device. Hence close to an upper bound of the syncs of the same code on a GPU;
        every count keeps its call site.
    """

    def __init__(self):
        super().__init__()
        self.sites: collections.Counter[str] = collections.Counter()
        self.generation_sites: collections.Counter[str] = collections.Counter()
        self.active = False
        self.in_generation = False
        self.paused = 0
        self._originals: dict[str, Any] = {}

    def _record(self) -> None:
        if self.active and not self.paused:
            (self.generation_sites if self.in_generation else self.sites)[_call_site()] += 1

    @staticmethod
    def _is_host(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and getattr(value, "_compute_host", False)

    @staticmethod
    def _mark_host(value: Any) -> Any:
        for leaf in tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                leaf._compute_host = True
        return value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves = tree_leaves((args, kwargs))
        if any(self._is_host(leaf) for leaf in leaves):
            return self._mark_host(out)
        if func is torch.ops.aten._local_scalar_dense.default or func in _SHAPE_FROM_DATA:
            self._record()
        elif func in _BOOL_INDEXED:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or []):
                self._record()
        return out

    @staticmethod
    def _target_device(args: tuple, kwargs: dict) -> Any:
        """The device argument of a ``Tensor.to`` call (a str, a ``torch.device``, a tensor's device), or None."""
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, torch.Tensor):
            return target.device
        return target if isinstance(target, (str, torch.device)) else None

    def _to(self, original):
        counter = self

        def to(tensor, *args, **kwargs):
            out = original(tensor, *args, **kwargs)
            target = counter._target_device(args, kwargs)
            if target is None or not isinstance(out, torch.Tensor):
                return out
            # A string "cpu" is a move to the host; a torch.device (the accelerator's, the CPU in this run) stands for
            # the training device: what was host data is device data again (e.g. ``x.cpu()...to(y.device)``).
            to_host = isinstance(target, str) and target.startswith("cpu")
            if to_host and not counter._is_host(tensor):
                counter._record()
            if to_host != counter._is_host(out) or out is tensor:
                out = out.view_as(out)
                out._compute_host = to_host
            return out

        return to

    def __enter__(self):
        counter = self
        self._originals["to"] = torch.Tensor.to
        torch.Tensor.to = self._to(torch.Tensor.to)
        for name in ("tolist", "cpu", "numpy"):
            original = getattr(torch.Tensor, name)
            self._originals[name] = original

            def wrapped(tensor, *args, _original=original, _name=name, **kwargs):
                if not counter._is_host(tensor):
                    counter._record()
                if _name == "cpu":  # on CPU .cpu() returns the tensor itself: mark a view, not the tensor
                    return counter._mark_host(_original(tensor, *args, **kwargs).view_as(tensor))
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)


# ---------------------------------------------------------------------------------------------------- forwards
class WorkCounter(TrainerCallback):
    """Forward / backward rows and tokens of the policy and reference model, generated rollouts, and which rows
    belong to dropped rollouts; active between ``on_step_begin`` and ``on_step_end`` (the optimizer step)."""

    def __init__(self, trainer, syncs: SyncCounter, skip_steps: int = 0):
        self.trainer, self.syncs, self.skip_steps = trainer, syncs, skip_steps
        self.counts = collections.Counter()
        self.steps = 0
        self.generated: list[tuple[int, ...]] = []
        self.trained: set[tuple[int, ...]] = set()
        self.forward_rows: list[tuple[str, tuple[int, ...]]] = []
        self.handles = [trainer.model.register_forward_hook(self._hook("policy"), with_kwargs=True)]
        if getattr(trainer, "ref_model", None) is not None:
            self.handles.append(trainer.ref_model.register_forward_hook(self._hook("ref"), with_kwargs=True))
        self._wrap(trainer, "_generate_single_turn", self._generation)
        self._wrap(trainer, "_generate", self._generated)
        self._wrap(trainer, "compute_loss", self._loss)

    @property
    def active(self) -> bool:
        return self.syncs.active

    @staticmethod
    def _wrap(trainer, name: str, make):
        setattr(trainer, name, make(getattr(trainer, name)))

    def _generation(self, generate):
        def wrapped(*args, **kwargs):
            self.syncs.in_generation = True
            try:
                return generate(*args, **kwargs)
            finally:
                self.syncs.in_generation = False

        return wrapped

    def _generated(self, generate):
        # Counted where TRL's `_generate` returns (prompt ids, completion ids, ...), once per generation round: a
        # method that selects rows scores its rollouts before TRL does, so `_calculate_rewards` may run twice.
        def wrapped(prompts):
            result = generate(prompts)
            if self.active:
                self.generated.extend(tuple(ids) for ids in result[1])
            return result

        return wrapped

    def _loss(self, compute_loss):
        def wrapped(model, inputs, *args, **kwargs):
            if self.active:
                self.syncs.paused += 1
                try:
                    ids, mask = inputs["completion_ids"], inputs["completion_mask"].bool()
                    self.trained.update(tuple(r[m].tolist()) for r, m in zip(ids, mask) if m.any())
                finally:
                    self.syncs.paused -= 1
            return compute_loss(model, inputs, *args, **kwargs)

        return wrapped

    def _hook(self, model_name: str):
        def hook(module, args, kwargs, output):
            if not self.active or self.syncs.in_generation:
                return
            self.syncs.paused += 1
            try:
                input_ids = kwargs.get("input_ids", args[0] if args else None)
                rows, tokens = input_ids.shape
                kind = (
                    "ref" if model_name == "ref" else ("policy_grad" if torch.is_grad_enabled() else "policy_nograd")
                )
                self.counts[f"{kind}_rows"] += rows
                self.counts[f"{kind}_tokens"] += rows * tokens
                labels = kwargs.get("labels")
                for r in range(rows):
                    scored = input_ids[r][labels[r] != -100] if labels is not None else input_ids[r]
                    self.forward_rows.append((model_name, tuple(scored.tolist())))
                if kind == "policy_grad":
                    out = next(
                        (getattr(output, k) for k in ("log_probs", "logits") if getattr(output, k, None) is not None),
                        None,
                    )
                    if out is not None and out.requires_grad:
                        out.register_hook(self._backward(rows, tokens))
            finally:
                self.syncs.paused -= 1

        return hook

    def _backward(self, rows: int, tokens: int):
        def hook(grad):
            self.counts["backward_rows"] += rows
            self.counts["backward_tokens"] += rows * tokens

        return hook

    def on_step_begin(self, args, state, control, **kwargs):
        self.syncs.active = state.global_step >= self.skip_steps

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += int(self.syncs.active)
        self.syncs.active = False

    def result(self) -> dict[str, Any]:
        """Counts per optimizer step (totals over the measured steps divided by their number)."""
        counts = dict(self.counts)
        trained = self.trained
        generated = collections.Counter(self.generated)
        dropped = {key for key in generated if key not in trained}
        counts["generated_rollouts"] = sum(generated.values())
        counts["generated_tokens"] = sum(len(key) * n for key, n in generated.items())
        counts["dropped_rollouts"] = sum(generated[key] for key in dropped)
        for model_name in ("policy", "ref"):
            counts[f"dropped_forward_rows_{model_name}"] = sum(
                1 for m, key in self.forward_rows if m == model_name and key in dropped
            )
        counts["dropped_forward_rows"] = counts["dropped_forward_rows_policy"] + counts["dropped_forward_rows_ref"]
        # Rollouts whose tokens equal another rollout's: kept vs dropped cannot be told apart (0 in every run here).
        counts["ambiguous_rollouts"] = sum(1 for key, n in generated.items() if n > 1)
        for key in COUNTS:
            counts.setdefault(key, 0)
        counts["forward_backward_tokens"] = (
            counts["policy_grad_tokens"]
            + counts["policy_nograd_tokens"]
            + counts["ref_tokens"]
            + counts["backward_tokens"]
        )
        steps = max(self.steps, 1)
        per_step = {k: v / steps for k, v in counts.items()}
        per_step["host_syncs"] = sum(self.syncs.sites.values()) / steps
        per_step["generation_host_syncs"] = sum(self.syncs.generation_sites.values()) / steps
        per_step["sync_sites"] = {k: v / steps for k, v in sorted(self.syncs.sites.items())}
        per_step["steps_measured"] = self.steps
        return per_step

    def close(self):
        for handle in self.handles:
            handle.remove()


# ---------------------------------------------------------------------------------------------------- settings
@dataclasses.dataclass
class Setting:
    """One measured configuration: a recipe's structure, optionally with the vLLM IS correction switched on."""

    name: str
    method: str
    options: dict[str, Any]  # config fields (structure + method options), completion length excluded
    vllm: bool = False  # TRL's vLLM code path (simulated sampler)
    is_correction: bool = False

    def grpo_options(self) -> dict[str, Any]:
        """The same structure for the ``grpo`` baseline (method options dropped)."""
        return {k: v for k, v in self.options.items() if k in STRUCTURE_KEYS}


def _config_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def recipe_settings(path: Path) -> list[Setting]:
    """The settings of one recipe: as written, and with vLLM's IS correction on where the recipe uses vLLM."""
    recipe = yaml.safe_load(path.read_text())
    method = recipe["method"]
    config_cls = METHODS[method][0]
    method_fields = _config_fields(config_cls) - _config_fields(GRPOConfig)
    options = {
        k: v
        for k, v in recipe.items()
        if k in STRUCTURE_KEYS or (k in method_fields and not k.startswith(JUDGE_ACCESS_PREFIX))
    }
    if method == "sgpo":
        options["judge_type"] = "programmatic"
        options["correctness_reward"] = "arithmetic_reward"  # the recipe's math_accuracy, on the arithmetic task
    vllm = bool(recipe.get("use_vllm", False))
    written_is = vllm and bool(recipe.get("vllm_importance_sampling_correction", True))
    settings = [Setting(path.stem, method, options, vllm=vllm, is_correction=written_is)]
    if vllm and not written_is:
        settings.append(Setting(f"{path.stem} + IS on", method, options, vllm=True, is_correction=True))
    return settings


def all_settings() -> list[Setting]:
    settings = [s for path in sorted(RECIPES.glob("*.yaml")) for s in recipe_settings(path)]
    # The acceptance point: D3S at its schedule start, vLLM IS correction on, beta 0.04.
    d3s = next(s for s in settings if s.name == "d3s_qwen2.5_math_7b")
    settings.append(
        Setting("d3s_qwen2.5_math_7b + IS on + beta 0.04", "d3s", {**d3s.options, "beta": 0.04}, True, True)
    )
    return settings


# ---------------------------------------------------------------------------------------------------- running
def spread_reward_for(num_generations: int):
    """A reward different for every rollout of a group (rows of a group are consecutive): no degenerate group."""

    def spread_reward(completions, **kwargs):
        return [(i % num_generations) / num_generations for i in range(len(completions))]

    return spread_reward


def save_model(size: str, workdir: Path) -> str:
    path = workdir / f"model-{size}"
    if not path.exists():
        tokenizer = build_tokenizer()
        build_tiny_model(tokenizer, seed=0, **MODEL_SIZES[size]).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


def one_length_prompts(tokenizer, count: int = 200):
    """Arithmetic problems whose chat-formatted prompts all have the same token length (the most common one)."""
    dataset = make_arithmetic_dataset("train", 4 * count, seed=0)
    text = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in dataset["prompt"]]
    lengths = [len(ids) for ids in tokenizer(text, add_special_tokens=False)["input_ids"]]
    length = collections.Counter(lengths).most_common(1)[0][0]
    keep = [i for i, n in enumerate(lengths) if n == length][:count]
    return dataset.select(keep), length


def simulate_vllm(trainer) -> None:
    """TRL's vLLM path with ``generate`` as the sampler: ``_generate_single_turn`` (the one place vLLM's output
    enters TRL's batch) returns the sampled tokens with sampler log-probs; everything downstream is TRL's vLLM code.
    The log-probs are a constant (-1 per token): their values change the IS ratio, not the work."""
    plain = trainer._generate_single_turn

    def generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
        trainer.use_vllm = False
        try:
            completion_ids, _ = plain(prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs)
        finally:
            trainer.use_vllm = True
        return completion_ids, [[-1.0] * len(ids) for ids in completion_ids]

    trainer._generate_single_turn = generate_single_turn
    trainer.use_vllm = True


def cycle_steps(options: dict[str, Any]) -> int:
    """Optimizer steps of one generation cycle (every step of it together does the cycle's work once)."""
    accumulation = options.get("gradient_accumulation_steps", 1)
    per_generation = options.get("steps_per_generation") or accumulation
    span = per_generation * options.get("num_iterations", 1)
    return span // math.gcd(span, accumulation)  # lcm(span, accumulation) / accumulation


def measure(
    method: str,
    options: dict[str, Any],
    *,
    vllm: bool = False,
    is_correction: bool = False,
    completion_length: int = 8,
    model_size: str = "tiny",
    workdir: Path,
    stock: bool = False,
) -> dict[str, Any]:
    """Counts per optimizer step of ``method`` (``stock``: ``trl.GRPOTrainer`` itself) under ``options``."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(save_model(model_size, workdir))
    dataset, prompt_length = one_length_prompts(tokenizer)
    config_cls, trainer_cls = (GRPOConfig, GRPOTrainer) if stock else METHODS[method]
    G = options["num_generations"]
    if method == "d3s" and not stock:  # pinned at the schedule's start (the second cycle is the one measured)
        start = options.get("d3s_samples_start") or default_samples_start(G)
        ratio = options.get("d3s_token_ratio_start", D3S_DEFAULTS["d3s_token_ratio_start"])
        options = {**options, "d3s_samples_start": start, "d3s_samples_end": start, "d3s_token_ratio_end": ratio}
    steps = cycle_steps(options)
    config = config_cls(
        output_dir=str(workdir / "out"),
        max_steps=2 * steps,  # the first cycle warms caches (e.g. MS-GRPO's subgroup tables); the second is counted
        max_completion_length=completion_length,
        generation_kwargs={"min_new_tokens": completion_length},  # every completion exactly this long
        vllm_importance_sampling_correction=is_correction,
        **RUN_ARGS,
        **options,
    )
    rewards = [spread_reward_for(G)]
    if method == "sgpo" and not stock:
        rewards = [arithmetic_reward, *rewards]  # correctness first: a random model's groups are all-negative
    torch.manual_seed(0)
    trainer = trainer_cls(
        model=save_model(model_size, workdir),
        reward_funcs=rewards,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)  # the per-step log lines
    if vllm:
        simulate_vllm(trainer)
    syncs = SyncCounter()
    work = WorkCounter(trainer, syncs, skip_steps=steps)
    trainer.add_callback(work)
    with syncs:
        trainer.train()
    work.close()
    result = work.result()
    result["prompt_length"] = prompt_length
    result["completion_length"] = completion_length
    return result


# ---------------------------------------------------------------------------------------------------- formulas
def expected_counts(method: str, options: dict[str, Any], *, vllm: bool, is_correction: bool, prompt_length: int,
                    completion_length: int, num_processes: int = 1) -> dict[str, float]:  # fmt: skip
    """Closed-form counts per optimizer step and process of today's code (every completion ``completion_length``
    tokens long, no degenerate group, GPG in one generation round).

    B = per-device batch, A = gradient accumulation, S = steps_per_generation (default A), I = num_iterations,
    R = B x S rows per generation batch and process, T = prompt + completion tokens, L = completion tokens; per
    optimizer step there are A / (S x I) generation batches. TRL computes old log-probs (one no-grad forward over
    every generated row) when A mod (S x I) != 0 or vLLM's IS correction is on, reference log-probs over every row
    when beta != 0.
    """
    B = options["per_device_train_batch_size"]
    A = options.get("gradient_accumulation_steps", 1)
    S = options.get("steps_per_generation") or A
    I = options.get("num_iterations", 1)  # noqa: E741
    G = options["num_generations"]
    beta = options.get("beta", 0.0)
    L, T = completion_length, prompt_length + completion_length
    R = B * S
    batches = A / (S * I)  # generation batches per optimizer step
    old = A % (S * I) != 0 or (vllm and is_correction)
    trained = R  # rows per generation batch that the loss sees
    nograd = R if old else 0
    dropped = 0
    if method == "cw_grpo" and not old:
        reuse = options.get("cw_reuse_loss_logps", True) and S == 1
        nograd = 0 if reuse else R  # CW-GRPO's own forward when TRL made no old log-probs
    if method == "d3s":
        start = options.get("d3s_samples_start")
        n_s = start if start is not None else max(2, math.floor(G / 4 + 0.5))  # schedule start (step 0)
        prompts = R * num_processes // G
        kept = min(n_s, G) * prompts  # pooled or per group: n_s per prompt at the start
        rows = max(-(-kept // num_processes), 1)  # per process (even split; uneven splits pad to the largest)
        trained = -(-rows // S) * S
        dropped = R - (kept // num_processes)
        # The selection runs before TRL's old / reference forwards, which then see the kept rows only.
        nograd = kept // num_processes if old else 0
        batch_scope = options.get("d3s_token_scope", "batch") == "batch" and S > 1
        nograd += trained if batch_scope else 0  # entropies for the batch-wide token ranking
    ref = (R - dropped) if beta != 0 else 0
    grad = trained * I  # every iteration trains the whole (kept) batch again
    counts = {
        "policy_grad_rows": grad * batches,
        "policy_nograd_rows": nograd * batches,
        "ref_rows": ref * batches,
        "backward_rows": grad * batches,
        "generated_rollouts": R * batches,
        "generated_tokens": R * L * batches,
        "dropped_rollouts": dropped * batches,
        "dropped_forward_rows": 0,  # D3S selects its rows before TRL's no-grad forwards; no other method drops
    }
    for kind in ("policy_grad", "policy_nograd", "ref", "backward"):
        counts[f"{kind}_tokens"] = counts[f"{kind}_rows"] * T
    counts["forward_backward_tokens"] = sum(
        counts[f"{k}_tokens"] for k in ("policy_grad", "policy_nograd", "ref", "backward")
    )
    return counts


def check_against_formula(setting_method: str, options, measured: dict[str, Any], *, vllm: bool,
                          is_correction: bool) -> list[str]:  # fmt: skip
    """Names (with both values) of the counts where ``measured`` differs from :func:`expected_counts`."""
    expected = expected_counts(
        setting_method, options, vllm=vllm, is_correction=is_correction,
        prompt_length=measured["prompt_length"], completion_length=measured["completion_length"],
    )  # fmt: skip
    return [f"{k}: measured {measured[k]:g}, formula {v:g}" for k, v in expected.items() if measured[k] != v]


# ---------------------------------------------------------------------------------------------------- scale checks
SCALE_BASE = dict(num_generations=4, per_device_train_batch_size=8, gradient_accumulation_steps=2, beta=0.04)
SCALE_LENGTH = 6
# dimension -> (what changes, the two values); every other value as in SCALE_BASE, vLLM IS correction on
SCALE_DIMENSIONS = {
    "batch": ("per_device_train_batch_size", (8, 16)),
    "G": ("num_generations", (4, 8)),
    "gradient accumulation": ("gradient_accumulation_steps", (2, 4)),
    "completion length": ("completion_length", (SCALE_LENGTH, 2 * SCALE_LENGTH)),
    "model size": ("model_size", tuple(MODEL_SIZES)),
}
SCALE_OPTIONS = {
    "sgpo": {"judge_type": "programmatic", "correctness_reward": "arithmetic_reward"},
    "gpg": {"beta": 0.0},  # GPG has no KL term (its config refuses beta != 0)
}


def scale_check(methods: list[str], workdir: Path, dimensions: dict | None = None) -> dict[str, Any]:
    """Every method at two sizes of each dimension: measured counts, the formula's, and mismatches."""
    dimensions = SCALE_DIMENSIONS if dimensions is None else dimensions
    out: dict[str, Any] = {}
    stock_runs: dict[str, dict[str, Any]] = {}  # stock TRL under the same structure, for the sync excess
    for method in methods:
        out[method] = {}
        for dimension, (knob, values) in dimensions.items():
            runs = []
            for value in values:
                options = {**SCALE_BASE, **SCALE_OPTIONS.get(method, {})}
                run_kwargs = dict(completion_length=SCALE_LENGTH, model_size="tiny")
                if knob in run_kwargs:
                    run_kwargs[knob] = value
                else:
                    options[knob] = value
                measured = measure(method, options, vllm=True, is_correction=True, workdir=workdir, **run_kwargs)
                mismatches = check_against_formula(method, options, measured, vllm=True, is_correction=True)
                structure = {k: v for k, v in options.items() if k in STRUCTURE_KEYS}
                key = json.dumps([structure, run_kwargs], sort_keys=True)
                if key not in stock_runs:
                    stock_runs[key] = measure(
                        "grpo", structure, vllm=True, is_correction=True, workdir=workdir, stock=True, **run_kwargs
                    )
                measured["stock_host_syncs"] = stock_runs[key]["host_syncs"]
                measured["host_syncs_above_stock"] = measured["host_syncs"] - measured["stock_host_syncs"]
                runs.append({"value": value, "options": options, "counts": measured, "mismatches": mismatches})
            out[method][dimension] = runs
    return out


# ---------------------------------------------------------------------------------------------------- report
SHOWN = (
    ("policy_grad_tokens", "policy fwd with grad"), ("policy_nograd_tokens", "policy fwd no grad"),
    ("ref_tokens", "reference fwd"), ("backward_tokens", "backward"),
    ("forward_backward_tokens", "fwd+bwd total"), ("generated_tokens", "generated tokens"),
    ("host_syncs", "host syncs"),
)  # fmt: skip


def _cell(value: float, base: float) -> str:
    ratio = "-" if base == 0 and value == 0 else ("inf" if base == 0 else f"{value / base:.2f}x")
    return f"{value:g} ({ratio})"


def sync_excess(method_sites: dict[str, float], stock_sites: dict[str, float]) -> dict[str, float]:
    """Call sites where the method syncs more often than stock TRL (method count - stock count)."""
    return {
        site: count - stock_sites.get(site, 0.0)
        for site, count in sorted(method_sites.items())
        if count > stock_sites.get(site, 0.0)
    }


def compute_report(runs: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Work per optimizer step, counted: every method vs `grpo` under its recipes' settings",
        "",
        f"Command: `{command}`. Generated by `benchmarks/compute.py`; everything below comes from this run.",
        "",
        "Per optimizer step and process, tiny random Qwen2 model, one process, every completion exactly "
        f"{runs[0]['counts']['completion_length']} tokens, prompts of {runs[0]['counts']['prompt_length']} tokens "
        "(T = prompt + completion tokens per forward row). Each cell: count (ratio to `grpo` in the same setting). "
        "Tokens are rows x T summed over forwards; 'fwd+bwd total' adds policy with and without grad, reference and "
        "backward tokens (a backward costs about twice a forward in FLOPs; the counts are not weighted). "
        "'dropped fwd rows': forward rows (policy or reference) over rollouts that were generated but are in no "
        "loss call. Host syncs: outside generation; `aten._local_scalar_dense` (`.item()`, `float()`, `bool()` of a "
        'tensor) counted by a `TorchDispatchMode`, plus `.tolist()` / `.cpu()` / `.numpy()` / `.to("cpu")` of '
        "device data (on a CPU tensor these reach no aten op at all, so the tensor methods are wrapped) and ops "
        "with a data-dependent output size (`nonzero`, boolean-mask indexing, `unique`, ...): close to an upper "
        "bound for the same code on a GPU (see `SyncCounter`); "
        "'stock' is `trl.GRPOTrainer` itself in the same setting. Settings: the recipe's structure as written "
        "(G, batch, accumulation, beta, iterations, loss, method options, vLLM with its IS correction as written) "
        "and, for recipes that use vLLM, with the IS correction on (TRL's default). D3S is measured at the start of "
        "its schedule (its end values set to the start values; the options column shows the recipe's), and every "
        "recipe's completion length, model and data are replaced by the small ones above.",
        "",
        "| setting | G | per-device batch x accumulation | beta | vLLM / IS correction | method options |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        o = run["options"]
        own = ", ".join(f"{k}={v}" for k, v in o.items() if k not in STRUCTURE_KEYS) or "-"
        vllm = ("yes / " + ("on" if run["is_correction"] else "off")) if run["vllm"] else "no"
        lines.append(
            f"| {run['setting']} | {o['num_generations']} | {o['per_device_train_batch_size']} x "
            f"{o.get('gradient_accumulation_steps', 1)} | {o.get('beta', 0.0)} | {vllm} | {own} |"
        )
    lines += [
        "",
        "| setting | method | " + " | ".join(title for _, title in SHOWN) + " | dropped fwd rows | stock syncs |",
        "|---|---|" + "---|" * len(SHOWN) + "---|---|",
    ]
    for run in runs:
        base = run["grpo"]
        for label, counts in ((run["method"], run["counts"]), ("grpo", base)):
            cells = " | ".join(_cell(counts[key], base[key]) for key, _ in SHOWN)
            lines.append(
                f"| {run['setting']} | {label} | {cells} | {counts['dropped_forward_rows']:g} "
                f"| {run['stock']['host_syncs']:g} |"
            )
    lines += ["", "## Host syncs above stock TRL, by call site", ""]
    lines += [
        "Per optimizer step, `method count - stock count` at every line where the method syncs more often than "
        "`trl.GRPOTrainer` (same setting). Lines under `grpo_family/` are this library's; a TRL line counted more "
        "often comes from a method running TRL's code more often (e.g. one more forward builds one more mask).",
        "",
        "| setting | method | syncs - stock | where (count) |",
        "|---|---|---|---|",
    ]
    for run in runs:
        for label, counts in ((run["method"], run["counts"]), ("grpo", run["grpo"])):
            if label == "grpo" and run["method"] != "grpo" and any(r["setting"] == run["setting"] and r["method"] ==
                                                                   "grpo" for r in runs):  # fmt: skip
                continue
            excess = sync_excess(counts["sync_sites"], run["stock"]["sync_sites"])
            where = ", ".join(f"`{site}` ({n:g})" for site, n in excess.items()) or "-"
            lines.append(
                f"| {run['setting']} | {label} | {counts['host_syncs'] - run['stock']['host_syncs']:+g} | {where} |"
            )
    lines += [
        "",
        "## D3S: forward rows over the rollouts it drops",
        "",
        "Rows of policy (no-grad) and reference forwards over rollouts that D3S generated and then dropped, per "
        "optimizer step, at the start of its schedule (where it drops the most). The issue's acceptance point is the "
        "last row: vLLM IS correction on and beta 0.04; its target is 0 such rows and fwd+bwd tokens <= 0.55x grpo's.",
        "",
        "| setting | generated rollouts | dropped | dropped fwd rows (policy / reference) | fwd+bwd tokens vs grpo "
        "| 0 such rows and <= 0.55x |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        if run["method"] != "d3s":
            continue
        c = run["counts"]
        ratio = c["forward_backward_tokens"] / run["grpo"]["forward_backward_tokens"]
        met = c["dropped_forward_rows"] == 0 and ratio <= 0.55
        lines.append(
            f"| {run['setting']} | {c['generated_rollouts']:g} | {c['dropped_rollouts']:g} | "
            f"{c['dropped_forward_rows']:g} ({c['dropped_forward_rows_policy']:g} / {c['dropped_forward_rows_ref']:g}) "
            f"| {ratio:.3f}x | {'yes' if met else 'no'} |"
        )
    mismatched = [r for r in runs if r["mismatches"]]
    lines += [
        "",
        "## Closed-form check",
        "",
        f"Every count above against `expected_counts` (the formulas, see scale.md): {len(runs) - len(mismatched)} "
        f"of {len(runs)} settings match exactly."
        + "".join(f"\n- {r['setting']} ({r['method']}): {'; '.join(r['mismatches'])}" for r in mismatched),
    ]
    return "\n".join(lines) + "\n"


FORMULAS = {
    "all": (
        "Per optimizer step and process. B = per-device batch, A = gradient accumulation, S = steps_per_generation "
        "(default A), I = num_iterations, R = B*S rows per generation batch, A/(S*I) generation batches per step, "
        "L = completion tokens, T = prompt + L tokens per row, [old] = 1 when TRL computes old log-probs "
        "(A mod S*I != 0, or vLLM with its IS correction), [ref] = 1 when beta != 0. Counts are rows; tokens are "
        "rows x T; generated tokens rows x L."
    ),
    "grpo": "grad = backward = B*A; no-grad = [old]*B*A/I; ref = [ref]*B*A/I; generated = B*A/I rows",
    "ms_grpo": "as grpo (the multi-scale advantages are computed on the rewards, no forward)",
    "sgpo": "as grpo (the judge runs elsewhere and reads text: no forward of the policy)",
    "gpg": (
        "as grpo times the generation rounds r for the generation side: generated = r*B*A/I, no-grad = "
        "[old]*r*B*A/I, ref = [ref]*r*B*A/I, forwards over the (r-1)*B*A/I resampled-away rows included; r = 1 "
        "when enough groups are informative (beta_th), at most max_generation_rounds"
    ),
    "cw_grpo": (
        "as grpo, plus when TRL computes no old log-probs one no-grad forward of its own over every row "
        "(no-grad = B*A/I), except when S = 1 and cw_reuse_loss_logps (the loss's forward gives the log-probs)"
    ),
    "d3s": (
        "kept rollouts K = n_s * R/G (n_s = rollouts per prompt on the schedule, d3s_samples_start at step 0, "
        "default round(G/4)); rows trained K' = ceil(K/S)*S (padded to whole micro-steps; over P processes each "
        "pads to the largest share); grad = backward = K'*A/S; no-grad = ([old]*K + [batch token scope, S>1]*K')"
        "*A/(S*I); ref = [ref]*K*A/(S*I); dropped forward rows = 0 (the rows are selected before TRL's old and "
        "reference forwards, which run over the K kept rows only)"
    ),
    # A method not listed (e.g. a loss term's): expected_counts gives it grpo's counts, which the test checks.
    "other": "as grpo (its changes read the loss forward's log-probs or the rewards: no forward of its own)",
}


def scale_report(scale: dict[str, Any], command: str, processes: dict[str, Any] | None = None) -> str:
    growth_keys = (
        "policy_grad_tokens", "policy_nograd_tokens", "ref_tokens", "backward_tokens", "generated_tokens",
        "dropped_forward_rows", "host_syncs", "host_syncs_above_stock", "generation_host_syncs",
    )  # fmt: skip
    lines = [
        "# How each count grows: formulas per method, checked at two sizes of each dimension",
        "",
        f"Command: `{command}`. Generated by `benchmarks/compute.py`; the tables come from this run.",
        "",
        "Base: G = 4, per-device batch 8, accumulation 2, beta 0.04, vLLM IS correction on, completions of "
        f"{SCALE_LENGTH} tokens, the `tiny` model; each dimension changes one value. Each cell: count at the "
        "smaller size -> at the larger size; the last column says whether every count equals the formula at both "
        "sizes.",
        "",
        "## Formulas",
        "",
        FORMULAS["all"],
        "",
    ]
    lines += [f"- **{method}**: {FORMULAS.get(method, FORMULAS['other'])}" for method in METHODS]
    unmeasured = [method for method in METHODS if method not in scale]
    if unmeasured:  # a report rewritten (--report-only) from a run older than some of the methods
        lines += [
            "",
            f"Not in this run (methods added after it): {', '.join(unmeasured)}. Their formulas above are not "
            "checked at two sizes here; `python benchmarks/compute.py` measures every method.",
        ]
    lines += [
        "",
        "Model size: no count above depends on it (rows and tokens are the same for any model); the FLOPs are "
        "about 2 x parameters per forward token and 4 x parameters per backward token, so the tokens above times "
        "the parameter count give the compute. Host syncs do not depend on it either (same code path). "
        "Processes: every count above is per process, with the per-device batch fixed: each process generates, "
        "scores and trains its own B*S rows, so the per-process counts do not change with the number of "
        "processes P and the totals grow as P. Exceptions: D3S pools the selection over all processes (each "
        "process trains ceil(max share / S) * S rows, padded to the largest share, so an uneven split adds padding "
        "rows), and GPG's rounds are decided on the gathered rewards (same r everywhere). Host syncs are counted "
        "per process too; with several processes TRL and accelerate take a few extra code paths (the processes "
        "table at the end, when run with `--processes`, gives both numbers), and each gather is a collective that "
        "waits for the slowest process.",
    ]
    lines += [
        "",
        "## Host syncs above stock TRL",
        "",
        "From the runs above: excess = method's syncs - `trl.GRPOTrainer`'s in the same structure; with A = "
        "gradient accumulation, excess = c + d*A (c, d from the two accumulation runs). Stock TRL itself: "
        "its own per-micro-step syncs (loss metrics) and per-generation-batch ones (reward and length metrics), and "
        "transformers' generate syncs about once per generated token (reported apart: absent with vLLM).",
        "",
        "| method | c (per generation batch) | d (per micro-step) | excess the same at both sizes of batch, G, "
        "completion length, model size |",
        "|---|---|---|---|",
    ]
    for method, dimensions in scale.items():
        (a1, e1), (a2, e2) = (
            (run["options"]["gradient_accumulation_steps"], run["counts"]["host_syncs_above_stock"])
            for run in dimensions["gradient accumulation"]
        )
        d = (e2 - e1) / (a2 - a1)
        flat = [
            name
            for name, (small, large) in dimensions.items()
            if name != "gradient accumulation"
            and small["counts"]["host_syncs_above_stock"] != large["counts"]["host_syncs_above_stock"]
        ]
        lines.append(f"| {method} | {e1 - d * a1:g} | {d:g} | {'yes' if not flat else 'no: ' + ', '.join(flat)} |")
    lines += [
        "",
        "## Measured at two sizes",
        "",
        "| method | dimension | " + " | ".join(growth_keys) + " | formula holds |",
        "|---|---|" + "---|" * len(growth_keys) + "---|",
    ]
    for method, dimensions in scale.items():
        for dimension, (small, large) in dimensions.items():
            cells = " | ".join(f"{small['counts'][k]:g} -> {large['counts'][k]:g}" for k in growth_keys)
            holds = (
                "yes"
                if not (small["mismatches"] or large["mismatches"])
                else "NO: " + "; ".join(small["mismatches"] + large["mismatches"])
            )
            lines.append(f"| {method} | {dimension} ({small['value']} -> {large['value']}) | {cells} | {holds} |")
    if processes is None:
        lines += ["", "Processes: not run here (`--processes` runs grpo and D3S on 2 CPU processes).", ""]
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "## Processes: 1 -> 2 (gloo, `accelerate_configs/cpu_2proc.yaml`)",
        "",
        "Per-process counts of each rank against the one-process run and the formula with P = 2.",
        "",
        "| method | counts | 1 process | rank 0 | rank 1 | formula holds |",
        "|---|---|---|---|---|---|",
    ]
    for method, check in processes.items():
        for key in growth_keys[:6] + ("host_syncs",):
            values = " | ".join(f"{run[key]:g}" for run in [check["single"], *check["ranks"]])
            holds = "yes" if not check["mismatches"] else "NO: " + "; ".join(check["mismatches"])
            lines.append(f"| {method} | {key} | {values} | {holds} |")
    return "\n".join(lines) + "\n"


PROCESS_CHECK_METHODS = ("grpo", "d3s")


def process_worker(out_dir: Path) -> None:
    """One rank of the processes check (started by accelerate): its own counts at the scale base."""
    rank = int(os.environ.get("RANK", "0"))
    workdir = Path(tempfile.mkdtemp(prefix=f"grpo-family-compute-rank{rank}-"))
    counts = {
        method: measure(method, {**SCALE_BASE, **SCALE_OPTIONS.get(method, {})}, vllm=True, is_correction=True,
                        completion_length=SCALE_LENGTH, workdir=workdir)
        for method in PROCESS_CHECK_METHODS
    }  # fmt: skip
    (out_dir / f"rank{rank}.json").write_text(json.dumps(counts))


def processes_check(workdir: Path, num_processes: int = 2) -> dict[str, Any]:
    """grpo and D3S on ``num_processes`` CPU processes (gloo, accelerate_configs/cpu_2proc.yaml): each process's
    counts against the formula with ``num_processes`` and against the one-process run."""
    import socket
    import subprocess

    out_dir = workdir / "ranks"
    out_dir.mkdir(exist_ok=True)
    with socket.socket() as probe:  # a free port: the config's fixed one may be taken by another run
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"), "--num_processes", str(num_processes),
        "--main_process_port", str(port), str(Path(__file__).resolve()), "--process-worker", str(out_dir),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launched = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if launched.returncode != 0:
        raise RuntimeError(f"the {num_processes}-process run failed:\n{launched.stderr[-3000:]}")
    result = {}
    for method in PROCESS_CHECK_METHODS:
        options = {**SCALE_BASE, **SCALE_OPTIONS.get(method, {})}
        single = measure(method, options, vllm=True, is_correction=True, completion_length=SCALE_LENGTH,
                         workdir=workdir)  # fmt: skip
        ranks = [json.loads((out_dir / f"rank{r}.json").read_text())[method] for r in range(num_processes)]
        expected = expected_counts(method, options, vllm=True, is_correction=True,
                                   prompt_length=single["prompt_length"], completion_length=SCALE_LENGTH,
                                   num_processes=num_processes)  # fmt: skip
        result[method] = {
            "single": single,
            "ranks": ranks,
            "mismatches": [
                f"rank {r} {k}: measured {counts[k]:g}, formula {v:g}"
                for r, counts in enumerate(ranks)
                for k, v in expected.items()
                if counts[k] != v
            ],
        }
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=None, help="methods whose recipe settings to measure")
    parser.add_argument("--completion-length", type=int, default=8)
    parser.add_argument("--no-scale", action="store_true", help="skip the scale checks")
    parser.add_argument("--output-dir", default=str(harness.RESULTS))
    parser.add_argument("--processes", action="store_true", help="also the 2-process check (slow: ~1 min)")
    parser.add_argument("--process-worker", default=None, help=argparse.SUPPRESS)  # internal: one rank
    parser.add_argument("--report-only", action="store_true", help="rewrite the .md files from the stored .json")
    args = parser.parse_args(argv)
    if args.report_only:  # the same run's numbers, formatted again (e.g. after a change to the report's layout)
        output_dir = Path(args.output_dir)
        stored = json.loads((output_dir / "compute.json").read_text())
        (output_dir / "compute.md").write_text(compute_report(stored["runs"], stored["command"]))
        if (output_dir / "scale.json").exists():
            scale = json.loads((output_dir / "scale.json").read_text())
            (output_dir / "scale.md").write_text(scale_report(scale["scale"], scale["command"], scale["processes"]))
        return stored
    if args.process_worker:
        torch.set_num_threads(1)
        process_worker(Path(args.process_worker))
        return {}
    torch.set_num_threads(1)
    command = harness.command_line(__file__, argv)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-compute-"))
    output_dir = Path(args.output_dir)
    runs = []
    for setting in all_settings():
        if args.only and setting.method not in args.only:
            continue
        kw = dict(vllm=setting.vllm, is_correction=setting.is_correction, workdir=workdir,
                  completion_length=args.completion_length)  # fmt: skip
        counts = measure(setting.method, setting.options, **kw)
        grpo = measure("grpo", setting.grpo_options(), **kw)
        stock = measure("grpo", setting.grpo_options(), stock=True, **kw)
        mismatches = check_against_formula(
            setting.method, setting.options, counts, vllm=setting.vllm, is_correction=setting.is_correction
        )
        mismatches += [f"grpo {m}" for m in check_against_formula(
            "grpo", setting.grpo_options(), grpo, vllm=setting.vllm, is_correction=setting.is_correction)]  # fmt: skip
        runs.append({
            "setting": setting.name, "method": setting.method, "options": setting.options, "vllm": setting.vllm,
            "is_correction": setting.is_correction, "counts": counts, "grpo": grpo, "stock": stock,
            "mismatches": mismatches,
        })  # fmt: skip
        print(f"{setting.name}: {setting.method} fwd+bwd {counts['forward_backward_tokens']:g} vs grpo "
              f"{grpo['forward_backward_tokens']:g}; syncs {counts['host_syncs']:g} / grpo {grpo['host_syncs']:g} "
              f"/ stock {stock['host_syncs']:g}; {'ok' if not mismatches else mismatches}", flush=True)  # fmt: skip
    harness.write_json(output_dir / "compute.json", {"command": command, "runs": runs})
    harness.write_report(output_dir / "compute.md", compute_report(runs, command), echo=False)
    result = {"runs": runs}
    if not args.no_scale:
        scale = scale_check(list(METHODS), workdir)
        processes = processes_check(workdir) if args.processes else None
        harness.write_json(output_dir / "scale.json", {"command": command, "scale": scale, "processes": processes})
        harness.write_report(output_dir / "scale.md", scale_report(scale, command, processes), echo=False)
        result["scale"], result["processes"] = scale, processes
    return result


if __name__ == "__main__":
    main()
