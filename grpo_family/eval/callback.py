"""Held-out evaluation during training, logged to the ``report_to`` backends.

:class:`EvaluationCallback` evaluates the policy on one or several held-out sets through
:func:`~grpo_family.eval.core.evaluate_data` (the command line's path): greedy accuracy, and with ``num_samples > 0``
(or a sampling ``preset``) sampled pass@k / avg@n / maj@n. It runs before training (:meth:`EvaluationCallback.evaluate`,
called by the script), every ``every`` optimizer steps, and at the last step, and logs through transformers'
``Trainer.log`` (the log history, the progress bar, and every ``report_to`` integration; TRL's own ``log`` is bypassed
because it would flush the training metrics it is accumulating).

Keys, one benchmark: ``held_out_accuracy`` (greedy, the name the demo's plot reads) and ``held_out/<metric>``; several
benchmarks: ``held_out/<benchmark>/<metric>`` for each (``held_out_accuracy`` is the first one's). Every accuracy has
its standard error over problems beside it (``<key>_stderr``, :func:`~grpo_family.eval.metrics.standard_error`).

Engine: the training run's own vLLM engine when it has one (TRL's ``vllm_generation``: the colocated ``LLM`` on each
process, or the server from the main process; weights pushed first if the step changed), else transformers'
``generate`` inside TRL's generation context (under ZeRO-3 it gathers the sharded weights). Distributed runs: the
problems are split between the processes and the generations gathered (:func:`~grpo_family.eval.core.generate_split`);
the main process scores and broadcasts the metrics, so every process logs the same numbers, and writes each
evaluation's generations to ``<output_dir>/eval_generations/step-<N>/<benchmark>-<greedy|sampled>.jsonl``. Sampling is
seeded per batch (``torch.random.fork_rng``), so an evaluation never changes the training run's random numbers: a run
with the callback trains exactly as one without it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from transformers import Trainer, TrainerCallback

from .core import check_ks, default_ks, evaluate_data
from .generation import GenerateBackend, TrainerVLLMBackend
from .presets import Decoding, get_preset

__all__ = ["EvaluationCallback"]

logger = logging.getLogger(__name__)

_COUNTS = ("mean_length", "truncation_rate", "samples_unscored")


class _Recording:
    """A backend that records which problems this process asked it to generate (for the logs and the tests)."""

    def __init__(self, backend):
        self.backend, self.generated = backend, []
        self.name = backend.name
        self.main_only = getattr(backend, "main_only", False)
        if hasattr(backend, "batch_size"):
            self.batch_size = backend.batch_size

    def generate(self, prompts, decoding, *, first_index: int = 0, **kwargs):
        self.generated.extend(range(first_index, first_index + len(prompts)))
        return self.backend.generate(prompts, decoding, first_index=first_index, **kwargs)


class EvaluationCallback(TrainerCallback):
    """Evaluate ``data`` (one :class:`~grpo_family.eval.data.EvalData`, or several) with ``reward`` during training.

    Args:
        data: the held-out set(s) (prompt and gold columns); several give per-benchmark keys.
        reward: the reward function that scores it (guarded, see :mod:`grpo_family.eval.scoring`).
        every: evaluate every this many optimizer steps (0: only before training and at the last step).
        max_new_tokens: generation length (also caps a preset's).
        num_samples: sampled completions per problem for pass@k / avg@n / maj@n (0: greedy accuracy only).
        temperature, top_p, top_k: how those samples are drawn (the training run's own settings are a good choice).
        ks: the k of pass@k (each at most ``num_samples``; default 1 and ``num_samples``).
        seed: the sampling seed, the same at every evaluation (common random numbers across steps).
        batch_size: sequences per ``generate`` call.
        label: printed before each evaluation line (e.g. the method name); None prints nothing.
        preset: an evaluation preset (:data:`~grpo_family.eval.presets.PRESETS`) whose sampled decoding replaces
            ``num_samples`` / ``temperature`` / ``top_p`` / ``top_k`` (its length capped to ``max_new_tokens``);
            ``greedy`` or None: as given.
        engine: ``auto`` (the run's vLLM engine when it has one, else ``generate``) or ``generate``.
        save_generations: write each evaluation's generations under ``<output_dir>/eval_generations/``.
    """

    def __init__(
        self,
        data,
        reward: Callable,
        *,
        every: int,
        max_new_tokens: int,
        num_samples: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        ks: Sequence[int] | None = None,
        seed: int = 0,
        batch_size: int = 64,
        label: str | None = None,
        mode: str = "eval",
        preset: str | None = None,
        engine: str = "auto",
        save_generations: bool = True,
    ):
        if engine not in ("auto", "generate"):
            raise ValueError(f"engine must be 'auto' or 'generate', got {engine!r}")
        self.datasets = [] if data is None else list(data) if isinstance(data, list | tuple) else [data]
        self.datasets = [d for d in self.datasets if len(d)]
        self.reward, self.every, self.label, self.mode = reward, every, label, mode
        self.engine, self.save_generations = engine, save_generations
        self.greedy = Decoding(max_new_tokens=max_new_tokens)
        self.sampled, headline = None, ()
        if preset is not None and preset != "greedy":
            resolved, headline = get_preset(preset).resolve(max(map(len, self.datasets), default=0))
            if not resolved.greedy:
                self.sampled = Decoding(resolved.temperature, resolved.top_p, resolved.top_k, resolved.num_samples,
                                        min(resolved.max_new_tokens or max_new_tokens, max_new_tokens))  # fmt: skip
        elif num_samples:
            self.sampled = Decoding(temperature, top_p, top_k, num_samples, max_new_tokens)
        if self.sampled is not None:
            self.sampled.check()
        if ks is not None:
            self.ks = list(ks)
        else:
            self.ks = default_ks(self.sampled, headline) if self.sampled is not None else []
        if self.sampled is not None:
            check_ks(self.ks, self.sampled, "held-out evaluation")  # before training, not at the first evaluation
        self.seed, self.batch_size = seed, batch_size
        self.trainer = None
        self.initial: dict[str, float] | None = None
        self.history: dict[int, dict[str, float]] = {}
        self.generated: dict[str, list[int]] = {}  # this process's problems at the last evaluation, per decoding
        self.backend_name: str | None = None

    @property
    def data(self):
        """The first held-out set (None without one)."""
        return self.datasets[0] if self.datasets else None

    def bind(self, trainer) -> EvaluationCallback:
        """The trainer whose model is evaluated and whose ``log`` receives the metrics."""
        self.trainer = trainer
        return self

    def _vllm_engine(self):
        trainer = self.trainer
        engine = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
        if engine is None or self.engine == "generate":
            return None
        if engine.mode == "colocate" and getattr(engine, "tensor_parallel_size", 1) > 1:
            # Each tensor-parallel group must generate the same prompts together: a per-process split cannot.
            logger.warning("Held-out evaluation: vLLM colocate with tensor_parallel_size > 1; using generate.")
            return None
        return TrainerVLLMBackend(trainer)

    def _split(self) -> bool:
        """Split the problems between processes, unless ZeRO-3 generates with sharded weights (every forward is a
        collective: every process must run the same batches)."""
        trainer = self.trainer
        zero3 = (
            getattr(trainer, "is_deepspeed_enabled", False)
            and getattr(getattr(trainer.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0) == 3
        )
        return not (zero3 and not getattr(trainer.args, "ds3_gather_for_generation", True))

    def evaluate(self) -> dict[str, float] | None:
        """The metrics now (every process calls this; all get the main process's numbers), or None without data."""
        if not self.datasets:
            return None
        import contextlib

        from trl.models import unwrap_model_for_generation

        trainer = self.trainer
        accelerator = trainer.accelerator
        main = accelerator.is_main_process
        split = accelerator if accelerator.num_processes > 1 and self._split() else None
        vllm = self._vllm_engine()
        if vllm is not None:
            vllm.sync()
            context = contextlib.nullcontext(None)
        else:
            context = unwrap_model_for_generation(trainer.model_wrapped, accelerator)
        results: list[tuple[Any, str, Any]] = []
        self.generated = {}
        with context as model:
            backend = vllm or GenerateBackend(model, trainer.processing_class, batch_size=self.batch_size)
            self.backend_name = backend.name
            for data in self.datasets:
                for kind, decoding in (("greedy", self.greedy), ("sampled", self.sampled)):
                    if decoding is None:
                        continue
                    recording = _Recording(backend)
                    result = evaluate_data(recording, data, decoding, self.reward, ks=self.ks if decoding is
                                           self.sampled else None, mode=self.mode, seed=self.seed, score=main,
                                           accelerator=split)  # fmt: skip
                    self.generated[f"{data.name}/{kind}"] = recording.generated
                    results.append((data, kind, result))
        metrics = self._metrics(results) if main else None
        if main and self.save_generations:
            self._save(results)
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            metrics = broadcast_object_list([metrics], from_process=0)[0]
        return metrics

    def _metrics(self, results) -> dict[str, float | None]:
        several = len(self.datasets) > 1
        metrics: dict[str, float | None] = {}
        for data, kind, result in results:
            summary = result.summary
            prefix = f"held_out/{data.name}/" if several else "held_out/"
            if kind == "greedy":
                if data is self.datasets[0]:  # None when no held-out problem could be scored
                    metrics["held_out_accuracy"] = summary.get("greedy_accuracy")
                    metrics["held_out_accuracy_stderr"] = summary.get("greedy_accuracy_stderr")
                if several:
                    metrics.update(self._keys(prefix, summary, ("greedy_accuracy", "greedy_accuracy_stderr")))
                metrics.update(self._keys(f"{prefix}greedy_", summary, _COUNTS))
            else:
                wanted = [f"pass@{k}" for k in self.ks] + [f"avg@{self.sampled.num_samples}"]
                wanted += [k for k in summary if k.startswith("maj@") and not k.endswith("_stderr")]
                metrics.update(self._keys(prefix, summary, [*wanted, *(f"{k}_stderr" for k in wanted)]))
                metrics.update(self._keys(f"{prefix}sampled_", summary, ("mean_length", "samples_unscored")))
        return metrics

    @staticmethod
    def _keys(prefix: str, summary: dict[str, Any], keys: Sequence[str]) -> dict[str, float]:
        return {f"{prefix}{k}": float(summary[k]) for k in keys if summary.get(k) is not None}

    def _save(self, results) -> None:
        """``<output_dir>/eval_generations/step-<N>/<benchmark>-<greedy|sampled>.jsonl``: one line per problem (the
        command line's samples-*.jsonl records), written by the main process."""
        from .report import _safe

        folder = os.path.join(
            self.trainer.args.output_dir, "eval_generations", f"step-{self.trainer.state.global_step}"
        )
        os.makedirs(folder, exist_ok=True)
        for data, kind, result in results:
            with open(os.path.join(folder, f"{_safe(data.name)}-{kind}.jsonl"), "w") as f:
                for record in result.problems:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def log(self, metrics: dict[str, float] | None) -> None:
        """Into the log history and every ``report_to`` backend, at the current step."""
        if metrics is None:
            return
        # transformers' Trainer.log, not TRL's override (which would flush the training metrics it is accumulating).
        # Its on_log event clears `should_log`: keep the flag, so the step's own training log still happens.
        control = self.trainer.control
        pending = control.should_log
        Trainer.log(self.trainer, {k: v for k, v in metrics.items() if v is not None})
        control.should_log = pending
        if self.label is not None and self.trainer.is_world_process_zero():
            from tqdm.auto import tqdm

            accuracy = metrics["held_out_accuracy"]
            sampled = "".join(f", {k.split('/')[-1]} {v:.3f}" for k, v in metrics.items()
                              if "@" in k and not k.endswith("_stderr") and v is not None)  # fmt: skip
            tqdm.write(
                f"[{self.label}] step {self.trainer.state.global_step}: held-out accuracy "
                f"{'unscored' if accuracy is None else f'{accuracy:.3f}'}{sampled}"
            )

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and self.initial is not None:  # train() starts a new log history
            self.history[0] = self.initial
            self.log(self.initial)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == state.max_steps or (self.every and step % self.every == 0):
            self.history[step] = self.evaluate()
            self.log(self.history[step])
