"""What the shared tests need to run each method: one file per method, ``tests/method_cases/<method>.py``, holding a
:class:`MethodCase` named ``CASE``.

The shared tests (``test_lora``, ``test_resume``, ``test_hostile_inputs``, ``test_compute_benchmark``, the vLLM and
DeepSpeed lanes, ...) take their method lists from ``grpo_family.METHODS`` and read each method's case here, so a new
method brings its case file with its own tests and touches no shared test; ``test_every_method_has_a_case`` fails
until it does.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from conftest import digit_share_reward


@dataclasses.dataclass(frozen=True)
class MethodCase:
    """One method's test data.

    * ``bad_config``: an incompatible combination of its options and the error it raises when the config is built;
    * ``host_syncs``: the pinned host syncs per optimizer step above stock TRL (per generation batch, and the change
      per extra micro-step) of ``tests/test_compute_benchmark.py``, measured;
    * ``metric``: a metric that proves the method's own code ran (None: ``grpo``, which logs none of its own);
    * ``options`` and ``rewards``: what a tiny run on the random test model needs to run the method's own logic;
    * ``resume_options`` / ``resume_rewards``: the settings under which its state matters across a checkpoint, and
      ``resume_check(logs)``: asserts on the uninterrupted run's per-step logs that it did;
    * ``accepts_beta``: whether its config takes a KL coefficient (``beta != 0``);
    * ``vllm_is_mode``: the vLLM importance-sampling mode its fake-vLLM run uses (None: its config turns it off).
    """

    bad_config: tuple[dict[str, Any], str]
    host_syncs: tuple[int, int]
    metric: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    rewards: tuple[Callable, ...] = (digit_share_reward,)
    resume_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    resume_rewards: tuple[Callable, ...] | None = None
    resume_check: Callable[[list[dict]], None] | None = None
    accepts_beta: bool = True
    vllm_is_mode: str | None = "token_truncate"


def case(method: str) -> MethodCase:
    """The case of ``method`` (``tests/method_cases/<method>.py``)."""
    return importlib.import_module(f"method_cases.{method}").CASE
