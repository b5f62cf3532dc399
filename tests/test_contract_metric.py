"""The ``<reward>/contract_violations`` metric reaches the trainer's logs (issue 29).

The answer rewards report it through TRL's ``log_metric`` keyword (which the base trainer's reward guard passes
through), so no trainer code is involved: this runs a real GRPOFamilyTrainer step and reads its log history.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast
from trl import GRPOConfig

from grpo_family import GRPOFamilyTrainer
from grpo_family.rewards import MathAccuracyReward
from grpo_family.tasks.arithmetic import ArithmeticReward


def test_contract_violations_are_logged_by_the_trainer(tiny_model_dir, arithmetic_train, config_kwargs):
    arithmetic = ArithmeticReward()
    math = MathAccuracyReward(backend="none")
    trainer = GRPOFamilyTrainer(
        model=tiny_model_dir,
        reward_funcs=[arithmetic, math],
        args=GRPOConfig(**config_kwargs(max_steps=1)),
        train_dataset=arithmetic_train,
        processing_class=PreTrainedTokenizerFast.from_pretrained(tiny_model_dir),
    )
    trainer.train()
    logged = {k: v for h in trainer.state.log_history for k, v in h.items()}
    # A random model writes no answer slot: its completions break the contract, and the logs say how many did.
    scored = arithmetic.counts["total"]
    assert scored == 8 and math.counts["total"] == 8
    assert logged["arithmetic_reward/contract_violations"] == arithmetic.counts["contract_violations"] / scored
    assert logged["math_accuracy/contract_violations"] == math.counts["contract_violations"] / scored
    assert logged["arithmetic_reward/contract_violations"] > 0
