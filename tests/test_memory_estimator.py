"""benchmarks/memory.py on cases worked by hand, and every recipe's layout estimated (issue 23)."""

# tol(defaults): the estimates are float64 sums and products of integers and a few decimal factors (relative
# rounding under 10 x 2^-52); pytest.approx's default relative 1e-6 lies far above that and far below the
# smallest wrong term (one factor of 2 in a part).
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import memory  # noqa: E402

RECIPES = sorted((ROOT / "examples/recipes").glob("*.yaml"))


def test_a_7b_models_bf16_weights_are_14_gb():
    assert memory.weights_gb(7e9) == pytest.approx(14.0)
    assert memory.weights_gb(7e9, shards=8) == pytest.approx(1.75)  # ZeRO-3 over 8 GPUs


def test_adam_fp32_states_under_zero3_over_8_gpus():
    # fp32 master weights + two fp32 moments = 12 bytes/param, split 8 ways: 7e9 * 12 / 8 = 10.5 GB
    assert memory.optimizer_gb(7e9, zero=3, processes=8) == pytest.approx(10.5)
    # without DeepSpeed: two bf16 moments per parameter on every GPU
    assert memory.optimizer_gb(7e9, zero=0, processes=8) == pytest.approx(28.0)


def test_logits_of_8_by_4096_tokens_over_a_152k_vocabulary():
    # 8 * 4096 * 152064 * 2 bytes = 9.966 GB of bf16 logits
    # tol: the expected figure is printed to 3 decimals (rounding to 0.0005), within 1e-3.
    assert memory.logits_gb(8 * 4096, 152064) == pytest.approx(9.966, abs=1e-3)


def test_activations_with_checkpointing_keep_each_layers_input_plus_one_layer():
    model = memory.Model(7e9, 4096, 32, 32000)
    tokens = 1000
    kept = tokens * 4096 * 2 * 32 / 1e9  # bf16 layer inputs
    one_layer = tokens * 4096 * memory.ACT_BYTES_PER_TOKEN_HIDDEN / 1e9
    assert memory.activations_gb(tokens, model) == pytest.approx(kept + one_layer)
    assert memory.activations_gb(tokens, model, checkpointing=False) == pytest.approx(32 * one_layer)


def test_a_whole_estimate_adds_its_parts():
    recipe = dict(model_name_or_path="Qwen/Qwen2.5-Math-7B", per_device_train_batch_size=2, max_completion_length=1024,
                  max_prompt_length=512, beta=0.0, gradient_checkpointing=True, use_vllm=True, vllm_mode="colocate",
                  vllm_gpu_memory_utilization=0.25)  # fmt: skip
    parts = memory.estimate(recipe, memory.Layout("8 x 80 GB", 80, 8, 3))
    p = 7.62e9
    assert parts["weights"] == pytest.approx(p * 2 / 8 / 1e9)
    assert parts["reference"] == 0.0  # beta = 0: no reference model
    assert parts["gradients"] == pytest.approx(p * 2 / 8 / 1e9)
    assert parts["optimizer"] == pytest.approx(p * 12 / 8 / 1e9)
    assert parts["logits_loss"] == pytest.approx(2 * 1024 * 152064 * 6 / 1e9)
    assert parts["vllm"] == pytest.approx(20.0)
    expected = sum(v for k, v in parts.items() if k not in ("total", "logits_no_grad"))
    assert parts["total"] == pytest.approx(expected)


def test_a_sleeping_vllm_engine_does_not_coexist_with_the_loss_pass():
    recipe = dict(model_name_or_path="Qwen/Qwen2.5-Math-7B", per_device_train_batch_size=2, max_completion_length=8192,
                  beta=0.0, gradient_checkpointing=True, use_vllm=True, vllm_mode="colocate")  # fmt: skip
    layout = memory.Layout("4 x 80 GB", 80, 4, 3)
    awake = memory.estimate(recipe, layout)
    asleep = memory.estimate({**recipe, "vllm_enable_sleep_mode": True}, layout)
    resident = sum(awake[k] for k in ("weights", "reference", "gradients", "optimizer", "overhead"))
    assert asleep["total"] == pytest.approx(max(awake["total"] - awake["vllm"], resident + awake["vllm"]))
    assert asleep["total"] < awake["total"]


def test_a_vllm_server_costs_the_training_gpus_nothing():
    recipe = dict(model_name_or_path="Qwen/Qwen2.5-Math-7B", use_vllm=True, vllm_mode="server")
    assert memory.estimate(recipe, memory.Layout("", 80, 8, 3))["vllm"] == 0.0


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_has_a_layout_and_a_known_model(path):
    try:
        layout = memory.layout_of(path)
    except KeyError as error:
        raise AssertionError(f"state its hardware in its header: {error}") from None
    if layout is None:  # the embedded CPU task
        return
    recipe = yaml.safe_load(path.read_text())
    assert recipe["model_name_or_path"] in memory.MODELS
    assert memory.estimate(recipe, layout)["total"] > 0


def test_the_table_covers_every_gpu_recipe():
    text = memory.table(RECIPES)
    assert sum(1 for path in RECIPES if memory.layout_of(path) is not None) == text.count("\n| `") > 10


def test_a_recipe_states_its_layout_in_its_header(tmp_path):
    """The header line is what the estimate reads; a missing, doubled or malformed line is refused with the format."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# Memory layout: 8 x 80 GB (6 train + 2 vLLM server); 80 GB per GPU, 6 training processes, ZeRO-3\n"
                      "method: grpo\n")  # fmt: skip
    assert memory.layout_of(recipe) == memory.Layout("8 x 80 GB (6 train + 2 vLLM server)", 80.0, 6, 3)
    recipe.write_text("# Memory layout: 1 x 24 GB; 24 GB per GPU, 1 training process, no ZeRO\nmethod: grpo\n")
    assert memory.layout_of(recipe) == memory.Layout("1 x 24 GB", 24.0, 1, 0)
    recipe.write_text("# Memory layout: none (runs on a CPU)\nmethod: grpo\n")
    assert memory.layout_of(recipe) is None
    for text, message in [
        ("method: grpo\n", "0 '# Memory layout:' lines"),
        ("# Memory layout: 1 x 24 GB\n# Memory layout: 1 x 24 GB\n", "2 '# Memory layout:' lines"),
        ("# Memory layout: 1 x 24 GB, one GPU\n", "is not in the format"),
    ]:
        recipe.write_text(text)
        with pytest.raises(KeyError, match=message):
            memory.layout_of(recipe)
