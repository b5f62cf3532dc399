"""``d3s``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from method_cases import MethodCase


def resume_check(logs):
    assert logs[4]["d3s/token_ratio"] > logs[3]["d3s/token_ratio"] > logs[1]["d3s/token_ratio"]


CASE = MethodCase(
    bad_config=(
        {"d3s_drop_degenerate_groups": True, "d3s_sample_scope": "pooled"},
        r"d3s_drop_degenerate_groups needs d3s_sample_scope='group'",
    ),
    # + its selection (before TRL's old/reference forwards), trimming and loss-denominator table; per micro-step
    # two pad_across_processes per chunk in _gather_rows for the batch-wide token ranking.
    host_syncs=(36, 2),
    metric="d3s/kept_rollouts",
    # The schedule moves at every step (N_s 2 -> 4 of G = 4, token share 0.25 -> 1.0 over 4 steps).
    resume_options=dict(d3s_samples_start=2, d3s_samples_end=4, d3s_token_ratio_start=0.25, d3s_token_ratio_end=1.0),
    resume_check=resume_check,
    vllm_is_mode="sequence_truncate",
)
