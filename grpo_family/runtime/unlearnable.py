"""The policy for runs that cannot learn (:class:`UnlearnableRunPolicy`): generation batches in a row with nothing
scorable, or with every advantage zero, stop the run (:class:`UnlearnableRunError`) or warn, as the config says."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import UnlearnableRunError

logger = logging.getLogger(__name__)


class UnlearnableRunPolicy:
    """Counts generation batches in a row that cannot teach anything. ``update`` takes one batch's signals, judged on
    values gathered from every process (so every process decides alike): ``unscorable`` (no completion could be
    scored), ``failing`` (names of reward functions, or of a method's own scorer, that failed on every completion
    they were asked to score) and ``degenerate`` (every advantage is zero)."""

    def __init__(self, max_unscorable_batches: int, max_degenerate_batches: int, on_unlearnable: str):
        self.max_unscorable_batches = max_unscorable_batches
        self.max_degenerate_batches = max_degenerate_batches
        self.on_unlearnable = on_unlearnable
        self.streaks = {"unscorable": 0, "degenerate": 0}

    def update(self, signals: dict[str, Any]) -> None:
        """Count one generation batch; at the configured limit stop the run (:class:`UnlearnableRunError`) or warn,
        as ``on_unlearnable`` says."""
        unscorable = signals["unscorable"] or bool(signals["failing"])
        self.streaks["unscorable"] = self.streaks["unscorable"] + 1 if unscorable else 0
        self.streaks["degenerate"] = self.streaks["degenerate"] + 1 if signals["degenerate"] else 0
        message = None
        limit, streak = self.max_unscorable_batches, self.streaks["unscorable"]
        if limit and streak and streak % limit == 0:
            what = (
                f"reward function(s) {', '.join(repr(n) for n in signals['failing'])} failed on every completion "
                "it was asked to score"
                if signals["failing"]
                else "no completion could be scored (every reward function returned None/NaN or failed)"
            )
            message = (
                f"The run cannot learn: for {streak} generation batches in a row {what}. Check the reward functions "
                "against the dataset columns they read (the reward_errors/<name> metric and the warnings above name "
                "the error), or the service a reward calls; raise max_unscorable_batches, or set "
                "on_unlearnable='warn' to train on regardless."
            )
        limit, streak = self.max_degenerate_batches, self.streaks["degenerate"]
        if message is None and limit and streak and streak % limit == 0:
            message = (
                f"The run cannot learn: for {streak} generation batches in a row every group was degenerate (all "
                "completions of a prompt got the same reward, so every advantage is zero and the policy gradient "
                "vanishes). Use easier prompts or a stronger starting model, a reward with partial credit, more "
                "generations per prompt (num_generations) or a higher temperature; raise max_degenerate_batches, or "
                "set on_unlearnable='warn' to train on regardless."
            )
        if message is None:
            return
        if self.on_unlearnable == "stop":
            raise UnlearnableRunError(message)
        logger.warning(message)
