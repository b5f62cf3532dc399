"""``gmpo``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from method_cases import MethodCase

CASE = MethodCase(
    bad_config=({"delta": 3.0}, r"GMPO does not use these TRL options: delta=3.0"),
    # The base class's 11 per generation batch; per loss call 1: the surrogate's clip metrics and gmpo/ratio read
    # back in one transfer (measured: 13 at accumulation 2 = 11 + 2 x 1).
    host_syncs=(13, 1),
    metric="gmpo/ratio",
    vllm_is_mode="sequence_truncate",  # GMPO weighs whole completions: a sequence-level correction
)
