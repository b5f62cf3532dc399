"""`benchmarks/claims.py`'s `real model` rows, from synthetic learning runs of `benchmarks/realmodel.py`'s shape (no
model, no training): D3S's tokens and CPU time to the paired grpo run's final accuracy with their censoring, GPG's CPU
time per step, "not run" naming the missing runs, the claims verdict rule; and `--report-only`'s fallback to the runs
stored in claims.json. Default lane (a few seconds: the bootstrap's resamples)."""

# tol(defaults): the values are sums and ratios of a few float64 numbers given here (rounding ~1e-13 relative);
# pytest.approx's relative 1e-6 lies far above that and far below any hand-worked difference (>= 1 token, 0.005 s).
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="module")
def claims():
    return importlib.import_module("benchmarks.claims")


def run(seed: int, curve: list[tuple[int, float, float]], train_cpu_s: float, method: str = "grpo") -> dict:
    """A learning run as realmodel.py writes it, only the fields the rows read."""
    return {"method": method, "seed": seed, "steps": 40, "held_out_curve": [list(p) for p in curve],
            "tokens": curve[-1][2], "train_cpu_s": train_cpu_s}  # fmt: skip


# grpo's thresholds: seed 42 reaches its final 0.72 at step 40 (4000 tokens, all 800 CPU-s); seed 43's final 0.66 is
# first reached at step 30 (3300 tokens, 880 x 30/40 = 660 CPU-s).
GRPO = {
    42: run(42, [(0, 0.6, 0), (10, 0.6, 1000), (20, 0.7, 2000), (30, 0.7, 3000), (40, 0.72, 4000)], 800.0),
    43: run(43, [(0, 0.6, 0), (10, 0.65, 1100), (20, 0.62, 2200), (30, 0.66, 3300), (40, 0.66, 4400)], 880.0),
}
# d3s seed 42 reaches 0.72 at step 10 (900 tokens, 600 x 10/40 = 150 CPU-s); seed 43 never reaches 0.66 (its best is
# 0.65): censored at its totals, 3000 tokens and 640 CPU-s.
D3S = {
    42: run(42, [(0, 0.6, 0), (10, 0.72, 900), (20, 0.7, 1800), (30, 0.75, 2700), (40, 0.74, 3600)], 600.0, "d3s"),
    43: run(43, [(0, 0.6, 0), (10, 0.6, 750), (20, 0.65, 1500), (30, 0.64, 2250), (40, 0.65, 3000)], 640.0, "d3s"),
}
CURVE = [(0, 0.6, 0), (40, 0.7, 4000)]
GPG = {42: run(42, CURVE, 1600.0, "gpg"), 43: run(43, CURVE, 1720.0, "gpg")}  # 40.0 and 43.0 CPU-s a step
GRPO_KL = {42: run(42, CURVE, 1000.0), 43: run(43, CURVE, 1080.0)}  # 25.0 and 27.0


def all_runs(**drop) -> dict:
    runs = {(name, seed): r for name, by_seed in (("grpo", GRPO), ("d3s", D3S), ("gpg", GPG), ("grpo_kl", GRPO_KL))
            for seed, r in by_seed.items()}  # fmt: skip
    for name, seed in drop.items():
        runs.pop((name, seed))
    return runs


def by_measure(rows: list[dict]) -> dict:
    return {(r["arm"], r["baseline"], r["measure"]): r for r in rows}


def test_d3s_to_threshold_counts_a_run_that_never_reaches_it_as_censored(claims):
    rows = by_measure(claims.real_model_rows(all_runs(), seeds=(42, 43)))
    tokens, cpu = rows[("d3s", "grpo", "tokens_to_threshold")], rows[("d3s", "grpo", "cpu_to_threshold")]
    assert tokens["setting"] == "real model" and tokens["seeds"] == [42, 43] and tokens["thresholds"] == [0.72, 0.66]
    assert tokens["arm_values"] == [900, 3000] and tokens["baseline_values"] == [4000, 3300]
    assert cpu["arm_values"] == pytest.approx([150.0, 640.0])
    assert cpu["baseline_values"] == pytest.approx([800.0, 660.0])
    for row in (tokens, cpu):
        assert row["censored"] == {"arm": 1, "baseline": 0}
        # every paired difference is negative (-3100, -300 tokens; -650, -20 CPU-s): the interval lies below 0, which
        # alone would reproduce the claim, but d3s seed 43 is a lower bound, so the claims rule withholds it
        assert row["high"] < 0 and claims.verdict(row["low"], row["high"], -1) == "reproduced"
        assert row["verdict"] == "not separable at this scale"
    assert tokens["diff"] == pytest.approx(-1700.0) and cpu["diff"] == pytest.approx(-335.0)
    assert tokens["paper"] == claims.D3S_TOKENS and cpu["paper"] == claims.D3S_SPEED  # the tiny rows' claim texts
    final = rows[("d3s", "grpo", "final_accuracy")]  # 0.74 vs 0.72, 0.65 vs 0.66: +0.02 and -0.01
    assert final["arm_values"] == [0.74, 0.65] and final["baseline_values"] == [0.72, 0.66]
    assert final["verdict"] == "not separable at this scale" and final["censored"] is None


def test_gpg_cpu_per_step_against_grpo_and_grpo_kl(claims):
    rows = by_measure(claims.real_model_rows(all_runs(), seeds=(42, 43)))
    grpo, kl = rows[("gpg", "grpo", "cpu_per_step")], rows[("gpg", "grpo_kl", "cpu_per_step")]
    assert grpo["arm_values"] == pytest.approx([40.0, 43.0]) and grpo["baseline_values"] == pytest.approx([20.0, 22.0])
    assert kl["baseline_values"] == pytest.approx([25.0, 27.0])
    assert grpo["diff"] == pytest.approx(20.5) and kl["diff"] == pytest.approx(15.5)
    # gpg costs more per step on both seeds: the claimed "lower" is contradicted against both baselines
    assert grpo["verdict"] == kl["verdict"] == "contradicted" and grpo["paper"] == claims.GPG_COST
    assert {r["measure"] for r in rows.values() if r["arm"] == "gpg"} == {"final_accuracy", "cpu_per_step"}


def test_a_missing_pair_is_not_run_and_names_the_missing_runs(claims):
    runs = all_runs()
    for seed in (42, 43):
        runs.pop(("grpo_kl", seed))
    runs.pop(("grpo", 43))
    rows = by_measure(claims.real_model_rows(runs, seeds=(42, 43)))
    kl = rows[("gpg", "grpo_kl", "cpu_per_step")]
    assert kl["verdict"] == "not run" and kl["seeds"] == []
    assert "missing: grpo_kl seed 42, grpo_kl seed 43;" in kl["reason"] and "grpo seed 43" not in kl["reason"]
    tokens = rows[("d3s", "grpo", "tokens_to_threshold")]
    assert tokens["verdict"] == "not run" and tokens["seeds"] == [42] and "missing: grpo seed 43;" in tokens["reason"]
    assert tokens["reason"].endswith("seed 42: d3s 900 vs grpo 4000")  # the seed that has both, for the reader
    assert tokens["needs"] == tokens["reason"]
    assert {r["verdict"] for key, r in rows.items() if key[1] == "grpo_kl"} == {"not run"}
    line = claims.row_line(tokens)
    assert "| `real model` (SmolLM2-135M-Instruct, the demo recipe, 40 steps) |" in line and "**not run**" in line


def test_real_model_rows_use_the_claims_verdict_rule(claims, monkeypatch):
    rows = claims.real_model_rows(all_runs(), seeds=(42, 43))
    for row in rows:
        censored = row["censored"] or {}
        assert row["verdict"] == claims.verdict(row["low"], row["high"], row["direction"],
                                                arm_censored=censored.get("arm", 0) > 0,
                                                base_censored=censored.get("baseline", 0) > 0)  # fmt: skip
        assert (row["verdict"] == "reproduced") == (row["needs"] == "")
        if row["verdict"] != "reproduced":
            assert "SmolLM2-135M-Instruct" in row["needs"]  # the real model's scale, not the tiny model's
    calls = []
    monkeypatch.setattr(claims, "verdict", lambda *a, **k: calls.append((a, k)) or "reproduced")
    assert {r["verdict"] for r in claims.real_model_rows(all_runs(), seeds=(42, 43))} == {"reproduced"}
    assert len(calls) == len(rows) == len(claims.real_model_comparisons())


def test_real_model_runs_are_read_from_realmodel_plan_files(claims, tmp_path):
    from benchmarks import realmodel

    for job, r in (
        (realmodel.learn_job("grpo", 42), GRPO[42]),
        (realmodel.learn_job("grpo", 43, "grpo_kl"), GRPO_KL[43]),
    ):
        realmodel.cache_path(tmp_path, job).write_text(json.dumps({**job, **r, "method": job["method"]}))
    found, missing = claims.real_model_runs(tmp_path)
    assert sorted(found) == [("grpo", 42), ("grpo_kl", 43)]  # grpo_kl's run (method grpo) under its arm's name
    assert len(missing) == len(realmodel.learn_jobs()) - 2


def test_report_only_reads_back_the_runs_stored_in_claims_json(claims):
    """Without the run cache (outputs/ is not committed) the stored runs give the committed rows exactly."""
    from grpo_family.tasks import DEFAULT_GRPO_ARGS

    stored = json.loads(claims.STORED.read_text())
    plan = claims.settings()
    runs = claims.stored_runs(plan, claims.STEPS, claims.EVAL_EVERY, claims.EVAL_EXAMPLES, DEFAULT_GRPO_ARGS)
    assert len(runs) == len(stored["runs"]) == stored["meta"]["runs_finished"]
    batch = DEFAULT_GRPO_ARGS["per_device_train_batch_size"]
    assert json.loads(json.dumps(claims.make_rows(list(runs.values()), plan, batch, claims.STEPS))) == stored["rows"]
    # another plan's file gives nothing
    assert claims.stored_runs(plan, claims.STEPS + 1, claims.EVAL_EVERY, claims.EVAL_EXAMPLES, DEFAULT_GRPO_ARGS) == {}
    assert claims.stored_runs(plan, claims.STEPS, claims.EVAL_EVERY, claims.EVAL_EXAMPLES,
                              {**DEFAULT_GRPO_ARGS, "learning_rate": 1.0}) == {}  # fmt: skip
