"""SGPOTrainer: judged partial credit in all-negative groups, exactly GRPO elsewhere, the activation window, a judge
that is down / slow / talking nonsense, and a 2-process run where the judge is asked once per completion."""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_config_kwargs
from datasets import Dataset
from dist_suite import MEMORISING_MODEL, scenario
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast, TrainerState
from trl import TrlParser

from grpo_family.algorithms.grpo import group_advantages
from grpo_family.judges import (
    HeuristicReferenceJudge,
    JudgeConfig,
    JudgeRequest,
    JudgeVerdict,
    OpenAICompatibleJudge,
    ProgrammaticJudge,
    TransformersJudge,
    make_judge,
)
from grpo_family.judges.batch import check_judge_columns
from grpo_family.judges.steps import split_steps
from grpo_family.rewards.extract import completion_text
from grpo_family.tasks import arithmetic_reward, build_tiny_model, build_tokenizer, check_steps, split_into_steps
from grpo_family.trainers.sgpo import SGPOConfig, SGPOTrainer
from grpo_family.trainers.stages import GenerationBatch

PROBLEM = "Compute 2+3*4."
ANSWER = "14"
SOLUTION = "3*4=12\n2+12=14\nAnswer: 14"
# What the memorising policy samples: one correct response and five wrong ones whose first error comes at
# different steps, so all-negative groups get distinct trajectory scores from the exact checker.
VARIANTS = [
    SOLUTION,  # correct
    "3*4=12\n2+12=14\nAnswer: 15",  # first error at step 3 of 3 -> RTS 2/3
    "3*4=12\n2+12=16\nAnswer: 16",  # step 2 -> RTS 1/3
    "3*4=11\n2+11=13\nAnswer: 13",  # step 1 -> RTS 0
    "3*4=12\n2+12",  # truncated before its result (no answer: "2+12=14" would state 14), no error -> RTS 1
    "2+3=5\n5*4=20\nAnswer: 20",  # step 1 (precedence) -> RTS 0
]


@pytest.fixture(scope="module")
def memorising_model_dir(dist_suite):
    """Built once per session (tests/dist_suite.py: the 2-process scenario below trains it too)."""
    return dist_suite.input(MEMORISING_MODEL)


def build_memorising_model(path: Path) -> str:
    """A tiny random model fitted (~8 s) to answer PROBLEM with one of VARIANTS: a random model's output is garbage
    whose first step is always wrong (RTS 0 everywhere), so it cannot show judge-coloured advantages."""
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    prompt_ids = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": PROBLEM}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    rows = [prompt_ids + tokenizer.encode(v, add_special_tokens=False) + [tokenizer.eos_token_id] for v in VARIANTS]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, len(prompt_ids) : len(row)] = ids[i, len(prompt_ids) : len(row)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    try:
        torch.manual_seed(0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(150):
            model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def char_tokenizer(path: str) -> PreTrainedTokenizerFast:
    # AutoTokenizer (what TRL uses given a path) sees the Qwen2 config.json and builds a Qwen2Tokenizer, which drops
    # "\n" and "." from the character-level vocabulary; load the tokenizer the model was trained with instead.
    return PreTrainedTokenizerFast.from_pretrained(path)


def one_problem_dataset(n: int = 32) -> Dataset:
    prompt = [{"role": "user", "content": PROBLEM}]
    return Dataset.from_dict({"prompt": [prompt] * n, "answer": [ANSWER] * n, "solution": [SOLUTION] * n})


class Recording(SGPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []

    def transform_rewards(self, batch):
        self.base = (batch.rewards.clone(), batch.rewards_per_func.clone())
        super().transform_rewards(batch)

    def compute_advantages(self, batch):
        base, base_per_func = self.base
        advantages = super().compute_advantages(batch)
        self.records.append(
            {
                "base": base,
                "base_per_func": base_per_func,
                "trained": batch.rewards.clone(),
                "advantages": advantages.clone(),
                "texts": [completion_text(c) for c in batch.completions],
            }
        )
        return advantages


class CountingJudge(ProgrammaticJudge):
    def __init__(self):
        super().__init__()
        self.requests = []

    def judge(self, requests):
        self.requests.extend(requests)
        return super().judge(requests)


def expected_credit(text: str) -> float | None:
    """SGPO reward of an incorrect completion computed independently of the trainer (line checker + Eq. 2);
    None where the shared splitter does not give one step per line (not comparable this way)."""
    lines = split_into_steps(text)
    if split_steps(text) != lines:
        return None
    k = check_steps(PROBLEM, text)
    rts = 0.0 if not lines else 1.0 if k is None else (k - 1) / len(lines)
    return 1.0 / (1.0 + math.exp(-10.0 * (rts - 0.5)))


def metric(trainer, name):
    return [h[name] for h in trainer.state.log_history if name in h]


# ---------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"partial_credit_mode": "cubic"}, "partial_credit_mode"),
        ({"judge_scope": "everything"}, "judge_scope"),
        ({"step_splitter": "token"}, "step_splitter"),
        ({"judge_type": "oracle"}, "judge_type"),
        ({"sgpo_beta": 0.0}, "sgpo_beta"),
        ({"sgpo_gamma": math.inf}, "sgpo_gamma"),
        ({"sgpo_num_epochs": -1.0}, "sgpo_num_epochs"),
        ({"sgpo_max_steps": -1}, "sgpo_max_steps"),
        ({"judge_max_steps": 0}, "judge_max_steps"),
        ({"num_judge_votes": 0}, "num_judge_votes"),
        ({"judge_max_retries": -1}, "judge_max_retries"),
        ({"judge_batch_timeout": 0.0}, "judge_batch_timeout"),
        ({"judge_temperature": -0.1}, "judge_temperature"),
        ({"judge_temperature": math.nan}, "judge_temperature"),
        ({"judge_temperature": math.inf}, "judge_temperature"),
        ({"sgpo_no_error_policy": "zero"}, "sgpo_no_error_policy"),
        ({"judge_batch_timeout": 2000.0}, "ddp_timeout"),
    ],
)
def test_config_rejects_bad_options(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        SGPOConfig(**tiny_config_kwargs(tmp_path, **overrides))


def test_config_defaults_are_the_papers(tmp_path):
    config = SGPOConfig(**tiny_config_kwargs(tmp_path))
    assert (config.sgpo_beta, config.sgpo_gamma, config.partial_credit_mode) == (10.0, 0.5, "sigmoid")
    assert (config.judge_scope, config.sgpo_num_epochs, config.num_judge_votes) == ("all_negative", 3.0, 1)
    assert config.mask_truncated_completions is False
    assert config.sgpo_no_error_policy == "full_credit"


def test_make_judge_from_config(tmp_path, tiny_model_dir):
    assert isinstance(make_judge(SGPOConfig(**tiny_config_kwargs(tmp_path))), ProgrammaticJudge)
    heuristic = make_judge(SGPOConfig(**tiny_config_kwargs(tmp_path, judge_type="heuristic")))
    assert isinstance(heuristic, HeuristicReferenceJudge)
    with pytest.raises(ValueError, match="judge_base_url"):
        make_judge(SGPOConfig(**tiny_config_kwargs(tmp_path, judge_type="openai")))
    template = tmp_path / "t.txt"
    template.write_text("[user]\n{steps}")
    judge = make_judge(
        SGPOConfig(
            **tiny_config_kwargs(
                tmp_path,
                judge_type="openai",
                judge_base_url="http://127.0.0.1:8000/v1",
                judge_model="Qwen/QwQ-32B",
                num_judge_votes=4,
                judge_timeout=30.0,
                judge_max_retries=1,
                judge_concurrency=8,
                judge_batch_timeout=100.0,
                judge_prompt_template_path=str(template),
            )
        )
    )
    assert isinstance(judge, OpenAICompatibleJudge)
    assert (judge.num_votes, judge.temperature, judge.timeout, judge.max_retries) == (4, 0.6, 30.0, 1)
    assert (judge.concurrency, judge.batch_timeout, judge.template.user) == (8, 100.0, "{steps}")
    with pytest.raises(ValueError, match="judge_model"):
        make_judge(SGPOConfig(**tiny_config_kwargs(tmp_path, judge_type="transformers")))
    local = make_judge(
        SGPOConfig(**tiny_config_kwargs(tmp_path, judge_type="transformers", judge_model=tiny_model_dir))
    )
    assert isinstance(local, TransformersJudge) and local.temperature == 0.0


def test_judge_settings_are_one_object_read_from_the_flat_fields(tmp_path):
    """``SGPOConfig.judge`` is the JudgeConfig of the flat ``judge_*`` fields: every JudgeConfig field names an
    SGPOConfig field with the same default, a flat value set after construction is what the judge code reads, and a
    bad setting is refused when the config is built, naming the flag."""
    config = SGPOConfig(**tiny_config_kwargs(tmp_path))
    sgpo_fields = {f.name: f for f in dataclasses.fields(SGPOConfig)}
    for field in dataclasses.fields(JudgeConfig):
        flag = field.metadata["flag"]
        assert flag in sgpo_fields, flag
        assert sgpo_fields[flag].default == field.default, flag
        assert sgpo_fields[flag].metadata["help"] == field.metadata["help"], flag  # declared once, in JudgeConfig
    assert config.judge == JudgeConfig()
    config.judge_answer_column, config.num_judge_votes = "final_answer", 3
    assert (config.judge.answer_column, config.judge.num_votes) == ("final_answer", 3)
    with pytest.raises(ValueError, match="--judge_max_steps must be an integer >= 1"):
        SGPOConfig(**tiny_config_kwargs(tmp_path, judge_max_steps=0))
    with pytest.raises(ValueError, match="--judge_type must be one of"):
        JudgeConfig(type="oracle")  # built alone: the same bounds, under the flags' names


def test_structured_judge_verdicts_from_the_command_line(tmp_path):
    """`--judge_structured_output true` (TRL's parser, as examples/train.py parses) reaches the served judge, which
    then asks for the verdict JSON; the flag is refused for a judge it cannot apply to."""
    served = ["--judge_type", "openai", "--judge_base_url", "http://127.0.0.1:8000/v1", "--judge_model", "m"]
    argv = ["--output_dir", str(tmp_path), "--use_cpu", "true", *served, "--judge_structured_output", "true"]
    [config] = TrlParser((SGPOConfig,)).parse_args_into_dataclasses(argv)
    judge = make_judge(config)
    assert judge.structured and b'"response_format"' in judge._request_body(
        JudgeRequest("p", "r", "a", ("s1", "s2", "s3"))
    )
    assert not make_judge(SGPOConfig(**tiny_config_kwargs(tmp_path, judge_type="openai", judge_base_url="http://x/v1",
                                                          judge_model="m"))).structured  # fmt: skip
    with pytest.raises(ValueError, match="judge_structured_output applies to judge_type='openai'"):
        SGPOConfig(**tiny_config_kwargs(tmp_path, judge_type="heuristic", judge_structured_output=True))


def test_trainer_set_up_errors(tiny_model_dir, config_kwargs):
    gsm8k_like = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "Natalia sold 48 clips. How many?"}]] * 8, "answer": ["72"] * 8}
    )
    with pytest.raises(ValueError, match="arithmetic task only"):
        SGPOTrainer(
            model=tiny_model_dir,
            reward_funcs=[arithmetic_reward],
            args=SGPOConfig(**config_kwargs()),
            train_dataset=gsm8k_like,
        )
    with pytest.raises(ValueError, match="correctness_reward"):
        SGPOTrainer(
            model=tiny_model_dir,
            reward_funcs=[arithmetic_reward],
            args=SGPOConfig(**config_kwargs(correctness_reward="accuracy")),
            train_dataset=one_problem_dataset(),
        )


# ---------------------------------------------------------------------------------------------------- the hook alone
_CONFIG_DIR = tempfile.mkdtemp(prefix="sgpo-hook-")


class ScriptedJudge:
    """Verdicts fixed in advance per completion (docs/methods/sgpo.md §3.5 item 3); the completion's index is in its steps."""

    def __init__(self, verdicts: dict[int, list], num_steps: dict[int, int]):
        self.verdicts, self.num_steps, self.requests = verdicts, num_steps, []

    def judge(self, requests):
        self.requests.extend(requests)
        out = []
        for r in requests:
            index = int(r.steps[0].split("-")[0][1:])
            assert len(r.steps) == self.num_steps[index]  # the shared splitter's K
            votes = self.verdicts[index]
            out.append(JudgeVerdict.from_votes(votes, len(r.steps), [""] * len(votes), [""] * len(votes), len(votes)))
        return out


def bare_trainer(judge, **overrides) -> SGPOTrainer:
    """An SGPOTrainer with just what its reward-transform and advantage stages read (single process, no model)."""
    trainer = object.__new__(SGPOTrainer)
    trainer.args = SGPOConfig(**tiny_config_kwargs(_CONFIG_DIR, **overrides))
    trainer.judge = judge
    trainer._correct_index = 0
    trainer.reward_weights = torch.ones(1)
    trainer.scale_rewards = trainer.args.scale_rewards
    trainer.multi_objective_aggregation = "sum_then_normalize"
    trainer.state = TrainerState(epoch=0.0, global_step=0)
    trainer.accelerator = SimpleNamespace(process_index=0, is_main_process=True, device=torch.device("cpu"))
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.model = SimpleNamespace(training=True)
    return trainer


def sigmoid_credit(rts: float) -> float:
    return 1.0 / (1.0 + math.exp(-10.0 * (rts - 0.5)))


groups = st.integers(1, 4).flatmap(
    lambda p: st.integers(2, 5).flatmap(
        lambda g: st.lists(
            st.tuples(
                st.booleans(),  # correct
                st.integers(0, 5),  # K
                st.lists(st.one_of(st.none(), st.integers(1, 5), st.just(math.nan)), min_size=1, max_size=3),  # votes
            ),
            min_size=p * g,
            max_size=p * g,
        ).map(lambda rows, g=g: (g, rows))
    )
)


@settings(max_examples=40, deadline=None)
@given(groups, st.sampled_from(["all_negative", "all_incorrect"]))
def test_hook_matches_the_spec_on_scripted_verdicts(case, scope):
    group_size, rows = case
    verdicts, num_steps, texts, correct = {}, {}, [], []
    for n, (ok, k, votes) in enumerate(rows):
        votes = [v if (v is None or (isinstance(v, float)) or v <= k) else k for v in votes]  # keep votes in range
        verdicts[n], num_steps[n] = votes, k
        texts.append("\n\n".join(f"c{n}-{j}" for j in range(k)))
        correct.append(1.0 if ok else 0.0)
    judge = ScriptedJudge(verdicts, num_steps)
    trainer = bare_trainer(judge, judge_scope=scope)
    base = torch.tensor(correct).view(-1, group_size)
    batch = stage_batch(
        trainer,
        base,
        inputs=[{"prompt": [{"role": "user", "content": "p"}], "answer": "a", "solution": "s"}] * len(rows),
        completions=[[{"role": "assistant", "content": t}] for t in texts],
    )
    advantages = advantage_stages(trainer, batch)

    from grpo_family.algorithms.sgpo import vote_first_error

    expected = base.clone().double()
    sent = set()
    for b in range(base.size(0)):
        judged = (scope == "all_negative" and not base[b].any()) or (scope == "all_incorrect" and not base[b].all())
        for i in range(group_size):
            n = b * group_size + i
            if not judged or correct[n]:
                continue
            k = num_steps[n]
            if k == 0:
                expected[b, i] = sigmoid_credit(0.0)
                continue
            sent.add(n)
            verdict = vote_first_error(verdicts[n], k)
            if isinstance(verdict, float):
                expected[b, i] = math.nan
            else:
                expected[b, i] = sigmoid_credit(1.0 if verdict is None else (verdict - 1) / k)
    trained = batch.rewards.double()
    # tol: the trained rewards are float32 sigmoid credits in (0, 1), the expected ones float64: the float32 side's
    # computation (a subtraction, a scaling, exp, a division: ~4 roundings) and its storage are each <= 2^-24 of a
    # value <= 1, ~3e-7 in all; 1e-6 is ~8 ULP of 1.
    assert torch.allclose(trained, expected, atol=1e-6, equal_nan=True)
    assert torch.equal(advantages, group_advantages(batch.rewards))
    # Groups outside the scope are bit-identical to GRPO.
    for b in range(base.size(0)):
        if (scope == "all_negative" and base[b].any()) or (scope == "all_incorrect" and base[b].all()):
            assert torch.equal(advantages[b], group_advantages(base)[b])
    # Each judged completion is sent once (docs/methods/sgpo.md §11 item 16: M votes per incorrect completion of a judged group).
    assert sorted(int(r.steps[0].split("-")[0][1:]) for r in judge.requests) == sorted(sent)
    calls = trainer._metrics["train"]["sgpo/judge_calls"]
    assert calls == [float(sum(len(verdicts[n]) for n in sent))]


def test_hook_outside_the_window_is_grpo_and_never_calls_the_judge():
    judge = ScriptedJudge({0: [2], 1: [1]}, {0: 2, 1: 2})
    trainer = bare_trainer(judge, sgpo_num_epochs=3.0)
    trainer.state.epoch = 3.0
    base = torch.zeros(1, 2)
    batch = stage_batch(
        trainer, base, inputs=[{"prompt": "p", "answer": "a"}] * 2, completions=["c0-0\n\nc0-1", "c1-0\n\nc1-1"]
    )
    assert torch.equal(advantage_stages(trainer, batch), torch.zeros(1, 2))
    assert judge.requests == [] and batch.rewards is batch.raw_rewards  # the rewards were left as they were
    assert trainer._metrics["train"]["sgpo/active"] == [0.0]
    trainer.state.epoch = 2.99
    advantage_stages(trainer, stage_batch(trainer, base, inputs=batch.inputs, completions=batch.completions))
    assert len(judge.requests) == 2 and trainer._metrics["train"]["sgpo/active"] == [0.0, 1.0]
    # Eval batches are never judged.
    advantage_stages(
        trainer, stage_batch(trainer, base, inputs=batch.inputs, completions=batch.completions, mode="eval")
    )
    assert len(judge.requests) == 2


def stage_batch(trainer, base, **fields):
    """The generation batch the stages receive for the correctness rewards ``base`` ``(P, G)``."""
    rewards = base.clone()
    values = dict(mode="train", num_generations=base.size(1), rewards_per_func=base.reshape(-1, 1).clone())
    values.update(raw_rewards=rewards, rewards=rewards, logger=trainer.log_method_metric, method="sgpo")
    return GenerationBatch(**{**values, **fields})


def advantage_stages(trainer, batch):
    """What the base class runs on a generation batch's rewards: the reward-transform stage, then the advantages."""
    trainer.transform_rewards(batch)
    return trainer.compute_advantages(batch)


def hook_batch(trainer, texts, correct, group_size, **row):
    """``(base rewards, batch)`` as the stages receive them; ``texts`` are strings or completions."""
    base = torch.tensor(correct, dtype=torch.float32).view(-1, group_size)
    row = {"prompt": [{"role": "user", "content": "p"}], "answer": "a", "solution": "s", **row}
    completions = [[{"role": "assistant", "content": t}] if isinstance(t, str) else t for t in texts]
    return base, stage_batch(trainer, base, inputs=[row] * len(texts), completions=completions)


def numbered_texts(num_steps):
    """Completion n has num_steps[n] paragraphs "c{n}-{j}" (ScriptedJudge reads n back from the first step)."""
    return ["\n\n".join(f"c{n}-{j}" for j in range(k)) for n, k in enumerate(num_steps)]


# docs/methods/sgpo.md §13, E2 / E4 / E5 / E6 through the trainer's advantage path (judge -> vote -> RTS -> reward -> GRPO).
@pytest.mark.parametrize(
    "num_steps, votes, expected",
    [
        (  # E2: G = 8, one vote each
            [10, 12, 8, 5, 20, 6, 15, 4],
            [[3], [10], [None], [1], [11], [4], [10], [2]],
            [-1.072249, 1.140252, 1.314800, -1.175044, 0.069878, 0.069878, 0.652983, -1.000497],
        ),
        (  # E4: a judge failure, an empty response (never sent) and a no-error verdict
            [10, 10, 7, 0, 9, 16],
            [[4], [4], [math.nan], None, [None], [9]],
            [-0.562033, -0.562033, 0.0, -0.838797, 1.588174, 0.374689],
        ),
        (  # E5: M = 4 votes, majority with ties to the smallest position
            [10, 8, 5, 12],
            [[4, 4, 6, math.nan], [None, None, 7, 7], [2, 3, 2, 3], [9, None, 9, 10]],
            [-0.784401, 0.951285, -0.939174, 0.772289],
        ),
    ],
    ids=["E2", "E4", "E5"],
)
def test_hook_reproduces_the_spec_worked_examples(num_steps, votes, expected):
    verdicts = {n: v for n, v in enumerate(votes) if v is not None}
    judge = ScriptedJudge(verdicts, dict(enumerate(num_steps)))
    trainer = bare_trainer(judge)
    base, batch = hook_batch(trainer, numbered_texts(num_steps), [0.0] * len(num_steps), len(num_steps))
    advantages = advantage_stages(trainer, batch)
    # tol: the spec's worked advantages are printed to 6 decimals (<= 5e-7 off) and computed here in float32 (mean,
    # std, division on |A| <= ~1.5: ~4 roundings of <= 1.5 x 2^-24 ~ 4e-7): 2e-6 covers both.
    torch.testing.assert_close(advantages, torch.tensor([expected]), atol=2e-6, rtol=0)
    assert len(judge.requests) == len(verdicts)


def test_hook_reproduces_e6_inside_and_after_the_window():
    correct = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    num_steps = [1, 1, 1, 1, 1, 1, 1, 1, 8, 10, 3, 16]
    judge = ScriptedJudge({8: [7], 9: [2], 10: [None], 11: [4]}, dict(enumerate(num_steps)))
    trainer = bare_trainer(judge, sgpo_num_epochs=3.0)
    base, batch = hook_batch(trainer, numbered_texts(num_steps), correct, 4)
    inside = advantage_stages(trainer, batch)
    expected = [[0, 0, 0, 0], [-0.4999, 1.4997, -0.4999, -0.4999], [0.800134, -0.886957, 0.928907, -0.842085]]
    # tol: as for E2-E5: 6-decimal worked values (5e-7) + ~4 float32 roundings of |A| <= 1.5 (~4e-7); the 4-decimal
    # values -0.4999 and 1.4997 are GRPO's -0.25 / 0.5001 and 0.75 / 0.5001, within 2e-7 of exact.
    torch.testing.assert_close(inside, torch.tensor(expected), atol=2e-6, rtol=0)
    assert len(judge.requests) == 4 and trainer._metrics["train"]["sgpo/judge_calls"] == [4.0]
    trainer.state.epoch = 3.0
    base, batch = hook_batch(trainer, numbered_texts(num_steps), correct, 4)
    after = advantage_stages(trainer, batch)
    expected = [[0, 0, 0, 0], [-0.4999, 1.4997, -0.4999, -0.4999], [0, 0, 0, 0]]
    # tol: the same worked values as inside the window (6-decimal printing + ~4 float32 roundings of |A| <= 1.5).
    torch.testing.assert_close(after, torch.tensor(expected), atol=2e-6, rtol=0)
    assert len(judge.requests) == 4  # no judge call after the window


class ReportingJudge:
    """Verdicts with the model calls a judge with retries / greedy votes reports (JudgeVerdict.num_calls)."""

    def __init__(self, script):
        self.script = script  # n -> (votes, num_calls or None)

    def judge(self, requests):
        out = []
        for r in requests:
            votes, calls = self.script[int(r.steps[0].split("-")[0][1:])]
            out.append(JudgeVerdict.from_votes(votes, len(r.steps), [""] * len(votes), [""] * len(votes), calls))
        return out


def test_judge_calls_counts_the_model_calls_the_judge_reports():
    script = {
        0: ([3], 3),  # valid after two retries
        1: ([math.nan], 3),  # failed after two retries
        2: ([None], None),  # not reported: one call per vote
        3: ([2, 2], 1),  # M = 2 greedy votes from one generation
    }
    trainer = bare_trainer(ReportingJudge(script))
    base, batch = hook_batch(trainer, numbered_texts([4, 4, 4, 4]), [0.0] * 4, 4)
    advantage_stages(trainer, batch)
    metrics = trainer._metrics["train"]
    assert metrics["sgpo/judge_requests"] == [4.0]
    assert metrics["sgpo/judge_calls"] == [3.0 + 3.0 + 1.0 + 1.0]  # not the 5 votes


class RecordingJudge:
    """Answers NONE to everything and keeps the requests."""

    def __init__(self):
        self.requests = []

    def judge(self, requests):
        self.requests.extend(requests)
        return [JudgeVerdict([None], None, [""], [""], 1) for _ in requests]


def test_judge_sees_the_reasoning_trl_parsed_out_of_the_completion():
    # With a response schema (tools, or a tokenizer that ships one) TRL 1.16 moves the <think> block into
    # reasoning_content / thinking; docs/methods/sgpo.md §2.2 item 1: the judge sees the whole completion.
    completions = [
        [{"role": "assistant", "reasoning_content": "3*4=12\n\n2+12=15", "content": "Answer: 15"}],
        [{"role": "assistant", "thinking": "3*4=11\n\nso 13", "content": ""}],  # cut off after the reasoning
        [{"role": "assistant", "content": "<think>\n3*4=12\n</think>\n\nAnswer: 16"}],  # not parsed: as is
        "3*4=12\n\nAnswer: 17",
    ]
    judge = RecordingJudge()
    trainer = bare_trainer(judge)
    base, batch = hook_batch(trainer, completions, [0.0] * 4, 4)
    advantage_stages(trainer, batch)
    seen = [list(r.steps) for r in judge.requests]
    assert seen == [
        split_steps("<think>\n3*4=12\n\n2+12=15\n</think>\n\nAnswer: 15"),
        split_steps("<think>\n3*4=11\n\nso 13\n</think>"),
        split_steps("<think>\n3*4=12\n</think>\n\nAnswer: 16"),
        split_steps("3*4=12\n\nAnswer: 17"),
    ]
    assert seen[0] == ["<think>\n3*4=12", "2+12=15\n</think>", "Answer: 15"]
    # The answer rewards still read the content alone (the shared completion_text is unchanged).
    assert completion_text(completions[0]) == "Answer: 15"


class KeyedJudge:
    """Votes per completion text (its steps joined by blank lines)."""

    def __init__(self, votes_by_text):
        self.votes_by_text = votes_by_text

    def judge(self, requests):
        out = []
        for r in requests:
            votes = self.votes_by_text["\n\n".join(r.steps)]
            out.append(JudgeVerdict.from_votes(votes, len(r.steps), [""], [""], 1))
        return out


NO_ERROR_TEXTS = [
    "3*4=12\n\n2+12=14\n\nAnswer: 15",  # K = 3, NONE, wrong final answer -> last_step: k = 3, RTS 2/3
    "3*4=12\n\n2+12=14",  # K = 2, NONE, truncated (no answer) -> RTS 1 either way
    "a = 1\n\nb = 2\n\nc = 3\n\nso \\boxed{7}",  # K = 4, NONE, boxed answer -> last_step: RTS 3/4
    "a = 1\n\nb = 2\n\nc = 3\n\nd = 4",  # K = 4, first error 2 -> RTS 1/4 either way
]


@pytest.mark.parametrize(
    "policy, rewards, advantages, rts_mean",
    [
        (  # sigmoid(10 (RTS - 0.5)) from the E1 table of docs/methods/sgpo.md §13; A worked out with math.exp alone
            "last_step",
            [0.841131, 0.993307, 0.924142, 0.075858],
            [0.310721, 0.667526, 0.505355, -1.483601],
            (2 / 3 + 1 + 3 / 4 + 1 / 4) / 4,
        ),
        ("full_credit", [0.993307, 0.993307, 0.993307, 0.075858], [0.499891, 0.499891, 0.499891, -1.499673], 0.8125),
    ],
)
def test_no_error_policy_in_the_hook(policy, rewards, advantages, rts_mean):
    votes = {text: [None] for text in NO_ERROR_TEXTS[:3]} | {NO_ERROR_TEXTS[3]: [2]}
    trainer = bare_trainer(KeyedJudge(votes), sgpo_no_error_policy=policy)
    base, batch = hook_batch(trainer, NO_ERROR_TEXTS, [0.0] * 4, 4)
    got = advantage_stages(trainer, batch)
    # tol: the E1 rewards are printed to 6 decimals (<= 5e-7 off) and are float32 sigmoid credits in (0, 1) (~4
    # roundings of 2^-24 each): 2e-6.
    torch.testing.assert_close(batch.rewards, torch.tensor([rewards]), atol=2e-6, rtol=0)
    # tol: the advantages come from the float32 rewards (each already <= ~8e-7 off the 6-decimal values) through a
    # mean, a std and a division by std ~ 0.4 that amplifies the rewards' error by up to ~1 / std ~ 2.5: ~2e-6 + the
    # 6-decimal printing (5e-7) < 5e-6.
    torch.testing.assert_close(got, torch.tensor([advantages]), atol=5e-6, rtol=0)
    metrics = trainer._metrics["train"]
    # tol: pytest.approx's default rel 1e-6 on a mean of four RTS values in [0, 1] computed in float32 (<= 4 roundings
    # of 2^-24 relative each, ~2.4e-7) against the float64 worked value.
    assert metrics["sgpo/rts_mean"] == [pytest.approx(rts_mean)] and metrics["sgpo/rts_max"] == [1.0]


def test_judge_answer_column_is_checked_against_the_training_set(caplog):
    trainer = bare_trainer(None)
    prompt = [{"role": "user", "content": PROBLEM}]
    trainer.train_dataset = Dataset.from_dict({"prompt": [prompt], "final_answer": ["14"], "solution": [SOLUTION]})
    with pytest.raises(ValueError, match="judge_answer_column 'answer' is not a training-set column"):
        check_judge_columns(trainer.args.judge, trainer.train_dataset, None)
    trainer.args.judge_answer_column = "final_answer"
    check_judge_columns(trainer.args.judge, trainer.train_dataset, None)  # the right column: fine
    # No reference column: the warning names the gold-answer column the judge sees instead, which exists.
    trainer.train_dataset = Dataset.from_dict({"prompt": [prompt], "final_answer": ["14"]})
    with caplog.at_level(logging.WARNING, logger="grpo_family.judges.batch"):
        check_judge_columns(trainer.args.judge, trainer.train_dataset, None)
    assert "gold answer (column 'final_answer')" in caplog.text
    # ... and the judge is sent that column's value.
    judge = RecordingJudge()
    trainer = bare_trainer(judge, judge_answer_column="final_answer")
    base, batch = hook_batch(trainer, ["a\n\nb", "c\n\nd"], [0.0, 0.0], 2, final_answer="14")
    advantage_stages(trainer, batch)
    assert [r.gold_answer for r in judge.requests] == ["14", "14"]


# ---------------------------------------------------------------------------------------------------- training
def test_judge_colours_all_negative_groups_and_mixed_groups_stay_grpo(memorising_model_dir, config_kwargs):
    # A small learning rate keeps the second batch sampled from the memorised mixture too.
    config = SGPOConfig(
        **config_kwargs(per_device_train_batch_size=16, max_completion_length=32, max_steps=2, learning_rate=1e-5)
    )
    trainer = Recording(
        model=memorising_model_dir,
        reward_funcs=[arithmetic_reward],
        args=config,
        train_dataset=one_problem_dataset(),
        processing_class=char_tokenizer(memorising_model_dir),
    )
    trainer.judge = counting = CountingJudge()
    trainer.train()

    mixed = coloured = compared = expected_calls = 0
    for record in trainer.records:
        base, trained, advantages = record["base"], record["trained"], record["advantages"]
        texts = record["texts"]
        correct = base == 1.0
        assert torch.equal(base, record["base_per_func"][:, 0].view_as(base))
        reference = group_advantages(base)
        for g in range(base.size(0)):
            if correct[g].any():  # >= 1 correct answer: bit-identical to GRPO, no judge call
                mixed += int(not correct[g].all())
                assert torch.equal(trained[g], base[g])
                assert torch.equal(advantages[g], reference[g])
                continue
            expected_calls += sum(bool(texts[g * 4 + i].strip()) for i in range(4))
            assert ((trained[g] > 0) & (trained[g] < 1)).all()  # partial credit strictly inside (0, 1)
            for i in range(4):
                want = expected_credit(texts[g * 4 + i])
                if want is not None:
                    compared += 1
                    # tol: a float32 sigmoid credit in (0, 1) against its float64 value: ~4 roundings of 2^-24 (~3e-7);
                    # 1e-6 is ~8 ULP of 1.
                    assert trained[g, i].item() == pytest.approx(want, abs=1e-6)
            # tol: allclose's defaults (rtol 1e-5, atol 1e-8) on the same group_advantages of the same float32 rewards:
            # the same operations, differing at most by a reduction order (~2 ULP of |A| <= 1.5).
            assert torch.allclose(advantages[g], group_advantages(trained[g : g + 1])[0])
            coloured += int(advantages[g].abs().sum() > 0)
    assert mixed > 0 and coloured > 0 and compared > 0, (mixed, coloured, compared)
    assert len(counting.requests) == expected_calls
    assert metric(trainer, "sgpo/judge_requests") and sum(metric(trainer, "sgpo/judge_requests")) == expected_calls
    assert max(metric(trainer, "sgpo/judged_groups")) >= 1 and metric(trainer, "sgpo/judge_failures") == [0.0, 0.0]
    assert all(0 <= r <= 1 for r in metric(trainer, "sgpo/rts_mean"))
    # The logged reward is what was trained on.
    trained_means = [torch.nanmean(r["trained"]).item() for r in trainer.records]
    # tol: pytest.approx's default rel 1e-6: the logged reward and nanmean of the same float32 rewards in [0, 1] (a
    # mean over <= 16 values, each addition a rounding of 2^-24 relative: <= 1e-6).
    assert metric(trainer, "reward") == pytest.approx(trained_means)


# RTS the heuristic judge gives each wrong variant, worked out by hand: no stated result off the reference
# ("3*4=12", "2+12=14") -> the final answer's step (3 of 3); 16 at step 2; 11 at step 1; truncated, nothing off
# the reference and no answer -> NONE; 5 at step 1.
HEURISTIC_RTS = {VARIANTS[1]: 2 / 3, VARIANTS[2]: 1 / 3, VARIANTS[3]: 0.0, VARIANTS[4]: 1.0, VARIANTS[5]: 0.0}


def test_heuristic_judge_trains_from_the_config(memorising_model_dir, config_kwargs):
    config = SGPOConfig(
        **config_kwargs(
            per_device_train_batch_size=16,
            max_completion_length=32,
            max_steps=2,
            learning_rate=1e-5,
            judge_type="heuristic",
        )
    )
    trainer = Recording(
        model=memorising_model_dir,
        reward_funcs=[arithmetic_reward],
        args=config,
        train_dataset=one_problem_dataset(),
        processing_class=char_tokenizer(memorising_model_dir),
    )
    assert isinstance(trainer.judge, HeuristicReferenceJudge)
    trainer.train()
    compared = coloured = 0
    for record in trainer.records:
        base, trained, advantages, texts = record["base"], record["trained"], record["advantages"], record["texts"]
        for g in range(base.size(0)):
            if (base[g] == 1).any():
                assert torch.equal(trained[g], base[g])
                continue
            for i in range(4):
                rts = HEURISTIC_RTS.get(texts[g * 4 + i])
                if rts is not None:
                    compared += 1
                    # tol: a float32 sigmoid credit in (0, 1) against its float64 value: ~4 roundings of 2^-24 (~3e-7);
                    # 1e-6 is ~8 ULP of 1.
                    assert trained[g, i].item() == pytest.approx(sigmoid_credit(rts), abs=1e-6)
            coloured += int(advantages[g].abs().sum() > 0)
    assert compared > 0 and coloured > 0, (compared, coloured)
    assert metric(trainer, "sgpo/judge_failures") == [0.0, 0.0]


def test_random_model_groups_are_judged_only_inside_the_window(tiny_model_dir, arithmetic_train, config_kwargs):
    # The random model gets everything wrong: every group is all-negative and goes to the judge (RTS 0: its first
    # step is never a valid operation), until sgpo_max_steps closes the window and the run is plain GRPO.
    config = SGPOConfig(**config_kwargs(max_steps=2, sgpo_max_steps=1))
    trainer = Recording(
        model=tiny_model_dir, reward_funcs=[arithmetic_reward], args=config, train_dataset=arithmetic_train
    )
    trainer.judge = counting = CountingJudge()
    trainer.train()
    first, second = trainer.records
    assert (first["base"] == 0).all() and (second["base"] == 0).all()
    assert metric(trainer, "sgpo/active") == [1.0, 0.0]
    assert metric(trainer, "sgpo/frac_all_negative") == [1.0]
    assert len(counting.requests) == sum(bool(t.strip()) for t in first["texts"]) > 0
    # tol: allclose's defaults (rtol 1e-5, atol 1e-8): float32 sigmoid(-5) ~ 6.7e-3 against float64, ~4 roundings of
    # 2^-24 relative (~2.4e-7 relative), under rtol 1e-5.
    assert torch.allclose(first["trained"], torch.full_like(first["trained"], 1 / (1 + math.exp(5))))
    assert (first["advantages"] == 0).all()  # equal RTS -> no signal (docs/methods/sgpo.md §11 property 9)
    assert torch.equal(second["trained"], second["base"]) and torch.equal(
        second["advantages"], group_advantages(second["base"])
    )


def test_judge_down_gives_nan_rewards_a_warning_and_a_metric(tiny_model_dir, arithmetic_train, config_kwargs, caplog):
    with socket.socket() as s:  # a loopback port nobody listens on: the judge server is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = SGPOConfig(
        **config_kwargs(
            judge_type="openai",
            judge_base_url=f"http://127.0.0.1:{port}/v1",
            judge_model="judge",
            judge_timeout=2.0,
            judge_max_retries=0,
            judge_batch_timeout=5.0,
        )
    )
    trainer = Recording(
        model=tiny_model_dir, reward_funcs=[arithmetic_reward], args=config, train_dataset=arithmetic_train
    )
    with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.sgpo"):
        trainer.train()
    assert trainer.state.global_step == 2  # training went on
    assert "SGPO judge failed" in caplog.text and "connection error" in caplog.text
    assert metric(trainer, "sgpo/judge_failure_rate") == [1.0, 1.0]
    assert all(f > 0 for f in metric(trainer, "sgpo/judge_failures"))
    # Refused at once ("connection error" above), not waited out: no vote reached the batch deadline.
    assert "batch deadline" not in caplog.text
    for record in trainer.records:
        judged = torch.tensor([bool(t.strip()) for t in record["texts"]]).view_as(record["base"])
        assert torch.isnan(record["trained"][judged]).all() and (record["advantages"] == 0).all()


class MisbehavingJudge:
    """First batch: nonsense verdicts (out of range, wrong type, too few); second batch: hangs."""

    def __init__(self):
        self.batches = 0
        self.release = threading.Event()  # set by the test after training: the hang ends only then

    def judge(self, requests):
        self.batches += 1
        if self.batches == 1:
            junk = [99, "three", JudgeVerdict([0], 0), True, -1]
            return [junk[i % len(junk)] for i in range(len(requests))]
        self.release.wait()
        return [None] * len(requests)


def test_slow_or_nonsense_judge_costs_at_most_the_timeout(tiny_model_dir, arithmetic_train, config_kwargs, caplog):
    config = SGPOConfig(**config_kwargs(judge_batch_timeout=0.5))
    judge = MisbehavingJudge()
    trainer = Recording(
        model=tiny_model_dir,
        reward_funcs=[arithmetic_reward],
        args=config,
        train_dataset=arithmetic_train,
        judge=judge,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.sgpo"):
            trainer.train()  # the second batch's judge never returns by itself: only the deadline ends the wait
    finally:
        judge.release.set()
    assert trainer.state.global_step == 2 and judge.batches == 2
    assert "invalid verdict" in caplog.text and "judge_batch_timeout" in caplog.text
    assert metric(trainer, "sgpo/judge_failure_rate") == [1.0, 1.0]
    assert metric(trainer, "sgpo/judge_latency_s")[1] >= 0.5  # the deadline was waited out, not skipped
    for record in trainer.records:
        assert (record["advantages"] == 0).all()


# ---------------------------------------------------------------------------------------------------- 2 processes
@scenario("sgpo_judge_once", MEMORISING_MODEL, PROBLEM, ANSWER, SOLUTION)
def test_two_processes_judge_once_per_completion(dist_output):
    # The run's reward marks every completion wrong, so every group is all-negative whatever is sampled and the
    # judge is asked on every step (with the arithmetic reward this was left to sampling, and one package upgrade
    # sampled no all-negative group: the test then checked nothing). Mixed groups staying GRPO is shown by the
    # single-process test above.
    rank0, rank1 = (torch.load(dist_output / f"rank{r}.pt") for r in (0, 1))
    assert rank1["calls"] == [] and len(rank0["calls"]) == 2  # only the main process asks, once per batch
    assert len(rank0["records"]) == len(rank1["records"]) == 2
    judged_steps = []
    for r0, r1 in zip(rank0["records"], rank1["records"]):
        assert r0["base"].shape == (3, 4)  # 12 completions, 3 groups, the middle one split 2 + 2
        assert (r0["base"] == 0).all()  # the subject: every group all-negative
        torch.testing.assert_close(r0["trained"], r1["trained"], rtol=0, atol=0, equal_nan=True)
        assert torch.equal(r0["advantages"], r1["advantages"])
        texts = r0["texts"] + r1["texts"]  # the global order: rank 0's slice, then rank 1's
        trained = r0["trained"]
        for g in range(3):
            for i, text in enumerate(texts[g * 4 : (g + 1) * 4]):
                if text.strip():
                    judged_steps.append(split_steps(text))
                want = expected_credit(text)
                if want is not None:
                    # tol: a float32 sigmoid credit in (0, 1) against its float64 value: ~4 roundings of 2^-24 (~3e-7);
                    # 1e-6 is ~8 ULP of 1.
                    assert trained[g, i].item() == pytest.approx(want, abs=1e-6)
    # Every incorrect completion was sent exactly once, in one call per batch.
    sent = [steps for call in rank0["calls"] for steps in call]
    assert sorted(map(tuple, sent)) == sorted(map(tuple, judged_steps)) and sent
