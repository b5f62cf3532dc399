"""One benchmark's evaluation: generate, score, extract answers, and the metrics per problem and over the benchmark.

:func:`evaluate_data` is the one path every evaluation takes: the command line, the training callback
(:class:`~grpo_family.eval.callback.EvaluationCallback`, which ``examples/train.py`` and ``benchmarks/learning.py``
use) and the throughput benchmark.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import EvalSetupError
from . import metrics as M
from .presets import Decoding
from .scoring import extract_answer, math_verify_verdicts, score_samples

__all__ = ["BenchmarkResult", "check_ks", "default_ks", "evaluate_data", "generate_split", "prompt_key"]


@dataclass
class BenchmarkResult:
    """What one benchmark gave: ``summary`` (metric -> mean over the problems that have it, plus counts, lengths,
    truncation, unscored samples and timing) and ``problems`` (one record per problem, the JSONL rows)."""

    name: str
    decoding: Decoding
    headline: tuple[str, ...]
    summary: dict[str, Any]
    problems: list[dict] = field(default_factory=list)
    scoring: dict[str, Any] = field(default_factory=dict)


def default_ks(decoding: Decoding, headline: Sequence[str]) -> list[int]:
    """pass@k to report: 1, the headline's k, and n."""
    ks = {1, decoding.num_samples}
    ks.update(int(m.split("@")[1]) for m in headline if m.startswith("pass@"))
    return sorted(k for k in ks if k <= decoding.num_samples)


def check_ks(ks: Sequence[int], decoding: Decoding, what: str) -> None:
    """k larger than the samples per problem (or below 1) cannot be estimated: refuse before generating."""
    bad = [k for k in ks if not 1 <= k <= decoding.num_samples]
    if bad:
        raise EvalSetupError(
            f"{what}: pass@k / maj@k with k={bad} needs at least {max(bad)} samples per problem, but the decoding "
            f"draws {decoding.num_samples}. Raise --num_samples to {max(bad)} or drop those k (k >= 1)."
        )


def prompt_key(prompt: Any) -> str:
    """A short stable hash of a prompt (to pair problems across runs in ``--compare``)."""
    return hashlib.sha256(json.dumps(prompt, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _chunks(num_problems: int, per_chunk: int) -> list[tuple[int, int]]:
    return [(start, min(start + per_chunk, num_problems)) for start in range(0, num_problems, per_chunk)]


def generate_split(backend, prompts: list, decoding: Decoding, *, seed: int | None, accelerator=None,
                   progress: bool = False):  # fmt: skip
    """Generate ``prompts`` with ``backend``, the problems split across ``accelerator``'s processes.

    One process (or none given): the backend generates everything. Several: the problems are cut into chunks of
    ``min(batch size in problems, ceil(problems / processes))`` consecutive problems, the chunks are split between
    the processes (accelerate's ``split_between_processes``: each process generates only its share), and the
    generations are gathered (``gather_object``) on every process in problem order. Each chunk is one generation
    batch seeded from ``seed`` and its first problem's index, so the result equals a one-process run whose batches
    hold the same problems (``batch_size`` = chunk x samples). A backend whose engine lives on the main process only
    (``main_only``: vLLM server mode, where the server does the batching) generates everything there; the others get
    None. Returns the :class:`~grpo_family.eval.generation.Generation` (None off the main process for ``main_only``)
    and the problem indices this process generated."""
    import math
    import time

    from .generation import Generation

    count = len(prompts)
    world = 1 if accelerator is None else accelerator.num_processes
    if world == 1 or getattr(backend, "main_only", False):
        if world > 1 and not accelerator.is_main_process:
            return None, []
        # A backend needs only (prompts, decoding, seed) here; the split below also passes first_index and the batch.
        generation = backend.generate(prompts, decoding, seed=seed, **({"progress": True} if progress else {}))
        return generation, list(range(count))
    from accelerate.utils import gather_object

    per_batch = max(1, getattr(backend, "batch_size", count * decoding.num_samples) // decoding.num_samples)
    chunks = _chunks(count, max(1, min(per_batch, math.ceil(count / world))))
    start_time = time.perf_counter()
    local = []
    with accelerator.split_between_processes(chunks) as mine:
        for first, stop in mine:
            part = backend.generate(prompts[first:stop], decoding, seed=seed, first_index=first,
                                    problems_per_batch=stop - first, progress=progress)  # fmt: skip
            local.append((first, part))
        generated = [i for first, stop in mine for i in range(first, stop)]
    gathered = sorted(gather_object(local), key=lambda item: item[0])
    parts = [part for _, part in gathered]
    generation = Generation(
        [row for part in parts for row in part.samples],
        max((p.max_new_tokens for p in parts), default=decoding.max_new_tokens or 0),
        time.perf_counter() - start_time,
        parts[0].backend if parts else getattr(backend, "name", "?"),
        {**(parts[0].extra if parts else {}), "processes": world, "chunks": len(chunks)},
    )
    return generation, generated


def evaluate_data(
    backend,
    data,
    decoding: Decoding,
    reward: Callable,
    *,
    headline: Sequence[str] = (),
    ks: Sequence[int] | None = None,
    maj_ks: Sequence[int] | None = None,
    mode: str = "eval",
    seed: int | None = 0,
    threshold: float = 1.0,
    math_verify: bool = False,
    reward_timeout: float | None = 600.0,
    score: bool = True,
    accelerator=None,
    progress: bool = False,
) -> BenchmarkResult | None:
    """Evaluate ``data`` (an :class:`~grpo_family.eval.data.EvalData`) with ``backend`` under ``decoding``.

    ``accelerator`` (a distributed run; every process calls this): the problems are split between the processes and
    the generations gathered (:func:`generate_split`); only the main process scores, the others return None. Without
    it, a process called with ``score=False`` only generates (the whole set) and returns None. ``progress``: a
    progress bar over the problems generated.
    """
    ks = list(ks) if ks is not None else default_ks(decoding, headline)
    maj_ks = list(maj_ks) if maj_ks is not None else ([decoding.num_samples] if decoding.num_samples > 1 else [])
    check_ks([*ks, *maj_ks], decoding, f"dataset {data.name}")
    rows = data.rows
    prompts = list(rows["prompt"])
    generation, generated = generate_split(backend, prompts, decoding, seed=seed, accelerator=accelerator,
                                           progress=progress)  # fmt: skip
    if not score or (accelerator is not None and not accelerator.is_main_process):
        return None
    texts = [[s.text for s in samples] for samples in generation.samples]
    columns = {c: list(rows[c]) for c in rows.column_names}
    scores = score_samples(reward, columns, texts, mode=mode, timeout=reward_timeout)
    reward_name = getattr(reward, "__name__", type(reward).__name__)
    golds = columns.get(data.gold_column, [None] * len(prompts))
    verdicts: list[bool | None] | None = None
    if math_verify and data.gold_column == "answer":
        flat_golds = [g for g, samples in zip(golds, texts) for _ in samples]
        verdicts = math_verify_verdicts([t for samples in texts for t in samples], flat_golds)

    problems, offset = [], 0
    for i, samples in enumerate(generation.samples):
        n = len(samples)
        values = scores.values[offset : offset + n]
        answers = [extract_answer(reward_name, s.text, mode, golds[i]) for s in samples]
        record = {
            "benchmark": data.name,
            "index": i,
            "prompt_key": prompt_key(prompts[i]),
            "prompt": _jsonable(prompts[i]),
            "gold": _jsonable(golds[i]),
            "samples": [s.text for s in samples],
            "answers": answers,
            "scores": values,
            "correct": [None if v is None else v >= threshold for v in values],
            "num_tokens": [s.num_tokens for s in samples],
            "truncated": [s.truncated for s in samples],
        }
        if verdicts is not None:
            record["math_verify"] = verdicts[offset : offset + n]
        record["metrics"] = M.problem_metrics(values, answers, ks=ks, maj_ks=maj_ks, threshold=threshold)
        if decoding.greedy and "pass@1" in record["metrics"]:
            record["metrics"]["greedy_accuracy"] = record["metrics"]["pass@1"]
        problems.append(record)
        offset += n

    keys = list(dict.fromkeys(k for p in problems for k in p["metrics"]))
    all_samples = [s for samples in generation.samples for s in samples]
    summary: dict[str, Any] = {}
    for key in keys:
        values = [p["metrics"][key] for p in problems if key in p["metrics"]]
        summary[key] = M.mean(values)
        summary[f"{key}_stderr"] = M.standard_error(values)
    summary.update(
        problems=len(problems),
        problems_unscored=sum(not p["metrics"] for p in problems),
        samples=len(all_samples),
        samples_unscored=scores.unscored,
        mean_length=M.mean([s.num_tokens for s in all_samples]),
        truncation_rate=M.mean([float(s.truncated) for s in all_samples]),
        generated_tokens=generation.num_tokens,
        generation_seconds=generation.seconds,
        tokens_per_second=generation.num_tokens / generation.seconds if generation.seconds > 0 else None,
        max_new_tokens=generation.max_new_tokens,
    )
    if verdicts is not None:
        pairs = [(v >= threshold, m) for v, m in zip(scores.values, verdicts) if v is not None and m is not None]
        summary["math_verify_accuracy"] = M.mean([float(m) for _, m in pairs]) if pairs else None
        summary["math_verify_accuracy_stderr"] = M.standard_error([float(m) for _, m in pairs])
        summary["math_verify_agreement"] = M.mean([float(a == m) for a, m in pairs]) if pairs else None
    scoring = {"reward": reward_name, "mode": scores.mode, "mode_applied": scores.mode_applied,
               "threshold": threshold, "errors": scores.errors, "backend": generation.backend, **generation.extra}  # fmt: skip
    scoring["generated_here"] = len(generated)  # problems this process generated (all of them on one process)
    return BenchmarkResult(data.name, decoding, tuple(headline), summary, problems, scoring)
