"""Collator: dataset presets -> TRL conversational prompts with ``answer`` / ``solution``; column errors."""

from __future__ import annotations

import logging

import pytest
from datasets import Dataset, DatasetDict

from grpo_family.collator import (
    BOXED_SYSTEM_PROMPT,
    CHOICE_SYSTEM_PROMPT,
    MATH_SYSTEM_PROMPT,
    REASONING_SYSTEM_PROMPT,
    detect_preset,
    format_options,
    gsm8k_gold,
    prepare_dataset,
)
from grpo_family.errors import DatasetFormatError
from grpo_family.rewards import (
    choice_accuracy_reward,
    math_accuracy_reward,
    qa_exact_match_reward,
    think_answer_format_reward,
)

GSM8K = [
    {
        "question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in total?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn total 48+24 = <<48+24=72>>72.\n#### 72",
    },
    {"question": "How many?", "answer": "Lots: 1000+72 = <<1000+72=1072>>1072\n#### 1,072"},
]
MATH = [
    {"problem": "Compute $1/2$.", "solution": r"Clearly $\boxed{\frac{1}{2}}$.", "level": "Level 1", "type": "A"},
    {"problem": "Set?", "solution": r"So $\boxed{\{1, 2\}}$", "level": "Level 2", "type": "B"},
]
MATH500 = [{"problem": "P", "solution": r"... $\boxed{3}$", "answer": "3", "subject": "Algebra", "unique_id": "x"}]
DEEPSCALER = [{"problem": "P", "answer": r"\frac{3}{4}", "solution": "long text without a box"}]
DAPO_PROCESSED = [
    {
        "prompt": "Solve the following math problem step by step. The last line of your response should be of the "
        "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is $1+1$?\n\n"
        'Remember to put your answer on its own line after "Answer:".',
        "solution": "2",
        "data_source": "math_dapo",
    }
]
DAPO_ORIGINAL = [
    {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": "What is $2+2$?"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "4", "style": "rule"},
    }
]
RIDDLESENSE = [
    {
        "answerKey": "E",
        "question": "What has keys but can't open locks?",
        "choices": {"label": list("ABCDE"), "text": ["door", "lock", "car", "map", "piano"]},
    }
]
MEDQA = [
    {
        "question": "A 23-year-old presents with ...",
        "answer": "Nitrofurantoin",
        "options": {"A": "Ampicillin", "B": "Ceftriaxone", "C": "Doxycycline", "D": "Nitrofurantoin"},
        "meta_info": "step2&3",
        "answer_idx": "D",
    }
]
MMLU = [{"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1}]
ARC_NUMERIC = [
    {"question": "Q?", "choices": {"text": ["w", "x", "y", "z"], "label": ["1", "2", "3", "4"]}, "answerKey": "3"}
]
HOTPOT = [{"id": "1", "question": "Capital of France?", "answer": "Paris", "type": "bridge", "level": "easy"}]
SQUAD = [{"id": "1", "context": "c", "question": "Q?", "answers": {"text": ["Denver Broncos"], "answer_start": [1]}}]
BUNDLED = [
    {
        "prompt": [{"role": "user", "content": "Compute 1+2."}],
        "problem": "Compute 1+2.",
        "answer": "3",
        "solution": "1+2=3\nAnswer: 3",
        "num_steps": 2,
    }
]


def prep(rows, **kwargs):
    return prepare_dataset(Dataset.from_list(rows), **kwargs)


def user_text(row) -> str:
    return row["prompt"][-1]["content"]


@pytest.mark.parametrize(
    ("rows", "preset"),
    [
        (GSM8K, "gsm8k"),
        (MATH, "math"),
        (MATH500, "math"),
        (DEEPSCALER, "math"),
        (DAPO_PROCESSED, "dapo"),
        (DAPO_ORIGINAL, "dapo"),
        (RIDDLESENSE, "choice"),
        (MEDQA, "choice"),
        (MMLU, "choice"),
        (HOTPOT, "qa"),
        (SQUAD, "qa"),
        (BUNDLED, "prompt"),
    ],
)
def test_detect_preset(rows, preset):
    assert detect_preset(Dataset.from_list(rows)) == preset


def test_gsm8k():
    out = prep(GSM8K)
    assert sorted(out.column_names) == ["answer", "prompt", "solution"]
    assert out["answer"] == ["72", "1072"]
    row = out[0]
    assert row["prompt"] == [
        {"role": "system", "content": MATH_SYSTEM_PROMPT},
        {"role": "user", "content": GSM8K[0]["question"]},
    ]
    assert "<<" not in row["solution"] and "#### 72" in row["solution"]
    assert gsm8k_gold("x\n#### -3") == "-3" and gsm8k_gold(None) is None


def test_math_presets():
    out = prep(MATH)
    assert out["answer"] == [r"\frac{1}{2}", r"\{1, 2\}"]
    assert out["solution"] == [r["solution"] for r in MATH]
    assert set(out.column_names) == {"prompt", "answer", "solution"}
    assert prep(MATH500)["answer"] == ["3"]  # an answer column wins over the boxed solution
    ds = prep(DEEPSCALER, preset="deepscaler")
    assert ds["answer"] == [r"\frac{3}{4}"] and ds["solution"] == ["long text without a box"]


def test_dapo_variants():
    processed = prep(DAPO_PROCESSED)
    assert user_text(processed[0]) == "What is $1+1$?"  # DAPO's own "Answer:" instruction removed
    assert processed["answer"] == ["2"] and processed.column_names == ["prompt", "answer"]
    original = prep(DAPO_ORIGINAL)
    assert user_text(original[0]) == "What is $2+2$?" and original["answer"] == ["4"]


def test_choice_presets():
    riddle = prep(RIDDLESENSE)[0]
    assert riddle["answer"] == "E"
    assert riddle["prompt"][0]["content"] == CHOICE_SYSTEM_PROMPT
    assert user_text(riddle) == "What has keys but can't open locks?\n\nA. door\nB. lock\nC. car\nD. map\nE. piano"
    med = prep(MEDQA)[0]
    assert med["answer"] == "D" and user_text(med).endswith("C. Doxycycline\nD. Nitrofurantoin")
    # the text answer alone also resolves to its letter
    text_only = [{k: v for k, v in MEDQA[0].items() if k != "answer_idx"}]
    assert prep(text_only)["answer"] == ["D"]
    assert prep(MMLU)["answer"] == ["B"]  # 0-based index
    arc = prep(ARC_NUMERIC)[0]
    assert arc["answer"] == "C" and "C. y" in user_text(arc)  # numeric labels re-lettered
    assert format_options([{"key": "A", "value": "x"}, {"key": "B", "value": "y"}]) == [("A", "x"), ("B", "y")]


def test_qa_presets():
    hot = prep(HOTPOT)
    assert hot["answer"] == ["Paris"] and hot[0]["prompt"][0]["content"] == REASONING_SYSTEM_PROMPT
    assert hot.column_names == ["prompt", "answer"]
    assert prep(SQUAD)["answer"] == [["Denver Broncos"]]
    assert prep([{"question": "Q", "answer": ["a", "b"]}])["answer"] == [["a", "b"]]


def test_bundled_pass_through_and_system_prompt_choices():
    ds = Dataset.from_list(BUNDLED)
    same = prepare_dataset(ds)
    assert same.column_names == ds.column_names and same[0] == ds[0]
    boxed = prepare_dataset(ds, system_prompt="boxed")
    assert boxed[0]["prompt"][0] == {"role": "system", "content": BOXED_SYSTEM_PROMPT}
    custom = prep(HOTPOT, system_prompt="Be brief.")
    assert custom[0]["prompt"][0]["content"] == "Be brief."
    none = prep(HOTPOT, system_prompt="")
    assert none[0]["prompt"] == [{"role": "user", "content": "Capital of France?"}]


def test_column_overrides():
    rows = [{"query": "What is 6*7?", "gold": "42", "explanation": "six sevens"}]
    out = prep(rows, preset="math", question_column="query", answer_column="gold", solution_column="explanation")
    assert user_text(out[0]) == "What is 6*7?" and out["answer"] == ["42"] and out["solution"] == ["six sevens"]
    auto = prep(rows, question_column="query", answer_column="gold")  # overrides alone -> qa, gold as is
    assert auto["answer"] == ["42"] and auto.column_names == ["prompt", "answer"]


def test_dataset_dict_is_prepared_split_by_split():
    dd = DatasetDict({"train": Dataset.from_list(GSM8K), "test": Dataset.from_list(GSM8K[:1])})
    out = prepare_dataset(dd)
    assert isinstance(out, DatasetDict) and out["train"]["answer"] == ["72", "1072"] and len(out["test"]) == 1


@pytest.mark.parametrize(
    ("rows", "kwargs", "must_contain"),
    [
        # GSM8K-like data without its answer column
        ([{"question": "Q", "rationale": "r"}], {"preset": "gsm8k"}, ["'answer'", "'question'", "'rationale'"]),
        # MATH-like data with neither an answer nor a solution column
        ([{"problem": "P", "difficulty": 3}], {}, ["'answer'", "'solution'", "'problem'", "'difficulty'"]),
        # multiple choice without a gold column
        ([{"question": "Q", "options": ["a", "b"]}], {}, ["'answerKey'", "'options'"]),
        # a named override that does not exist
        ([{"question": "Q", "answer": "a"}], {"question_column": "prompt_text"}, ["'prompt_text'", "'answer'"]),
        # nothing recognisable
        ([{"text": "x", "label": 1}], {}, ["'text'", "'label'"]),
    ],
)
def test_missing_column_error_message(rows, kwargs, must_contain):
    with pytest.raises(DatasetFormatError) as info:
        prep(rows, **kwargs)
    message = str(info.value)
    for fragment in must_contain:
        assert fragment in message
    assert "question_column" in message or "answer_column" in message
    assert "--" in message  # says how to map on the command line
    assert isinstance(info.value, ValueError)


def test_unknown_preset():
    with pytest.raises(ValueError, match="Valid presets"):
        prep(HOTPOT, preset="squadv3")


def test_missing_gold_rows_are_kept_and_warned(caplog):
    rows = MATH + [{"problem": "P", "solution": "no box here", "level": "Level 1", "type": "A"}]
    with caplog.at_level(logging.WARNING, logger="grpo_family.collator"):
        out = prep(rows)
    assert out["answer"][-1] is None
    assert "1 of 3 rows" in caplog.text


def test_prepared_rows_feed_the_rewards():
    """Collator output -> TRL-style reward call (columns become keyword lists)."""
    math_rows = prep(MATH)
    completions = [
        [{"role": "assistant", "content": r"<think>half</think><answer>\boxed{0.5}</answer>"}],
        [{"role": "assistant", "content": r"<think>set</think><answer>\boxed{\{2,1\}}</answer>"}],
    ]
    kwargs = {"answer": math_rows["answer"], "solution": math_rows["solution"], "prompts": math_rows["prompt"]}
    assert math_accuracy_reward(completions=completions, **kwargs) == [1.0, 1.0]
    assert think_answer_format_reward(completions=completions, **kwargs) == [1.0, 1.0]
    med = prep(MEDQA)
    assert choice_accuracy_reward(completions=["<answer>D</answer>"], answer=med["answer"]) == [1.0]
    squad = prep(SQUAD)
    assert qa_exact_match_reward(completions=["<answer>the Denver Broncos</answer>"], answer=squad["answer"]) == [1.0]


def test_code_preset_keeps_the_tests_for_the_code_reward():
    from grpo_family.rewards import code_tests_reward

    mbpp = Dataset.from_list(
        [{"text": "Write add(a, b).", "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "task_id": 1}]
    )
    apps = Dataset.from_list(
        [{"question": "Print the sum of two numbers.", "input_output": '{"inputs": ["1 2\\n"], "outputs": ["3\\n"]}'}]
    )
    assert detect_preset(mbpp) == detect_preset(apps) == "code"
    prepared_mbpp, prepared_apps = prepare_dataset(mbpp), prepare_dataset(apps, preset="apps")
    assert prepared_mbpp.column_names == prepared_apps.column_names == ["prompt", "test_cases"]
    assert prepared_mbpp[0]["prompt"][-1] == {"role": "user", "content": "Write add(a, b)."}
    assert prepared_mbpp[0]["prompt"][0]["role"] == "system"
    good_function = "```python\ndef add(a, b):\n    return a + b\n```"
    good_program = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    scores = code_tests_reward(
        [good_function, "```python\ndef add(a, b):\n    return a - b\n```"],
        test_cases=list(prepared_mbpp["test_cases"]) * 2,
    )
    assert scores == [1.0, 0.5]  # a - b passes only add(0, 0) == 0
    assert code_tests_reward([good_program], test_cases=list(prepared_apps["test_cases"])) == [1.0]


def test_code_preset_without_tests_names_the_flag():
    with pytest.raises(DatasetFormatError, match="test cases.*answer_column"):
        prepare_dataset(Dataset.from_list([{"question": "Print 1."}]), preset="code")


def test_user_instruction_follows_the_question_in_the_user_turn():
    """GPG's App. B.4 placement: a plain system message, the instruction after the question in the user turn."""
    from datasets import Dataset

    instruction = "Please reason step by step, and put your final answer within \\boxed{}."
    rows = Dataset.from_dict({"question": ["What is 2+2?"], "answer": ["2+2=4\n#### 4"]})
    prepared = prepare_dataset(
        rows, preset="gsm8k", system_prompt="You are a helpful assistant.", user_instruction=instruction
    )
    assert prepared[0]["prompt"] == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"What is 2+2?\n{instruction}"},
    ]
    assert prepared[0]["answer"] == "4"
    plain = prepare_dataset(rows, preset="gsm8k", system_prompt="You are a helpful assistant.")
    assert plain[0]["prompt"][-1]["content"] == "What is 2+2?"  # nothing added without the option
    passed = prepare_dataset(
        Dataset.from_dict({"prompt": [[{"role": "user", "content": "Q?"}]], "answer": ["1"]}),
        preset="prompt",
        user_instruction=instruction,
    )
    assert passed[0]["prompt"] == [{"role": "user", "content": f"Q?\n{instruction}"}]
