"""Every recipe parses with examples/train.py's parser into its method's config, and says what it reproduces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train  # noqa: E402

from grpo_family import METHODS  # noqa: E402

RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))


def test_every_method_has_a_paper_recipe_and_a_small_one():
    names = {p.stem for p in RECIPES}
    for method in set(METHODS) - {"grpo"}:
        assert f"{method}_small" in names, f"{method} has no small-model recipe"
        assert any(n.startswith(method) and n != f"{method}_small" for n in names), f"{method} has no paper recipe"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses_and_validates(recipe, monkeypatch):
    header = recipe.read_text().splitlines()[0]
    assert header.startswith("# "), "a recipe starts with a comment saying what it reproduces"
    values = yaml.safe_load(recipe.read_text())
    method = values["method"]
    # bf16/vLLM settings need a GPU; parse them as a CPU machine would, everything else as written.
    script_args, training_args, model_args, trainer_cls = train.parse_args(
        ["--config", str(recipe), "--bf16", "false", "--use_vllm", "false"]
    )
    assert script_args.method == method and trainer_cls is METHODS[method][1]
    assert isinstance(training_args, METHODS[method][0])
    assert model_args.model_name_or_path == values.get("model_name_or_path")  # None: the embedded default
    for key in ("num_generations", "learning_rate", "max_completion_length"):
        if key in values:
            assert getattr(training_args, key) == pytest.approx(values[key])
