"""``clip_cov``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from method_cases import MethodCase

CASE = MethodCase(
    bad_config=({"clip_cov_lower": 5.0, "clip_cov_upper": 1.0}, r"clip_cov_lower < clip_cov_upper"),
    # The base class's 11 per generation batch; per loss call 6: the gathered rows' widths (pad_across_processes),
    # the candidates (nonzero), the valid-token count and its two metrics (measured: 23 at accumulation 2 = 11 + 2 x 6).
    host_syncs=(23, 6),
    metric="clip_cov/detached_tokens",
)
