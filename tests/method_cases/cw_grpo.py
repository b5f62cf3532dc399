"""``cw_grpo``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from method_cases import MethodCase

CASE = MethodCase(
    bad_config=({"cw_bandwidth_scale": 0.0}, r"cw_bandwidth_scale must be > 0 .*1.0 = the paper.*use method 'grpo'"),
    host_syncs=(28, 0),  # + its weight metrics (10 .item()s) and one pad_across_processes
    metric="cw_grpo/weight_std",
    vllm_is_mode="token_truncate",
)
