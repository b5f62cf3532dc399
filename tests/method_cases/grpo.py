"""``grpo``, the base class: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from method_cases import MethodCase

CASE = MethodCase(
    bad_config=({"per_device_train_batch_size": 6, "num_generations": 4}, r"divisible by num_generations"),
    # The base class's own per generation batch (tests/test_compute_benchmark.py explains the 11).
    host_syncs=(11, 0),
    vllm_is_mode="sequence_mask",
)
