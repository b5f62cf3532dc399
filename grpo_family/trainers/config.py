"""``GRPOFamilyConfig``: TRL's ``GRPOConfig`` plus the options every grpo_family trainer shares."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trl import GRPOConfig

from ..algorithms.losses import loss_term_problems
from ..bounds import check_bounds, check_unused
from ..launch import check_distributed_launch

__all__ = ["GRPOFamilyConfig"]


@dataclasses.dataclass
class GRPOFamilyConfig(GRPOConfig):
    """``GRPOConfig`` plus what every grpo_family trainer shares: the policy for runs that cannot learn and the
    default deadline of reward calls. Every method's config derives from it (``grpo`` uses it as is); a plain
    ``GRPOConfig`` still works with these defaults.

    The policy counts *generation batches* (one per optimizer step unless ``steps_per_generation >
    gradient_accumulation_steps`` or ``num_iterations > 1``; for GPG with ``beta_th``, one per assembled batch, however
    many rounds it took), judged on the rewards and advantages gathered from every process, so every process takes the
    same decision. With ``on_unlearnable="stop"`` the run raises :class:`UnlearnableRunError` before training on the
    batch that reaches the limit; with ``"warn"`` it logs a warning at the limit (and again every further limit's
    worth of batches) and trains on.
    """

    # The registered loss term (grpo_family.algorithms.losses) the method's trainer applies, if any: its
    # preconditions, declared at its registration, are checked here once for every such method.
    loss_term: ClassVar[str | None] = None

    max_unscorable_batches: int = dataclasses.field(
        default=3,
        metadata={
            "help": "Generation batches in a row in which no completion could be scored (every reward function "
            "returned None/NaN or failed), or one reward function (or SGPO's judge) failed (raised, timed out, returned "
            "NaN/inf or a non-number) on every completion it was asked to score, before on_unlearnable applies. 0 "
            "disables the check."
        },
    )
    max_degenerate_batches: int = dataclasses.field(
        default=20,
        metadata={
            "help": "Generation batches in a row in which every advantage is zero (every group degenerate: all its "
            "completions got the same reward, so the policy gradient is zero) before on_unlearnable applies. Early "
            "batches of a weak model on a hard task can be all wrong, hence the larger default. 0 disables the check."
        },
    )
    on_unlearnable: str = dataclasses.field(
        default="stop",
        metadata={
            "help": "What a run that cannot learn does: 'stop' (raise UnlearnableRunError with the reason and the "
            "fix, before the next update) or 'warn' (log a warning and train on)."
        },
    )
    reward_timeout: float | None = dataclasses.field(
        default=600.0,
        metadata={
            "help": "Deadline in seconds for every call of a reward function (not a reward model): a call past it "
            "leaves that batch unscored by the function, with a warning and the reward_errors/<name> metric, as "
            "grpo_family.rewards.with_timeout does (a synchronous function then runs in a helper thread). Functions "
            "already wrapped by with_timeout keep their own deadline. None or 0: no deadline."
        },
    )

    def __post_init__(self):
        check_bounds(self)  # every field, TRL's included, before TRL's __post_init__ uses any (grpo_family.bounds)
        check_unused(self)  # options the method inherits but does not use (its unused_options)
        if self.loss_term is not None:
            problems = loss_term_problems(
                self.loss_term, loss_type=self.loss_type, importance_sampling_level=self.importance_sampling_level
            )
            if problems:
                raise ValueError(f"{type(self).__name__}: " + " ".join(problems))
        super().__post_init__()
        check_distributed_launch(self)  # several processes launched, one seen: they would train independently


# GRPOFamilyConfig's own fields with their defaults: what a trainer given a plain GRPOConfig uses.
_FAMILY_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(GRPOFamilyConfig) if f.name not in GRPOConfig.__dataclass_fields__
}
