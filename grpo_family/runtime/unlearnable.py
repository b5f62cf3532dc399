"""The policy for runs that cannot learn (:class:`LearnablePolicyMixin`): generation batches in a row with nothing
scorable, or with every advantage zero, stop the run (:class:`UnlearnableRunError`) or warn, as the config says."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .reward_guards import GuardedReward

logger = logging.getLogger(__name__)


class UnlearnableRunError(RuntimeError):
    """A run cannot learn: for ``max_unscorable_batches`` / ``max_degenerate_batches`` generation batches in a row
    nothing could be scored, or every advantage was zero (see :class:`GRPOFamilyConfig`)."""


class LearnablePolicyMixin:
    """Counts generation batches in a row that cannot teach anything; needs ``self._streaks``
    (``{"unscorable": 0, "degenerate": 0}``) and ``self._family_arg`` from the trainer."""

    def _batch_signals(self, rewards: torch.Tensor, advantages: torch.Tensor) -> dict[str, Any]:
        """What the policy for runs that cannot learn judges, from the gathered ``rewards`` and ``advantages`` of one
        generation batch and each reward function's failures (summed over processes): the same on every process."""
        guarded = [(f.__name__, f) for f in self.reward_funcs if isinstance(f, GuardedReward)]
        failing = []
        if guarded:
            local = torch.tensor([[float(f.failed) for _, f in guarded]], device=self.accelerator.device)
            failed = self.accelerator.gather(local).sum(dim=0)
            failing = [name for (name, _), count in zip(guarded, failed.tolist()) if count >= rewards.numel()]
        return {
            "unscorable": bool(torch.isnan(rewards).all()),
            "failing": failing,
            "degenerate": not bool(advantages.abs().gt(0).any()),
        }

    def _apply_learnable_policy(self, signals: dict[str, Any]) -> None:
        """Count generation batches in a row that cannot teach anything; at the configured limit stop the run
        (:class:`UnlearnableRunError`) or warn, as ``on_unlearnable`` says."""
        unscorable = signals["unscorable"] or bool(signals["failing"])
        self._streaks["unscorable"] = self._streaks["unscorable"] + 1 if unscorable else 0
        self._streaks["degenerate"] = self._streaks["degenerate"] + 1 if signals["degenerate"] else 0
        message = None
        limit, streak = self._family_arg("max_unscorable_batches"), self._streaks["unscorable"]
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
        limit, streak = self._family_arg("max_degenerate_batches"), self._streaks["degenerate"]
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
        if self._family_arg("on_unlearnable") == "stop":
            raise UnlearnableRunError(message)
        logger.warning(message)
