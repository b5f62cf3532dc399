"""Training runs on the bundled task for the benchmarks that train (``learning.py``, ``claims.py``): one run per job,
in worker processes with one torch thread each, resumable from a per-job cache.

A *job* is a JSON-able dict: ``method``, ``setting``, ``seed``, ``steps``, ``difficulty`` (a name of
``grpo_family.tasks.DIFFICULTIES`` or the fields of a ``Difficulty``), ``eval_every``, ``eval_examples``,
``overrides`` (config fields over ``DEFAULT_GRPO_ARGS``) and optionally ``reward`` (how the training reward differs
from the task's, see :func:`make_training_reward`) and ``log_keys`` (more per-step log keys to return). Every run
starts from the same warm start (``load_warm_start(seed=0)``); ``seed`` sets the training-data order and the
sampling, so two methods run with the same seed see the same prompts in the same order. Held-out greedy accuracy is
measured by the evaluation package's :class:`~grpo_family.eval.EvaluationCallback` on fixed problems (seed 0).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from benchmarks import harness

# Per-step log keys every run returns (None where a step's log lacks one).
BASE_LOG_KEYS = ("entropy", "rewards/arithmetic_reward/mean", "frac_reward_zero_std", "completions/mean_length")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def job_key(job: dict) -> str:
    """A short hash of the job's description (its cache key: the settings, not the code)."""
    return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]


class FlippedReward:
    """The task's reward with exactly ``round(p * n)`` of each call's ``n`` scored values flipped (``1 - r``), the
    flipped positions drawn from a generator seeded by ``seed`` and the call's number: label noise at rate ``p``
    whose share is exact in every batch. Counts what it did (``scored``, ``flipped``, ``calls``)."""

    def __init__(self, base, p: float, seed: int):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"flip probability must lie in [0, 1], got {p}")
        self.base, self.p, self.seed = base, p, seed
        self.__name__ = f"{base.__name__}_flipped"
        self.calls = self.scored = self.flipped = 0

    def __call__(self, completions, **kwargs):
        values = self.base(completions, **kwargs)
        scored = [i for i, v in enumerate(values) if v is not None]
        chosen = random.Random(f"{self.seed}-{self.calls}").sample(scored, round(self.p * len(scored)))
        for i in chosen:
            values[i] = 1.0 - values[i]
        self.calls += 1
        self.scored += len(scored)
        self.flipped += len(chosen)
        return values


def graded_arithmetic_reward(completions, answer, **kwargs) -> list[float | None]:
    """Heterogeneous rewards on the bundled task: 1.0 for the right final answer, ``0.5 / (1 + |stated - gold|)``
    (at most 0.25) for a wrong integer answer, 0.0 without one. Same answer contract as ``arithmetic_reward``."""
    from grpo_family.rewards.extract import completion_text
    from grpo_family.rewards.values import integer_value
    from grpo_family.tasks.arithmetic import arithmetic_reward, extract_answer

    exact = arithmetic_reward(completions, answer)
    out: list[float | None] = []
    for value, completion, gold in zip(exact, completions, answer):
        if value is None or value == 1.0:
            out.append(value)
            continue
        stated = extract_answer("" if completion is None else completion_text(completion))
        out.append(0.0 if stated is None else 0.5 / (1 + abs(stated - integer_value(str(gold).strip()))))
    return out


def make_training_reward(spec: dict | None, seed: int):
    """The training reward of a job: the task's ``arithmetic_reward`` (``spec`` None), ``{"flip": p}`` (see
    :class:`FlippedReward`) or ``{"graded": True}`` (:func:`graded_arithmetic_reward`)."""
    from grpo_family.tasks import arithmetic_reward

    if not spec:
        return arithmetic_reward
    if set(spec) == {"flip"}:
        return FlippedReward(arithmetic_reward, spec["flip"], seed)
    if spec == {"graded": True}:
        return graded_arithmetic_reward
    raise ValueError(f"unknown training reward {spec!r}: use None, {{'flip': p}} or {{'graded': True}}")


def _difficulty(spec):
    from grpo_family.tasks import Difficulty

    return spec if isinstance(spec, str) else Difficulty(**spec)


def run_one(job: dict) -> dict:
    """Train one job from the warm start; return its curves. Runs in a worker process."""
    import torch

    torch.set_num_threads(1)
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from grpo_family import get_method
    from grpo_family.eval import EvalData, EvaluationCallback
    from grpo_family.tasks import (
        DEFAULT_GRPO_ARGS,
        DEFAULT_TRAIN_EXAMPLES,
        arithmetic_reward,
        load_warm_start,
        make_arithmetic_dataset,
    )

    whole, started = harness.Timer(), time.time()
    method, seed, steps = job["method"], job["seed"], job["steps"]
    difficulty = _difficulty(job["difficulty"])
    model, tokenizer = load_warm_start(seed=0)
    train = make_arithmetic_dataset("train", DEFAULT_TRAIN_EXAMPLES, seed=seed, difficulty=difficulty)
    held_out = make_arithmetic_dataset("eval", job["eval_examples"], seed=0, difficulty=difficulty)
    reward = make_training_reward(job.get("reward"), seed)
    settings = {**DEFAULT_GRPO_ARGS, **job["overrides"]}
    # Greedy held-out accuracy at step 0, every eval_every steps and at the last step: the demo's evaluation path.
    evaluation = EvaluationCallback(
        EvalData.held_out(held_out, arithmetic_reward),
        arithmetic_reward,
        every=job["eval_every"],
        max_new_tokens=settings["max_completion_length"],
        mode="train",  # the answer contract the policy is trained on, as examples/train.py
    )
    # CPU seconds of this process per optimizer step (generation, scoring, forwards, backward, update); it runs
    # before the evaluation callback, so held-out evaluations are not counted.
    clock = harness.step_timer()

    config_cls, trainer_cls = get_method(method)
    with tempfile.TemporaryDirectory() as out:
        args = config_cls(
            output_dir=out,
            **{
                **settings,
                "max_steps": steps,
                "logging_steps": 1,
                "seed": seed,
                "use_cpu": True,
                "bf16": False,
                "disable_tqdm": True,
            },
        )
        trainer = trainer_cls(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=train,
            processing_class=tokenizer,
            callbacks=[clock, evaluation],
        )
        trainer.remove_callback(PrinterCallback)  # the per-step log dicts; the curves are returned instead
        evaluation.bind(trainer)
        evaluation.initial = evaluation.evaluate()
        with harness.Timer() as training:
            trainer.train()
    accuracy = {step: metrics["held_out_accuracy"] for step, metrics in evaluation.history.items()}
    logs = [row for row in trainer.state.log_history if "entropy" in row]
    keys = [*BASE_LOG_KEYS, *job.get("log_keys", ())]
    series = {key: [row.get(key) for row in logs] for key in keys}
    rounds = [row.get(f"{method}/rounds", 1.0) for row in logs]  # GPG's generation rounds per step
    result = {
        **{k: job[k] for k in ("method", "setting", "seed")},
        "steps": steps,
        "seconds": round(training.wall, 1),
        "cpu_seconds": [round(c, 4) for c in clock.times],
        "cpu_total": round(whole.cpu, 1),  # the whole run: set-up and evaluations included
        "started": round(started, 1),  # Unix times: a report of cached runs can give the span they were trained in
        "finished": round(time.time(), 1),
        "accuracy": {str(k): v for k, v in sorted(accuracy.items())},
        "entropy": series.pop("entropy"),
        # the correctness reward as sampled, comparable across methods (SGPO's `reward` includes its partial credit;
        # a job with another training reward logs that reward's mean under its own name instead)
        "reward": series.pop("rewards/arithmetic_reward/mean"),
        "frac_reward_zero_std": series.pop("frac_reward_zero_std"),
        "completions_per_step": _mean(rounds) * args.per_device_train_batch_size,
        "rounds": rounds,
        "log": series,
    }
    if isinstance(reward, FlippedReward):
        result["flips"] = {"calls": reward.calls, "scored": reward.scored, "flipped": reward.flipped}
    return result


def cache_path(cache: Path, job: dict) -> Path:
    """Where a finished job's run is kept in ``cache``: one JSON per job, named by method, setting, seed and
    :func:`job_key` (so a changed job is a new file, and the old one is not read for it)."""
    return cache / f"{job['method']}-{job['setting']}-{job['seed']}-{job_key(job)}.json"


def run_all(
    jobs: list[dict],
    workers: int,
    cache: Path | None,
    label: str = "runs",
    gpg_first: bool = True,
    deadline: float | None = None,
    train: bool = True,
) -> tuple[list[dict | None], int]:
    """Every job's run, in job order, and how many were trained now. Finished runs are kept in ``cache`` (one JSON
    per job, keyed by :func:`job_key`), so an interrupted benchmark resumes where it stopped. Jobs start in the
    order given (with ``gpg_first``, GPG's first: the longest, for its resampling rounds), at most ``workers`` at a
    time; none starts after ``deadline`` (a ``time.perf_counter()`` value) or at all without ``train``: their
    places hold None."""
    results: dict[int, dict] = {}
    pending = []
    for index, job in enumerate(jobs):
        path = None if cache is None else cache_path(cache, job)
        if path is not None and path.exists():
            results[index] = json.loads(path.read_text())
        else:
            pending.append((index, job, path))
    if gpg_first:
        pending.sort(key=lambda item: item[1]["method"] != "gpg")
    trained = 0
    if pending and train:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            running: dict = {}
            while pending or running:
                while pending and len(running) < workers and (deadline is None or time.perf_counter() < deadline):
                    index, job, path = pending.pop(0)
                    running[pool.submit(run_one, job)] = (index, path)
                if not running:
                    break  # past the deadline
                future = next(as_completed(running))
                index, path = running.pop(future)
                results[index] = future.result()
                trained += 1
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(results[index]))
                print(f"[{label}] {len(results)}/{len(jobs)} runs done", flush=True)
    return [results.get(i) for i in range(len(jobs))], trained


def finite(values) -> list[float]:
    """The values that are numbers (not None, not NaN)."""
    return [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
