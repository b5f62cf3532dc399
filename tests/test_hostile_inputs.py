"""Hostile and broken inputs (issue 10, part 2): each gets a clear outcome.

Either an error that names the problem before training starts, or -- during training -- the affected completions
become unscorable (NaN reward, zero advantage) with a warning and a metric; never a crash mid-run, a hang, or a NaN
in the weights. The table of what each input gets is ``benchmarks/results/hostile_inputs.md``.

"Bounded" below means: the call returns, checked from a watchdog thread (so also off the main thread) that turns a
hang into a failure instead of a hung suite. Its limit is conftest's ``HANG_GUARD_S`` (10 minutes), a liveness guard
and not a budget: no test asserts on the machine's speed (a 60 s budget once failed on a loaded machine where a
reward took 9 s). The behaviours it guards against (regex backtracking, parser bombs) take hours on a 1 MB input;
where the subject is a deadline, the test checks the deadline's outcome (the timeout error or status, the hung work
not finished), not the time.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import HANG_GUARD_S, digit_share_reward
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from method_cases import case
from test_judges import FakeOpenAI, ScriptedLM, completion

from grpo_family import METHODS
from grpo_family.errors import RewardFunctionError, RewardTimeoutError
from grpo_family.judges import (
    JudgeRequest,
    OpenAICompatibleJudge,
    ProgrammaticJudge,
    PromptTemplate,
    TransformersJudge,
    parse_verdict,
    strip_reasoning,
)
from grpo_family.judges.batch import _clean_verdict
from grpo_family.judges.steps import split_steps
from grpo_family.rewards import get_reward_funcs, reward_names
from grpo_family.rewards.math import MathAccuracyReward
from grpo_family.rewards.timeout import get_runner, with_timeout
from grpo_family.runtime.reward_guards import GuardedReward
from grpo_family.runtime.setup_checks import is_empty_prompt

MB = 1_000_000


def bounded(fn: Callable, *args: Any, _guard_s: float = HANG_GUARD_S, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run in a daemon thread (so also off the main thread); fails if it has not returned
    after ``_guard_s`` (a hang) instead of hanging the suite, and re-raises what it raised."""
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            box["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(_guard_s)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} did not return within {_guard_s} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def is_fail(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


# ------------------------------------------------------------------------------------------------ hostile texts
# Each id names what the text attacks. The 1 MB ones with many unclosed tags / long whitespace runs took minutes to
# hours before the fixes in rewards/extract.py, choice.py, qa.py and judges.py (regex backtracking).
HOSTILE_TEXTS = {
    "empty": "",
    "whitespace_only": " \n\t\r\n ",
    "1MB_plain": "x" * MB,
    "1MB_unclosed_answer_tags": "<answer>" * (MB // 8),
    "1MB_unclosed_think_tags": "<think>" * (MB // 7),
    "1MB_stray_think_closes": "</think>" * (MB // 8),
    "1MB_mismatched_think_blocks": "<think>x</thinking>" * (MB // 19),
    "1MB_unclosed_boxes": "\\boxed{" * (MB // 7),
    "1MB_nested_braces": "\\boxed{" + "{" * (MB // 2) + "}" * (MB // 2) + "}",
    "1MB_digits_in_a_box": "\\boxed{" + "9" * MB + "}",
    "1MB_lines": "1+2=3\n" * (MB // 6),
    "anchor_then_300k_spaces": "The answer is" + " " * 300_000 + "!",
    "anchor_then_300k_newlines": "Answer:" + "\n" * 300_000,
    "letter_then_300k_spaces": "C" + " " * 300_000 + "x",
    "step_then_300k_spaces": "1+2=3" + " " * 300_000 + "x",
    "verdict_then_300k_spaces": "FIRST_ERROR_STEP:" + " " * 300_000 + "x",
    "5000_digit_answer": "Answer: " + "9" * 5000 + "\n\\boxed{" + "9" * 5000 + "}",
    "lone_surrogates": "\ud800 step one\n\n\udfff <answer>A</answer> \\boxed{4\udcff}",
    "surrogateescape_bytes": bytes(range(128, 256)).decode("utf-8", errors="surrogateescape") + " Answer: 4",
    "nul_and_control_chars": "\x00\x1b[2J\x7f<answer>\x00</answer>\u202e\ufeff",
}
TEXT_IDS = list(HOSTILE_TEXTS)
# The chat-message form of a hostile text carries its first MESSAGE_CHARS characters (the reward test below).
MESSAGE_CHARS = 10_000
TEXTS = list(HOSTILE_TEXTS.values())

# Gold answers / columns each reward reads.
REWARD_COLUMNS = {
    "choice_accuracy": {"answer": "A"},
    "code_tests": {"test_cases": [{"input": "", "output": "4\n"}]},
    "reasoning_gym": {  # a reasoning-gym entry as the dataset stores it (grpo_family.tasks.reasoning_gym)
        "answer": "4",
        "reasoning_gym_entry": json.dumps(
            {"question": "2 + 2 =", "answer": "4", "metadata": {"source_dataset": "basic_arithmetic"}}
        ),
    },
}


@pytest.mark.parametrize("name", reward_names())
def test_every_registered_reward_scores_hostile_text_without_crashing_or_hanging(name):
    """Every reward in the registry, on every hostile text (as a plain string and as a chat message): one value per
    completion, each a float in [0, 1] or None, returned in bounded time.

    The chat message holds the text's first ``MESSAGE_CHARS`` characters (the same attack, smaller): a reward reads
    a message through ``completion_text`` and then does the plain string's work, so the full size is paid once, as
    a plain string, and each message scores as the same characters do as a plain string."""
    if name == "reasoning_gym":
        pytest.importorskip(
            "reasoning_gym", reason='reasoning-gym is the [realmodel] extra: pip install -e ".[realmodel]"'
        )
    func = get_reward_funcs([name])[0]
    heads = [text[:MESSAGE_CHARS] for text in TEXTS]
    completions = TEXTS + [[{"role": "assistant", "content": head}] for head in heads] + heads
    if name == "math_accuracy":  # its own deadline bounds each item; a short one keeps the test short
        func = MathAccuracyReward(timeout=2.0)
        completions = TEXTS
    columns = REWARD_COLUMNS.get(name, {"answer": "4"})
    kwargs = {column: [value] * len(completions) for column, value in columns.items()}
    values = bounded(func, completions=completions, **kwargs)
    assert len(values) == len(completions)
    for text_id, value in zip(TEXT_IDS * 3, values):
        assert value is None or (isinstance(value, float) and 0.0 <= value <= 1.0), (text_id, value)
    messages, plain_heads = values[len(TEXTS) : 2 * len(TEXTS)], values[2 * len(TEXTS) :]
    for text_id, message, plain in zip(TEXT_IDS, messages, plain_heads):
        assert message == plain, (text_id, plain, message)  # the same answer, whichever form it came in


@pytest.mark.parametrize("text", TEXTS, ids=TEXT_IDS)
def test_step_splitting_and_reasoning_stripping_are_bounded(text):
    for splitter in ("paragraph", "line", "sentence"):
        steps = bounded(split_steps, text, splitter=splitter, max_steps=8)
        assert len(steps) <= 8 and all(step.strip() for step in steps)
    assert isinstance(bounded(strip_reasoning, text), str)
    assert is_fail(bounded(parse_verdict, text, 3)) or bounded(parse_verdict, text, 3) in (None, 1, 2, 3)


# ------------------------------------------------------------------------------------------------ math parser
# Answers that make a LaTeX / sympy parser slow or explode: 10^4 nested braces, 10^3 nested \frac, power towers
# whose value has more digits than atoms in the universe, a float exponent of ten million.
SLOW_MATH = {
    "10^4_nested_braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "10^3_nested_fracs": "\\boxed{" + "\\frac{1}{" * 1000 + "2" + "}" * 1000 + "}",
    "power_tower_latex": "\\boxed{10^{10^{10^{10}}}}",
    "power_tower_plain": "The final answer is 10^10^10^10",
    "nine_tower": "\\boxed{9^{9^{9^{9}}}}",
    "1e9999999": "\\boxed{1e9999999}",
    "huge_factorial": "\\boxed{100000000!}",
}


def test_slow_math_answers_are_bounded_by_the_timeout_off_the_main_thread():
    """From a non-main thread (where math-verify's signal.alarm timeouts cannot work) each pathological answer
    costs at most the deadline (plus restarting the killed worker) and scores None (timeout) or 0.0, never hangs."""
    get_runner("process", 1, preload=("grpo_family.rewards.math",)).map(abs, [(1,)], 120)  # worker started
    reward = MathAccuracyReward(timeout=1.5)
    texts = list(SLOW_MATH.values()) + ["\\boxed{4}"]
    values = bounded(reward, [[{"role": "assistant", "content": t}] for t in texts], answer=["4"] * 8)
    assert values[-1] == 1.0  # the pool still serves after the timeouts
    for name, value in zip(SLOW_MATH, values):
        assert value in (None, 0.0), (name, value)
    assert reward.counts["timeouts"] >= 1 and reward.counts["total"] == len(texts)


def test_slow_gold_answer_is_bounded_too():
    reward = MathAccuracyReward(timeout=1.5)
    values = bounded(reward, ["\\boxed{4}"], answer=[SLOW_MATH["power_tower_latex"]])
    assert values in ([None], [0.0])


# ------------------------------------------------------------------------------------------------ judges
HOSTILE_REQUESTS = [
    JudgeRequest(problem=text, reference_solution=text, gold_answer=text, steps=(text, "2+2=4"))
    for text in ("\udcff\ud800", "{steps} {problem} {{}}", "x" * MB, "\x00")
] + [JudgeRequest(problem="Compute 1+2.", reference_solution=None, gold_answer=None, steps=())]


def test_judge_prompts_are_built_for_hostile_requests():
    """The prompt renders and JSON-encodes (surrogates escaped, so the HTTP body is valid ASCII) for any text."""
    template = PromptTemplate.load()
    for request in HOSTILE_REQUESTS:
        messages = bounded(template.messages, request)
        body = json.dumps({"messages": messages}).encode()
        assert json.loads(body)["messages"] == messages
    # Placeholders inside the inserted text are not expanded again.
    system, user = template.render(HOSTILE_REQUESTS[1])
    assert "{steps} {problem} {{}}" in user


def test_openai_judge_sends_hostile_requests_and_survives_garbage_answers():
    garbage = [
        completion("FIRST_ERROR_STEP: " + "9" * 5000),  # int() refuses > 4300 digits
        completion("<think>" * 20_000 + "FIRST_ERROR_STEP: 1"),  # unclosed reasoning: no verdict
        completion({"nested": "dict"}),
        completion([7, None, {"no": "text"}]),  # content parts without text
        [1, 2, 3],  # JSON, but not an object
        "just a string",
        {"choices": [{"message": "not a dict"}]},
        b"\xff\xfe\x00 not utf-8",
        json.dumps(completion("\udcff FIRST_ERROR_STEP: \ud800")).encode(),  # escaped lone surrogates
        completion("x" * MB),
    ]
    server = FakeOpenAI()
    try:
        server.behave = lambda body, headers, n: (200, garbage[n % len(garbage)], 0.0)
        judge = OpenAICompatibleJudge(server.url, "judge", max_retries=0, timeout=10.0, concurrency=4)
        verdicts = bounded(judge.judge, [HOSTILE_REQUESTS[0]] * len(garbage) + HOSTILE_REQUESTS[1:])
    finally:
        server.close()
    assert len(verdicts) == len(garbage) + len(HOSTILE_REQUESTS) - 1
    assert all(v.failed for v in verdicts[: len(garbage)])  # garbage is a failure (NaN reward), never a crash
    assert verdicts[-1].first_error is None and verdicts[-1].num_calls == 0  # nothing to judge: no request
    sent = [r["body"]["messages"] for r in server.requests]
    assert any("\udcff" in m[-1]["content"] for m in sent)  # the surrogates arrived, JSON-escaped


def test_transformers_judge_survives_hostile_requests_and_garbage_output(tiny_tokenizer):
    for text in ("FIRST_ERROR_STEP: " + "9" * 5000, "\udcff" * 10, "<think>" * 5000):
        judge = TransformersJudge(ScriptedLM(tiny_tokenizer, "garbage"), tiny_tokenizer)
        judge._generate = lambda prompts, text=text: [[text] for _ in prompts]  # what the model "said"
        requests = [r for r in HOSTILE_REQUESTS if len(r.problem) < 1000]  # tokenizing 1 MB is slow, not hostile
        verdicts = bounded(judge.judge, requests)
        assert len(verdicts) == len(requests)
        assert all(v.failed for v in verdicts[:-1]) and not verdicts[-1].failed


def test_programmatic_judge_on_hostile_steps():
    judge = ProgrammaticJudge()
    requests = [JudgeRequest("Compute 1+2.", None, "3", (text,)) for text in TEXTS if text.strip()] + HOSTILE_REQUESTS
    verdicts = bounded(judge.judge, requests)
    assert len(verdicts) == len(requests)
    for verdict in verdicts:
        assert verdict.failed or verdict.first_error is None or verdict.first_error == 1


GARBAGE_VERDICTS = [
    "",
    "the second step looks off",
    "FIRST_ERROR_STEP: 0",
    "FIRST_ERROR_STEP: -1",
    "FIRST_ERROR_STEP: 4",  # K = 3
    "FIRST_ERROR_STEP: " + "9" * 5000,
    "FIRST_ERROR_STEP: 1e3",
    "FIRST_ERROR_STEP: nan",
    "FIRST_ERROR_STEP: two",
    "<think>FIRST_ERROR_STEP: 2",  # only inside an unclosed reasoning block
    "<think>FIRST_ERROR_STEP: 2</think>",  # only inside reasoning
    "\udcff\ud800",
    None,
    42,
    b"FIRST_ERROR_STEP: 2",
]


@pytest.mark.parametrize("text", GARBAGE_VERDICTS, ids=range(len(GARBAGE_VERDICTS)))
def test_garbage_judge_output_is_a_failure_verdict(text):
    assert is_fail(parse_verdict(text, 3))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.integers(1, 20))
def test_parse_verdict_never_raises_and_stays_in_range(text, num_steps):
    verdict = parse_verdict(text, num_steps)
    assert verdict is None or is_fail(verdict) or (isinstance(verdict, int) and 1 <= verdict <= num_steps)


class RaisingAttribute:
    @property
    def first_error(self):
        raise RuntimeError("broken verdict object")


@pytest.mark.parametrize(
    "verdict", [math.inf, 2.0, "2", 10**100, True, -3, [2], object(), RaisingAttribute()], ids=lambda v: repr(v)[:20]
)
def test_sgpo_turns_any_garbage_verdict_object_into_a_failure(verdict):
    value, _, reason = _clean_verdict(verdict, 3)
    assert is_fail(value) and reason


# ------------------------------------------------------------------------------------------------ empty prompts
EMPTY_PROMPTS = {
    "blank_string": "  \n",
    "empty_user_message": [{"role": "user", "content": ""}],
    "system_prompt_but_blank_question": [{"role": "system", "content": "Think."}, {"role": "user", "content": " "}],
    "blank_text_parts": [{"role": "user", "content": [{"type": "text", "text": ""}]}],
    "no_content_key": [{"role": "user"}],
}


def test_is_empty_prompt():
    for prompt in EMPTY_PROMPTS.values():
        assert is_empty_prompt(prompt)
    assert not is_empty_prompt("Compute 1+2.")
    assert not is_empty_prompt([{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}])
    assert not is_empty_prompt([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ""}]}])


@pytest.mark.parametrize("kind", list(EMPTY_PROMPTS))
def test_empty_prompts_fail_at_init_naming_the_rows(kind, tiny_model_dir, tiny_tokenizer, config_kwargs):
    """An empty prompt would make TRL generate from a template with no question, or from zero tokens -- which
    crashes ``generate`` whenever a whole batch is empty. It is refused before training, with the rows and the fix."""
    good = {
        "blank_string": "Compute 1+2.",
        "blank_text_parts": [{"role": "user", "content": [{"type": "text", "text": "Compute 1+2."}]}],
    }.get(kind, [{"role": "user", "content": "Compute 1+2."}])
    rows = [{"prompt": EMPTY_PROMPTS[kind] if i in (3, 5) else good, "answer": "3"} for i in range(8)]
    config_cls, trainer_cls = METHODS["grpo"]
    with pytest.raises(ValueError, match=r"2 of 8 rows of the training set have an empty prompt .*rows 3, 5.*filter"):
        trainer_cls(
            model=tiny_model_dir,
            reward_funcs=[digit_share_reward],
            args=config_cls(**config_kwargs()),
            train_dataset=Dataset.from_list(rows),
            processing_class=tiny_tokenizer,
        )


# ------------------------------------------------------------------------------------------------ hostile rewards
def counter_reward(name: str, bad: Callable[[int], Any], *, every: int = 3) -> Callable:
    """A reward that returns ``bad(n)`` (or raises, if ``bad`` raises) for every ``every``-th completion it sees
    (counted over all calls, row-wise retries included) and a digit-share score for the others."""
    seen = [0]

    def reward(completions, **kwargs):
        out = []
        for score in digit_share_reward(completions):
            seen[0] += 1
            out.append(bad(len(completions)) if seen[0] % every == 0 else score)
        return out

    reward.__name__ = name
    return reward


def _raise(n):
    raise RuntimeError("reward server unavailable")


def wrong_count_after_first_batch(completions, **kwargs):
    wrong_count_after_first_batch.calls += 1
    scores = digit_share_reward(completions)
    return scores[:-1] if wrong_count_after_first_batch.calls > 1 and len(scores) > 1 else scores


async def async_raising_reward(completions, **kwargs):
    """Async: a batch call always times out; retried one by one, every third completion still does."""
    async_raising_reward.calls += 1
    if len(completions) > 1 or async_raising_reward.calls % 3 == 0:
        raise TimeoutError("async scorer timed out")
    return digit_share_reward(completions)


class AsyncClassReward:
    """An async callable *class* (TRL awaits its ``__call__``); NaN for every third completion."""

    __name__ = "async_class_reward"

    def __init__(self):
        self.seen = 0

    async def __call__(self, completions, **kwargs):
        out = []
        for score in digit_share_reward(completions):
            self.seen += 1
            out.append(math.nan if self.seen % 3 == 0 else score)
        return out


def _exit(n):
    sys.exit(0)


def numpy_reward(completions, **kwargs):
    """Scores as a numpy float32 array (numpy values used to reach the checkpoint's JSON and crash its write)."""
    return np.asarray(digit_share_reward(completions), dtype=np.float32)


def hostile_rewards() -> list[Callable]:
    wrong_count_after_first_batch.calls = async_raising_reward.calls = 0
    return [
        digit_share_reward,  # sane, first: SGPO's correctness reward
        counter_reward("raises_reward", _raise),
        counter_reward("exit_reward", _exit),  # sys.exit(0) on some rows: an error of the reward, not the run's end
        numpy_reward,
        counter_reward("none_reward", lambda n: None),
        counter_reward("nan_reward", lambda n: math.nan),
        counter_reward("inf_reward", lambda n: math.inf),
        counter_reward("neg_inf_reward", lambda n: -math.inf),
        counter_reward("string_reward", lambda n: "0.5"),
        counter_reward("list_reward", lambda n: [0.5]),
        wrong_count_after_first_batch,
        async_raising_reward,
        AsyncClassReward(),
    ]


CONTAINED = ["raises_reward", "exit_reward", "nan_reward", "inf_reward", "neg_inf_reward", "string_reward",
             "list_reward"]  # fmt: skip


def train_and_record(method, model_dir, tokenizer, dataset, config_kwargs, rewards, trainer_kwargs=None, **overrides):
    """Train ``method`` for the config's steps, recording each generation batch's advantages and completion ids."""
    config_cls, trainer_cls = METHODS[method]
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=rewards,
        args=config_cls(**config_kwargs(**overrides)),
        train_dataset=dataset,
        processing_class=tokenizer,
        **(trainer_kwargs or {}),
    )
    trainer.recorded = []
    original = trainer._generate_and_score_completions

    def record(inputs):
        out = original(inputs)
        trainer.recorded.append({"advantages": out["advantages"].clone(), "completion_ids": out["completion_ids"]})
        return out

    trainer._generate_and_score_completions = record
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    return trainer, initial


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_hostile_rewards_are_contained_in_every_method(
    method, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, caplog
):
    """Thirteen reward functions at once -- raising, calling sys.exit(0), numpy values, None, NaN, +-inf, a string, a
    list, the wrong count after the first batch, an async one that raises, an async callable class returning NaN --
    through two real steps of each method: training finishes, every advantage and weight stays finite, each
    misbehaving function has its ``reward_errors/<name>`` metric and warning, and the numpy scores arrive as plain
    floats."""
    with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.base"):
        trainer, initial = train_and_record(
            method, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, hostile_rewards()
        )
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(r["advantages"]).all() for r in trainer.recorded)
    weights = trainer.model.state_dict()
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert any(not torch.equal(initial[k], weights[k]) for k in initial), "nothing was trained"
    assert all(math.isfinite(loss) for loss in logged(trainer, "loss"))
    for name in CONTAINED:
        assert sum(logged(trainer, f"reward_errors/{name}")) > 0, name
        assert f"Reward function '{name}' could not score" in caplog.text, name
    assert logged(trainer, "reward_errors/wrong_count_after_first_batch")  # the second batch fell back to rows
    assert sum(logged(trainer, "reward_errors/async_raising_reward")) > 0
    assert sum(logged(trainer, "reward_errors/async_class_reward")) > 0
    assert not logged(trainer, "skipped_steps")  # nothing non-finite reached the gradients
    numpy_means = logged(trainer, "rewards/numpy_reward/mean")
    assert numpy_means and all(type(v) is float and math.isfinite(v) for v in numpy_means)
    assert not logged(trainer, "reward_errors/numpy_reward")  # numbers, not errors


@pytest.mark.parametrize(
    "reward, match",
    [
        (counter_reward("always_raises", _raise, every=1), r"always_raises.*failed on every completion.*RuntimeError"),
        (counter_reward("always_exits", _exit, every=1), r"always_exits.*failed on every completion.*SystemExit"),
        (lambda completions, **kw: [0.5], r"returned 1 values for 8 completions"),
        (counter_reward("all_strings", lambda n: "high", every=1), r"all_strings.*no number.*\['str'\]"),
        (lambda completions, **kw: 0.5, r"returned float values for 8"),
    ],
    ids=["raises_always", "exits_always", "wrong_count", "all_strings", "not_a_list"],
)
def test_unusable_reward_stops_before_any_update(
    reward, match, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs
):
    with pytest.raises(RewardFunctionError, match=match):
        train_and_record("grpo", tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, [reward])


def test_numpy_values_in_the_log_history_do_not_break_checkpoints(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs
):
    """A numpy float reached trainer_state.json through examples/train.py's held-out scoring (the mean of a reward
    that returns numpy values, appended to the log history by a callback) and crashed the write of checkpoint-2
    ("Object of type float32 is not JSON serializable"). The trainer makes its log history plain before every
    write of its state."""
    from transformers import TrainerCallback

    class NumpyScore(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            state.log_history.append({"step": state.global_step, "held_out_accuracy": np.float32(0.25)})

    trainer, _ = train_and_record(
        "grpo", tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, [numpy_reward],
        trainer_kwargs={"callbacks": [NumpyScore()]}, save_strategy="steps", save_steps=1,
    )  # fmt: skip
    for step in (1, 2):
        state = json.loads((Path(trainer.args.output_dir) / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert [h["held_out_accuracy"] for h in state["log_history"] if "held_out_accuracy" in h][-1] == 0.25
    trainer.save_state()
    assert json.loads((Path(trainer.args.output_dir) / "trainer_state.json").read_text())["global_step"] == 2


def test_reward_model_inf_logits_are_unscorable(tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs):
    """A reward *model* (an nn.Module TRL calls itself) whose logits are inf / NaN: unscorable, metric, finite run."""
    from transformers import AutoModelForSequenceClassification

    scorer = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    scorer.config.pad_token_id = tiny_tokenizer.pad_token_id
    calls = [0]

    def poison(module, args, output):  # every other completion's score is inf, then NaN
        calls[0] += 1
        logits = output.logits.clone()
        logits[::2, 0] = math.inf if calls[0] == 1 else math.nan
        output.logits = logits
        return output

    scorer.register_forward_hook(poison)
    trainer, _ = train_and_record(
        "grpo",
        tiny_model_dir,
        tiny_tokenizer,
        arithmetic_train,
        config_kwargs,
        [scorer, digit_share_reward],
        trainer_kwargs={"reward_processing_classes": [tiny_tokenizer, None]},
    )
    assert all(torch.isfinite(r["advantages"]).all() for r in trainer.recorded)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    name = trainer.reward_func_names[0]
    assert logged(trainer, f"reward_errors/{name}") == [4.0, 4.0]


# ------------------------------------------------------------------------------------------------ rewards that hang
def test_with_timeout_unit_behaviour():
    """``with_timeout``: values and errors pass through, a call past the deadline raises RewardTimeoutError, the
    name and signature are the wrapped function's (TRL's logging and the dataset-column check use them)."""
    release = threading.Event()

    def scorer(completions, answer, **kwargs):
        if completions == ["hang"]:
            release.wait()
        if completions == ["boom"]:
            raise KeyError("boom")
        return [float(c == a) for c, a in zip(completions, answer)]

    timed = with_timeout(scorer, 0.5)
    try:
        assert timed.__name__ == "scorer" and "answer" in inspect.signature(timed).parameters
        assert timed(completions=["1", "2"], answer=["1", "3"]) == [1.0, 0.0]
        with pytest.raises(KeyError, match="boom"):
            timed(completions=["boom"], answer=["1"])
        with pytest.raises(RewardTimeoutError, match=r"'scorer' did not return within 0.5 s"):
            bounded(timed, completions=["hang"], answer=["1"])
    finally:
        release.set()  # let the abandoned thread end
    for bad in (0, -1, math.inf, math.nan, "5", True):
        with pytest.raises(ValueError, match="positive number of seconds"):
            with_timeout(scorer, bad)
    with pytest.raises(TypeError, match="reward function"):
        with_timeout("scorer", 1)


def test_with_timeout_cancels_an_async_reward():
    cancelled = []

    async def remote(completions, **kwargs):
        if completions == ["hang"]:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        if completions == ["own-timeout"]:
            raise TimeoutError("the reward's own HTTP client gave up")
        return [0.5] * len(completions)

    timed = with_timeout(remote, 0.3)
    assert inspect.iscoroutinefunction(timed) and timed.__name__ == "remote"
    assert asyncio.run(timed(completions=["a", "b"])) == [0.5, 0.5]
    with pytest.raises(RewardTimeoutError, match="'remote' did not return within 0.3 s"):
        bounded(asyncio.run, timed(completions=["hang"]))
    assert cancelled == [True]
    with pytest.raises(TimeoutError, match="own HTTP client") as raised:  # its own error, not our deadline
        asyncio.run(timed(completions=["own-timeout"]))
    assert not isinstance(raised.value, RewardTimeoutError)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_reward_that_never_returns_is_contained(
    kind, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, caplog
):
    """A reward whose every call hangs (a stuck HTTP request, an infinite loop), wrapped in ``with_timeout``: both
    steps finish, its completions are unscored (NaN -> the other reward decides), the batch is not retried row by row,
    and ``reward_errors/<name>`` counts every completion. Without the wrapper this run would never end."""
    release = threading.Event()
    calls = [0]

    def stuck_reward(completions, **kwargs):
        calls[0] += 1
        release.wait()
        return [1.0] * len(completions)

    async def stuck_async_reward(completions, **kwargs):
        calls[0] += 1
        await asyncio.sleep(3600)

    stuck = with_timeout(stuck_reward if kind == "sync" else stuck_async_reward, 1.0)
    try:
        with caplog.at_level(logging.WARNING, logger="grpo_family.trainers.base"):
            trainer, initial = bounded(
                train_and_record,
                "grpo",
                tiny_model_dir,
                tiny_tokenizer,
                arithmetic_train,
                config_kwargs,
                [digit_share_reward, stuck],
            )
    finally:
        release.set()
    assert trainer.state.global_step == 2 and calls[0] == 2  # one call per batch: no row-by-row retry
    per_batch = [float(r["advantages"].numel()) for r in trainer.recorded]
    assert logged(trainer, f"reward_errors/{stuck.__name__}") == per_batch
    assert f"Reward function '{stuck.__name__}' could not score" in caplog.text and "did not return" in caplog.text
    assert any(r["advantages"].abs().sum() > 0 for r in trainer.recorded)  # the other reward still teaches
    weights = trainer.model.state_dict()
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert any(not torch.equal(initial[k], weights[k]) for k in initial)


# ------------------------------------------------------------------------------------------------ empty completions
def alternating_reward(completions, **kwargs):
    alternating_reward.calls += 1
    return [float((i + alternating_reward.calls) % 2) for i in range(len(completions))]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_empty_completions_train_finitely_in_every_method(
    method, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs
):
    """Every completion is just the end-of-sequence token (empty text, one-token mask) while the rewards still
    differ within groups: every method's advantages, loss and weights stay finite."""
    eos = tiny_tokenizer.eos_token_id
    suppress = [i for i in range(len(tiny_tokenizer)) if i != eos]
    alternating_reward.calls = 0
    trainer, _ = train_and_record(
        method,
        tiny_model_dir,
        tiny_tokenizer,
        arithmetic_train,
        config_kwargs,
        [alternating_reward],
        generation_kwargs={"suppress_tokens": suppress},
    )
    assert all(r["completion_ids"].size(1) == 1 for r in trainer.recorded)  # really empty
    assert any(r["advantages"].abs().sum() > 0 for r in trainer.recorded)
    assert all(torch.isfinite(r["advantages"]).all() for r in trainer.recorded)
    assert all(math.isfinite(loss) for loss in logged(trainer, "loss"))
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_guarded_reward_unit_behaviour():
    """The guard on its own: plain floats out, None for anything unusable, the reasons reported."""
    errors = []
    guard = GuardedReward(lambda completions, **kw: [1, True, None, "0.5", math.nan, torch.tensor(0.25)], "r",
                          lambda name, count, reason: errors.append((count, reason)))  # fmt: skip
    assert guard(completions=list("abcdef")) == [1.0, 1.0, None, None, None, 0.25]
    assert errors == [(1, "non-numeric reward (str)"), (1, "non-finite reward")]


# ------------------------------------------------------------------------------------------------ configs
# One incompatible combination per method: rejected when the config is built (before any model is loaded), by the
# method's one __post_init__, with a message that names the options and what to change.
# Each method's combination is its case's bad_config (tests/method_cases/<method>.py).
BAD_CONFIGS = {method: case(method).bad_config for method in METHODS}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_incompatible_config_is_refused_when_built(method, config_kwargs):
    assert set(BAD_CONFIGS) == set(METHODS)
    overrides, match = BAD_CONFIGS[method]
    config_cls, _ = METHODS[method]
    with pytest.raises(ValueError, match=match):
        config_cls(**config_kwargs(**overrides))
    config_cls(**config_kwargs())  # the same config without the bad combination is fine


def test_hostile_dataset_text_cannot_reach_training():
    """Arrow stores UTF-8 only: a dataset row with a lone surrogate is refused when the dataset is built, so it can
    never reach the tokenizer mid-run (TRL accepts only datasets.Dataset / IterableDataset)."""
    with pytest.raises(Exception, match="surrogate|utf-8|UTF-8|encode"):
        Dataset.from_list([{"prompt": "Compute \udcff 1+2.", "answer": "3"}])


def test_a_slow_reward_call_is_not_charged_to_the_test_suite():
    """Sanity check of the watchdog itself: a hang is reported, not waited for (the event is never set, so
    returning at all shows it did not wait)."""
    never = threading.Event()
    with pytest.raises(AssertionError, match="did not return within"):
        bounded(never.wait, _guard_s=0.2)
    assert not never.is_set()


def test_a_reward_written_per_sample_is_told_how_trl_calls_it():
    """``def reward(prompt, completion)`` was told to rename a dataset column 'completion'; it is told the batch
    call instead. A dataset that has a 'prompt' column still gets the message for 'completion'."""
    from grpo_family.runtime.setup_checks import check_reward_columns

    def my_reward(prompt, completion):
        return 1.0

    data = Dataset.from_list([{"prompt": "p", "answer": "1"}])
    with pytest.raises(ValueError, match=r"takes 'completion'.*'completions'.*def my_reward\(prompts, completions"):
        check_reward_columns(data, [my_reward], ["my_reward"])
    without_prompt = Dataset.from_list([{"question": "p", "answer": "1"}])
    with pytest.raises(ValueError, match=r"takes 'prompt'.*'prompts'"):
        check_reward_columns(without_prompt, [my_reward], ["my_reward"])


def test_a_missing_transformers_judge_model_is_refused_before_the_policy_loads(tmp_path, monkeypatch):
    """It was an HFValidationError after the policy had loaded."""
    from grpo_family.errors import PreflightError
    from grpo_family.preflight import check_judge_model
    from grpo_family.trainers.sgpo import SGPOConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, problem in (
        (str(tmp_path / "no" / "judge"), "no such directory"),
        ("nobody/no-such-judge", "Hub cache"),
    ):
        config = SGPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none",
                            judge_type="transformers", judge_model=name)  # fmt: skip
        with pytest.raises(PreflightError, match=f"--judge_model {name}: .*{problem}"):
            check_judge_model(config)
