"""The one reward-function package: TRL reward functions and a registry of them by name.

Every function follows TRL's signature ``reward(completions, **kwargs) -> list[float | None]``: ``completions``
are strings or conversational message lists, dataset columns arrive as keyword lists (the gold in ``answer``, a
reference solution in ``solution``; see :mod:`grpo_family.collator`), and ``None`` means "cannot score" (missing
or unparseable gold, a scoring timeout), never a disguised 0. A model answer that cannot be read scores 0.0.
Each function's ``__name__`` is its registry name, which is also the name TRL logs it under.

=========================  =================================================================================
``math_accuracy``          math-verify equivalence (exact numbers) of the answer slot's value with the gold (1/0/None)
``think_answer_format``    ``<think>...</think><answer>...</answer>`` layout (1/0)
``boxed_format``           ``<think>...</think>`` then a ``\\boxed{}`` answer (1/0)
``think_prefilled_*``      ``think_prefilled_answer_format`` / ``think_prefilled_boxed_format``: the same layouts
                           for chat templates that pre-fill ``<think>`` (DeepSeek-R1-Distill): the completion
                           starts inside the think block, without the opening tag (1/0)
``choice_accuracy``        multiple-choice letter (A-E) equals the gold letter (1/0/None)
``qa_exact_match``         SQuAD-normalised exact match, best over gold aliases (1/0/None)
``qa_f1``                  SQuAD-normalised token F1, best over gold aliases ([0, 1]/None)
``code_tests``             fraction of test cases (``test_cases`` column) a sandboxed run of the program passes
``reasoning_gym``          the reasoning-gym task's own verifier on the answer slot (1/0/None; ``reasoning_gym_entry``
                           column, from ``--dataset_name reasoning_gym/<task>``)
``arithmetic``             the bundled task's reward (``grpo_family.tasks``), resolved on first use
=========================  =================================================================================

Every answer-reading reward (math, choice, QA, reasoning-gym, the bundled task) reads the last assistant message
(:func:`completion_text`) under one answer contract, :func:`read_answer` (``docs/answer_extraction.md``), decided
from structure: text after ``</think>`` only, no hiding markup, the committed answer is the last answer slot (box,
``<answer>`` tag, ``Answer:`` line), one value in it, so a completion scores exactly what that one value earns. A
completion that breaks it scores 0.0 and is counted in ``<reward>/contract_violations``; ``mode="eval"`` adds the
benchmarks' numeric tolerance, ``mode="strict"`` requires exactly one slot and nothing after it.
:func:`check_golds` reports, before training, the golds a reward cannot read (count and examples) and fails fast
when most are unreadable.

``with_timeout(func, seconds)`` gives any reward function a per-call deadline: a call that never returns scores
``None`` for its batch (with a metric and a warning in the trainers) instead of stalling training.

SGPO's step judges are not rewards: they live in :mod:`grpo_family.judges`, a higher floor that imports this
package (``docs/architecture.md`` §1).

This package imports only the standard library, math-verify, its own modules and :mod:`grpo_family.errors` (never
TRL, torch or the trainers), so the scoring worker subprocesses of :mod:`grpo_family.rewards.timeout` start quickly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from ..errors import RewardTimeoutError
from .choice import ChoiceAccuracyReward, choice_accuracy_reward, extract_choice, gold_letter
from .code import CodeTestsReward, Sandbox, code_tests_reward, extract_code, parse_test_cases
from .contract import Reading, read_answer
from .extract import completion_text, last_boxed, last_tag_content, solution_gold
from .format import (
    FormatReward,
    boxed_format_reward,
    has_boxed_format,
    has_think_answer_format,
    make_format_reward,
    think_answer_format_reward,
    think_prefilled_answer_format_reward,
    think_prefilled_boxed_format_reward,
)
from .golds import GoldReport, check_golds
from .math import MathAccuracyReward, math_accuracy_reward, parse_answer, parse_gold, score_math, too_expensive
from .qa import (
    QAReward,
    exact_match_score,
    extract_qa_answer,
    f1_score,
    normalize_answer,
    qa_exact_match_reward,
    qa_f1_reward,
)
from .reasoning_gym import ReasoningGymReward, reasoning_gym_reward
from .timeout import with_timeout

RewardFunc = Callable[..., list]

REWARD_FUNCS: dict[str, RewardFunc] = {
    fn.__name__: fn
    for fn in (
        math_accuracy_reward,
        think_answer_format_reward,
        boxed_format_reward,
        think_prefilled_answer_format_reward,
        think_prefilled_boxed_format_reward,
        choice_accuracy_reward,
        qa_exact_match_reward,
        qa_f1_reward,
        code_tests_reward,
        reasoning_gym_reward,
    )
}

# Rewards defined elsewhere in the library, imported on first use so that this package stays light and does not
# depend on them: name -> (module, attribute).
_OPTIONAL_REWARDS: dict[str, tuple[str, str]] = {
    "arithmetic": ("grpo_family.tasks.arithmetic", "arithmetic_reward"),
}


def _load_optional(name: str) -> RewardFunc | None:
    module_name, attr = _OPTIONAL_REWARDS[name]
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None
    REWARD_FUNCS[name] = fn
    return fn


def reward_names() -> list[str]:
    """Every name :func:`get_reward_funcs` accepts (optional rewards included when they import)."""
    for name in _OPTIONAL_REWARDS:
        if name not in REWARD_FUNCS:
            _load_optional(name)
    return sorted(REWARD_FUNCS)


def get_reward_funcs(names: str | Iterable[str | RewardFunc]) -> list[RewardFunc]:
    """Reward functions by name, in order. ``names`` may be a list or a comma-separated string; callables are
    passed through. An unknown name raises a ValueError that lists the valid names."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    funcs = []
    for name in names:
        if callable(name):
            funcs.append(name)
            continue
        fn = REWARD_FUNCS.get(name)
        if fn is None and name in _OPTIONAL_REWARDS:
            fn = _load_optional(name)
        if fn is None:
            raise ValueError(f"Unknown reward function {name!r}. Valid names: {', '.join(reward_names())}.")
        funcs.append(fn)
    return funcs


__all__ = [
    "RewardTimeoutError",
    "GoldReport",
    "Reading",
    "check_golds",
    "read_answer",
    "solution_gold",
    "too_expensive",
    "with_timeout",
    "REWARD_FUNCS",
    "ChoiceAccuracyReward",
    "CodeTestsReward",
    "Sandbox",
    "code_tests_reward",
    "extract_code",
    "parse_test_cases",
    "FormatReward",
    "MathAccuracyReward",
    "QAReward",
    "ReasoningGymReward",
    "boxed_format_reward",
    "choice_accuracy_reward",
    "completion_text",
    "exact_match_score",
    "extract_choice",
    "extract_qa_answer",
    "f1_score",
    "get_reward_funcs",
    "gold_letter",
    "has_boxed_format",
    "has_think_answer_format",
    "last_boxed",
    "last_tag_content",
    "make_format_reward",
    "math_accuracy_reward",
    "normalize_answer",
    "parse_answer",
    "parse_gold",
    "qa_exact_match_reward",
    "qa_f1_reward",
    "reasoning_gym_reward",
    "reward_names",
    "score_math",
    "think_answer_format_reward",
    "think_prefilled_answer_format_reward",
    "think_prefilled_boxed_format_reward",
]
