"""Each paper recipe runs 1 step on CPU through examples/train.py with local stand-ins for its model and data.

What a CPU needs is what the recipe's header prints for a CPU run (`--bf16 false`, `--use_vllm false`, the
heuristic judge for a judge server), read from the header so that the printed command is the tested one; the rest
is sizing (a tiny batch, short completions, 1 step). The recipe's data settings (dataset_filters, column names,
preset, prompt, rewards) and method knobs run as written."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train  # noqa: E402

SIZING = dict(
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
)

# Stand-in rows shaped like each recipe's dataset: its columns, configs and splits. Keyed by `dataset_name`;
# `None` is the embedded default (no model, no dataset).
AIME = [{"ID": f"{y}-{i}", "Year": y, "Problem Number": i, "Question": f"What is {y} plus {i}?", "Answer": str(y + i),
         "Part": None} for y in (1990, 2000, 2010, 2024) for i in range(1, 5)]  # fmt: skip
GSM8K = [{"question": f"Tom has {i} apples and buys 2 more. How many now?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
         for i in range(8)]  # fmt: skip
OPEN_RS = [{"problem": f"Compute {i} + 3.", "solution": f"{i} + 3 = \\boxed{{{i + 3}}}", "answer": str(i + 3),
            "level": "unknown"} for i in range(8)]  # fmt: skip
DEEPSCALER = [{"problem": f"Compute {i} * 2.", "answer": str(2 * i), "solution": f"\\boxed{{{2 * i}}}"}
              for i in range(8)]  # fmt: skip
MATH_LIGHTEVAL = [{"problem": f"Compute {i} + {i}.", "level": f"Level {1 + i % 5}", "type": "Algebra",
                   "solution": f"{i} + {i} = \\boxed{{{2 * i}}}"} for i in range(10)]  # fmt: skip
DAPO = [{"data_source": "math_dapo", "prompt": f"Solve the following math problem step by step. The last line of "
         f"your response should be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
         f"problem.\n\nWhat is {i} + 5?\n\nRemember to put your answer on its own line after \"Answer:\".",
         "solution": str(i + 5)} for i in range(8)]  # fmt: skip

# dataset_name -> (config directory or None, {split: rows})
STAND_INS = {
    "di-zhang-fdu/AIME_1983_2024": (None, {"train": AIME}),
    "openai/gsm8k": ("main", {"train": GSM8K, "test": GSM8K[:4]}),
    "knoveleng/open-rs": (None, {"train": OPEN_RS}),
    "agentica-org/DeepScaleR-Preview-Dataset": (None, {"train": DEEPSCALER}),
    "DigitalLearningGmbH/MATH-lighteval": ("default", {"train": MATH_LIGHTEVAL, "test": MATH_LIGHTEVAL[:4]}),
    "open-r1/DAPO-Math-17k-Processed": ("all", {"train": DAPO}),
    None: None,  # the embedded default task: nothing to stand in for
}
GENERATED = "reasoning_gym/"  # reasoning-gym tasks are generated locally: no stand-in, fewer problems
RECIPES = sorted((ROOT / "examples/recipes").glob("*.yaml"))
CPU_COMMAND = re.compile(
    r"^#\s+python examples/train\.py --config examples/recipes/(?P<file>\S+\.yaml)(?P<flags>.*)$", re.M
)


def header_cpu_flags(path: Path) -> dict:
    """The flags of the CPU command the recipe's header prints, as recipe keys (``--bf16 false`` -> bf16: False);
    a recipe with bf16 or vLLM on must print one that turns them off."""
    commands = [m for m in CPU_COMMAND.finditer(path.read_text()) if m.group("file") == path.name]
    tokens = commands[0].group("flags").split() if commands else []
    flags = {tokens[i].removeprefix("--"): yaml.safe_load(tokens[i + 1]) for i in range(0, len(tokens), 2)}
    recipe = yaml.safe_load(path.read_text())
    for key in ("bf16", "use_vllm"):
        assert not recipe.get(key) or flags.get(key) is False, (
            f"{path.name}: its header prints no CPU command with --{key} false"
        )
    return flags


def _dataset(root: Path, rows: list[dict] | None = None, config: str | None = None, splits: dict | None = None) -> str:
    """A local dataset directory: ``root[/config]/<split>.jsonl`` per split (``rows`` alone: the train split)."""
    splits = splits if splits is not None else {"train": rows}
    where = root / config if config else root
    where.mkdir(parents=True, exist_ok=True)
    for split, split_rows in splits.items():
        (where / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in split_rows))
    return str(root)


def _run(recipe: dict, tmp_path: Path) -> None:
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe))
    train.main(["--config", str(config)])


def _cpu_recipe(path: Path, tmp_path: Path, tiny_model_dir: str) -> dict:
    recipe = yaml.safe_load(path.read_text())
    name = recipe.get("dataset_name")
    if str(name).startswith(GENERATED):
        recipe.update(SIZING, output_dir=str(tmp_path / "out"), model_name_or_path=tiny_model_dir,
                      dataset_options={**recipe.get("dataset_options", {}), "size": 8})  # fmt: skip
        return recipe
    assert name in STAND_INS, f"{path.name}: no local stand-in for dataset {name!r}: add a stand-in to STAND_INS"
    recipe.update(header_cpu_flags(path))
    if "steps_per_generation" in recipe:  # the recipe's updates per generation batch, at the CPU's accumulation
        updates = recipe["steps_per_generation"] // recipe.get("gradient_accumulation_steps", 1)
        recipe["steps_per_generation"] = updates * SIZING["gradient_accumulation_steps"]
    recipe.update(SIZING, output_dir=str(tmp_path / "out"))
    if name is not None:
        config, splits = STAND_INS[name]
        recipe.update(model_name_or_path=tiny_model_dir, dataset_name=_dataset(tmp_path / "data", config=config,
                                                                                splits=splits))  # fmt: skip
    for key in ("deepspeed", "vllm_mode", "vllm_server_base_url"):
        recipe.pop(key, None)
    recipe.pop("num_train_epochs", None)  # max_steps=1 bounds the run
    # Method knobs sized by the paper's group size G or step count, scaled to the CPU's G = 4 and 1 step.
    if recipe["method"] == "d3s":  # its defaults follow G
        recipe.pop("d3s_samples_start", None), recipe.pop("d3s_samples_end", None)
    if recipe["method"] == "sgpo":  # the judge's map and window, sized to 1 step
        recipe.update(sgpo_num_epochs=None, sgpo_max_steps=1)
    return recipe


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_runs_one_cpu_step(path, tmp_path, tiny_model_dir, caplog):
    recipe = _cpu_recipe(path, tmp_path, tiny_model_dir)
    with caplog.at_level("WARNING", logger="grpo_family.collator"):
        _run(recipe, tmp_path)
    if recipe.get("dataset_filters"):
        kept = re.search(r"kept (\d+) of (\d+) rows", caplog.text)
        assert kept and int(kept.group(1)) > 0, caplog.text


def test_sgpo_recipe_dry_run_on_the_aime_filter(tmp_path, tiny_model_dir, caplog):
    recipe = yaml.safe_load((ROOT / "examples/recipes/sgpo_r1_distill_qwen_7b.yaml").read_text())
    assert recipe["dataset_filters"] == {"Year": {"min": 1997, "max": 2023}}
    recipe = _cpu_recipe(ROOT / "examples/recipes/sgpo_r1_distill_qwen_7b.yaml", tmp_path, tiny_model_dir)
    with caplog.at_level("WARNING", logger="grpo_family.collator"):
        _run(recipe, tmp_path)
    assert "kept 8 of 16 rows" in caplog.text


def test_a_recipe_without_a_stand_in_says_add_one(tmp_path, tiny_model_dir):
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump({"method": "grpo", "dataset_name": "someone/new-data"}))
    with pytest.raises(AssertionError, match="add a stand-in"):
        _cpu_recipe(path, tmp_path, tiny_model_dir)
