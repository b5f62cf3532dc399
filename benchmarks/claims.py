"""Claims benchmark: each paper's central claim, tested at the scale this machine allows, with a verdict computed
from the numbers.

    python benchmarks/claims.py                # full run (resumable: finished runs are cached in outputs/claims_runs/)
    python benchmarks/claims.py --quick        # the same pipeline on tiny runs, uncached; numbers meaningless (tests)
    python benchmarks/claims.py --report-only  # the report from the runs finished so far (the run cache, else the
                                               # runs stored in claims.json); the rest says "not run"; trains nothing

One setting per claim (``SETTINGS``), each method paired seed by seed with ``grpo`` (same warm start, same training
data in the same order, same sampling seed), trained on the bundled arithmetic task by
:func:`benchmarks.runs.run_one` (shared with ``learning.py``) in worker processes with one torch thread each. Held-out
greedy accuracy on fixed problems every ``EVAL_EVERY`` steps, through ``grpo_family.eval.EvaluationCallback``.

Each row of the report compares one measure of a method (``arm``) with its baseline over the seeds both ran: mean ±
sd of each, the paired difference (arm - baseline) with a 95% paired-bootstrap interval over seeds
(``grpo_family.eval.paired_bootstrap``: 10,000 resamples, seed 0), and a verdict computed by :func:`verdict`:

* **reproduced**: the interval lies entirely on the side the paper claims;
* **contradicted**: it lies entirely on the other side;
* **not separable at this scale**: it contains 0;
* **not run**: fewer than 2 seeds have both runs (out of time, or a method this checkout lacks).

A "to threshold" value of a run that never reached the threshold is that run's whole total, a lower bound of the true
value: a row where the claimed method has such a run cannot be "reproduced", one where the baseline has one cannot be
"contradicted" (both measures claim *lower* is better).

Seeds (rule ``SEED_RULE``, applied by the script): every setting runs seeds 0-4; a setting with a row that is "not
separable at this scale" after them runs seeds 5-9 as well, and its rows use all ten.

Real model (``real_model_rows``): D3S's and GPG's claims on SmolLM2-135M-Instruct, as rows of the same table in the
setting ``real model``, from ``benchmarks/realmodel.py``'s learning runs (its plan, ``learn_jobs``; the demo recipe,
40 steps, LoRA, seeds 42 and 43; one file per run in ``benchmarks/results/realmodel_runs/``, trained by
``realmodel.py --stages learn``, never here), paired by seed and judged by :func:`verdict` with the same censoring:
d3s vs grpo in tokens and CPU time to reach the paired grpo run's final held-out accuracy (at the held-out evaluations
every 10 steps; the CPU time the training command's, apportioned by steps) and in final accuracy; gpg vs grpo and vs
grpo_kl (grpo with beta 0.04, ``realmodel.LEARN_ARMS``) in CPU time per step (the training command's, whose held-out
evaluations the run files cannot separate: the same five in every arm) and in final accuracy. Fewer than 2 paired
seeds: "not run", naming the missing runs.

``--report-only`` reads each run from the cache, else from the ``runs`` an earlier full run stored in ``claims.json``
(same plan only: ``stored_runs``), so a checkout without ``outputs/`` regenerates the same tiny-model rows.

Writes ``benchmarks/results/claims.md``, ``claims.json``, ``claims_<setting>.png`` and the README's claims block
(between ``<!-- generated: claims -->`` markers). ``--quick`` writes to ``outputs/claims_quick/`` and leaves the
README alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from benchmarks.runs import _mean, _std, finite, run_all  # noqa: E402 - the training runs, shared with learning.py
from grpo_family import METHODS  # noqa: E402 - light: the trainers load on first use

VERDICTS = ("reproduced", "not separable at this scale", "contradicted", "not run")
FIRST_SEEDS, MAX_SEEDS = 5, 10
SEED_RULE = (
    f"every setting runs seeds 0-{FIRST_SEEDS - 1}; a setting with a row that is 'not separable at this scale' after "
    f"them runs seeds {FIRST_SEEDS}-{MAX_SEEDS - 1} as well (all its methods), and its rows use every seed run"
)
STEPS = 50
EVAL_EVERY = 5
EVAL_EXAMPLES = 200
BUDGET_MINUTES = 90
COLLAPSE_DROP = 0.10
THRESHOLD_SHARE = 0.5
QUICK = dict(steps=2, eval_every=1, eval_examples=4, seeds=(2, 2))
QUICK_ARGS = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=24)  # 2 prompts a step
COV_METHODS = [m for m in ("kl_cov", "clip_cov") if m in METHODS]  # issue 31's Cui et al. methods, once merged


@dataclass(frozen=True)
class Arm:
    """One trained configuration of a setting: a method and its config changes."""

    name: str
    method: str
    overrides: dict = field(default_factory=dict)
    log_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setting:
    """Task, training changes over ``DEFAULT_GRPO_ARGS`` and training reward, shared by every arm."""

    name: str
    claim: str
    description: str
    arms: tuple[Arm, ...]
    difficulty: str | dict = "default"
    overrides: dict = field(default_factory=dict)
    reward: dict | None = None


@dataclass(frozen=True)
class Comparison:
    """A row: ``measure`` of ``arm`` against ``baseline`` in ``setting``; ``direction`` +1 when the paper claims
    the arm's value is higher, -1 when lower; ``paper`` the paper's number and where it is."""

    claim: str
    setting: str
    arm: str
    baseline: str
    measure: str
    direction: int
    paper: str
    headline: bool = False


GRPO = Arm("grpo", "grpo")
# SGPO: problems of 3-4 operations (the warm start saw 2-3), where most groups of 8 are all wrong and their samples
# go wrong at different lines, so the programmatic step judge tells them apart.
LONG_PROBLEMS = dict(name="long", min_ops=3, max_ops=4, max_operand=9, precedence_share=0.9)
CW_LEARNING_RATES = (5e-4,)
FLIP_RATES = (0.25, 0.4)


def settings() -> list[Setting]:
    cov = tuple(Arm(m, m) for m in COV_METHODS)
    out = [
        Setting(
            "default",
            "d3s+gpg",
            "the embedded default (`DEFAULT_GRPO_ARGS`); GPG with and without its beta_th resampling, grpo with and "
            "without a KL term to a reference model (beta 0.04)",
            (
                GRPO,
                Arm("d3s", "d3s", log_keys=("d3s/kept_tokens",)),
                Arm("gpg", "gpg"),
                Arm("gpg_no_resampling", "gpg", {"beta_th": None}),
                Arm("grpo_kl", "grpo", {"beta": 0.04}),
            ),
        ),
        Setting(
            "two_iterations",
            "d3s",
            "the default with `num_iterations=2` (each generation batch trained twice)",
            (GRPO, Arm("d3s", "d3s", log_keys=("d3s/kept_tokens",))),
            overrides={"num_iterations": 2},
        ),
        Setting(
            "long_problems",
            "sgpo",
            "problems of 3-4 operations (the warm start learnt 2-3) with completions up to 48 tokens; SGPO with its "
            "programmatic step judge, whose first wrong line differs between samples of a group",
            (
                GRPO,
                Arm(
                    "sgpo",
                    "sgpo",
                    log_keys=("sgpo/frac_all_negative", "sgpo/judge_calls", "sgpo/frac_degenerate_judged"),
                ),
            ),
            difficulty=LONG_PROBLEMS,
            overrides={"max_completion_length": 48},
        ),
    ]
    out += [
        Setting(
            f"lr_{lr:g}",
            "cw_grpo",
            f"the default at learning rate {lr:g} (10x the default), where grpo destabilises, with "
            "`num_iterations=2` (each generation batch trained twice, so the policy moves off the sampling policy and "
            "the clip acts; with one update per batch the ratio is 1 and KL-Cov's penalty is 0)",
            (GRPO, Arm("cw_grpo", "cw_grpo"), *cov),
            overrides={"learning_rate": lr, "num_iterations": 2},
        )
        for lr in CW_LEARNING_RATES
    ]
    ms = (GRPO, Arm("ms_grpo", "ms_grpo", log_keys=("ms_grpo/abs_diff_to_grpo",)))
    out += [
        Setting(
            f"flip_{p:g}",
            "ms_grpo",
            f"the default with a share {p:g} of each batch's training rewards flipped (exactly round({p:g} n) of n, "
            "at random); held-out accuracy is scored on the true answers",
            ms,
            reward={"flip": p},
        )
        for p in FLIP_RATES
    ]
    out.append(
        Setting(
            "graded",
            "ms_grpo",
            "the default with graded rewards: 1 for the right answer, 0.5 / (1 + |stated - gold|) for a wrong integer "
            "answer, 0 without one",
            ms,
            reward={"graded": True},
        )
    )
    return out


# The papers' numbers, from /work/shared/specs/<method>.md ("Headline results") and the papers' text.
D3S_TOKENS = (
    "D3S trains on fewer than 20% of GRPO's tokens and its validation pass@1 rises faster (Qwen2.5-Math-7B on "
    "AIME24; §1 and Fig. 1a, 1c)"
)
D3S_SPEED = (
    "reaches GRPO's accuracy 2.04x sooner on Qwen2.5-Math-7B, 1.57x on 1.5B (§4.5, Table 4: time to the baseline's "
    "accuracy)"
)
D3S_ACCURACY = "pass@1 average of 7 math benchmarks 34.3 vs GRPO 29.8 on Qwen2.5-Math-7B, +4.5 (§4.2, Table 1)"
GPG_ACCURACY = (
    "R1-Distill-Qwen-1.5B, 5 math benchmarks: average 55.7 vs 53.1 for GRPO (Open-RS1, reproduced) (§3.2, Table 3)"
)
GPG_COST = (
    "no reference model, no KL, no clip (§1; Table 14); cost: 0.45x DAPO's training cost (§3.4, Table 9); no timing "
    "against GRPO in the paper"
)
GPG_RESAMPLING = "Qwen2.5-Math-7B: beta_th = 0.6 resampling 48.3 vs 47.8 without (§2.2, Table 1)"
SGPO_SIGNAL = (
    "all-wrong groups give GRPO no update; the step judge's partial credit gives them one (§1, §3.1, Eq. 2); it "
    "'alleviates but does not fully eliminate' degeneracy (§3.1, Remark 3.1)"
)
SGPO_ACCURACY = (
    "R1-Distill-Qwen-7B, 9 benchmarks: overall 66.19 (DeepSeek-V3 judge) vs GRPO 63.72 (§4.2, Table 2); gains in "
    "early and mid training where all-wrong groups are common (§1, contribution 2)"
)
CW_ENTROPY = (
    "GRPO's entropy is unstable, CW-GRPO keeps it at a stable level (§3.2 'Policy Entropy Results', Fig. 1; no "
    "numbers)"
)
CW_COLLAPSE = (
    "GRPO's MATH-500 falls 85.0 -> 82.0 -> 79.8 at steps 100/150/200 as its entropy swings; CW-GRPO holds "
    "86.2-87.0 (§3.2, Table 3)"
)
CW_ACCURACY = "R1-Distill-Qwen-1.5B, 5 math benchmarks: average 55.3 vs GRPO 52.6 (§3.2, Table 2)"
COV_PAPER = {
    "clip_cov": "Clip-Cov as a baseline in the CW-GRPO paper: 53.6 vs GRPO 52.6, R1-Distill-Qwen-1.5B (Table 2)",
    "kl_cov": "KL-Cov is not compared in the CW-GRPO paper; its own paper (Cui et al. 2025) is not among the papers "
    "here",
}
MS_ROBUST = (
    "'sensitive to the heterogeneity and stochasticity of reward distribution' is GRPO's weakness that MS-GRPO "
    "corrects (Abstract; §1; App. D: the correction grows with reward heterogeneity); no noisy-reward experiment; "
    "on clean rewards AIME24 +5.5 over GRPO, mean of 6 models (Abstract, Table 1)"
)

MEASURES = {  # name -> (what it is, unit format)
    "final_accuracy": ("held-out greedy accuracy at the last step", "{:.3f}"),
    "mean_accuracy": (
        "held-out greedy accuracy averaged over the evaluations after step 0 (accuracy over steps)",
        "{:.3f}",
    ),  # fmt: skip
    "tokens_to_threshold": (
        "completion tokens trained on until the first evaluation at or above the threshold",
        "{:.0f}",
    ),  # fmt: skip
    "cpu_to_threshold": ("CPU seconds of training (evaluations excluded) until that evaluation", "{:.1f}"),
    "cpu_per_step": ("CPU seconds per optimizer step (one thread; evaluations excluded)", "{:.3f}"),
    "no_signal_share": (
        "share of groups whose training rewards are all equal (no learning signal), mean over steps",
        "{:.3f}",
    ),  # fmt: skip
    "entropy_sd": ("standard deviation of the per-step policy entropy across steps", "{:.4f}"),
    "collapsed": (
        f"1 if the run collapsed (held-out accuracy at the end at least {COLLAPSE_DROP:g} below its best "
        "evaluation, or below the warm start), else 0",
        "{:.2f}",
    ),  # fmt: skip
}
CENSORED = ("tokens_to_threshold", "cpu_to_threshold")


def comparisons(setting_names: list[str]) -> list[Comparison]:
    rows = []
    for s in ("default", "two_iterations"):
        rows += [
            Comparison("d3s", s, "d3s", "grpo", "tokens_to_threshold", -1, D3S_TOKENS, s == "default"),
            Comparison("d3s", s, "d3s", "grpo", "cpu_to_threshold", -1, D3S_SPEED),
            Comparison("d3s", s, "d3s", "grpo", "final_accuracy", +1, D3S_ACCURACY),
        ]
    rows += [
        Comparison("gpg", "default", "gpg", "grpo", "final_accuracy", +1, GPG_ACCURACY, True),
        Comparison("gpg", "default", "gpg", "grpo_kl", "final_accuracy", +1, GPG_ACCURACY),
        Comparison("gpg", "default", "gpg", "gpg_no_resampling", "final_accuracy", +1, GPG_RESAMPLING),
        Comparison("gpg", "default", "gpg", "grpo", "cpu_per_step", -1, GPG_COST),
        Comparison("gpg", "default", "gpg", "grpo_kl", "cpu_per_step", -1, GPG_COST),
        Comparison("sgpo", "long_problems", "sgpo", "grpo", "no_signal_share", -1, SGPO_SIGNAL),
        Comparison("sgpo", "long_problems", "sgpo", "grpo", "mean_accuracy", +1, SGPO_ACCURACY, True),
        Comparison("sgpo", "long_problems", "sgpo", "grpo", "final_accuracy", +1, SGPO_ACCURACY),
    ]
    for lr in CW_LEARNING_RATES:
        s = f"lr_{lr:g}"
        for arm in ("cw_grpo", *COV_METHODS):
            paper = {"cw_grpo": None}.get(arm, COV_PAPER.get(arm))
            rows += [
                Comparison("cw_grpo", s, arm, "grpo", "entropy_sd", -1, paper or CW_ENTROPY, arm == "cw_grpo"),
                Comparison("cw_grpo", s, arm, "grpo", "collapsed", -1, paper or CW_COLLAPSE),
                Comparison("cw_grpo", s, arm, "grpo", "final_accuracy", +1, paper or CW_ACCURACY),
            ]
    for s in [f"flip_{p:g}" for p in FLIP_RATES] + ["graded"]:
        rows.append(Comparison("ms_grpo", s, "ms_grpo", "grpo", "final_accuracy", +1, MS_ROBUST, s == "flip_0.25"))
    return [r for r in rows if r.setting in setting_names]


CLAIMS = {  # claim -> (the claim in a line, what a reproduction would need beyond this machine)
    "d3s": (
        "D3S: the same accuracy from fewer rollouts and tokens, sooner",
        "the paper's scale: 1.5B-8B models, G = 32 rollouts per prompt, responses of thousands of tokens and "
        "hundreds of steps (§4.1), where the tokens D3S drops are a large share of the backward pass; here G = 8, "
        "completions of at most 40 tokens and {steps} steps on a 0.34M-parameter model",
    ),
    "gpg": (
        "GPG: as good as GRPO without a reference model, cheaper",
        "a model whose reference forward is a large share of a step (the paper's 1.5B-7B models on GPUs) and "
        "hundreds of steps on math data (§3.1); here the reference forward of a 0.34M-parameter model over "
        "40-token completions, {steps} steps",
    ),
    "sgpo": (
        "SGPO: learns where all-wrong groups dominate",
        "failures that are 'truncated but largely correct trajectories or localized mistakes' (§4.4) on problems "
        "the policy can partly solve, several epochs (Fig. 4) and a 7B+ policy; here a warm start that mostly "
        "orders operations wrongly, {steps} steps",
    ),
    "cw_grpo": (
        "CW-GRPO: steadier entropy, better accuracy",
        "the paper's regime: a 1.5B-7B model whose entropy swings over 100-200 steps at a stable learning rate "
        "(Fig. 1, Table 3); here the instability is forced by a 10x learning rate on a 0.34M-parameter model "
        "within {steps} steps",
    ),
    "ms_grpo": (
        "MS-GRPO: robust to heterogeneous or noisy rewards",
        "rewards whose heterogeneity the group statistics miss, over more than {steps} steps (the paper tests no "
        "noisy rewards: its gains are on clean rewards with 1.5B-8B models and groups of 8, Table 1)",
    ),
}


# ----------------------------------------------------------------------------------------------- measures
def _accuracy(run: dict) -> list[tuple[int, float]]:
    return [(int(step), acc) for step, acc in run["accuracy"].items()]


def trained_tokens(run: dict, arm: Arm, batch_size: int) -> list[float]:
    """Completion tokens each optimizer step trains on: D3S's kept tokens (its own count), else every completion
    token of the step's generation batch; a step that reuses a batch (``num_iterations > 1``) trains it again."""
    kept = run["log"].get(f"{arm.method}/kept_tokens")
    lengths = run["log"]["completions/mean_length"]
    values = kept if kept is not None else [None if m is None else m * batch_size for m in lengths]
    out, last = [], None
    for value in values:
        last = value if value is not None else last
        out.append(last)
    return out


def first_reaching(curve: list[tuple[int, float]], threshold: float) -> int | None:
    """The step of the first evaluation after step 0 (the start never counts) whose accuracy is at or above
    ``threshold``; None when none is (the run is censored: its whole total stands for its cost)."""
    for step, acc in curve:
        if step > 0 and acc >= threshold - 1e-12:
            return step
    return None


def _to_threshold(run: dict, costs: list[float], threshold: float) -> tuple[float, bool]:
    """The cumulative cost at the first evaluation (after step 0) at or above ``threshold``; the whole run's cost
    and censored=True when none is."""
    step = first_reaching(_accuracy(run), threshold)
    return (sum(costs), True) if step is None else (sum(costs[:step]), False)


def measure(name: str, run: dict, arm: Arm, context: dict) -> tuple[float, bool]:
    """``(value, censored)`` of measure ``name`` for one run."""
    accuracy = [acc for _, acc in _accuracy(run)]
    if name == "final_accuracy":
        return accuracy[-1], False
    if name == "mean_accuracy":
        return _mean(accuracy[1:]), False
    if name == "cpu_per_step":
        return _mean(run["cpu_seconds"]), False
    if name == "entropy_sd":
        return _std(finite(run["entropy"])), False
    if name == "no_signal_share":
        return _mean(finite(run["frac_reward_zero_std"])), False
    if name == "collapsed":
        final, best, start = accuracy[-1], max(accuracy), accuracy[0]
        return float(final <= best - COLLAPSE_DROP + 1e-12 or final < start), False
    if name == "tokens_to_threshold":
        return _to_threshold(run, trained_tokens(run, arm, context["batch_size"]), context["threshold"])
    if name == "cpu_to_threshold":
        return _to_threshold(run, run["cpu_seconds"], context["threshold"])
    raise KeyError(name)


# ----------------------------------------------------------------------------------------------- verdicts
def verdict(low: float, high: float, direction: int, *, arm_censored: bool = False, base_censored: bool = False):
    """The verdict of a paired difference's interval ``[low, high]`` for a claim that the arm's value is higher
    (``direction`` +1) or lower (-1) than the baseline's. Censored values are lower bounds of costs (measures that
    claim lower): a censored arm rules out "reproduced", a censored baseline "contradicted"."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if not low <= high:
        raise ValueError(f"interval [{low}, {high}] is empty")
    if direction * low > 0 and direction * high > 0 and not arm_censored:
        return "reproduced"
    if direction * low < 0 and direction * high < 0 and not base_censored:
        return "contradicted"
    return "not separable at this scale"


MAX_SEEDS_QUOTED = 1000


def seeds_needed(diffs: list[float]) -> int | None:
    """Seeds a paired two-sided test at 5% would need for 80% power at the observed mean difference and spread
    (normal approximation, ``((1.96 + 0.84) sd / |mean|)^2``); None when the mean difference is 0."""
    mean = _mean(diffs)
    if mean == 0:
        return None
    return max(2, math.ceil(((1.96 + 0.84) * _std(diffs) / abs(mean)) ** 2))


def needs_text(row: dict) -> str:
    """What a row that does not reproduce would need: computed from its numbers, plus the claim's scale."""
    if row["verdict"] == "reproduced":
        return ""
    if row["verdict"] == "not run":
        return row["reason"]
    scale = (REAL_NEEDS if row["setting"] == REAL_SETTING else {c: v[1] for c, v in CLAIMS.items()})[row["claim"]]
    scale = scale.format(steps=row["steps"])
    n = len(row["seeds"])
    if row["verdict"] == "contradicted":
        return (
            f"The difference is on the other side of zero in all resamples of these {n} seeds. It would need {scale}."
        )
    diffs = [a - b for a, b in zip(row["arm_values"], row["baseline_values"])]
    if all(d == 0 for d in diffs):
        return f"Both gave the same value on every seed: this setting does not exercise the measure. It would need {scale}."
    more = seeds_needed(diffs)
    if more is None:
        seeds = "the mean difference is 0"
    elif more > MAX_SEEDS_QUOTED:  # a mean difference near 0: a seed count says nothing more than that
        seeds = f"at this mean difference and spread more than {MAX_SEEDS_QUOTED:,} seeds would be needed (80% power)"
    else:
        seeds = f"at this mean difference and spread about {max(more, n + 1)} seeds would separate it (80% power)"
    censored = " (some runs never reached the threshold: their values are lower bounds)" if row["censored"] else ""
    return f"The interval contains 0 with {n} seeds{censored}; {seeds}. It would need {scale}."


def bootstrap(baseline: list[float], arm: list[float]) -> dict:
    from grpo_family.eval import paired_bootstrap

    return paired_bootstrap(baseline, arm)


def make_rows(runs: list[dict], plan: list[Setting], batch_size: int, steps: int) -> list[dict]:
    """Every comparison of the planned settings, from the runs that finished."""
    by_key = {(r["setting"], r["arm"], r["seed"]): r for r in runs}
    arms = {(s.name, a.name): a for s in plan for a in s.arms}
    contexts = {}
    for s in plan:
        grpo = [r for r in runs if r["setting"] == s.name and r["arm"] == "grpo"]
        start = _mean([r["accuracy"]["0"] for r in grpo]) if grpo else math.nan
        final = _mean([list(r["accuracy"].values())[-1] for r in grpo]) if grpo else math.nan
        contexts[s.name] = {"start": start, "threshold": start + THRESHOLD_SHARE * (final - start),
                            "batch_size": batch_size}  # fmt: skip
    rows = []
    for c in comparisons([s.name for s in plan]):
        seeds = sorted(
            seed for (setting, arm, seed) in by_key if setting == c.setting and arm == c.arm
            and (c.setting, c.baseline, seed) in by_key
        )  # fmt: skip
        row = {**asdict(c), "measure_text": MEASURES[c.measure][0], "steps": steps, "seeds": seeds}
        row["threshold"] = contexts[c.setting]["threshold"] if c.measure in CENSORED else None
        if len(seeds) < 2:
            runs_of = {
                arm: sum(1 for (s, a, _) in by_key if (s, a) == (c.setting, arm)) for arm in (c.arm, c.baseline)
            }
            missing = min(runs_of, key=runs_of.get)
            rows.append(not_run_row(row, f"not run: fewer than 2 seeds have both {c.arm} and {c.baseline} (runs of "
                                    f"{missing} missing: out of time, or not in this checkout's METHODS)"))  # fmt: skip
            continue
        ctx = contexts[c.setting]
        arm_m = [measure(c.measure, by_key[(c.setting, c.arm, s)], arms[(c.setting, c.arm)], ctx) for s in seeds]
        base_m = [measure(c.measure, by_key[(c.setting, c.baseline, s)], arms[(c.setting, c.baseline)], ctx)
                  for s in seeds]  # fmt: skip
        rows.append(judge_row(row, arm_m, base_m))
    return rows


def not_run_row(row: dict, reason: str) -> dict:
    """``row`` with the verdict "not run" and why."""
    row.update(verdict="not run", reason=reason)
    row["needs"] = needs_text(row)
    return row


def judge_row(row: dict, arm_m: list[tuple[float, bool]], base_m: list[tuple[float, bool]]) -> dict:
    """``row`` (a comparison's fields and its ``seeds``) with the ``(value, censored)`` of each seed's arm and
    baseline run: their means and sds, the paired bootstrap's difference and interval, and the verdict
    (:func:`verdict`, censored values as lower bounds) and what a row that does not reproduce would need."""
    arm_v, base_v = [v for v, _ in arm_m], [v for v, _ in base_m]
    boot = bootstrap(base_v, arm_v)
    arm_c, base_c = sum(c_ for _, c_ in arm_m), sum(c_ for _, c_ in base_m)
    row.update(
        arm_values=arm_v,
        baseline_values=base_v,
        arm_mean=_mean(arm_v),
        arm_sd=_std(arm_v),
        baseline_mean=_mean(base_v),
        baseline_sd=_std(base_v),
        diff=boot["diff"],
        low=boot["low"],
        high=boot["high"],
        censored={"arm": arm_c, "baseline": base_c} if arm_c or base_c else None,
        verdict=verdict(boot["low"], boot["high"], row["direction"], arm_censored=arm_c > 0, base_censored=base_c > 0),
    )
    row["needs"] = needs_text(row)
    return row


def settings_for_more_seeds(rows: list[dict], plan: list[Setting]) -> list[Setting]:
    """The seed rule (``SEED_RULE``): the settings with a row that the first seeds leave 'not separable at this
    scale'; each gets the further seeds for all its arms."""
    unseparated = {r["setting"] for r in rows if r["verdict"] == "not separable at this scale"}
    return [s for s in plan if s.name in unseparated]


# ----------------------------------------------------------------------------------------------- descriptive numbers
def describe(runs: list[dict], plan: list[Setting], batch_size: int) -> dict:
    """Per setting and arm, the numbers the claims' measures do not judge: completions per step, GPG's rounds, SGPO's
    judge, MS-GRPO's advantage gap, the measured flip share, trained tokens, CPU per step."""
    out: dict[str, dict] = {}
    for s in plan:
        out[s.name] = {}
        for arm in s.arms:
            mine = [r for r in runs if r["setting"] == s.name and r["arm"] == arm.name]
            if not mine:
                continue
            info = {
                "seeds": sorted(r["seed"] for r in mine),
                "final_accuracy": _mean([list(r["accuracy"].values())[-1] for r in mine]),
                "completions_per_step": _mean([r["completions_per_step"] for r in mine]),
                "cpu_per_step": _mean([_mean(r["cpu_seconds"]) for r in mine]),
                "trained_tokens": _mean([sum(trained_tokens(r, arm, batch_size)) for r in mine]),
                "entropy_first_last": [
                    _mean([r["entropy"][0] for r in mine]),
                    _mean([r["entropy"][-1] for r in mine]),
                ],
            }
            for key in arm.log_keys:
                values = [_mean(finite(r["log"][key])) for r in mine if finite(r["log"].get(key, []))]
                if values:
                    info[key] = _mean(values)
            if "sgpo/judge_calls" in arm.log_keys:
                info["judge_calls_total"] = _mean([sum(finite(r["log"]["sgpo/judge_calls"])) for r in mine])
            flips = [r["flips"] for r in mine if "flips" in r]
            if flips:
                info["flipped_share"] = sum(f["flipped"] for f in flips) / sum(f["scored"] for f in flips)
            out[s.name][arm.name] = info
    return out


# ----------------------------------------------------------------------------------------------- report
def _fmt(measure_name: str, value: float | None) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else MEASURES[measure_name][1].format(value)
    )


def _diff_cell(row: dict) -> str:
    if row["verdict"] == "not run":
        return "-"
    f = MEASURES[row["measure"]][1]
    sign = lambda v: ("+" if v >= 0 else "") + f.format(v)  # noqa: E731
    return f"{sign(row['diff'])} [{sign(row['low'])}, {sign(row['high'])}]"


def _side(row: dict, which: str) -> str:
    if row["verdict"] == "not run":
        return "-"
    return f"{_fmt(row['measure'], row[f'{which}_mean'])} ± {_fmt(row['measure'], row[f'{which}_sd'])}"


def row_line(row: dict) -> str:
    claimed = "higher" if row["direction"] > 0 else "lower"
    setting = REAL_LABEL if row["setting"] == REAL_SETTING else f"`{row['setting']}`"
    return (
        f"| {row['claim']} | {setting} | {row['arm']} vs {row['baseline']} | {row['measure']} ({claimed}) "
        f"| {row['paper']} | {_side(row, 'arm')} | {_side(row, 'baseline')} | {_diff_cell(row)} "
        f"| {len(row['seeds'])} | **{row['verdict']}** |"
    )


def readme_block(result: dict) -> str:
    """The README's claims table: each claim's headline row and the count of every verdict among its rows."""
    lines = [
        "| claim | headline measure (setting) | ours: method vs grpo, paired difference [95% CI] | verdict | all rows |",
        "|---|---|---|---|---|",
    ]
    for claim, (text, _) in CLAIMS.items():
        rows = [r for r in result["rows"] if r["claim"] == claim]
        if not rows:
            continue
        head = next((r for r in rows if r["headline"]), rows[0])
        counts = ", ".join(
            f"{sum(r['verdict'] == v for r in rows)} {v}" for v in VERDICTS if any(r["verdict"] == v for r in rows)
        )
        ours = "-" if head["verdict"] == "not run" else (
            f"{_side(head, 'arm')} vs {_side(head, 'baseline')}, {_diff_cell(head)} ({len(head['seeds'])} seeds)"
        )  # fmt: skip
        lines.append(f"| {text} | {head['measure']} (`{head['setting']}`) | {ours} | {head['verdict']} | {counts} |")
    meta = result["meta"]
    lines += [
        "",
        f"{meta['runs_finished']} of {meta['runs']} planned runs, {meta['steps']} steps each on the bundled task; "
        "every row, the verdict rule and what a claim that does not reproduce would need: "
        "[`benchmarks/results/claims.md`](benchmarks/results/claims.md).",
    ]
    return "\n".join(lines)


def trained_by(meta: dict) -> str:
    """Where the finished runs came from: this command, or the run cache a full run fills."""
    cache = "the run cache `outputs/claims_runs/`, which the same command without `--report-only` fills first"
    stored = meta.get("runs_from_json", 0)
    if meta["runs_trained"] == meta["runs_finished"]:
        return "all trained by this command"
    if stored:
        json_text = (
            "the runs an earlier full run stored in `benchmarks/results/claims.json` (`runs`), read back by "
            "`--report-only` where the run cache `outputs/claims_runs/` lacks them"
        )
        if stored == meta["runs_finished"]:
            return f"none trained by this command: all from {json_text}"
        cached = meta["runs_finished"] - meta["runs_trained"] - stored
        return (
            f"{meta['runs_trained']} trained by this command, {cached} from the run cache, {stored} from {json_text}"
        )
    if meta["runs_trained"] == 0:
        return f"none trained by this command: all from {cache}"
    return f"{meta['runs_trained']} trained by this command, the rest from {cache}"


def write_markdown(result: dict, path: Path) -> str:
    meta, rows = result["meta"], result["rows"]
    real_rows = result.get("real_model_rows", [])
    lines = [
        "# Claims: does each paper's claim reproduce at this machine's scale?",
        "",
        f"Command: `{meta['command']}`; date {meta['date']}; {meta['wall_minutes']:.1f} min wall; "
        f"{meta['runs_finished']} of {meta['runs']} planned runs finished ({trained_by(meta)}). "
        "`python benchmarks/claims.py` regenerates this file.",
        f"The finished runs: {meta['cpu_minutes']:.1f} CPU-minutes (each run's process, evaluations included), "
        + (
            f"trained between {meta['training_span'][0]} and {meta['training_span'][1]} "
            f"({meta['training_span'][2]:.1f} min wall)"
            if meta["training_span"]
            else "no training time recorded"
        )
        + f"; {meta['workers']} worker processes, one torch thread each"
        + ("" if meta["budget_minutes"] is None else f", no run started after {meta['budget_minutes']:g} minutes")
        + ".",
        f"Machine: {meta['machine']}, shared with other work; load average (1 min) {meta['load'][0]:.1f} at the "
        f"start of this command, {meta['load'][1]:.1f} at its end.",
        f"Every run: the warm-started tiny Qwen2 (`load_warm_start(seed=0)`), `DEFAULT_GRPO_ARGS` "
        f"({meta['grpo_args']}) with the setting's changes, {meta['steps']} steps, greedy held-out accuracy on "
        f"{meta['eval_examples']} fixed problems every {meta['eval_every']} steps "
        "(`grpo_family.eval.EvaluationCallback`).",
        "",
    ]
    if meta["quick"]:
        lines += ["**Quick mode** (`--quick`): tiny runs that check the pipeline; the numbers mean nothing.", ""]
    lines += [
        "## How to read it",
        "",
        "Each row compares one measure of a method with its baseline over the seeds both ran (same warm start, same "
        "training data in the same order, same sampling seed): mean ± sd over seeds of each, and the paired "
        "difference (method - baseline) with a 95% paired-bootstrap interval over seeds "
        "(`grpo_family.eval.paired_bootstrap`, 10,000 resamples). The verdict is computed from that interval "
        "(`benchmarks/claims.py: verdict`): **reproduced** when it lies entirely on the side the paper claims, "
        "**contradicted** when it lies entirely on the other side, **not separable at this scale** when it contains "
        "0, **not run** when fewer than 2 seeds have both runs. With 5-10 seeds a percentile bootstrap interval is "
        'narrow: a "reproduced" here means every resample agreed, not a significance test at 5%.',
        f"Seeds: {SEED_RULE}.",
        f"Thresholds (D3S rows): warm-start accuracy + {THRESHOLD_SHARE:g} x grpo's mean gain by the last step in "
        "that setting; a run that never reaches it counts its whole total, a lower bound (a censored claimed method "
        'cannot give "reproduced", a censored baseline cannot give "contradicted").',
        f"The {REAL_LABEL} rows (D3S, GPG): `benchmarks/realmodel.py`'s learning runs of SmolLM2-135M-Instruct, paired "
        "by seed (42, 43), judged by the same rule; their D3S threshold is, per seed, the paired grpo run's final "
        "held-out accuracy.",
        "",
        "| claim | setting | comparison | measure (claimed) | the paper | method | baseline | difference [95% CI] "
        "| seeds | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[row_line(r) for r in rows + real_rows],
        "",
        "Measures: " + "; ".join(f"`{k}`: {v[0]}" for k, v in MEASURES.items()) + ".",
        "",
        f"Measures of the {REAL_LABEL} rows: " + "; ".join(f"`{k}`: {v}" for k, v in REAL_MEASURES.items()) + ".",
        "",
        "## Settings",
        "",
    ]
    for s in result["settings"]:
        arms = ", ".join(f"`{a['name']}`" + (f" ({a['method']}, {a['overrides']})" if a["overrides"] else "")
                         for a in s["arms"])  # fmt: skip
        lines.append(f"- `{s['name']}` ({s['claim']}): {s['description']}. Arms: {arms}.")
    lines += ["", "## What was run and what was not", ""]
    for s in result["settings"]:
        info = result["describe"].get(s["name"], {})
        seeds = "; ".join(f"{arm} seeds {_ranges(v['seeds'])}" for arm, v in info.items()) or "no run finished"
        lines.append(f"- `{s['name']}`: {seeds}.")
    if meta["not_run"]:
        lines.append(
            f"- Planned but not trained ({sum(len(g['seeds']) for g in meta['not_run'])} runs: the time budget ran "
            "out before they started): "
            + "; ".join(f"`{g['setting']}` {g['arm']} seeds {_ranges(g['seeds'])}" for g in meta["not_run"])
            + "."
        )
    lines += [f"- Real model: {result['real_model']}", ""]
    lines += ["## What the rows that do not reproduce would need", ""]
    for r in rows + real_rows:
        if r["verdict"] != "reproduced":
            lines.append(
                f"- {r['claim']}, `{r['setting']}`, {r['arm']} vs {r['baseline']}, {r['measure']}: {r['needs']}"
            )
    lines += ["", "## Per setting", ""]
    for s in result["settings"]:
        info = result["describe"].get(s["name"], {})
        if not info:
            lines += [f"### `{s['name']}`", "", "not run", ""]
            continue
        extra = sorted({k for v in info.values() for k in v} - {"seeds", "final_accuracy", "completions_per_step",
                       "cpu_per_step", "trained_tokens", "entropy_first_last"})  # fmt: skip
        lines += [
            f"### `{s['name']}`",
            "",
            f"![{s['name']}](claims_{s['name']}.png)",
            "",
            "| arm | seeds | final accuracy | completions / step | CPU s / step | trained tokens (run) | entropy first → last"
            + "".join(f" | {k}" for k in extra)
            + " |",
            "|---" * (7 + len(extra)) + "|",
        ]
        for arm, v in info.items():
            lines.append(
                f"| {arm} | {len(v['seeds'])} | {v['final_accuracy']:.3f} | {v['completions_per_step']:.1f} "
                f"| {v['cpu_per_step']:.3f} | {v['trained_tokens']:.0f} | {v['entropy_first_last'][0]:.3f} → "
                f"{v['entropy_first_last'][1]:.3f}" + "".join(f" | {_num(v.get(k))}" for k in extra) + " |"
            )
        lines.append("")
    return harness.write_report(path, "\n".join(lines) + "\n", echo=False)


def _ranges(seeds: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def plot(runs: list[dict], setting: Setting, batch_size: int, path: Path) -> None:
    mine = [r for r in runs if r["setting"] == setting.name]
    if not mine:
        return
    second = {"d3s": "tokens", "cw_grpo": "entropy", "sgpo": "no_signal"}.get(setting.claim.split("+")[0], "cpu")
    panels = ["step", second] + (["cpu"] if second == "tokens" else [])
    fig, axes = harness.pyplot().subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
    for index, arm in enumerate(setting.arms):
        runs_of = [r for r in mine if r["arm"] == arm.name]
        if not runs_of:
            continue
        color = f"C{index}"
        steps = [int(s) for s in runs_of[0]["accuracy"]]
        acc = [_mean([r["accuracy"][str(s)] for r in runs_of]) for s in steps]
        for ax, panel in zip(axes, panels):
            if panel == "step":
                ax.plot(steps, acc, color=color, marker="o", markersize=3, label=arm.name)
                ax.set(xlabel="optimizer step", ylabel="held-out accuracy (seed mean)")
            elif panel in ("tokens", "cpu"):
                per_step = [
                    trained_tokens(r, arm, batch_size) if panel == "tokens" else r["cpu_seconds"] for r in runs_of
                ]
                x = [_mean([sum(p[:s]) for p in per_step]) for s in steps]
                ax.plot(x, acc, color=color, marker="o", markersize=3, label=arm.name)
                ax.set(xlabel="trained completion tokens" if panel == "tokens" else "training CPU seconds",
                       ylabel="held-out accuracy (seed mean)")  # fmt: skip
                if panel == "tokens":
                    ax.set_xscale("symlog", linthresh=100)
            else:
                key = "entropy" if panel == "entropy" else "frac_reward_zero_std"
                series = [[v if v is not None else math.nan for v in r[key]] for r in runs_of]
                ax.plot(range(1, len(series[0]) + 1), [statistics.fmean(finite(c)) if finite(c) else math.nan
                                                       for c in zip(*series)], color=color, label=arm.name)  # fmt: skip
                ax.set(xlabel="optimizer step", ylabel="policy entropy" if panel == "entropy" else "share of groups "
                       "with no signal")  # fmt: skip
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(f"{setting.name}: {setting.claim}")
    harness.save_figure(fig, path, dpi=100)


# ----------------------------------------------------------------------------------------------- real model
# D3S's and GPG's claims on SmolLM2-135M-Instruct, from benchmarks/realmodel.py's learning runs (its "learn" stage:
# the demo recipe, 40 steps, LoRA, seeds 42 and 43; one JSON file per run in benchmarks/results/realmodel_runs/), paired
# seed by seed, judged by the same rule as the tiny-model rows. Nothing is trained here.
REAL_SETTING = "real model"
REAL_LABEL = "`real model` (SmolLM2-135M-Instruct, the demo recipe, 40 steps)"
REAL_MEASURES = {  # measure -> what it is on the real model's runs (their names and units as in MEASURES)
    "final_accuracy": "held-out greedy accuracy on the recipe's 100 problems after the last step",
    "tokens_to_threshold": (
        "TRL's `num_tokens` (prompt and completion tokens of every sequence generated; D3S's loss keeps only some "
        "of its completion tokens) by the first held-out evaluation (every 10 steps, step 0 not counted) at or "
        "above the paired grpo run's final accuracy; the run's total, censored, when none is"
    ),
    "cpu_to_threshold": (
        "CPU seconds of the training command (all its processes: start-up, model loading and its held-out "
        "evaluations included) by that evaluation, the run's total apportioned by steps (step s of n at s/n of it, "
        "as `realmodel_learning.png` places steps); the total, censored, when none is"
    ),
    "cpu_per_step": (
        "CPU seconds of the training command / its 40 steps. Its held-out evaluations cannot be taken out: the run "
        "files record no time of their own for them (the evaluation callback logs accuracies only), so this "
        "includes start-up, model loading and the same five greedy evaluations of 100 problems (before training and "
        "at steps 10, 20, 30, 40; about 1 CPU-minute each) in every arm, which pulls the ratio towards 1"
    ),
}
REAL_NEEDS = {  # claim -> what a reproduction would need beyond these runs ({steps}: the runs' steps)
    "d3s": "the paper's scale: 1.5B-8B models, G = 32 rollouts per prompt, responses of thousands of tokens and "
    "hundreds of steps (§4.1); here SmolLM2-135M-Instruct with LoRA, G = 8, completions of at most 32 tokens, {steps} "
    "steps and 2 seeds",
    "gpg": "a model whose reference forward is a large share of a step (the paper's 1.5B-7B models on GPUs), "
    "hundreds of steps on math data (§3.1), and step times measured without the held-out evaluations; here "
    "SmolLM2-135M-Instruct with LoRA (the reference is the same model with its adapter off), completions of at "
    "most 32 tokens, {steps} steps and 2 seeds on a shared 2-core CPU",
}


def real_model_comparisons() -> list[Comparison]:
    """The real-model rows: the tiny model's D3S and GPG comparisons that the learning runs can answer, with the same
    paper claims."""
    return [
        Comparison("d3s", REAL_SETTING, "d3s", "grpo", "tokens_to_threshold", -1, D3S_TOKENS),
        Comparison("d3s", REAL_SETTING, "d3s", "grpo", "cpu_to_threshold", -1, D3S_SPEED),
        Comparison("d3s", REAL_SETTING, "d3s", "grpo", "final_accuracy", +1, D3S_ACCURACY),
        Comparison("gpg", REAL_SETTING, "gpg", "grpo", "final_accuracy", +1, GPG_ACCURACY),
        Comparison("gpg", REAL_SETTING, "gpg", "grpo_kl", "final_accuracy", +1, GPG_ACCURACY),
        Comparison("gpg", REAL_SETTING, "gpg", "grpo", "cpu_per_step", -1, GPG_COST),
        Comparison("gpg", REAL_SETTING, "gpg", "grpo_kl", "cpu_per_step", -1, GPG_COST),
    ]


def real_curve(run: dict) -> list[tuple[int, float, float]]:
    """A learning run's held-out curve, ``(step, accuracy, tokens by then)`` from step 0."""
    return [(int(step), acc, tokens) for step, acc, tokens in run["held_out_curve"]]


def real_measure(name: str, run: dict, paired_grpo: dict) -> tuple[float, bool]:
    """``(value, censored)`` of measure ``name`` for one real-model learning run; ``paired_grpo``: the grpo run of
    the same seed, whose final held-out accuracy is the threshold of the "to threshold" measures."""
    curve = real_curve(run)
    if name == "final_accuracy":
        return curve[-1][1], False
    if name == "cpu_per_step":
        return run["train_cpu_s"] / run["steps"], False
    if name in ("tokens_to_threshold", "cpu_to_threshold"):
        step = first_reaching([(s, a) for s, a, _ in curve], real_curve(paired_grpo)[-1][1])
        if name == "tokens_to_threshold":
            return (run["tokens"], True) if step is None else (dict((s, t) for s, _, t in curve)[step], False)
        share = 1.0 if step is None else step / run["steps"]
        return run["train_cpu_s"] * share, step is None
    raise KeyError(name)


def real_model_runs(directory: Path | None = None) -> tuple[dict[tuple[str, int], dict], list[dict]]:
    """The learning runs of ``benchmarks/realmodel.py``'s plan (``learn_jobs``; its run files, none trained here) by
    ``(method or claim arm, seed)``, and the planned jobs without a run file."""
    from benchmarks import realmodel

    directory = realmodel.LEARN_DIR if directory is None else directory
    found, missing = {}, []
    for job in realmodel.learn_jobs():
        path = realmodel.cache_path(directory, job)
        if path.exists():
            found[(realmodel.run_label(job), job["seed"])] = json.loads(path.read_text())
        else:
            missing.append(job)
    return found, missing


def real_model_rows(runs: dict[tuple[str, int], dict], seeds=None) -> list[dict]:
    """Every real-model comparison from the learning runs ``runs`` (``(method or arm, seed) -> run``), over the seeds
    where both sides (and, for a "to threshold" measure, grpo) have a run; "not run", naming the missing runs, with
    fewer than 2 such seeds."""
    from benchmarks import realmodel

    seeds = realmodel.LEARN_SEEDS if seeds is None else seeds
    rows = []
    for c in real_model_comparisons():
        needed = (c.arm, c.baseline, *(("grpo",) if c.measure in CENSORED else ()))  # grpo: the threshold
        both = [s for s in seeds if all((name, s) in runs for name in needed)]
        steps = {runs[(c.arm, s)]["steps"] for s in both} or {realmodel.recipe()["max_steps"]}
        row = {**asdict(c), "measure_text": REAL_MEASURES[c.measure], "steps": max(steps), "seeds": both,
               "threshold": None}  # fmt: skip
        values = {s: (real_measure(c.measure, runs[(c.arm, s)], runs[("grpo", s)]),
                      real_measure(c.measure, runs[(c.baseline, s)], runs[("grpo", s)])) for s in both}  # fmt: skip
        if c.measure in CENSORED:
            row["thresholds"] = [real_curve(runs[("grpo", s)])[-1][1] for s in both]
        if len(both) < 2:
            absent = [f"{name} seed {s}" for s in seeds for name in dict.fromkeys(needed) if (name, s) not in runs]
            so_far = "".join(
                f"; seed {s}: {c.arm} {_fmt(c.measure, a[0])}{' (censored)' * a[1]} vs {c.baseline} "
                f"{_fmt(c.measure, b[0])}{' (censored)' * b[1]}"
                for s, (a, b) in values.items()
            )  # fmt: skip
            rows.append(not_run_row(row, f"not run: fewer than 2 seeds have both {c.arm} and {c.baseline} (missing: "
                                    f"{', '.join(absent)}; `python benchmarks/realmodel.py --stages learn` trains "
                                    f"them){so_far}"))  # fmt: skip
            continue
        rows.append(judge_row(row, [values[s][0] for s in both], [values[s][1] for s in both]))
    return rows


def real_model_text(runs: dict[tuple[str, int], dict], missing: list[dict],
                    path: Path = harness.RESULTS / "realmodel.json") -> str:  # fmt: skip
    """The real-model line of "What was run": which learning runs the `real model` rows read, which are missing,
    and a step's cost without evaluations from ``benchmarks/realmodel.py``'s cost stage, for scale."""
    from benchmarks import realmodel

    names = ("d3s", "gpg", "grpo", "grpo_kl")
    have = "; ".join(f"{n} seeds {', '.join(str(s) for (m, s) in runs if m == n) or 'none'}" for n in names)
    absent = [f"{realmodel.run_label(j)} seed {j['seed']}" for j in missing if realmodel.run_label(j) in names]
    restarted = [f"{n} seed {s}" for (n, s), r in runs.items() if n in names and (r.get("restarts") or
                 r.get("killed_segments"))]  # fmt: skip
    text = (
        f"the {REAL_LABEL} rows read `benchmarks/realmodel.py`'s learning runs (`benchmarks/results/realmodel_runs/`; "
        f"nothing is trained here; grpo_kl is its claim arm, grpo with beta {realmodel.LEARN_ARMS['grpo_kl'][1]['beta']}"
        f"), paired by seed: {have}."
        + (f" Missing: {', '.join(absent)} (`python benchmarks/realmodel.py --stages learn` trains them)." if absent
           else "")
        + (f" Resumed after a stop (their CPU time counts a restart's start-up and redone steps): {', '.join(restarted)}."
           if restarted else "")
    )  # fmt: skip
    if path.exists():
        cost = json.loads(path.read_text()).get("cost") or {}
        step_cpu = {m: statistics.median(r["step_cpu_s"] for r in cost.get("runs", []) if r["label"] == m)
                    for m in ("grpo", "d3s", "gpg") if any(r["label"] == m for r in cost.get("runs", []))}  # fmt: skip
        if {"grpo", "d3s", "gpg"} <= set(step_cpu):
            text += (
                f" For scale, a training step alone (no evaluation; `realmodel.md` section 3, median of its "
                f"repetitions): grpo {step_cpu['grpo']:.1f} CPU-s, d3s {step_cpu['d3s'] / step_cpu['grpo']:.2f}x, "
                f"gpg {step_cpu['gpg'] / step_cpu['grpo']:.2f}x grpo's."
            )
    return text


# ----------------------------------------------------------------------------------------------- main
def plan_jobs(plan: list[Setting], seeds, steps: int, eval_every: int, eval_examples: int, quick: bool) -> list[dict]:
    """Seed-major, so a seed's paired runs start close together (the CPU-time measures compare them)."""
    jobs = []
    for seed in seeds:
        for s in plan:
            for arm in s.arms:
                job = {
                    "method": arm.method,
                    "arm": arm.name,
                    "setting": s.name,
                    "difficulty": s.difficulty,
                    "seed": seed,
                    "steps": steps,
                    "eval_every": eval_every,
                    "eval_examples": eval_examples,
                    "overrides": {**(QUICK_ARGS if quick else {}), **s.overrides, **arm.overrides},
                }
                if s.reward is not None:
                    job["reward"] = s.reward
                if arm.log_keys:
                    job["log_keys"] = list(arm.log_keys)
                jobs.append(job)
    return jobs


STORED = harness.RESULTS / "claims.json"


def stored_runs(plan: list[Setting], steps: int, eval_every: int, eval_examples: int, grpo_args: dict,
                path: Path = STORED) -> dict[tuple[str, str, int], dict]:  # fmt: skip
    """The runs a full run stored in ``claims.json`` (its ``runs``), by ``(setting, arm, seed)``, for ``--report-only``
    where the run cache lacks them (a fresh clone: ``outputs/`` is not committed). Only runs of the same plan: the
    file's steps, evaluations and ``DEFAULT_GRPO_ARGS`` values as now, and each run's setting (its arms and their
    overrides, task, reward) as now; none from a ``--quick`` file."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    meta = data.get("meta", {})
    shown = dict(item.split("=", 1) for item in meta.get("grpo_args", "").split(", ") if "=" in item)
    same = (
        not meta.get("quick")
        and (meta.get("steps"), meta.get("eval_every"), meta.get("eval_examples"))
        == (steps, eval_every, eval_examples)
        and shown
        and all(str(grpo_args.get(k)) == v for k, v in shown.items())
    )
    if not same:
        return {}
    now = {s.name: json.loads(json.dumps(asdict(s))) for s in plan}
    settings_same = {s["name"] for s in data.get("settings", []) if now.get(s["name"]) == s}
    return {(r["setting"], r["arm"], r["seed"]): r for r in data.get("runs", []) if r["setting"] in settings_same}


def training_span(runs: list[dict]) -> list | None:
    """``[first start, last finish, minutes between]`` of the runs (UTC), None when none recorded its times."""
    timed = [r for r in runs if "started" in r]
    if not timed:
        return None
    first, last = min(r["started"] for r in timed), max(r["finished"] for r in timed)
    stamp = lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")  # noqa: E731
    return [stamp(first), stamp(last), (last - first) / 60]


def not_run(jobs: list[dict], runs: list[dict | None]) -> list[dict]:
    """The planned jobs without a run, grouped by setting and arm."""
    groups: dict[tuple[str, str], list[int]] = {}
    for job, run in zip(jobs, runs):
        if run is None:
            groups.setdefault((job["setting"], job["arm"]), []).append(job["seed"])
    return [{"setting": s, "arm": a, "seeds": seeds} for (s, a), seeds in groups.items()]


def _tag(runs: list[dict], jobs: list[dict]) -> list[dict]:
    return [None if r is None else {**r, "arm": j["arm"]} for r, j in zip(runs, jobs)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny runs that check the pipeline (the test suite)")
    parser.add_argument("--settings", nargs="+", default=None, help="a subset of the settings (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes, one torch thread each")
    parser.add_argument("--budget-minutes", type=float, default=BUDGET_MINUTES,
                        help="start no run after this many minutes; what did not run is reported as not run")  # fmt: skip
    parser.add_argument("--report-only", action="store_true", help="train nothing: report the cached runs")
    parser.add_argument("--output-dir", default=None,
                        help="default: benchmarks/results (full), outputs/claims_quick (--quick)")  # fmt: skip
    args = parser.parse_args(argv)

    from grpo_family.tasks import DEFAULT_GRPO_ARGS, load_warm_start

    all_settings = settings()
    plan = [s for s in all_settings if args.settings is None or s.name in args.settings]
    steps, eval_every, eval_examples = (QUICK["steps"], QUICK["eval_every"], QUICK["eval_examples"]) if args.quick \
        else (STEPS, EVAL_EVERY, EVAL_EXAMPLES)  # fmt: skip
    first, most = QUICK["seeds"] if args.quick else (FIRST_SEEDS, MAX_SEEDS)
    grpo_args = {**DEFAULT_GRPO_ARGS, **(QUICK_ARGS if args.quick else {})}
    batch_size = grpo_args["per_device_train_batch_size"]
    cache = None if args.quick else ROOT / "outputs" / "claims_runs"  # quick: every run trained, every time
    clock, load_start = harness.Timer(), harness.load_average()[0]
    deadline = None if args.report_only else time.perf_counter() + 60 * args.budget_minutes
    if not args.report_only:
        load_warm_start(seed=0)  # build the cache once, before the workers race for it

    stored = stored_runs(plan, steps, eval_every, eval_examples, grpo_args) if args.report_only and not args.quick \
        else {}  # fmt: skip
    from_json = 0

    def run(jobs):
        nonlocal from_json
        if not args.report_only:
            return run_all(jobs, args.workers, cache, label="claims", gpg_first=False, deadline=deadline)
        runs, trained = run_all(jobs, args.workers, cache, label="claims", gpg_first=False, train=False)
        for i, job in enumerate(jobs):  # not in the cache: the run an earlier full run stored in claims.json
            if runs[i] is None and (found := stored.get((job["setting"], job["arm"], job["seed"]))) is not None:
                runs[i], from_json = {k: v for k, v in found.items() if k != "arm"}, from_json + 1
        return runs, trained

    jobs = plan_jobs(plan, range(first), steps, eval_every, eval_examples, args.quick)
    runs, trained = run(jobs)
    runs = _tag(runs, jobs)
    rows = make_rows([r for r in runs if r is not None], plan, batch_size, steps)
    more = settings_for_more_seeds(rows, plan)
    if more and most > first:
        extra_jobs = plan_jobs(more, range(first, most), steps, eval_every, eval_examples, args.quick)
        extra, trained_more = run(extra_jobs)
        jobs, runs, trained = jobs + extra_jobs, runs + _tag(extra, extra_jobs), trained + trained_more
    done = [r for r in runs if r is not None]
    rows = make_rows(done, plan, batch_size, steps)

    shown = ("per_device_train_batch_size", "num_generations", "max_completion_length", "learning_rate", "beta")
    meta = {
        "command": harness.command_line(__file__, argv),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "wall_minutes": clock.wall / 60,
        "cpu_minutes": sum(r.get("cpu_total", 0.0) for r in done) / 60,
        "runs": len(jobs),
        "runs_finished": len(done),
        "runs_trained": trained,
        "runs_from_json": from_json,
        "training_span": training_span(done),
        "not_run": not_run(jobs, runs),
        "budget_minutes": None if args.report_only else args.budget_minutes,
        "workers": args.workers,
        "machine": harness.machine_line(),
        "load": [load_start, harness.load_average()[0]],
        "grpo_args": ", ".join(f"{k}={grpo_args[k]}" for k in shown),
        "steps": steps,
        "eval_every": eval_every,
        "eval_examples": eval_examples,
        "seed_rule": SEED_RULE,
        "quick": args.quick,
        "methods": list(METHODS),
    }
    real_runs, real_missing = real_model_runs()
    result = {
        "meta": meta,
        "settings": [asdict(s) for s in plan],
        "rows": rows,
        "describe": describe(done, plan, batch_size),
        "real_model": real_model_text(real_runs, real_missing),
        "real_model_rows": real_model_rows(real_runs),
        "runs": done,
    }
    out_dir = Path(args.output_dir or (ROOT / "outputs" / "claims_quick" if args.quick else harness.RESULTS))
    for s in plan:
        plot(done, s, batch_size, out_dir / f"claims_{s.name}.png")
    text = write_markdown(result, out_dir / "claims.md")
    harness.write_json(out_dir / "claims.json", result)
    if not args.quick and args.output_dir is None:
        update_readme()
    print(text)
    return result


def update_readme() -> None:
    """Rewrite the README's claims block from the ``claims.json`` just written (``docs/generate.py`` renders it)."""
    subprocess.run([sys.executable, str(ROOT / "docs" / "generate.py"), "--only", "claims"], check=True)


if __name__ == "__main__":
    main()
