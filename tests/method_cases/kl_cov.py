"""``kl_cov``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from method_cases import MethodCase

CASE = MethodCase(
    bad_config=(
        {"importance_sampling_level": "sequence"},
        r"KLCovConfig: The kl_cov loss term works on tokens one by one: importance_sampling_level",
    ),
    # The base class's 11 per generation batch; per loss call 8: the gathered rows' widths (pad_across_processes),
    # the valid-token count and the top-k's indices, and its two metrics (measured: 27 at accumulation 2 = 11 + 2 x 8).
    host_syncs=(27, 8),
    metric="kl_cov/selected_tokens",
)
