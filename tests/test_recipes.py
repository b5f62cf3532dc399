"""Every recipe parses with examples/train.py's parser into its method's config, and says what it reproduces."""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
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


# Data selection a recipe can state (dataset_filters) -------------------------------------------------------------


def test_dataset_filters_by_values_range_and_failure(caplog):
    from datasets import Dataset

    from grpo_family.collator import filter_rows
    from grpo_family.errors import DatasetFormatError

    rows = [{"problem": f"p{i}", "level": f"Level {1 + i % 5}", "Year": str(1990 + i)} for i in range(30)]
    data = Dataset.from_list(rows)
    with caplog.at_level("WARNING", logger="grpo_family.collator"):
        kept = filter_rows(data, {"level": ["Level 3", "Level 4", "Level 5"]}, name="math")
    assert kept.num_rows == 18 and set(kept["level"]) == {"Level 3", "Level 4", "Level 5"}
    assert "kept 18 of 30 rows of math" in caplog.text
    years = filter_rows(data, '{"Year": {"min": 1997, "max": 2003}, "level": "Level 1"}')  # JSON, rules ANDed
    assert [int(y) for y in years["Year"]] == [2000]
    assert filter_rows(data, None) is data and filter_rows(data, {}) is data
    with pytest.raises(DatasetFormatError, match=r"kept 0 of 30 rows.*columns: \['problem', 'level', 'Year'\]"):
        filter_rows(data, {"level": ["Level 9"]})
    with pytest.raises(DatasetFormatError, match="does not have"):
        filter_rows(data, {"source": "aime"})


def test_dataset_filters_parses_from_a_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "method: grpo\nmodel_name_or_path: m\ndataset_name: d\n"
        'dataset_filters:\n  level: ["Level 3", "Level 4"]\n  Year: {min: 1997, max: 2023}\n'
    )
    script_args, *_ = train.parse_args(["--config", str(recipe), "--bf16", "false"])
    assert script_args.dataset_filters == {"level": ["Level 3", "Level 4"], "Year": {"min": 1997, "max": 2023}}


def test_think_prefilled_format_rewards_by_name():
    """DeepSeek-R1-Distill's template ends the prompt with `<think>\\n`: completions start inside the think block."""
    from grpo_family.rewards import REWARD_FUNCS

    answer = REWARD_FUNCS["think_prefilled_answer_format"]
    boxed = REWARD_FUNCS["think_prefilled_boxed_format"]
    r1_distill = "Let me add 2 and 2.\n</think>\n<answer>\\boxed{4}</answer>"
    r1_boxed = "Let me add 2 and 2.\n</think>\n\nThe answer is \\boxed{4}."
    assert answer(completions=[r1_distill]) == [1.0] and boxed(completions=[r1_boxed]) == [1.0]
    assert REWARD_FUNCS["think_answer_format"](completions=[r1_distill]) == [0.0]  # why the plain one fails
    assert answer(completions=["<think>x</think><answer>4</answer>"]) == [0.0]  # a second <think>
    assert answer(completions=[[{"role": "assistant", "content": r1_distill}]]) == [1.0]
    assert answer.__name__ == "think_prefilled_answer_format"
