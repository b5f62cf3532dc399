"""The loss-term stage: a registered loss term (:mod:`grpo_family.algorithms.losses`) over the rows of one loss
call on every process, gathered, with this process's rows carrying the gradient; checked before training. A mixin of
:class:`~grpo_family.trainers.base.GRPOFamilyTrainer`, which calls it at the loss call's policy forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..algorithms.losses import LOSS_TYPES, get_loss_term, loss_term_problems
from .stages import LossCall, gather_padded

__all__ = ["LossTermStageMixin"]


class LossTermStageMixin:
    """The check and the application of the class's ``loss_term`` (needs ``GRPOTrainer``'s state)."""

    def _check_loss_term(self) -> None:
        """A loss term is added to TRL's per-token loss as TRL aggregates it; refuse the settings where TRL would
        also multiply the per-token loss by a mask the term does not see."""
        if self.loss_term is None:
            return
        get_loss_term(self.loss_term)  # registered
        if getattr(type(self.args), "loss_term", None) != self.loss_term:  # a config that did not check them
            unmet = loss_term_problems(
                self.loss_term, loss_type=self.loss_type, importance_sampling_level=self.args.importance_sampling_level
            )
            if unmet:
                raise ValueError(f"{self.method_name}: " + " ".join(unmet))
        problems = []
        if self.loss_type not in LOSS_TYPES:
            problems.append(f"loss_type={self.loss_type!r} (one of {LOSS_TYPES})")
        if self.top_entropy_quantile != 1.0:
            problems.append(f"top_entropy_quantile={self.top_entropy_quantile} (1.0)")
        if self.off_policy_mask_threshold is not None:
            problems.append(f"off_policy_mask_threshold={self.off_policy_mask_threshold} (None)")
        if problems:
            raise ValueError(
                f"{self.method_name} adds its loss term to TRL's per-token loss; these settings mask that loss in "
                f"ways the term does not follow: {', '.join(problems)}. Use the values in brackets."
            )

    def _apply_loss_term(self, call: LossCall) -> None:
        """The registered loss term over the rows of this loss call on every process (gathered; this process's rows
        carry the gradient), its result sliced back to this process's rows."""
        term = get_loss_term(self.loss_term)
        logps = call.logps
        rows, width = logps.shape
        old = call.old_logps if call.old_logps is not None else logps.detach()
        every = gather_padded(logps.detach().float())
        start = self.accelerator.process_index * rows
        mine = F.pad(logps.float(), (0, every.size(1) - width))
        every = torch.cat([every[:start], mine, every[start + rows :]])  # this process's rows with their gradient
        advantages = call.advantages
        out = term(
            every,
            gather_padded(old.detach().float()),
            gather_padded(advantages.detach()),
            gather_padded(call.loss_mask.to(torch.int32)).bool(),
            generator=call.generator(self.loss_term) if term.sampled else None,
            **self.loss_term_options(),
        )
        if out.advantages is not None:
            call.advantages = out.advantages[start : start + rows, :width].to(advantages.dtype)
        if out.per_token_loss is not None:
            extra = out.per_token_loss[start : start + rows, :width].to(logps.dtype)
            ratio = call.importance_sampling_ratio
            if ratio is not None and self.loss_type != "vespo":  # as TRL weighs its per-token policy loss
                extra = extra * ratio
            call.extra_loss = extra
        for name, value in out.metrics.items():
            self.log_method_metric(name, float(value))
