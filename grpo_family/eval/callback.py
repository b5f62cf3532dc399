"""Held-out evaluation during training, logged to the ``report_to`` backends.

:class:`EvaluationCallback` evaluates the policy on a held-out set through :func:`~grpo_family.eval.core.evaluate_data`
(the command line's path): greedy accuracy, and with ``num_samples > 0`` sampled pass@k / avg@n / maj@n at the given
temperature. It runs before training (:meth:`EvaluationCallback.evaluate`, called by the script), every ``every``
optimizer steps, and at the last step, and logs through transformers' ``Trainer.log`` (the log history, the progress
bar, and every ``report_to`` integration; TRL's own ``log`` is bypassed because it would flush the training metrics
it is accumulating). Keys: ``held_out_accuracy`` (greedy, the name the demo's plot reads) and ``held_out/<metric>``.

Distributed runs: every process enters TRL's generation context (under ZeRO-3 it gathers the sharded weights, a
collective) and generates; the main process scores and broadcasts the metrics, so every process logs the same
numbers. Sampling uses its own seeded generator state (``torch.random.fork_rng``), so an evaluation never changes the
training run's random numbers: a run with the callback trains exactly as one without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import Trainer, TrainerCallback

from .core import check_ks, evaluate_data
from .generation import GenerateBackend
from .presets import Decoding

__all__ = ["EvaluationCallback"]


class EvaluationCallback(TrainerCallback):
    """Evaluate ``data`` (an :class:`~grpo_family.eval.data.EvalData`) with ``reward`` during training.

    Args:
        data: the held-out set (prompt and gold columns).
        reward: the reward function that scores it (guarded, see :mod:`grpo_family.eval.scoring`).
        every: evaluate every this many optimizer steps (0: only before training and at the last step).
        max_new_tokens: generation length.
        num_samples: sampled completions per problem for pass@k / avg@n / maj@n (0: greedy accuracy only).
        temperature, top_p, top_k: how those samples are drawn (the training run's own settings are a good choice).
        ks: the k of pass@k (each at most ``num_samples``; default 1 and ``num_samples``).
        seed: the sampling seed, the same at every evaluation (common random numbers across steps).
        batch_size: sequences per ``generate`` call.
        label: printed before each evaluation line (e.g. the method name); None prints nothing.
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
    ):
        self.data, self.reward, self.every, self.label, self.mode = data, reward, every, label, mode
        self.greedy = Decoding(max_new_tokens=max_new_tokens)
        self.sampled = None
        if num_samples:
            self.sampled = Decoding(temperature, top_p, top_k, num_samples, max_new_tokens)
            self.sampled.check()
        self.ks = list(ks) if ks is not None else sorted({1, num_samples}) if num_samples else []
        if self.sampled is not None:
            check_ks(self.ks, self.sampled, "held-out evaluation")  # before training, not at the first evaluation
        self.seed, self.batch_size = seed, batch_size
        self.trainer = None
        self.initial: dict[str, float] | None = None
        self.history: dict[int, dict[str, float]] = {}

    def bind(self, trainer) -> EvaluationCallback:
        """The trainer whose model is evaluated and whose ``log`` receives the metrics."""
        self.trainer = trainer
        return self

    def evaluate(self) -> dict[str, float] | None:
        """The metrics now (every process calls this; all get the main process's numbers), or None without data."""
        if self.data is None or len(self.data) == 0:
            return None
        from trl.models import unwrap_model_for_generation

        trainer = self.trainer
        accelerator = trainer.accelerator
        main = accelerator.is_main_process
        tokenizer = trainer.processing_class
        with unwrap_model_for_generation(trainer.model_wrapped, accelerator) as model:
            backend = GenerateBackend(model, tokenizer, batch_size=self.batch_size)
            greedy = evaluate_data(backend, self.data, self.greedy, self.reward, mode=self.mode, score=main)
            sampled = None
            if self.sampled is not None:
                sampled = evaluate_data(backend, self.data, self.sampled, self.reward, ks=self.ks, mode=self.mode,
                                        seed=self.seed, score=main)  # fmt: skip
        metrics = None
        if main:
            # None when no held-out problem could be scored (then only the counts are logged).
            metrics = {"held_out_accuracy": greedy.summary.get("greedy_accuracy")}
            metrics.update(
                self._keys("greedy", greedy.summary, ("mean_length", "truncation_rate", "samples_unscored"))
            )
            if sampled is not None:
                wanted = [f"pass@{k}" for k in self.ks] + [f"avg@{self.sampled.num_samples}"]
                wanted += [k for k in sampled.summary if k.startswith("maj@")]
                metrics.update(self._keys("", sampled.summary, wanted))
                metrics.update(self._keys("sampled", sampled.summary, ("mean_length", "samples_unscored")))
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            metrics = broadcast_object_list([metrics], from_process=0)[0]
        return metrics

    @staticmethod
    def _keys(group: str, summary: dict[str, Any], keys: Sequence[str]) -> dict[str, float]:
        prefix = f"held_out/{group}_" if group else "held_out/"
        return {f"{prefix}{k}": float(summary[k]) for k in keys if summary.get(k) is not None}

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
            sampled = "".join(f", {k.split('/')[-1]} {v:.3f}" for k, v in metrics.items() if "@" in k)
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
