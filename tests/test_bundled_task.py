"""The embedded default: the bundled arithmetic task, its reward and step checker, the tokenizer and tiny model."""

from __future__ import annotations

import random
import re

import torch

from grpo_family.tasks import (
    arithmetic_reward,
    build_tiny_model,
    build_tokenizer,
    check_steps,
    make_arithmetic_dataset,
    solve,
)


def test_dataset_is_deterministic_and_splits_are_disjoint():
    a, b = make_arithmetic_dataset("train", 200, seed=3), make_arithmetic_dataset("train", 200, seed=3)
    assert a["problem"] == b["problem"] and a["solution"] == b["solution"]
    evaluation = make_arithmetic_dataset("eval", 200, seed=3)
    assert not set(a["problem"]) & set(evaluation["problem"])
    assert set(a.column_names) >= {"prompt", "answer", "solution", "num_steps"}


def test_reference_solutions_are_right_and_score_one():
    data = make_arithmetic_dataset("eval", 100, seed=0)
    for problem, solution, answer, steps in zip(data["problem"], data["solution"], data["answer"], data["num_steps"]):
        expression = problem.removeprefix("Compute ").rstrip(".")
        assert eval(expression) == int(answer)  # noqa: S307 - digits and + - * only, generated above
        assert check_steps(problem, solution) is None
        assert len(solution.splitlines()) == steps
    assert arithmetic_reward(list(data["solution"]), list(data["answer"])) == [1.0] * 100


def test_reward_none_only_for_a_bad_gold_and_zero_for_a_bad_answer():
    completions = ["2+2=4\nAnswer: 4", [{"role": "assistant", "content": "Answer: 5"}], "no answer", "Answer: 4"]
    assert arithmetic_reward(completions, ["4", "4", "4", "four"]) == [1.0, 0.0, 0.0, None]


def test_check_steps_finds_the_first_wrong_step():
    problem = "Compute 7+5*3-4."
    assert check_steps(problem, "5*3=15\n7+15=22\n22-4=18\nAnswer: 18") is None
    assert check_steps(problem, "5*3=16\n7+16=23\n23-4=19\nAnswer: 19") == 1  # false arithmetic
    assert check_steps(problem, "5*3=15\n7+15=22\n22-4=17\nAnswer: 17") == 3
    assert check_steps(problem, "7+5=12\n12*3=36") == 1  # wrong order of operations
    assert check_steps(problem, "5*3=15\n7+15=22\n22-4=18\nAnswer: 19") == 4
    assert check_steps(problem, "5*3=15\n9+15=24") == 2  # a value the problem does not have


def test_solve_matches_python_on_random_expressions():
    rng = random.Random(0)
    for _ in range(200):
        numbers = [rng.randint(0, 9) for _ in range(rng.randint(2, 5))]
        ops = [rng.choice("+-*") for _ in range(len(numbers) - 1)]
        expression = "".join(f"{n}{o}" for n, o in zip(numbers, ops)) + str(numbers[-1])
        assert solve(numbers, ops)[-1][3] == eval(expression)  # noqa: S307


def test_tokenizer_round_trip_and_chat_template():
    tokenizer = build_tokenizer()
    text = "5*3=15\n7+15=22\nAnswer: 22"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Compute 1+2."}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n") and "Compute 1+2." in prompt
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None


def test_tiny_model_is_a_qwen2_and_runs():
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    assert model.config.model_type == "qwen2"
    ids = tokenizer("1+2=3", return_tensors="pt")["input_ids"]
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()


def test_default_task_mostly_needs_precedence_and_left_to_right_is_then_wrong():
    from grpo_family.tasks import DEFAULT_DIFFICULTY, left_to_right, needs_precedence
    from grpo_family.tasks.arithmetic import _parse_problem

    data = make_arithmetic_dataset("eval", 400, seed=0)
    kinds = []
    for problem, answer in zip(data["problem"], data["answer"]):
        numbers, ops = _parse_problem(problem)
        kinds.append(needs_precedence(ops))
        wrong_order = left_to_right(numbers, ops)
        assert all(0 <= c <= DEFAULT_DIFFICULTY.max_value for *_, c in wrong_order)
        if not needs_precedence(ops):  # the same order as the reference: the same answer
            assert wrong_order[-1][3] == int(answer)
    # tol: sampling, not rounding: the share of n Bernoulli(p) draws has sd sqrt(p(1-p)/n) <= 0.5/sqrt(n); 0.05
    # is over 4 sd for the data sets drawn here (n >= 500) and the generator is seeded, so the figure is fixed.
    assert abs(sum(kinds) / len(kinds) - DEFAULT_DIFFICULTY.precedence_share) < 0.05
    assert needs_precedence(["+", "*"]) and needs_precedence(["*", "-", "*"]) and not needs_precedence(["*", "+"])
    assert left_to_right([7, 5, 3], ["+", "*"]) == [(7, "+", 5, 12), (12, "*", 3, 36)]


def test_teacher_evaluates_left_to_right_in_its_share_of_solutions():
    from grpo_family.tasks import teacher_solutions

    data = make_arithmetic_dataset("train", 2000, seed=0)
    solutions = teacher_solutions(data, left_to_right_share=0.8)
    judged = [check_steps(p, s) for p, s in zip(data["problem"], solutions)]
    wrong = [j is not None for j in judged]
    # left to right is wrong exactly where precedence matters (about 9 in 10 problems): 0.8 * 0.9 = 0.72 of rows
    assert 0.68 < sum(wrong) / len(wrong) < 0.76
    for solution, j in zip(solutions, judged):  # the error is the order, never the arithmetic
        for line in solution.splitlines()[:-1]:
            a, op, b, c = re.fullmatch(r"(\d+)([-+*])(\d+)=(\d+)", line).groups()
            assert eval(f"{a}{op}{b}") == int(c)  # noqa: S307
        assert j is None or j < len(solution.splitlines())  # a computation line, not the answer line
    assert teacher_solutions(data, 0.0) == list(data["solution"])


def test_tiny_model_head_dim_is_servable_by_vllm_cpu():
    model = build_tiny_model(build_tokenizer(), seed=0)
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
