"""``ms_grpo``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from method_cases import MethodCase


def resume_check(logs):
    assert logs[3]["ms_grpo/abs_diff_to_grpo"] > 0


CASE = MethodCase(
    bad_config=({"tau_min": 5, "num_generations": 4}, r"tau_min=5 exceeds num_generations=4; need 2 <= tau_min"),
    host_syncs=(29, 0),  # + its value classes and scales
    metric="ms_grpo/abs_diff_to_grpo",
    resume_options=dict(num_scales=2, subgroups_per_scale=2, selection="random"),
    resume_check=resume_check,
    vllm_is_mode="token_mask",
)
