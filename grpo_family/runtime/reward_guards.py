"""Reward functions that cannot stop a run: :class:`GuardedReward` (sync) and :class:`AsyncGuardedReward`.

:class:`~grpo_family.trainers.base.GRPOFamilyTrainer` wraps every reward function (not a reward model) in one of
them at init: an exception or a non-finite or non-numeric value on some completions turns them into "unscorable"
(``None``, then NaN reward and zero advantage) with a report to the trainer; a function that fails on *every*
completion of the first batch (or returns the wrong number of values, or no number at all) is a set-up bug and
raises :class:`RewardFunctionError` before any update, with its name in the message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..errors import RewardFunctionError, RewardTimeoutError

# What a reward call may raise and the guard contains: any exception, and SystemExit (a reward calling sys.exit() used
# to end the whole run at that step with exit code 0 and nothing saved). KeyboardInterrupt still stops the run.
CONTAINED = (Exception, SystemExit)


class GuardedReward:
    """Wraps a synchronous TRL reward function so one bad completion cannot stop a run.

    If the function raises on the batch (or, after the first batch, returns the wrong number of values), it is
    called again one completion at a time and only the completions that still fail become ``None`` ("cannot
    score"). A call past its :func:`~grpo_family.rewards.with_timeout` deadline leaves the whole batch ``None``
    without that retry. Values that are not finite numbers (NaN, inf, a string, a list, ...) also become ``None``, and every
    value passed on is a plain ``float``. On the first generation batch (``strict``) a function that fails on
    every completion, returns the wrong number of values, or returns no number at all is a set-up bug: a
    :class:`RewardFunctionError` names it before any update.
    """

    def __init__(self, func: Callable, name: str, on_error: Callable[[str, int, str], None]):
        self.func = func
        self.__name__ = name
        self.on_error = on_error
        self.strict = True
        self.failed = 0  # completions the last call failed on (raised, timed out, non-finite or non-numeric)

    @staticmethod
    def _row_kwargs(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
        return {k: (v[i : i + 1] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}

    @staticmethod
    def _single(value: Any) -> Any:
        """The one value of a one-completion call, or None."""
        try:
            return value[0] if value is not None and len(value) == 1 else None
        except TypeError:  # not a sequence
            return None

    def _call_rows(self, completions: list, kwargs: dict[str, Any]) -> list:
        n = len(completions)
        out = []
        for i in range(n):
            try:
                out.append(
                    self._single(self.func(completions=completions[i : i + 1], **self._row_kwargs(kwargs, i, n)))
                )
            except CONTAINED:  # a reward function may raise anything
                out.append(None)
        return out

    def _counted(self, values: Any, n: int) -> list:
        """``values`` as a list of ``n``; a :class:`RewardFunctionError` otherwise."""
        try:
            values = list(values) if values is not None else None
        except TypeError:  # e.g. a bare float
            values, got = None, type(values).__name__
        else:
            got = "None" if values is None else len(values)
        if values is None or len(values) != n:
            raise RewardFunctionError(
                f"Reward function '{self.__name__}' returned {got} values for {n} completions; it must return "
                "one value (a float, or None for 'cannot score') per completion."
            )
        return values

    def _after_failure(self, error: Exception, values: list, n: int) -> None:
        """Report the completions a batch-level failure left unscored; on the first batch, a total failure stops."""
        failures = sum(v is None for v in values)
        self.failed += failures
        if self.strict and failures == n:
            raise RewardFunctionError(
                f"Reward function '{self.__name__}' failed on every completion of the first batch "
                f"({type(error).__name__}: {error}). Fix the function (or the dataset columns it reads) before "
                "training."
            ) from error
        self.on_error(self.__name__, failures, f"{type(error).__name__}: {error}")

    def _clean(self, values: list) -> list[float | None]:
        """Plain floats; ``None`` for None, non-finite and non-numeric values (counted and reported)."""
        cleaned: list[float | None] = []
        nonfinite, nonnumeric = 0, []
        for value in values:
            number = None
            if value is not None:
                try:
                    if isinstance(value, str | bytes):  # float("nan") / float("1") would accept text
                        raise TypeError
                    number = float(value)
                except Exception:  # noqa: BLE001 - a list, a dict, a multi-element tensor, ...
                    nonnumeric.append(type(value).__name__)
                else:
                    if not math.isfinite(number):
                        number, nonfinite = None, nonfinite + 1
            cleaned.append(number)
        if nonnumeric and self.strict and len(nonnumeric) == len(values):
            raise RewardFunctionError(
                f"Reward function '{self.__name__}' returned no number on the first batch (values of type "
                f"{sorted(set(nonnumeric))}); it must return a float, or None for 'cannot score', per completion."
            )
        self.failed += len(nonnumeric) + nonfinite
        if nonnumeric:
            self.on_error(self.__name__, len(nonnumeric), f"non-numeric reward ({', '.join(sorted(set(nonnumeric)))})")
        if nonfinite:
            self.on_error(self.__name__, nonfinite, "non-finite reward")
        self.strict = False
        return cleaned

    def _timed_out(self, error: RewardTimeoutError, n: int) -> list:
        """A call past its :func:`~grpo_family.rewards.with_timeout` deadline: the batch is unscored, not retried
        row by row (every row could hang as well), and never fatal (a slow service is not a set-up bug)."""
        self.on_error(self.__name__, n, str(error))
        self.failed += n
        return [None] * n

    def __call__(self, completions: list, **kwargs: Any) -> list:
        n, self.failed = len(completions), 0
        try:
            values = self._counted(self.func(completions=completions, **kwargs), n)
        except RewardTimeoutError as error:
            values = self._timed_out(error, n)
        except CONTAINED as error:  # contained below
            if isinstance(error, RewardFunctionError) and self.strict:
                raise
            values = self._call_rows(completions, kwargs)
            self._after_failure(error, values, n)
        return self._clean(values)


class AsyncGuardedReward(GuardedReward):
    """:class:`GuardedReward` for an ``async`` reward function (TRL awaits it on its event loop)."""

    async def _call_rows_async(self, completions: list, kwargs: dict[str, Any]) -> list:
        n = len(completions)
        out = []
        for i in range(n):
            try:
                value = await self.func(completions=completions[i : i + 1], **self._row_kwargs(kwargs, i, n))
                out.append(self._single(value))
            except CONTAINED:
                out.append(None)
        return out

    async def __call__(self, completions: list, **kwargs: Any) -> list:
        n, self.failed = len(completions), 0
        try:
            values = self._counted(await self.func(completions=completions, **kwargs), n)
        except RewardTimeoutError as error:
            values = self._timed_out(error, n)
        except CONTAINED as error:  # contained below
            if isinstance(error, RewardFunctionError) and self.strict:
                raise
            values = await self._call_rows_async(completions, kwargs)
            self._after_failure(error, values, n)
        return self._clean(values)
