"""Evaluate checkpoints the way the papers do: ``python -m grpo_family.eval`` (``docs/evaluation.md``).

pass@k (unbiased, Chen et al. 2021), avg@n, maj@k and greedy accuracy over the papers' benchmarks, local files, the
bundled task and collator-known datasets; a preset per paper plus ``greedy``; ``generate`` and vLLM backends; scoring
through the project's rewards behind the trainers' guard; JSON / JSONL / markdown outputs; ``--compare`` with paired
bootstrap intervals; :class:`EvaluationCallback` for held-out evaluation during training.

Names load on first use (PEP 562): the scoring worker processes import :mod:`grpo_family.eval._mathverify` alone.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Decoding": "presets",
    "EvalSetupError": "presets",
    "PRESETS": "presets",
    "Preset": "presets",
    "get_preset": "presets",
    "BENCHMARKS": "data",
    "EvalData": "data",
    "load_eval_data": "data",
    "pass_at_k": "metrics",
    "avg_at_n": "metrics",
    "maj_at_k": "metrics",
    "paired_bootstrap": "metrics",
    "problem_metrics": "metrics",
    "GenerateBackend": "generation",
    "VLLMBackend": "generation",
    "generate_completions": "generation",
    "evaluate_accuracy": "generation",
    "score_samples": "scoring",
    "BenchmarkResult": "core",
    "evaluate_data": "core",
    "EvaluationCallback": "callback",
    "resolve_model": "models",
    "load_model": "models",
    "compare": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpo_family.eval' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
