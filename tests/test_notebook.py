"""The fine-tuning notebook runs top to bottom on the embedded default (LoRA, train, evaluate, plot)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebooks" / "finetune_small_model.ipynb"


def test_notebook_executes_on_the_embedded_default(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert "EMBEDDED = True" in params.source  # the switch CI relies on
    params.source += f'\nMAX_STEPS = 2\nOUTPUT_DIR = "{tmp_path / "out"}"\n'
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "accuracy before:" in outputs and "after:" in outputs
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
