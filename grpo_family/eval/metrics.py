"""Evaluation metrics over ``n`` scored samples per problem, and the paired bootstrap used by ``--compare``.

Pure functions on Python numbers (no torch): what a problem's samples give, and what a benchmark's problems give.

* ``pass@k`` -- the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models Trained on Code",
  Eq. 1): with ``c`` of ``n`` samples correct, ``1 - C(n - c, k) / C(n, k)``, the probability that a random size-``k``
  subset of the ``n`` samples holds a correct one. Computed in the paper's numerically stable product form
  ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (no huge binomials); exactly 1 when ``n - c < k``.
* ``avg@n`` -- the share of the ``n`` samples that are correct (SGPO's "average percentage of correct samples
  among the k samples"; D3S's Avg@32, which equals its Pass@1). ``pass@1`` from ``n`` samples is the same number.
* ``maj@k`` -- majority vote over the extracted answers of the first ``k`` samples: the most frequent answer
  wins, samples without an answer do not vote, and a tie goes to the tied answer that appears *first* among the
  samples (deterministic, order-dependent, documented in ``docs/evaluation.md``). Correct when the samples with that
  answer are correct.
* ``greedy accuracy`` -- the share of problems whose one greedy sample is correct.
* every benchmark mean has a standard error over problems (:func:`standard_error`), reported as ``<metric>_stderr``.

A sample is *correct* when its reward is at least ``threshold`` (default 1.0: full marks; rewards in [0, 1] such as
``qa_f1`` or ``code_tests`` count only when perfect). Unscored samples (reward ``None``) are left out: a problem's
estimates use its scored samples only, and a problem with none is left out of the benchmark's means (both counted in
the results).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "avg_at_n",
    "correct_flags",
    "majority_answer",
    "maj_at_k",
    "mean",
    "paired_bootstrap",
    "pass_at_k",
    "problem_metrics",
    "standard_error",
]

# --compare: problems resampled with replacement this many times, from this seed (so a comparison is reproducible).
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021): ``1 - C(n-c, k) / C(n, k)``,
    in the numerically stable product form. ``1 <= k <= n`` and ``0 <= c <= n`` are required."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k takes integers, got n={n!r}, c={c!r}, k={k!r}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples; got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} correct of n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_n(flags: Sequence[bool]) -> float:
    """Share of correct samples (avg@n, = pass@1 estimated from n samples)."""
    if not flags:
        raise ValueError("avg@n of no samples")
    return sum(flags) / len(flags)


def correct_flags(scores: Sequence[float | None], threshold: float = 1.0) -> list[bool]:
    """Correctness of the scored samples (``score >= threshold``); unscored samples (None) are dropped."""
    return [s >= threshold for s in scores if s is not None]


def majority_answer(answers: Sequence[str | None]) -> tuple[str | None, int]:
    """``(answer, index)``: the most frequent non-None answer and the index of its first sample; ties go to the
    answer seen first. ``(None, -1)`` when no sample has an answer."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None, -1
    top = max(counts.values())
    for index, answer in enumerate(answers):
        if answer is not None and counts[answer] == top:
            return answer, index
    raise AssertionError("unreachable")


def maj_at_k(answers: Sequence[str | None], flags: Sequence[bool | None], k: int) -> float:
    """1.0 if the majority answer of the first ``k`` samples is correct, else 0.0 (no answer at all: 0.0).
    ``flags[i]`` is sample ``i``'s correctness (None: unscored, which counts as not correct)."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@{k} needs 1 <= k <= {len(answers)} samples")
    _, index = majority_answer(answers[:k])
    return 1.0 if index >= 0 and flags[index] else 0.0


def problem_metrics(
    scores: Sequence[float | None],
    answers: Sequence[str | None],
    *,
    ks: Sequence[int],
    maj_ks: Sequence[int] = (),
    threshold: float = 1.0,
) -> dict[str, float]:
    """One problem's metrics from its samples (in sampling order): ``pass@k`` for each ``k`` in ``ks`` that its
    scored samples allow, ``avg@n`` over its scored samples, ``maj@k`` for each ``k`` in ``maj_ks``. Empty when no
    sample was scored."""
    flags = correct_flags(scores, threshold)
    if not flags:
        return {}
    n, c = len(flags), sum(flags)
    out = {f"pass@{k}": pass_at_k(n, c, k) for k in ks if k <= n}
    out[f"avg@{len(scores)}"] = c / n
    per_sample = [None if s is None else s >= threshold for s in scores]
    for k in maj_ks:
        if k <= len(answers):
            out[f"maj@{k}"] = maj_at_k(answers, per_sample, k)
    return out


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def standard_error(values: Sequence[float]) -> float | None:
    """Standard error of a benchmark's mean over its problems: ``s / sqrt(P)`` with ``s`` the sample standard
    deviation (``P - 1`` in the denominator) of the ``P`` per-problem values; None below 2 problems.

    Problems are the random unit (a benchmark is a sample of problems): for greedy accuracy the values are 0/1 and
    this is the binomial standard error ``sqrt(p (1 - p) / (P - 1))``; for pass@k they are the unbiased estimator's
    per-problem values, so this is that estimator's standard error over problems (the within-problem sampling noise
    is included, since each problem's value carries it)."""
    count = len(values)
    if count < 2:
        return None
    centre = math.fsum(values) / count
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / (count - 1) / count)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> dict[str, float]:
    """Difference of means ``mean(b) - mean(a)`` over paired per-problem values, with a percentile confidence
    interval from ``resamples`` paired bootstrap resamples of the problems (the same problems for both runs in each
    resample), drawn from ``numpy.random.default_rng(seed)``; the interval's ends are the resampled means'
    quantiles. Returns ``diff``, ``low``, ``high`` and ``resamples``."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired bootstrap needs the same problems on both sides, got {len(a)} and {len(b)}")
    import numpy as np

    diffs = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    rng = np.random.default_rng(seed)
    stats = np.concatenate(  # in chunks: resamples x problems indices at once could be large
        [diffs[rng.integers(0, len(diffs), size=(min(1000, resamples - i), len(diffs)))].mean(axis=1)
         for i in range(0, resamples, 1000)]
    )  # fmt: skip
    low, high = np.quantile(stats, [(1.0 - level) / 2, (1.0 + level) / 2])
    return {"diff": float(diffs.mean()), "low": float(low), "high": float(high), "resamples": resamples}
