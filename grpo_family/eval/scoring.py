"""Scoring completions for evaluation: one function, :func:`score_samples`, with the scoring mode as an argument.

Every reward call goes through the trainers' guard (:class:`~grpo_family.runtime.reward_guards.GuardedReward`, or
its async twin, non-strict) under a deadline (:func:`~grpo_family.rewards.with_timeout`, ``timeout`` seconds per
call): a reward that raises, times out, returns strings, NaN, numpy values or None on some rows, is ``async``, or calls
``sys.exit`` leaves those rows unscored (``None``), counted in :attr:`Scores.unscored` with the reasons in
:attr:`Scores.errors`, and the evaluation goes on. ``KeyboardInterrupt`` still stops it.

``mode``: ``"eval"`` (the default) asks the reward for its documented lenient evaluation reading; ``"train"`` for the
strict training contract (the answer rewards take both: ``docs/answer_extraction.md`` §7). A reward whose signature
has a ``mode`` parameter receives it; a reward without one is scored in its only mode, and
:attr:`Scores.mode_applied` says so.

Beside the reward's verdict: the answer each sample commits to (:func:`extract_answer`, what ``maj@k`` votes on),
and optionally math-verify's own verdict with its default extraction (:func:`math_verify_verdicts`), so the
project's extraction can be compared with the library's on every sample.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RewardExitError

__all__ = ["RewardExitError", "Scores", "extract_answer", "guard_reward", "math_verify_verdicts", "score_samples"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 600.0  # seconds per reward call, as the trainers' reward_timeout
MODES = ("eval", "train", "strict")


@dataclass
class Scores:
    """``values``: one reward per sample, None where unscored; ``unscored``: how many; ``errors``: what the guard
    reported (reward name, rows, reason); ``mode``: the mode asked for; ``mode_applied``: whether the reward took it."""

    values: list[float | None]
    mode: str
    mode_applied: bool
    errors: list[dict] = field(default_factory=list)

    @property
    def unscored(self) -> int:
        return sum(v is None for v in self.values)


def _name(func: Callable) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _is_async(func: Callable) -> bool:
    from trl.trainer.utils import is_async_callable

    return is_async_callable(func)


def _exit_is_an_error(func: Callable) -> Callable:
    """``func`` with ``SystemExit`` turned into :class:`RewardExitError` where it is raised (inside the coroutine of
    an async reward, where asyncio would otherwise let it escape the event loop)."""
    name = _name(func)

    def exited(error: SystemExit) -> RewardExitError:
        return RewardExitError(f"reward function '{name}' called sys.exit({error.code!r})")

    if _is_async(func):

        @functools.wraps(func)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await func(*args, **kwargs)
            except SystemExit as error:
                raise exited(error) from None

        return call_async

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SystemExit as error:
            raise exited(error) from None

    return call


def guard_reward(
    func: Callable, on_error: Callable[[str, int, str], None], *, timeout: float | None = DEFAULT_TIMEOUT
):
    """``func`` behind the trainers' guard, never strict (no set-up error is raised: failures become None), with a
    per-call deadline unless it has its own (``with_timeout``'s ``reward_deadline``) or ``timeout`` is None."""
    from grpo_family.rewards.timeout import with_timeout
    from grpo_family.runtime.reward_guards import AsyncGuardedReward, GuardedReward

    name = _name(func)
    wrapped = _exit_is_an_error(func)
    if timeout and not hasattr(func, "reward_deadline"):
        wrapped = with_timeout(wrapped, timeout)
    guard = (AsyncGuardedReward if _is_async(func) else GuardedReward)(wrapped, name, on_error)
    guard.strict = False
    return guard


def _run(awaitable):
    """Await ``awaitable`` from synchronous code, also where an event loop is already running (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(awaitable)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, awaitable).result()


def _accepts_mode(func: Callable) -> bool:
    try:
        return "mode" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def _as_completion(prompt: Any, text: str) -> Any:
    """A completion in the format TRL gives reward functions: messages for a conversational prompt, else text."""
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


def score_samples(
    reward: Callable,
    rows: dict[str, list],
    texts: list[list[str]],
    *,
    mode: str = "eval",
    timeout: float | None = DEFAULT_TIMEOUT,
) -> Scores:
    """Score ``texts[i][j]`` (problem ``i``'s sample ``j``) with ``reward`` in one guarded call.

    ``rows``: the dataset's columns (``prompt`` and the gold column at least), one value per problem; each is passed
    to the reward repeated once per sample, as TRL passes a group's columns. Returns the scores flattened in
    (problem, sample) order."""
    if mode not in MODES:
        raise ValueError(f"scoring mode must be one of {MODES}, got {mode!r}")
    counts = [len(samples) for samples in texts]
    columns = {key: [v for v, c in zip(values, counts) for _ in range(c)] for key, values in rows.items()}
    prompts = columns.pop("prompt")
    completions = [_as_completion(p, t) for p, samples in zip(rows["prompt"], texts) for t in samples]
    errors: list[dict] = []
    guard = guard_reward(reward, lambda name, n, why: errors.append({"reward": name, "rows": n, "reason": why}),
                         timeout=timeout)  # fmt: skip
    applied = _accepts_mode(reward)
    extra = {"mode": mode} if applied else {}
    if not completions:
        return Scores([], mode, applied, errors)
    result = guard(completions=completions, prompts=prompts, **columns, **extra)
    values = _run(result) if inspect.isawaitable(result) else result
    for error in errors:
        logger.warning("reward %s: %d sample(s) unscored: %s", error["reward"], error["rows"], error["reason"])
    return Scores(list(values), mode, applied, errors)


_SPACE = re.compile(r"\s+")


def extract_answer(reward_name: str, text: str, mode: str = "eval", gold: Any = None) -> str | None:
    """The answer a completion commits to, as the named reward reads it in ``mode`` (None: no answer, or the answer
    contract broken in training mode); whitespace collapsed, so that ``maj@k`` votes on the reading, not the spacing.
    ``gold``: the problem's gold, where the reading depends on its shape (a math tuple, units after a number).
    Rewards without a known reader use the contract's generic slot (:func:`~grpo_family.rewards.read_answer`)."""
    from grpo_family.rewards import extract_choice, extract_qa_answer, normalize_answer, read_answer
    from grpo_family.rewards.contract import ANSWER_SLOTS

    if reward_name in ("arithmetic", "arithmetic_reward"):
        from grpo_family.tasks.arithmetic import extract_answer as arithmetic_answer

        value = arithmetic_answer(text, mode)
        return None if value is None else str(value)
    if reward_name == "math_accuracy":
        from grpo_family.rewards.math import OK, math_answer

        status, value, _ = math_answer(text, gold, mode)
        answer = value if status == OK else None
    elif reward_name == "choice_accuracy":
        answer = extract_choice(text, mode=mode)
    elif reward_name in ("qa_exact_match", "qa_f1"):
        answer = normalize_answer(extract_qa_answer(text, mode)) or None
    elif reward_name in ("reasoning_gym", "reasoning_gym_partial"):
        from grpo_family.rewards.reasoning_gym import extract_reasoning_gym_answer

        partial = reward_name == "reasoning_gym_partial"
        answer = extract_reasoning_gym_answer(text, marked_only=partial, mode=mode, gold=gold)
    else:
        answer = read_answer(text, ANSWER_SLOTS, mode).value
    return None if answer is None else _SPACE.sub(" ", answer.strip()) or None


def math_verify_verdicts(texts: list[str], golds: list[Any], *, timeout: float = 10.0) -> list[bool | None]:
    """math-verify's verdict per (text, gold), each under a ``timeout`` deadline in a killable worker; None where the
    gold is missing or does not parse, or the item failed or timed out."""
    from grpo_family.rewards.timeout import get_runner

    from ._mathverify import math_verify_verdict

    items = [(t, str(g)) for t, g in zip(texts, golds)]
    keep = [i for i, (_, g) in enumerate(items) if golds[i] is not None and g.strip()]
    runner = get_runner("process", preload=("grpo_family.eval._mathverify",))
    outcomes = runner.map(math_verify_verdict, [items[i] for i in keep], timeout)
    out: list[bool | None] = [None] * len(items)
    for i, outcome in zip(keep, outcomes):
        out[i] = outcome.value if outcome.status == "ok" else None
    return out
