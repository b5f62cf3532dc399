"""What keeps a run safe, resumable and documented, around any grpo_family trainer (none of it is a method's maths):

* :mod:`.reward_guards` -- reward functions that cannot stop a run (:class:`GuardedReward`, ``RewardFunctionError``);
* :mod:`.setup_checks` -- datasets and reward functions checked at init, before any generation;
* :mod:`.unlearnable` -- the policy for runs that cannot learn (``UnlearnableRunError``);
* :mod:`.nonfinite_guard` -- an optimizer step with non-finite gradients is skipped;
* :mod:`.resume` -- exact resumption (complete-checkpoint marker, epoch-aligned sampler, per-process state);
* :mod:`.redaction` and :mod:`.model_card` -- secrets kept out of what a run writes, the method's model card.
"""
