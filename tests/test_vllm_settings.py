"""vLLM settings checked at start, without vLLM installed (the real-vLLM tests are `tests/test_vllm.py`, the vllm
lane): server mode on a CPU trainer stops before TRL's client connects (or waits 240 s for a server), naming the
fix; the trainer does the same check before its engine or client exists; the Transformers backend is refused
colocated; structured outputs turn TRL's importance-sampling correction off; the colocated engine is shut down
before the process group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trl import GRPOConfig

from grpo_family import GRPOFamilyTrainer
from grpo_family.integrations import vllm_cpu
from grpo_family.tasks import arithmetic_reward


def _config(tmp_path, **kwargs) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", bf16=False, **kwargs)


def test_server_mode_on_cpu_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"--vllm_mode server cannot train.*NCCL.*CUDA.*--vllm_mode colocate"):
        vllm_cpu.check_vllm_settings(_config(tmp_path, use_vllm=True, vllm_mode="server"))
    vllm_cpu.check_vllm_settings(_config(tmp_path, vllm_mode="server"))  # no vLLM asked for: nothing to check


def test_trainer_refuses_server_mode_before_connecting(tmp_path, tiny_model_dir, arithmetic_train, monkeypatch):
    """The check runs before GRPOTrainer.__init__: no client is built, so nothing waits for a server."""
    import trl

    built = []
    monkeypatch.setattr(trl.GRPOTrainer, "__init__", lambda self, *a, **k: built.append(1))
    args = _config(tmp_path, use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match="--vllm_mode server cannot train"):
        GRPOFamilyTrainer(
            model=tiny_model_dir, reward_funcs=arithmetic_reward, args=args, train_dataset=arithmetic_train
        )
    with pytest.raises(ValueError, match="--vllm_mode server cannot train"):  # args given by position, as TRL allows
        GRPOFamilyTrainer(tiny_model_dir, arithmetic_reward, args)
    assert built == []


def test_cpu_sync_is_installed_only_for_colocated_vllm_on_cpu(monkeypatch):
    class Generation:
        def sync_weights(self):
            return "trl"

    class Trainer:
        use_vllm, vllm_mode, vllm_generation = True, "colocate", Generation()

    monkeypatch.setattr(vllm_cpu, "vllm_platform_is_cpu", lambda: False)  # vLLM on a GPU: TRL's sync stays
    assert not vllm_cpu.install_cpu_weight_sync(Trainer()) and Trainer.vllm_generation.sync_weights() == "trl"
    monkeypatch.setattr(vllm_cpu, "vllm_platform_is_cpu", lambda: True)
    Trainer.vllm_mode = "server"
    assert not vllm_cpu.install_cpu_weight_sync(Trainer())
    Trainer.vllm_mode = "colocate"
    assert vllm_cpu.install_cpu_weight_sync(Trainer())
    assert Trainer.vllm_generation.sync_weights.__qualname__.startswith("reload_weights_sync")


def test_transformers_model_impl_is_refused_colocated(tmp_path):
    """vLLM's Transformers backend decorates transformers' model class in place, which breaks the training model
    of that class in the same process (seen: AttributeError ... 'do_not_compile' at the next forward)."""
    with pytest.raises(ValueError, match=r"--vllm_model_impl transformers cannot run colocated.*do_not_compile"):
        vllm_cpu.check_vllm_settings(_config(tmp_path, use_vllm=True, vllm_model_impl="transformers"))
    vllm_cpu.check_vllm_settings(_config(tmp_path, use_vllm=True, vllm_model_impl="vllm"))


def test_structured_outputs_turn_the_importance_sampling_correction_off(tmp_path, caplog):
    """Under a regex, vLLM's log-probs are the masked, renormalised distribution's: TRL's trainer/sampler ratios
    measured the mask (2e-11), so the correction is turned off, saying why; without a regex it stays on."""
    args = _config(tmp_path, use_vllm=True, vllm_structured_outputs_regex=r"Answer: \d+")
    assert args.vllm_importance_sampling_correction  # TRL's default
    with caplog.at_level("WARNING", logger=vllm_cpu.__name__):
        vllm_cpu.check_vllm_settings(args)
    assert not args.vllm_importance_sampling_correction
    assert "--vllm_structured_outputs_regex" in caplog.text and "importance-sampling correction" in caplog.text
    plain = _config(tmp_path, use_vllm=True)
    vllm_cpu.check_vllm_settings(plain)
    assert plain.vllm_importance_sampling_correction


def test_colocated_engine_is_shut_down_before_the_process_group(monkeypatch):
    """examples/train.py shuts the colocated engine down before `end_training` destroys the process group (vLLM's
    own finalizer at exit then found its groups invalid: a traceback on every rank); nothing without an engine."""
    calls = []

    class Trainer:
        vllm_generation = type("G", (), {})()

    Trainer.vllm_generation.llm = type("LLM", (), {})()
    Trainer.vllm_generation.llm.llm_engine = type("E", (), {})()
    Trainer.vllm_generation.llm.llm_engine.engine_core = type("C", (), {"shutdown": lambda self: calls.append(1)})()
    assert vllm_cpu.shutdown_colocated_vllm(Trainer()) and calls == [1]
    assert not vllm_cpu.shutdown_colocated_vllm(type("NoVLLM", (), {})())
    source = (Path(__file__).resolve().parents[1] / "examples" / "train.py").read_text()
    assert source.index("shutdown_colocated_vllm(trainer)") < source.index("trainer.accelerator.end_training()")


class _PackingHead(torch.nn.Module):
    """An output layer the way vLLM's CPU GEMM serves it on AVX-512/AMX machines: from a packed copy of the weight,
    made by its ``quant_method`` when the weights are loaded (and not again by ``reload_weights``)."""

    def __init__(self, weight: torch.nn.Parameter):
        super().__init__()
        self.weight = weight
        self.quant_method = self

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        layer.packed = layer.weight.detach().clone()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.packed.T


def _tied_model() -> torch.nn.Module:
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = torch.nn.Embedding(5, 3)
    model.lm_head = _PackingHead(model.model.embed_tokens.weight)
    model.lm_head.process_weights_after_loading(model.lm_head)
    return model


def test_retie_rebuilds_a_packed_tied_head_after_the_embedding_changes():
    """The control happens on every machine here (vLLM's own packing only on some CPUs, tests/test_vllm.py): a sync
    writes the new embedding into the shared parameter; the packed head stays stale until `retie_lm_head`."""
    model, hidden = _tied_model(), torch.eye(3)
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)  # what reload_weights does to the shared parameter
    assert not torch.equal(model.lm_head(hidden), model.model.embed_tokens.weight.T)  # stale: the control
    assert vllm_cpu.retie_lm_head(model, tie_word_embeddings=True)
    assert torch.equal(model.lm_head(hidden), model.model.embed_tokens.weight.T)
    # A model that re-created the head's parameter is tied again before packing.
    model.lm_head.weight = torch.nn.Parameter(torch.zeros(5, 3))
    assert vllm_cpu.retie_lm_head(model, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head(hidden), model.model.embed_tokens.weight.T)
    # Untied, or a head vLLM does not pack: nothing to do.
    assert not vllm_cpu.retie_lm_head(model, tie_word_embeddings=False)
    del model.lm_head.quant_method
    model.lm_head.quant_method = None
    assert not vllm_cpu.retie_lm_head(model, tie_word_embeddings=True)
