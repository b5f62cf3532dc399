"""Reward functions: extraction, None-versus-0 semantics, deadlines from any thread, metrics, registry."""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
from __future__ import annotations

import pickle
import threading
import time
from collections import Counter

import pytest
from conftest import HANG_GUARD_S
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.rewards import (
    REWARD_FUNCS,
    ChoiceAccuracyReward,
    MathAccuracyReward,
    QAReward,
    boxed_format_reward,
    choice_accuracy_reward,
    exact_match_score,
    extract_choice,
    extract_qa_answer,
    f1_score,
    get_reward_funcs,
    gold_letter,
    last_boxed,
    last_tag_content,
    make_format_reward,
    math_accuracy_reward,
    normalize_answer,
    qa_exact_match_reward,
    qa_f1_reward,
    read_answer,
    reward_names,
    score_math,
    think_answer_format_reward,
)
from grpo_family.rewards.contract import MATH_SLOTS
from grpo_family.rewards.timeout import Outcome, ProcessRunner, ThreadRunner, get_runner, run_with_timeout

# A verify call that sympy cannot finish (9^(99999^2) has ~10^10 digits) and that the parser-bomb pre-check lets
# through (no tower, no 6-digit exponent): only the worker's deadline stops it.
SLOW_ANSWER = r"\boxed{(9^{99999})^{99999}}"


def msg(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


class FakeLogMetric:
    def __init__(self):
        self.calls: list[tuple[str, float]] = []

    def __call__(self, name: str, value: float) -> None:
        self.calls.append((name, value))

    def as_dict(self) -> dict[str, float]:
        return dict(self.calls)


# ----------------------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),
        (r"\boxed{x^{2}+\frac{1}{2}}", r"x^{2}+\frac{1}{2}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are literal, not grouping
        (r"first \boxed{3}, finally \boxed{4}", "4"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5 is it", "5"),
        (r"cut off \boxed{\frac{1}{2", None),  # truncated: no answer, and the earlier box is not used
        (r"\boxed{3} then \boxed{\frac{1}", None),
        (r"\boxed{}", None),
        ("no box", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_tag_content():
    assert last_tag_content("<answer> 1 </answer> x <answer>2</answer>") == "2"
    assert last_tag_content("<answer>open") is None
    assert last_tag_content("<answer>  </answer>") is None


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        (r"<think>r</think><answer>\boxed{\frac{1}{2}}</answer>", "0.5", ("ok", 1.0)),
        (r"<think>r</think><answer>0.5</answer>", r"\frac{1}{2}", ("ok", 1.0)),
        (r"<think>r</think><answer>\frac{1}{2}</answer>", r"\dfrac12", ("ok", 1.0)),
        (r"<think>r</think><answer>\frac{1}{3}</answer>", r"\frac{1}{2}", ("ok", 0.0)),
        (r"thus \boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", ("ok", 1.0)),  # nested braces, symbolic
        (r"\boxed{x^{2}+1}", r"$1+x^2$", ("ok", 1.0)),
        (r"\boxed{\{1,2\}}", r"\{2,1\}", ("ok", 1.0)),
        (r"\boxed{1{,}000}", "1000", ("ok", 1.0)),
        # two boxes are two answer slots: the contract is broken whichever box is right
        (r"first \boxed{3}, finally \boxed{4}", "4", ("contract_violations", 0.0)),
        (r"first \boxed{3}, finally \boxed{4}", "3", ("contract_violations", 0.0)),
        ("The final answer is 42.", "42", ("ok", 1.0)),  # anchored free text
        ("Answer: 7", "7", ("ok", 1.0)),
        ("<answer>the answer is x = 5</answer>", "5", ("ok", 1.0)),
        # gold forms: reference solution with a box, GSM8K "####"
        (r"\boxed{5}", r"We get $x=5$, so the answer is $\boxed{5}$.", ("ok", 1.0)),
        (r"\boxed{1072}", "She sold 1,072 clips.\n#### 1,072", ("ok", 1.0)),
        # the model gave no answer slot, or a broken one: a contract violation, a wrong answer (0.0)
        ("I computed 42 and 24 along the way but never answered", "42", ("contract_violations", 0.0)),
        (r"<think>\boxed{4}</think> and then nothing", "4", ("contract_violations", 0.0)),  # thinking is no answer
        (r"truncated \boxed{\frac{1}{2", "0.5", ("contract_violations", 0.0)),
        ("", "1", ("contract_violations", 0.0)),
        # the gold cannot be read: we cannot score (None)
        (r"\boxed{5}", "", ("unparseable_gold", None)),
        (r"\boxed{5}", None, ("unparseable_gold", None)),
        (r"\boxed{5}", "$$", ("unparseable_gold", None)),
    ],
)
def test_score_math(completion, gold, expected):
    assert score_math(completion, gold) == expected


def test_an_answer_tag_the_model_wrote_in_prose_breaks_the_contract():
    """A real SmolLM2-135M-Instruct completion (issue 27's real-model test, sampled at temperature 1) mentions
    ``<answer>`` in prose and never closes it; the gold appended in a block after it is then an ``<answer>`` opened
    inside another: the contract is broken in both modes (docs/answer_extraction.md §4), whatever the block holds,
    and without the model's stray tag the same appended block scores."""
    real = "Ask a question. Repeat the question to the answer and give <answer> replaces with <number of repetitions selected>."
    appended = f"{real}\nSo the final answer is <answer>-4</answer>"
    reading = read_answer(appended, MATH_SLOTS)
    assert reading.value is None and reading.violation == "an <answer> opened inside another (the first never closed)"
    assert read_answer(appended, MATH_SLOTS, "eval").value is None
    from grpo_family.tasks import arithmetic_reward

    for reward in (math_accuracy_reward, qa_exact_match_reward, arithmetic_reward):
        assert reward([appended], answer=["-4"]) == [0.0], reward.__name__
        clean = appended.replace("give <answer> replaces", "give the answer, which replaces")
        assert reward([clean], answer=["-4"]) == [1.0], reward.__name__


# ------------------------------------------------------------------------------------ math reward end to end


def test_math_reward_batch_metrics_and_counts():
    reward = MathAccuracyReward(timeout=30)
    log = FakeLogMetric()
    completions = [
        msg(r"<think>2+2</think><answer>\boxed{4}</answer>"),
        msg(r"<think>2+2</think><answer>\boxed{5}</answer>"),
        msg("no answer at all"),
        msg(r"\boxed{4}"),
        r"\boxed{\frac{1}{2}}",  # standard (string) completions work too
    ]
    golds = ["4", "4", "4", "", "0.5"]
    out = reward(completions=completions, answer=golds, log_metric=log, prompts=[None] * 5, trainer_state=None)
    assert out == [1.0, 0.0, 0.0, None, 1.0]
    metrics = log.as_dict()
    assert metrics["math/unparseable_gold"] == pytest.approx(1 / 5)
    assert metrics["math_accuracy/contract_violations"] == pytest.approx(1 / 5)  # "no answer at all"
    assert metrics["math/timeouts"] == 0.0
    assert reward.counts == Counter({"total": 5, "unparseable_gold": 1, "contract_violations": 1})
    reward(completions=completions[:1], answer=[None])
    assert reward.counts["unparseable_gold"] == 2 and reward.counts["total"] == 6


def test_math_reward_uses_solution_when_no_answer_column():
    out = math_accuracy_reward([msg(r"\boxed{3}"), msg(r"\boxed{2}")], solution=[r"... $\boxed{3}$"] * 2)
    assert out == [1.0, 0.0]


def test_math_reward_without_gold_column_is_an_error():
    with pytest.raises(ValueError, match="answer"):
        math_accuracy_reward([msg("x")], problem=["p"])


def test_math_reward_is_picklable_and_named():
    clone = pickle.loads(pickle.dumps(math_accuracy_reward))
    assert clone.__name__ == "math_accuracy"
    assert clone([msg(r"\boxed{1}")], answer=["1"]) == [1.0]


def test_timeout_from_non_main_thread_is_bounded():
    """The pathological answer would hang verify; from a worker thread (where math-verify's signal timeouts cannot
    work) the reward still returns: the bomb's worker killed at its deadline (one restart), timeout_reward (0.0)
    and the timeout metric, and the next answer scored by the restarted worker. Nothing here depends on the
    machine's speed: the budget (1.5 s) is charged only while a worker is ready, so however long the restarted
    worker takes to import, the second answer is still scored (it was None where the import took 3.7 s)."""
    reward = MathAccuracyReward(timeout=1.0, num_workers=1)
    runner = get_runner("process", 1, preload=("grpo_family.rewards.math",))
    runner.map(abs, [(1,)], 30)  # worker started
    restarts = runner.restarts
    log = FakeLogMetric()
    box: dict = {}

    def call():
        box["out"] = reward([msg(SLOW_ANSWER), msg(r"\boxed{1}")], answer=["1", "1"], log_metric=log)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(HANG_GUARD_S)  # SLOW_ANSWER never finishes: only the deadline ends the call
    assert not thread.is_alive()
    assert box["out"] == [0.0, 1.0]
    assert log.as_dict()["math/timeouts"] == pytest.approx(0.5)
    assert runner.restarts == restarts + 1  # the bomb's worker was killed and replaced, once


def test_call_budget_is_not_charged_for_a_worker_restart(tmp_path, monkeypatch):
    """A worker killed at its deadline is replaced; the replacement's start-up (here made slower than the whole
    budget) is not charged to the call's budget, so the item after the bomb is still served, not skipped."""
    (tmp_path / "slow_start_work.py").write_text(
        "import os, time\n"
        "if os.path.exists(os.environ['SLOW_START_FLAG']):\n"
        "    time.sleep(2.0)  # a slow import, longer than the budget below\n"
        "def work(seconds):\n"
        "    time.sleep(seconds)\n"
        "    return seconds\n"
    )
    flag = tmp_path / "slow"
    monkeypatch.setenv("SLOW_START_FLAG", str(flag))
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_start_work

    runner = ProcessRunner(1, preload=("slow_start_work",))
    try:
        assert runner.map(slow_start_work.work, [(0,)], 30) == [Outcome("ok", 0)]  # started fast (no flag yet)
        flag.touch()  # from now on every worker start takes 2 s
        out = runner.map(slow_start_work.work, [(3600,), (0,)], timeout=0.3, budget=1.0)
        assert out == [Outcome("timeout"), Outcome("ok", 0)]
        assert runner.restarts == 1
    finally:
        runner.close()


def test_timeout_reward_option():
    assert MathAccuracyReward(timeout=0.5).timeout_reward == 0.0  # documented default: a bomb is a wrong answer
    reward = MathAccuracyReward(timeout=0.5, timeout_reward=None)
    assert reward([msg(SLOW_ANSWER)], answer=["1"]) == [None]
    assert reward.counts["timeouts"] == 1


def test_inline_backend_works_in_a_thread():
    """With math-verify's signal timeouts disabled, scoring never raises 'signal only works in main thread'."""
    reward = MathAccuracyReward(backend="none")
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", reward([msg(r"\boxed{2}")], answer=["2"])))
    thread.start()
    thread.join(30)
    assert box["out"] == [1.0]


# ------------------------------------------------------------------------------------------- timeout runners


def test_process_runner_kills_and_recovers_from_a_thread():
    runner = ProcessRunner(1)
    try:
        runner.map(abs, [(-1,)], 30)  # start-up is not charged to a deadline, but warm it anyway
        box: dict = {}
        thread = threading.Thread(target=lambda: box.setdefault("r", runner.map(time.sleep, [(3600,)], 0.5)))
        thread.start()
        thread.join(HANG_GUARD_S)
        assert box["r"] == [Outcome("timeout")]  # the sleep never ends by itself: the deadline killed it
        assert runner.restarts == 1
        assert runner.map(abs, [(-3,), (4,)], 30) == [Outcome("ok", 3), Outcome("ok", 4)]  # a fresh worker serves
    finally:
        runner.close()


def test_process_runner_reports_errors_and_crashes():
    runner = ProcessRunner(2)
    try:
        out = runner.map(int, [("x",), ("5",)], 30)
        assert out[0].status == "error" and "ValueError" in out[0].value
        assert out[1] == Outcome("ok", 5)
        import os

        crashed = runner.map(os._exit, [(3,)], 30)[0]
        assert crashed.status == "error" and "exit code 3" in crashed.value
        assert runner.map(abs, [(-2,)], 30) == [Outcome("ok", 2)]
    finally:
        runner.close()


def test_worker_does_not_import_torch_or_trl():
    """The worker loads grpo_family.rewards without grpo_family/__init__ (which imports TRL and torch)."""
    code = "sorted(m for m in ('torch', 'trl', 'transformers', 'math_verify') if m in __import__('sys').modules)"
    out = get_runner("process", 1, preload=("grpo_family.rewards.math",)).map(eval, [(code,)], 30)[0]
    assert out == Outcome("ok", ["math_verify"])


def test_thread_runner_returns_on_time():
    # The first item sleeps an hour: a "timeout" (not "ok") for it means the runner returned at the deadline.
    out = ThreadRunner().map(time.sleep, [(3600,), (0.0,)], 0.3)
    assert out == [Outcome("timeout"), Outcome("ok", None)]


def test_run_with_timeout_inline_and_unknown_backend():
    assert run_with_timeout(divmod, (7, 2), backend="none") == Outcome("ok", (3, 1))
    with pytest.raises(ValueError, match="process, thread, none"):
        get_runner("bogus")


# ----------------------------------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    ("text", "think_answer", "boxed"),
    [
        ("<think>r</think><answer>4</answer>", 1.0, 0.0),
        ("  <think>\nr\n</think>\n<answer>\n4\n</answer>\n", 1.0, 0.0),
        (r"<think>r</think><answer>\boxed{4}</answer>", 1.0, 1.0),
        (r"<think>r</think> so the result is \boxed{4}.", 0.0, 1.0),
        ("<think>r</think><answer>4</answer> trailing text", 0.0, 0.0),
        ("<answer>4</answer><think>r</think>", 0.0, 0.0),
        ("<think>r</think><answer>4</answer><answer>5</answer>", 0.0, 0.0),
        ("<think>a<think>b</think><answer>4</answer>", 0.0, 0.0),
        ("<think></think><answer>4</answer>", 0.0, 0.0),
        ("<think>r</think><answer> </answer>", 0.0, 0.0),
        (r"<think>r \boxed{4}</think> nothing after", 0.0, 0.0),
        (r"<think>r</think> cut \boxed{4", 0.0, 0.0),
        ("just text", 0.0, 0.0),
    ],
)
def test_format_rewards(text, think_answer, boxed):
    assert think_answer_format_reward([msg(text)]) == [think_answer]
    assert boxed_format_reward([text]) == [boxed]


def test_format_reward_with_prefilled_think():
    reward = make_format_reward("think_answer", think_prefilled=True)
    assert reward(["r</think><answer>4</answer>"]) == [1.0]
    assert reward(["<think>r</think><answer>4</answer>"]) == [0.0]  # a second <think> is malformed
    assert make_format_reward("think_boxed", think_prefilled=True)([r"r</think>\boxed{1}"]) == [1.0]
    with pytest.raises(ValueError, match="think_answer, think_boxed"):
        make_format_reward("xml")


# ----------------------------------------------------------------------------------------- multiple choice


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Answer: C", "C"),
        ("The answer is (C).", "C"),
        ("(C)", "C"),
        ("C", "C"),
        ("c", "C"),
        (r"\boxed{C}", "C"),
        (r"Therefore the answer is $\boxed{\text{(D)}}$", "D"),
        ("<think>A or B?</think><answer>B</answer>", "B"),
        ("<answer>(b)</answer>", "B"),
        # the option's text or an explanation after the letter: not one letter alone, the contract is broken
        ("<answer>C. Pneumonia</answer>", "C"),  # the option's text after its letter (issue 40)
        ("<answer>The answer is E because ...</answer>", None),
        ("The correct option is D", "D"),
        ("**Answer:** **E**", "E"),
        ("The final answer: (A) a cat", "A"),
        ("The final answer: (A)", "A"),
        ("answer is Bob", None),
        ("I think A is wrong and B is right", None),
        ("Answer: F", None),  # not an option letter
        ("A cat", None),
    ],
)
def test_extract_choice(text, letter):
    assert extract_choice(text) == letter


def test_choice_reward_none_and_zero():
    log = FakeLogMetric()
    completions = [msg("<answer>C</answer>"), msg("<answer>B</answer>"), msg("no idea"), msg("C"), msg("C"), "C"]
    golds = ["C", "C", "C", None, "F", 2]
    out = choice_accuracy_reward(completions, answer=golds, log_metric=log)
    assert out == [1.0, 0.0, 0.0, None, None, None]
    assert log.as_dict() == {
        "choice/unparseable_gold": pytest.approx(3 / 6),
        "choice_accuracy/contract_violations": 1 / 6,
    }
    ten = ChoiceAccuracyReward("ABCDEFGHIJ")
    assert ten(["Answer: (H)"], answer=["H"]) == [1.0]
    assert gold_letter("(c)") == "C" and gold_letter("C. Liver") == "C" and gold_letter("CD") is None


# ------------------------------------------------------------------------------------------------------- QA


def test_normalize_and_scores():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert exact_match_score("the Eiffel Tower", "Eiffel Tower") == 1.0
    # precision 2/4, recall 2/2 -> F1 = 2 * 0.5 * 1 / 1.5
    assert f1_score("Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    assert f1_score("Paris France", "France, Paris") == 1.0
    assert f1_score("no", "yes") == 0.0 and f1_score("yes it is", "yes") == 0.0  # HotpotQA yes/no rule
    assert f1_score("cat", "dog") == 0.0


def test_qa_rewards_aliases_and_none():
    completions = [
        msg("<think>r</think><answer>Paris</answer>"),
        msg("<answer>the city of Paris</answer>"),
        msg("The answer is: Barack Obama"),
        msg("<answer></answer> nothing"),
        msg("<answer>x</answer>"),
    ]
    golds = [["paris", "Paris, France"], "Paris", "Obama", "Paris", []]
    assert qa_exact_match_reward(completions, answer=golds) == [1.0, 0.0, 0.0, 0.0, None]
    f1 = qa_f1_reward(completions, answer=golds)
    assert f1[0] == 1.0 and f1[1] == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert f1[2] == pytest.approx(2 / 3) and f1[3] == 0.0 and f1[4] is None
    assert QAReward("f1")([msg("<answer>x</answer>")], answer=[{"text": ["x", "y"], "answer_start": [0, 1]}]) == [1.0]
    assert extract_qa_answer(r"\boxed{\text{Paris}}") == "Paris"


_words = st.lists(st.sampled_from(["a", "the", "cat", "dog", "Paris", "x1", "blue", "sat", "!"]), max_size=6)


@settings(max_examples=100, deadline=None)
@given(_words, _words)
def test_f1_properties(p, g):
    pred, gold = " ".join(p), " ".join(g)
    f = f1_score(pred, gold)
    assert 0.0 <= f <= 1.0
    assert f == pytest.approx(f1_score(gold, pred))  # symmetric
    if exact_match_score(pred, gold) == 1.0:
        assert f == 1.0
    # brute force: multiset overlap of normalised tokens
    pt, gt = normalize_answer(pred).split(), normalize_answer(gold).split()
    if pt and gt and not ({" ".join(pt), " ".join(gt)} & {"yes", "no", "noanswer"}):
        same = sum(min(pt.count(w), gt.count(w)) for w in set(pt))
        expected = 0.0 if same == 0 else 2 * same / (len(pt) + len(gt))
        assert f == pytest.approx(expected)


# --------------------------------------------------------------------------------------------------- registry


def test_registry_names_match_function_names():
    from grpo_family.rewards import _OPTIONAL_REWARDS

    for name, fn in REWARD_FUNCS.items():
        # Optional rewards, once loaded by another test, sit under their short name (e.g. "arithmetic" ->
        # arithmetic_reward); TRL logs them by function name.
        assert fn.__name__ == (_OPTIONAL_REWARDS[name][1] if name in _OPTIONAL_REWARDS else name)
    assert {
        "math_accuracy",
        "think_answer_format",
        "boxed_format",
        "choice_accuracy",
        "qa_exact_match",
        "qa_f1",
    } <= set(REWARD_FUNCS)


def test_get_reward_funcs():
    funcs = get_reward_funcs(["math_accuracy", "think_answer_format"])
    assert funcs == [math_accuracy_reward, think_answer_format_reward]
    assert get_reward_funcs("qa_f1, choice_accuracy") == [qa_f1_reward, choice_accuracy_reward]
    custom = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    assert get_reward_funcs([custom]) == [custom]
    with pytest.raises(ValueError) as info:
        get_reward_funcs(["math_accuracy", "acuracy"])
    message = str(info.value)
    assert "'acuracy'" in message
    for name in ("math_accuracy", "think_answer_format", "choice_accuracy", "qa_f1"):
        assert name in message


def test_optional_arithmetic_reward_resolves_when_present():
    pytest.importorskip("grpo_family.tasks.arithmetic")
    assert "arithmetic" in reward_names()
    (fn,) = get_reward_funcs(["arithmetic"])
    assert fn(["Answer: 3"], answer=["3"]) == [1.0]


def test_gold_is_parsed_once_per_string():
    from grpo_family.rewards.math import _parse_gold_cached, parse_gold

    gold = r"\frac{22}{7} + \sqrt{13}"
    before = _parse_gold_cached.cache_info()
    first = parse_gold(gold)
    for _ in range(5):
        assert parse_gold(gold) == first
    after = _parse_gold_cached.cache_info()
    assert after.misses - before.misses == 1 and after.hits - before.hits == 5
