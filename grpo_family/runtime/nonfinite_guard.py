"""Containment of non-finite updates: an optimizer step whose gradients are not finite is skipped."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def drop_nonfinite_gradients(optimizer: torch.optim.Optimizer) -> bool:
    """Set every gradient of ``optimizer``'s parameters to None when any of them is not finite; returns whether it
    did. Torch optimizers skip parameters without a gradient, so the step then leaves the weights (and Adam's
    moments) as they were."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return False
    norms = torch._foreach_norm(grads)
    if bool(torch.isfinite(torch.stack([n.float() for n in norms])).all()):
        return False
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None
    return True


class NonFiniteGradientGuard(TrainerCallback):
    """Skips an optimizer step whose gradients are not finite (``on_pre_optimizer_step``: after gradient clipping,
    before the step) and calls ``on_skip`` (the trainer counts it in the ``skipped_steps`` metric). Gradients are
    already all-reduced there, so every process takes the same decision. Not for DeepSpeed, which steps inside its
    engine and has its own overflow handling."""

    def __init__(self, on_skip: Callable[[], None]):
        self.on_skip = on_skip

    def on_pre_optimizer_step(self, args, state, control, optimizer: Any = None, **kwargs):
        if optimizer is not None and drop_nonfinite_gradients(optimizer):
            logger.warning("Skipped an optimizer step: non-finite gradients (weights unchanged).")
            self.on_skip()
