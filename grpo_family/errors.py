"""Every error grpo_family raises for a caller to catch, in one module on the lowest floor (``docs/architecture.md``
§1): any layer may raise one, and a caller catches it without importing the layer that raised it.

:class:`PreflightError` and its subclasses are refused inputs, found before training starts; ``examples/train.py``
and ``python -m grpo_family.eval`` print them as one line, without a traceback. The others happen while a run or
an evaluation is under way.
"""

from __future__ import annotations

__all__ = [
    "BoundsError",
    "CacheBuildError",
    "DatasetFormatError",
    "EvalSetupError",
    "ModelNotInstalledError",
    "PreflightError",
    "RewardExitError",
    "RewardFunctionError",
    "RewardTimeoutError",
    "RunFinishedError",
    "UnlearnableRunError",
]


# ------------------------------------------------------------------------------------- refused before training
class PreflightError(ValueError):
    """A problem found before training: the message names it and says how to fix it."""


class BoundsError(PreflightError):
    """One or more config values outside their declared bounds; the message names each flag and its allowed values."""


class ModelNotInstalledError(PreflightError):
    """A local model alias whose weights (or converter) are not installed: the message names the install command."""


class RunFinishedError(PreflightError):
    """The checkpoint to resume from already reached the end of the run: there is nothing to train."""


class DatasetFormatError(ValueError):
    """The dataset lacks a column the chosen preset needs (raised before any row is processed)."""


class EvalSetupError(ValueError):
    """An evaluation cannot start as asked (unknown preset or dataset, bad settings, missing model or golds); the
    message names the problem and the fix. Raised before anything is generated."""


# ------------------------------------------------------------------------------------------ while a run goes on
class RewardTimeoutError(TimeoutError):
    """A reward function wrapped by :func:`grpo_family.rewards.with_timeout` missed its deadline.

    The trainers' reward guard scores every completion of that call ``None`` ("cannot score"), logs
    ``reward_errors/<name>`` and a warning, and does not retry the call row by row (each row could hang as well)."""


class RewardFunctionError(RuntimeError):
    """A reward function is unusable (it fails on every completion, or returns the wrong number of values)."""


class RewardExitError(RuntimeError):
    """A reward function called ``sys.exit`` (or raised ``SystemExit``): an error of the reward, not the end of the
    evaluation."""


class UnlearnableRunError(RuntimeError):
    """A run cannot learn: for ``max_unscorable_batches`` / ``max_degenerate_batches`` generation batches in a row
    nothing could be scored, or every advantage was zero (see :class:`grpo_family.GRPOFamilyConfig`)."""


class CacheBuildError(RuntimeError):
    """A freshly built cache folder that its own loader cannot load (a bug in the builder: rebuilding cannot help)."""
