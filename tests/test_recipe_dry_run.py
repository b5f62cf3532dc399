"""Each paper recipe runs 1 step on CPU through examples/train.py with local stand-ins for its model and data.

Only what a CPU needs is overridden (bf16, vLLM, the judge server, tiny batch and lengths); the recipe's data
settings (dataset_filters, column names, preset, prompt, rewards) and method knobs run as written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train  # noqa: E402

CPU = dict(
    bf16=False,
    use_vllm=False,
    max_steps=1,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=1,
    num_generations=4,
    max_completion_length=8,
    num_eval_examples=2,
    held_out_every=0,
    save_strategy="no",
    report_to="none",
    gradient_checkpointing=False,
    judge_type="heuristic",  # SGPO: no judge server on CPU
)

# Stand-in rows shaped like each recipe's dataset (its columns).
AIME = [{"ID": f"{y}-{i}", "Year": y, "Problem Number": i, "Question": f"What is {y} plus {i}?", "Answer": str(y + i),
         "Part": None} for y in (1990, 2000, 2010, 2024) for i in range(1, 5)]  # fmt: skip


def _dataset(root: Path, rows: list[dict]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(root)


def test_sgpo_recipe_dry_run_on_the_aime_filter(tmp_path, tiny_model_dir, caplog):
    recipe = yaml.safe_load((ROOT / "examples/recipes/sgpo_r1_distill_qwen_7b.yaml").read_text())
    assert recipe["dataset_filters"] == {"Year": {"min": 1997, "max": 2023}}
    recipe.update(CPU, model_name_or_path=tiny_model_dir, dataset_name=_dataset(tmp_path / "aime", AIME))
    recipe.update(output_dir=str(tmp_path / "out"), num_train_epochs=1, sgpo_num_epochs=None, sgpo_max_steps=1)
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe))
    with caplog.at_level("WARNING", logger="grpo_family.collator"):
        train.main(["--config", str(config)])
    assert "kept 8 of 16 rows" in caplog.text
