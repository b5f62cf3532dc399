"""Every method trains a PEFT LoRA adapter the way TRL users pass one (``peft_config=`` to the trainer): after two
optimizer steps every adapter matrix moved (``lora_B`` away from its zero initialisation), every base weight is
bit-identical, nothing is NaN, and the method's own code ran (its ``<method>/`` metrics). With ``beta > 0`` TRL
loads no reference model under PEFT and scores the reference with the adapter disabled; the test checks that the
reference log-probs each method trained with are the frozen base model's, not the adapted policy's."""

from __future__ import annotations

import math

import pytest
import torch
from method_cases import case
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

from grpo_family import METHODS

# Learning rate 1e-2 (not the embedded default 5e-6) so that two Adam steps move every adapter entry visibly.
LEARNING_RATE = 1e-2
BETA = 0.04  # TRL's documented KL coefficient; GPG has no KL term and rejects any beta != 0

# What each method needs on top of the shared tiny config to run its own logic on the tiny random model, and the
# metric that proves its own code ran, are its case (tests/method_cases/<method>.py). CW-GRPO with
# steps_per_generation 1 builds its per-token weights from the loss's own forward; D3S keeps a per-token mask in
# the loss forward, rows dropped after scoring.
CASES = [pytest.param(name, 0.0, {}, id=name) for name in METHODS]
CASES += [pytest.param(name, BETA, {}, id=f"{name}-beta") for name in METHODS if case(name).accepts_beta]
CASES += [pytest.param("cw_grpo", 0.0, {"cw_reuse_loss_logps": False}, id="cw_grpo-extra_forward")]


def _completion_logps(model, batch: dict) -> torch.Tensor:
    """Per-token log-probs of the batch's completion tokens under ``model`` (a plain forward, temperature 1)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize(("name", "beta", "extra"), CASES)
def test_lora_adapter_trains_and_base_stays_frozen(
    name, beta, extra, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, monkeypatch
):
    Config, Trainer = METHODS[name]
    args = Config(**config_kwargs(learning_rate=LEARNING_RATE, beta=beta, **case(name).options, **extra))
    trainer = Trainer(
        model=tiny_model_dir,
        reward_funcs=list(case(name).rewards),
        args=args,
        train_dataset=arithmetic_train,
        processing_class=tiny_tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )
    model = trainer.model
    assert isinstance(model, PeftModel)
    assert trainer.ref_model is None  # under PEFT the reference is the adapter-disabled model, never a copy
    params = dict(model.named_parameters())
    adapters = {n: p.detach().clone() for n, p in params.items() if "lora_" in n}
    base = {n: p.detach().clone() for n, p in params.items() if "lora_" not in n}
    assert adapters and {n for n, p in params.items() if p.requires_grad} == set(adapters)
    assert all(not adapters[n].any() for n in adapters if "lora_B" in n)  # PEFT's zero init: step 0 = base model

    batches = []  # every generation batch as the method handed it to the loss
    generate = trainer._generate_and_score_completions

    def record(inputs):
        out = generate(inputs)
        batches.append({k: v.detach().clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
        return out

    monkeypatch.setattr(trainer, "_generate_and_score_completions", record)
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    after = dict(model.named_parameters())
    for n, before in base.items():
        assert torch.equal(after[n], before), f"base weight {n} changed"
    for n, before in adapters.items():
        assert torch.isfinite(after[n]).all(), f"{n} is not finite"
        assert not torch.equal(after[n], before), f"adapter weight {n} did not train"
    metric = case(name).metric
    if metric is not None:
        values = [h[metric] for h in logs if metric in h]
        assert len(values) == 2 and all(math.isfinite(v) for v in values)
    if name == "sgpo":
        assert sum(h["sgpo/judge_requests"] for h in logs) > 0  # the judge was asked under PEFT

    if beta:
        assert all(math.isfinite(h["kl"]) for h in logs) and logs[-1]["kl"] > 0
        # Step 2's reference log-probs were scored while the adapter (trained once) was live: they must be the
        # frozen base model's, which a fresh load of the saved model gives independently.
        batch = batches[-1]
        valid = batch["completion_mask"].bool()
        reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        expected = _completion_logps(reference, batch)
        # tol: the two scorings batch the same tokens differently (padding, row count): a log-softmax over the
        # vocabulary of float32 logits of size <= ~20 rounds to within vocab x 2^-23 x 20 ~ 1e-4 at most; the adapter
        # moves them by over 1e-3 (checked next).
        assert (batch["ref_per_token_logps"] - expected)[valid].abs().max() < 1e-4
        # ...and the test can tell: the adapted policy scores the same tokens measurably differently.
        model.eval()
        adapted = _completion_logps(model, batch)
        assert (adapted - expected)[valid].abs().max() > 1e-3


def test_an_adapter_of_an_aliased_model_names_the_hub_id_of_its_base(tiny_model_dir, tmp_path):
    """A model named by a local alias loads from this machine's cache; its saved adapter named that path as the
    base (a pushed adapter pointed at the trainer's disk). record_hub_base names the alias's Hub id instead."""
    import json

    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_family.models import LOCAL_MODELS, hub_id_of, record_hub_base

    assert hub_id_of("SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct" and hub_id_of("org/x") is None
    assert all(m.hub_id.count("/") == 1 for m in LOCAL_MODELS.values())
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"])
    )
    assert model.peft_config["default"].base_model_name_or_path == tiny_model_dir  # the local path, before
    record_hub_base(model, "HuggingFaceTB/SmolLM2-135M-Instruct")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert model.get_base_model().config._name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"  # TRL's card reads it
