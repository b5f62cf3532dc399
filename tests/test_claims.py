"""`benchmarks/claims.py`: its verdicts follow from the numbers beside them (worked intervals, and every row of a
`--quick` run recomputed from its own values), the seed rule, the measures' censoring, and the noisy and graded
training rewards. The quick run's values are not checked: two steps on a tiny model mean nothing."""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="module")
def claims():
    return importlib.import_module("benchmarks.claims")


@pytest.fixture(scope="module")
def runs():
    return importlib.import_module("benchmarks.runs")


# ------------------------------------------------------------------------------------------------ the verdict rule
@pytest.mark.parametrize(
    ("low", "high", "direction", "expected"),
    [
        (0.01, 0.05, +1, "reproduced"),  # entirely on the claimed (higher) side
        (-0.02, 0.05, +1, "not separable at this scale"),  # straddles 0
        (-0.05, -0.01, +1, "contradicted"),  # entirely on the other side
        (0.0, 0.04, +1, "not separable at this scale"),  # touching 0 is not separated
        (0.0, 0.0, +1, "not separable at this scale"),  # identical on every seed
        (-300.0, -10.0, -1, "reproduced"),  # a cost the paper claims lower, lower
        (10.0, 300.0, -1, "contradicted"),
        (-10.0, 300.0, -1, "not separable at this scale"),
    ],
)
def test_verdict_follows_the_interval(claims, low, high, direction, expected):
    assert claims.verdict(low, high, direction) == expected


def test_censored_values_cannot_give_the_verdict_they_bias_towards(claims):
    # a claimed method that never reached the threshold has a lower bound as its cost: its "lower" is not shown
    assert claims.verdict(-5.0, -1.0, -1, arm_censored=True) == "not separable at this scale"
    assert claims.verdict(-5.0, -1.0, -1, base_censored=True) == "reproduced"
    # a baseline that never reached it: its cost is a lower bound, so "the method costs more" is not shown
    assert claims.verdict(1.0, 5.0, -1, base_censored=True) == "not separable at this scale"
    assert claims.verdict(1.0, 5.0, -1, arm_censored=True) == "contradicted"


def test_verdict_refuses_nonsense(claims):
    with pytest.raises(ValueError, match="direction"):
        claims.verdict(0.1, 0.2, 0)
    with pytest.raises(ValueError, match="empty"):
        claims.verdict(0.2, 0.1, 1)


def test_seed_rule_extends_exactly_the_unseparated_settings(claims):
    plan = claims.settings()
    names = [s.name for s in plan]
    rows = [
        {"setting": names[0], "verdict": "reproduced"},
        {"setting": names[1], "verdict": "reproduced"},
        {"setting": names[1], "verdict": "not separable at this scale"},
        {"setting": names[2], "verdict": "contradicted"},
    ]
    assert [s.name for s in claims.settings_for_more_seeds(rows, plan)] == [names[1]]


def test_to_threshold_is_censored_when_never_reached(claims):
    run = {"accuracy": {"0": 0.2, "5": 0.3, "10": 0.5}, "cpu_seconds": [1.0] * 10}
    arm = claims.Arm("grpo", "grpo")
    context = {"threshold": 0.45, "batch_size": 8}
    assert claims.measure("cpu_to_threshold", run, arm, context) == (10.0, False)
    assert claims.measure("cpu_to_threshold", run, arm, {**context, "threshold": 0.25}) == (5.0, False)
    # the warm start's own evaluation (step 0) never counts as reaching it
    assert claims.measure("cpu_to_threshold", run, arm, {**context, "threshold": 0.1}) == (5.0, False)
    assert claims.measure("cpu_to_threshold", run, arm, {**context, "threshold": 0.9}) == (10.0, True)


def test_every_cov_method_of_this_checkout_sits_beside_cw_grpo(claims):
    from grpo_family import METHODS

    lr_settings = [s for s in claims.settings() if s.claim == "cw_grpo"]
    assert lr_settings
    for setting in lr_settings:
        arms = {a.method for a in setting.arms}
        assert {"grpo", "cw_grpo"} <= arms
        assert {m for m in ("kl_cov", "clip_cov") if m in METHODS} <= arms


# ------------------------------------------------------------------------------------------------ training rewards
def test_flipped_reward_flips_exactly_the_share_asked(runs):
    def base(completions, **kwargs):
        return [1.0 if c == "right" else 0.0 for c in completions]

    base.__name__ = "base"
    noisy = runs.FlippedReward(base, 0.25, seed=3)
    completions = ["right", "wrong"] * 8
    values = noisy(completions)
    clean = base(completions)
    assert sum(v != c for v, c in zip(values, clean)) == 4  # round(0.25 * 16)
    assert all(v == 1.0 - c for v, c in zip(values, clean) if v != c)
    assert (noisy.calls, noisy.scored, noisy.flipped) == (1, 16, 4)
    again = runs.FlippedReward(base, 0.25, seed=3)
    assert again(completions) == values  # seeded: paired runs see the same noise
    with pytest.raises(ValueError, match="flip probability"):
        runs.FlippedReward(base, 1.5, seed=0)


def test_graded_reward_is_partial_credit_by_distance(runs):
    values = runs.graded_arithmetic_reward(
        ["The answer is 7.", "The answer is 8.", "The answer is 17.", "no number here"], answer=["7", "7", "7", "7"]
    )
    assert values == [1.0, 0.25, pytest.approx(0.5 / 11), 0.0]


# ------------------------------------------------------------------------------------------------ the quick run
@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("claims_quick")
    readme = (ROOT / "README.md").read_text()
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "claims.py"), "--quick", "--output-dir", str(out)],
                   check=True, cwd=ROOT)  # fmt: skip
    assert (ROOT / "README.md").read_text() == readme  # --quick leaves the README alone
    return out, json.loads((out / "claims.json").read_text())


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_quick_run_trains_every_planned_run(quick, claims):
    _, result = quick
    meta = result["meta"]
    assert meta["quick"] and meta["runs"] == meta["runs_trained"] == meta["runs_finished"] > 0
    assert not meta["not_run"]
    planned = {(s["name"], a["name"]) for s in result["settings"] for a in s["arms"]}
    assert {(r["setting"], r["arm"]) for r in result["runs"]} == planned


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_quick_run_verdicts_follow_the_numbers_beside_them(quick, claims):
    from grpo_family.eval import paired_bootstrap

    out, result = quick
    rows = result["rows"]
    assert {r["claim"] for r in rows} == set(claims.CLAIMS)
    markdown = (out / "claims.md").read_text()
    for row in rows:
        assert row["verdict"] != "not run" and len(row["seeds"]) >= 2
        arm, base = row["arm_values"], row["baseline_values"]
        assert len(arm) == len(base) == len(row["seeds"])
        boot = paired_bootstrap(base, arm)
        assert (row["diff"], row["low"], row["high"]) == (boot["diff"], boot["low"], boot["high"])
        assert row["diff"] == pytest.approx(sum(arm) / len(arm) - sum(base) / len(base))
        censored = row["censored"] or {}
        expected = claims.verdict(row["low"], row["high"], row["direction"], arm_censored=censored.get("arm", 0) > 0,
                                  base_censored=censored.get("baseline", 0) > 0)  # fmt: skip
        assert row["verdict"] == expected
        assert claims.row_line(row) in markdown
        assert (row["verdict"] == "reproduced") == (row["needs"] == "")
    assert "Quick mode" in markdown and "- Real model: the `real model`" in markdown  # which learning runs it read
    assert all(claims.row_line(row) in markdown for row in result["real_model_rows"])
