"""Containment of non-finite updates: an optimizer step whose gradients are not finite is skipped."""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)


class NonFiniteStepGuardMixin:
    """Registers :meth:`_drop_nonfinite_gradients` on the optimizer when ``self._skip_nonfinite_steps`` (set by the
    trainer; off under DeepSpeed); a skipped step is counted in the ``skipped_steps`` metric."""

    def create_optimizer(self, *args: Any, **kwargs: Any):
        optimizer = super().create_optimizer(*args, **kwargs)
        if self._skip_nonfinite_steps and not getattr(optimizer, "_grpo_family_guard", False):
            optimizer.register_step_pre_hook(self._drop_nonfinite_gradients)
            optimizer._grpo_family_guard = True
        return optimizer

    def _drop_nonfinite_gradients(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        # Gradients are already all-reduced here, so every process takes the same decision. Setting them to None
        # makes torch optimizers skip the parameters: a NaN/inf step leaves the weights (and Adam's moments) as
        # they were. DeepSpeed has its own overflow handling and is left alone.
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        norms = torch._foreach_norm(grads)
        if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        logger.warning("Skipped an optimizer step: non-finite gradients (weights unchanged).")
        self._metrics["train"]["skipped_steps"].append(1.0)
