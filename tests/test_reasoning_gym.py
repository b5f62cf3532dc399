"""reasoning-gym through the data module: `reasoning_gym/<task>` splits that never share a problem, the task's options
from the command line or the YAML, the collator preset, the `reasoning_gym` reward (the task's own verifier on the
final answer) and the project's answer rewards on the same rows. No model: the real-model lane is test_realmodel.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym", reason='reasoning-gym is the [realmodel] extra: pip install -e ".[realmodel]"')

import reasoning_gym  # noqa: E402

from grpo_family.collator import REASONING_GYM_SYSTEM_PROMPT, prepare_dataset  # noqa: E402
from grpo_family.errors import PreflightError  # noqa: E402
from grpo_family.preflight import load_data  # noqa: E402
from grpo_family.rewards import (  # noqa: E402
    ReasoningGymReward,
    check_golds,
    get_reward_funcs,
    math_accuracy_reward,
    reasoning_gym_reward,
)
from grpo_family.tasks.reasoning_gym import ENTRY_COLUMN, reasoning_gym_splits  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_train_and_held_out_never_share_a_question():
    """A task with few distinct problems (2 one-digit terms: 19 x 2 x 10 sums at most), so the held-out candidates
    repeat training questions: those are skipped, and what is left is disjoint from training and has no repeats."""
    data = reasoning_gym_splits("chain_sum", size=150, eval_size=40, seed=3, min_terms=2, max_terms=2, min_digits=1,
                                max_digits=1)  # fmt: skip
    train, test = data["train"], data["test"]
    assert len(train) == 150 and 0 < len(test) <= 40
    assert not set(train["question"]) & set(test["question"])
    assert len(set(test["question"])) == len(test)
    # The subject happened: the generator did repeat training questions after the training indices.
    from reasoning_gym import create_dataset

    raw = create_dataset("chain_sum", size=150 + 400, seed=3, min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    after = [raw[i]["question"] for i in range(150, 550)]
    assert set(after) & set(train["question"])
    # Deterministic given the seed; another seed gives other problems.
    again = reasoning_gym_splits("chain_sum", size=150, eval_size=40, seed=3, min_terms=2, max_terms=2,
                                 min_digits=1, max_digits=1)  # fmt: skip
    assert again["test"]["question"] == test["question"]
    assert (
        reasoning_gym_splits("chain_sum", size=20, eval_size=5, seed=4)["train"]["question"]
        != (reasoning_gym_splits("chain_sum", size=20, eval_size=5, seed=3)["train"]["question"])
    )


def test_wide_task_fills_the_held_out_split():
    data = reasoning_gym_splits("basic_arithmetic", size=100, eval_size=30, seed=0)
    assert len(data["test"]) == 30
    assert not set(data["train"]["question"]) & set(data["test"]["question"])
    entry = json.loads(data["test"][0][ENTRY_COLUMN])
    assert entry["metadata"]["source_dataset"] == "basic_arithmetic" and entry["answer"] == data["test"][0]["answer"]


def test_load_data_takes_options_as_json_or_mapping_and_refuses_bad_ones():
    as_json = load_data("reasoning_gym/chain_sum", options='{"size": 12, "seed": 1, "max_terms": 2}', eval_size=4)
    as_dict = load_data("reasoning_gym/chain_sum", options={"size": 12, "seed": 1, "max_terms": 2}, eval_size=4)
    assert as_json["train"]["question"] == as_dict["train"]["question"] and len(as_json["train"]) == 12
    assert len(as_json["test"]) == 4
    assert all(json.loads(e)["metadata"]["num_terms"] == 2 for e in as_json["train"][ENTRY_COLUMN])
    with pytest.raises(PreflightError, match="no option 'max_term'.*max_terms"):
        load_data("reasoning_gym/chain_sum", options={"max_term": 2})
    # A wrongly typed option is named (it was a "'>=' not supported" TypeError naming none).
    with pytest.raises(PreflightError, match="max_terms must be of type int like its default .*, got 'two'"):
        load_data("reasoning_gym/chain_sum", options={"max_terms": "two"})
    with pytest.raises(PreflightError, match="Unknown reasoning-gym task 'chain_summ'.*chain_sum"):
        load_data("reasoning_gym/chain_summ")
    with pytest.raises(PreflightError, match="not JSON"):
        load_data("reasoning_gym/chain_sum", options="{size: 3}")
    with pytest.raises(PreflightError, match="reasoning_gym/<task> datasets only"):
        load_data(str(ROOT / "README.md"), options={"size": 3})


def test_options_reach_the_data_from_the_yaml_and_the_command_line(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train
    finally:
        sys.path.remove(str(ROOT / "examples"))
    recipe = tmp_path / "rg.yaml"
    recipe.write_text(
        "model_name_or_path: some/model\ndataset_name: reasoning_gym/chain_sum\nreward_funcs: [reasoning_gym]\n"
        "dataset_options:\n  size: 10\n  max_terms: 2\n"
    )
    script_args, *_ = train.parse_args(["--config", str(recipe), "--output_dir", str(tmp_path / "out")])
    assert script_args.dataset_options == {"size": 10, "max_terms": 2}
    script_args, *_ = train.parse_args(
        ["--config", str(recipe), "--output_dir", str(tmp_path), "--dataset_options", '{"size": 6}']
    )
    assert json.loads(script_args.dataset_options) == {"size": 6}  # the command line wins over the YAML


def test_collator_preset_keeps_the_entry_and_states_the_answer_format():
    raw = reasoning_gym_splits("chain_sum", size=8, eval_size=2, seed=0)
    rows = prepare_dataset(raw["train"])
    assert rows.column_names == ["prompt", "answer", ENTRY_COLUMN]
    system, user = rows[0]["prompt"]
    assert system == {"role": "system", "content": REASONING_GYM_SYSTEM_PROMPT} and "<answer>" in system["content"]
    assert user == {"role": "user", "content": raw["train"][0]["question"]}
    assert rows["answer"] == raw["train"]["answer"]


def _rows(task: str, n: int = 6, **options):
    return prepare_dataset(reasoning_gym_splits(task, size=n, eval_size=0, seed=0, **options)["train"])


def test_reward_scores_with_the_tasks_verifier_on_the_committed_answer():
    rows = _rows("chain_sum")
    gold, entry = rows[0]["answer"], rows[0][ENTRY_COLUMN]
    wrong = str(int(gold) + 1)
    cases = [
        (f"Adding up: {gold}. <answer>{gold}</answer>", 1.0),
        (f"<answer>{wrong}</answer>", 0.0),
        (f"<answer>{gold}</answer> or <answer>{wrong}</answer>", 0.0),  # two candidates: a hedge
        (f"<answer>{gold}</answer> wait, that's wrong", 1.0),  # text after the committed answer is not read
        (f"The answer is {gold}.", 1.0),  # an anchored answer is a committed one
        (f"{gold}", 1.0),  # a bare reply is the answer when it is nothing else
        (f"{gold} + 0 = {gold}", 1.0),  # a true computation states its result ...
        (f"{gold} + 1 = {gold}", 0.0),  # ... a false one states nothing
        (f"{wrong} - 1 = {gold}", 1.0),  # ... and its operands are no candidates:
        (f"{gold} + 1 = {wrong}", 0.0),  # only the result is compared
        (f"<think><answer>{gold}</answer>", 0.0),  # reasoning left open: no final answer
        ([{"role": "assistant", "content": f"<answer>{gold}</answer>"}], 1.0),  # conversational completions
    ]
    completions, expected = zip(*cases)
    assert reasoning_gym_reward(list(completions), reasoning_gym_entry=[entry] * len(cases)) == list(expected)
    assert reasoning_gym_reward([f"<answer>{gold}</answer>"], reasoning_gym_entry=[None]) == [None]


def test_partial_credit_is_off_by_default_because_it_can_be_farmed():
    """reasoning-gym's default verifier gives len(gold)/len(answer) to any answer containing the gold: a policy
    listing numbers farms it. The registered reward gives full marks only; the partial reward passes it through."""
    rows = _rows("leg_counting")
    gold, entry = rows[0]["answer"], rows[0][ENTRY_COLUMN]
    farmed = f"<answer>{gold} {gold}0 {gold}1</answer>"
    assert reasoning_gym_reward([farmed], reasoning_gym_entry=[entry]) == [0.0]
    partial_reward = ReasoningGymReward(partial_credit=True)
    # The listed candidates are more numbers than the gold holds: more than one value, refused before the verifier.
    assert partial_reward([farmed], reasoning_gym_entry=[entry]) == [0.0]
    (partial,) = partial_reward([f"<answer>{gold} legs</answer>"], reasoning_gym_entry=[entry])
    assert 0.0 < partial < 1.0  # one value with more text: the task's own partial credit
    # With partial credit an unmarked reply is not read at all: dumping candidates earns nothing.
    assert partial_reward([f"{gold} {gold}0 {gold}1"], reasoning_gym_entry=[entry]) == [0.0]
    assert get_reward_funcs(["reasoning_gym"]) == [reasoning_gym_reward]


def test_answer_rewards_score_the_same_rows():
    rows = _rows("basic_arithmetic")
    check_golds(rows, [math_accuracy_reward, reasoning_gym_reward], max_unreadable=0.0)  # every gold readable
    completions = [f"<answer>{g}</answer>" for g in rows["answer"]]
    columns = {"answer": list(rows["answer"]), "reasoning_gym_entry": list(rows[ENTRY_COLUMN])}
    assert math_accuracy_reward(completions, **columns) == [1.0] * len(rows)
    assert reasoning_gym_reward(completions, **columns) == [1.0] * len(rows)
    boxed = [f"So \\boxed{{{g}}}" for g in rows["answer"]]
    assert math_accuracy_reward(boxed, **columns) == reasoning_gym_reward(boxed, **columns) == [1.0] * len(rows)


def test_reward_reads_under_the_answer_contract():
    """The reasoning_gym reward reads its answer as every answer reward does (issue 29): structure decides, no word
    does; a broken contract scores 0 and is counted; the slot's text reaches the verifier as it is."""
    rows = _rows("chain_sum")
    gold, entry = rows[0]["answer"], rows[0][ENTRY_COLUMN]
    wrong = str(int(gold) + 1)
    cases = [
        # (completion, training score, a contract violation)
        (f"<answer>{gold}</answer> Hmm, no.", 1.0, False),  # text after the committed answer is not read
        (f"<answer>{gold}</answer>\nEdit: {wrong}", 1.0, False),  # ... whatever it says: words decide nothing
        (f"<!-- <answer>{gold}</answer> -->\n<answer>{wrong}</answer>", 0.0, True),  # hiding markup
        (f"<answer>{gold}</answer>\u200b", 0.0, True),  # an invisible character
        (f"Wait, let me verify: yes, that is correct.\n<answer>{gold}</answer>", 1.0, False),  # words decide nothing
        (f"<think>maybe {wrong}</think>\n<answer>{gold}</answer><|im_end|>", 1.0, False),
        (f"<answer>{wrong}</answer>", 0.0, False),  # a committed wrong answer: no violation
        (f"Answer: {gold}\nAnswer: {wrong}", 0.0, False),  # the last slot is the committed answer
        (f"<answer>{gold} or {wrong}</answer>", 0.0, True),  # a list of values
    ]
    metrics: dict[str, float] = {}
    scores = reasoning_gym_reward(
        [c for c, _, _ in cases], reasoning_gym_entry=[entry] * len(cases), log_metric=metrics.__setitem__
    )
    assert scores == [s for _, s, _ in cases]
    assert metrics["reasoning_gym/contract_violations"] == sum(v for _, _, v in cases) / len(cases)
    # The self-correction and text after the slot score by the committed answer, never the hiding markup; the
    # strict mode (opt-in) refuses both.
    texts = [f"Answer: {wrong}\nAnswer: {gold}", f"<answer>{gold}</answer> Hmm.", cases[2][0]]
    assert reasoning_gym_reward(texts, reasoning_gym_entry=[entry] * 3) == [1.0, 1.0, 0.0]
    assert reasoning_gym_reward(texts, reasoning_gym_entry=[entry] * 3, mode="strict") == [0.0, 0.0, 0.0]
    # The partial reward accepts only a marked slot: a bare reply breaks its contract.
    partial = ReasoningGymReward(partial_credit=True)
    assert partial([gold, f"<answer>{gold}</answer>"], reasoning_gym_entry=[entry] * 2) == [0.0, 1.0]
    assert partial.counts["contract_violations"] == 1
    with pytest.raises(ValueError, match="reasoning_gym_entry"):
        reasoning_gym_reward([gold], answer=[gold])


def _entry(task: str, answer: str, **metadata) -> str:
    return json.dumps({"question": "", "answer": answer, "metadata": {"source_dataset": task, **metadata}})


@pytest.mark.parametrize(
    ("task", "gold", "slot", "metadata"),
    [
        ("gsm_symbolic", "31", "31 or 40", {}),  # its verifier reads the first number
        ("chain_sum", "3037", "30,37", {}),  # its verifier strips commas
        ("fraction_simplification", "3/4", "\\frac{3}{4} \\frac{6}{8}", {}),  # its verifier matches a prefix
    ],
)
def test_the_verifier_never_sees_more_than_one_value(task, gold, slot, metadata):
    """reasoning-gym's own verifiers give full marks to these slots (checked here, so the test cannot pass by the
    verifier's change); the wrapper refuses them: more numbers or separators than the gold is more than one value."""
    metadata = metadata or {"simplified_numerator": 3, "simplified_denominator": 4, "numerator": 6, "denominator": 8}
    entry = _entry(task, gold, **metadata)
    assert reasoning_gym.get_score_answer_fn(task)(slot, json.loads(entry)) == 1.0
    assert reasoning_gym_reward([f"<answer>{slot}</answer>"], reasoning_gym_entry=[entry]) == [0.0]
    # The one value alone, and one number with a thousands separator, score 1.
    one = "3,037" if task == "chain_sum" else gold
    assert reasoning_gym_reward([f"<answer>{one}</answer>"], reasoning_gym_entry=[entry]) == [1.0]


def test_multiline_answer_reaches_the_verifier_whole():
    """A grid answer spans lines inside the tag; the verifier gets the tag's text as reasoning-gym's own
    extract_answer gives it (stripped, nothing else changed)."""
    rows = _rows("rotate_matrix")
    gold, entry = rows[0]["answer"], rows[0][ENTRY_COLUMN]
    assert "\n" in gold
    assert reasoning_gym_reward([f"Rotating:\n<answer>\n{gold}\n</answer>"], reasoning_gym_entry=[entry]) == [1.0]
    assert reasoning_gym_reward([gold], reasoning_gym_entry=[entry]) == [0.0]  # no slot: several lines, no tag


def test_evaluation_reads_the_reasoning_gym_answer_as_the_reward_does():
    """grpo_family.eval hands the reward its mode and reads maj@k's answer the same way (the partial reward: marked
    slots only)."""
    from grpo_family.eval.scoring import extract_answer, score_samples

    rows = _rows("chain_sum", n=1)
    gold, entry = rows[0]["answer"], rows[0][ENTRY_COLUMN]
    text = f"Answer: {int(gold) + 1}\nAnswer: {gold}"  # a self-correction: the committed (last) answer is read
    columns = {"prompt": [rows[0]["prompt"]], "answer": [gold], ENTRY_COLUMN: [entry]}
    scores = {m: score_samples(reasoning_gym_reward, columns, [[text]], mode=m) for m in ("eval", "train", "strict")}
    assert scores["eval"].mode_applied
    assert {m: s.values for m, s in scores.items()} == {"eval": [1.0], "train": [1.0], "strict": [0.0]}
    assert extract_answer("reasoning_gym", text, "eval") == gold == extract_answer("reasoning_gym", text, "train")
    assert extract_answer("reasoning_gym", text, "strict") is None
    assert extract_answer("reasoning_gym", gold, "train") == gold
    assert extract_answer("reasoning_gym_partial", gold, "train") is None


def test_a_numeric_task_reads_its_answer_as_a_value_reward_does():
    """Issue 40: a task whose gold is one number reads the slots of a value reward (SmolLM2's endings in the
    corpus): the last sentence that holds a value, a computation in a sentence stating its result, an anchor
    followed by a sentence of its own stating its one number. Each compares one value: the nearest shotguns
    score 0, and strict mode reads none of these layouts."""
    entry = _entry("products", "18", expression="3 * 6")
    right = [
        "Here is the solution: 3 * 6 = 18",  # smollm2-s0-017
        "To find 3 * 6, add 3 six times. Therefore, 3 * 6 = 18.",  # the layout of smollm2-s1-001
        "3 * 6 = 18\n\nWhen giving a final answer, include the entire input in the result.",  # smollm2-s0-015
        "Final Answer: The product is 18.",
    ]
    assert reasoning_gym_reward(right, reasoning_gym_entry=[entry] * len(right)) == [1.0] * len(right)
    assert reasoning_gym_reward(right, reasoning_gym_entry=[entry] * len(right), mode="strict") == [0.0] * len(right)
    shotguns = [
        "Here is the solution: 3 * 6 = 18 or 19",
        "Therefore, 3 * 6 = 18, not 20.",
        "Final Answer: The product is 18 or 19.",
        "Therefore, 3 * 6 = 19.",  # a false computation states nothing
    ]
    for gold in ("18", "19", "20"):
        golds = [_entry("products", gold, expression="3 * 6")] * len(shotguns)
        assert reasoning_gym_reward(shotguns, reasoning_gym_entry=golds) == [0.0] * len(shotguns), gold
