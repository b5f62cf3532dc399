"""``sgpo``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from conftest import digit_share_reward

from grpo_family.tasks import arithmetic_reward
from method_cases import MethodCase


def resume_check(logs):
    step3, step4 = logs[3], logs[4]
    assert step3["sgpo/active"] == 1.0 and step3["sgpo/judge_requests"] > 0 and step4["sgpo/active"] == 0.0


CASE = MethodCase(
    bad_config=(
        {"judge_batch_timeout": 2000.0, "ddp_timeout": 1800},
        r"judge_batch_timeout \(2000s\) must stay below ddp_timeout.*Lower judge_batch_timeout or raise ddp_timeout",
    ),
    host_syncs=(29, 0),  # + its judged groups
    metric="sgpo/judge_requests",
    options={"judge_type": "programmatic"},
    # Correctness first (what the judge colours); the dense digit reward keeps groups non-degenerate, because a
    # random model's answers are all wrong with first step wrong (RTS 0), i.e. equal rewards, no gradient.
    rewards=(arithmetic_reward, digit_share_reward),
    # The random model answers nothing right: every group is all-negative and judged while the epoch counter is
    # below 1.25, i.e. at steps 1-3 (epochs 0, 0.5, 1.0), not at step 4 (1.5).
    resume_options=dict(correctness_reward="arithmetic_reward", sgpo_num_epochs=1.25),
    resume_check=resume_check,
    vllm_is_mode="sequence_mask",
)
