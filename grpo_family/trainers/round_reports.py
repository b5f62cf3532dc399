"""What a scored generation round reports: TRL's logged advantages and reward statistics made to describe what is
trained on, and the signals the policy for runs that cannot learn judges
(:class:`~grpo_family.runtime.unlearnable.UnlearnableRunPolicy`). A mixin of
:class:`~grpo_family.trainers.base.GRPOFamilyTrainer`.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather, pad_across_processes
from trl.trainer.utils import nanstd

from ..algorithms.grpo import zero_std_mask
from ..runtime.reward_guards import GuardedReward
from .stages import GenerationBatch

__all__ = ["RoundReportsMixin"]


class RoundReportsMixin:
    """TRL's logs repaired and the learnability signals of one generation round (needs ``GRPOTrainer``'s state)."""

    def _learnability_signals(self, rewards: torch.Tensor, advantages: torch.Tensor) -> dict[str, Any]:
        """What the policy for runs that cannot learn judges, from the gathered ``rewards`` and ``advantages`` of one
        generation round and each reward function's failures (summed over processes): the same on every process."""
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

    def _fix_logged_batch(self, batch: GenerationBatch) -> None:
        """Make TRL's logged advantages and reward statistics describe what was trained on."""
        advantages, rewards, output = batch.advantages, batch.rewards, batch.output
        if advantages.dim() == 2:  # per-token: log each completion's mean over its valid tokens
            mask = gather(pad_across_processes(output["completion_mask"], dim=1)).to(advantages.dtype)
            width = min(mask.size(1), advantages.size(1))
            mask, tokens = mask[:, :width], advantages[:, :width]
            advantages = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1)
        logged = self._logs["advantages"]
        for _ in range(min(len(logged), advantages.numel())):
            logged.pop()
        logged.extend(advantages.tolist())
        metrics = self._metrics[batch.mode]
        flat = rewards.reshape(-1)
        is_std_zero = zero_std_mask(rewards, scale=self.scale_rewards)
        if self.multi_objective_aggregation == "normalize_then_sum":
            is_std_zero = torch.isclose(nanstd(flat), torch.zeros(())).expand_as(flat)
        metrics["reward"][-1] = torch.nanmean(flat).item()
        metrics["reward_std"][-1] = nanstd(flat).item()
        metrics["frac_reward_zero_std"][-1] = is_std_zero.float().mean().item()
