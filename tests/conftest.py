"""Shared fixtures: a tiny random Qwen2 model saved to disk, its tokenizer, and the bundled task."""

from __future__ import annotations

import os

import pytest
from dist_suite import dist_output, dist_suite  # noqa: F401 - the 2-process scenarios' fixtures (tests/dist_suite.py)
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tests never assert on the machine's speed. Where a test must wait on work that never ends unless the mechanism
# under test (a deadline, a kill, a cancel) stops it, it waits at most HANG_GUARD_S: a liveness guard that turns a
# broken mechanism into a failure instead of a hung suite, not a budget (what is checked is the outcome: the
# timeout status, the kill counted, the never-ending work not finished).
HANG_GUARD_S = 600.0

# Hypothesis: CI and the default run draw the same examples every time (derandomize: each test's examples follow
# from the test itself), so a red run is the change's doing, never a new random draw. Before a change lands, run
# the property tests with HYPOTHESIS_PROFILE=explore: new random examples on every run, 1000 for the tests that set
# no count of their own (with GRPO_FAMILY_PROPERTY_SOAK=20 for tests/test_algorithm_properties.py's); a
# counterexample it finds becomes a fixed case (@example or a plain test). Tests never set their own seed.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=1000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def require_vllm_or_skip_module() -> None:
    """At the top of a vllm-lane module: skip it where vLLM is not installed (the default environment); in the lane
    (``GRPO_FAMILY_REQUIRE_VLLM`` set by .ci/vllm) a missing vLLM is a failure, not a skip."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        if os.environ.get("GRPO_FAMILY_REQUIRE_VLLM"):
            raise
        pytest.skip("vLLM is not installed: see README, 'vLLM on a CPU machine'", allow_module_level=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small random-initialised Qwen2 model + tokenizer saved to disk (TRL builds the reference model from it)."""
    from grpo_family.tasks import build_tiny_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    """The tiny model's character-level tokenizer. Pass it as ``processing_class``: given only the model path,
    TRL's AutoProcessor/AutoTokenizer maps ``model_type=qwen2`` to ``Qwen2Tokenizer``, which rebuilds a byte-level
    pipeline and drops characters (newlines) of this vocabulary."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def arithmetic_train():
    from grpo_family.tasks import make_arithmetic_dataset

    return make_arithmetic_dataset("train", 64, seed=0)


def digit_share_reward(completions, **kwargs):
    """A dense test reward (share of digit characters) so that a random model's groups are not degenerate."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def tiny_config_kwargs(output_dir, **overrides) -> dict:
    """GRPOConfig keyword arguments for a few fast CPU steps of the tiny model."""
    kwargs = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        save_strategy="no",
        beta=0.0,
        disable_tqdm=True,
        bf16=False,  # GRPOConfig defaults to bf16, which on CPU means bf16 autocast
    )
    kwargs.update(overrides)
    return kwargs


@pytest.fixture
def config_kwargs(tmp_path):
    """Factory: ``config_kwargs(**overrides)`` -> GRPOConfig kwargs writing under this test's tmp dir."""
    return lambda **overrides: tiny_config_kwargs(tmp_path / "out", **overrides)
