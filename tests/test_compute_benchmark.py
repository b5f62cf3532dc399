"""`benchmarks/compute.py`: its counters count what they say, every method's forward/backward/generation counts
equal the closed-form formulas (`expected_counts`), the committed results agree with those formulas, and the host
syncs per optimizer step are pinned: each method's excess over stock `trl.GRPOTrainer` is a constant per generation
batch plus (D3S only) a stated amount per micro-step, with no growth in batch, G or completion length."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from method_cases import case

from grpo_family import METHODS

ROOT = Path(__file__).resolve().parents[1]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("compute_benchmark", ROOT / "benchmarks" / "compute.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


compute = _load_benchmark()

# Host syncs per optimizer step above stock TRL at the scale base (G 4, batch 8, accumulation 2, vLLM IS correction
# on, beta 0.04; GPG beta 0), and the change per extra micro-step (benchmarks/results/scale.md: c + d*A). Where each
# comes from (file:line in benchmarks/results/compute.md). grpo_family's base class, once per generation batch, 11:
# reward-function failures (gather + tolist), the unscorable and degenerate tests (2), the reward sum's NaN rows
# (a boolean-mask assignment), the logged advantages and three reward metrics rewritten to describe what was
# trained (4), grpo.py's rare-rescale test in nanstd (2 calls) and the non-finite-gradient check before the
# optimizer step. Each method adds its own per-batch decisions and metrics on top: MS-GRPO its value classes and
# scales, CW-GRPO its weight metrics (10 .item()s) and one pad_across_processes, D3S its selection (made before
# TRL's old/reference forwards, so their rows are cut to the kept ones), trimming and loss-denominator table, SGPO
# its judged groups. Per micro-step: D3S +2 (two pad_across_processes per chunk in _gather_rows for the batch-wide
# token ranking); GPG -8 (its own loss logs one entropy and reads alpha where TRL's loss logs its clip and entropy
# metrics). Re-measured after the named stages (D3S 32 + 3/micro-step -> 36 + 2, GPG 1 -> -1).
# Each method's pinned pair (per generation batch, per extra micro-step) is its case's host_syncs
# (tests/method_cases/<method>.py).
SYNC_EXCESS = {method: case(method).host_syncs[0] for method in METHODS}
SYNC_EXCESS_PER_MICRO_STEP = {method: case(method).host_syncs[1] for method in METHODS}


def test_sync_counter_counts_what_a_gpu_run_waits_for():
    x = torch.arange(6.0)
    with compute.SyncCounter() as syncs:
        syncs.active = True
        x.sum().item()  # _local_scalar_dense
        float(x[1])  # _local_scalar_dense
        x.tolist()  # not dispatched on CPU: the wrapped tensor method
        x[x > 2]  # boolean-mask indexing: a data-dependent size
        torch.nonzero(x)
        host = x.cpu()
        host.tolist()  # host data: not a sync
        host[0].item()
        (host + 1).tolist()  # still host data
        host.to(x.device).sum().item()  # moved back to the training device: a sync again
        x.to("cpu").tolist()  # the move to the host is the one sync
        x.to(torch.float64).tolist()  # a dtype change keeps device data on the device
        syncs.in_generation = True
        x.max().item()  # counted apart
    assert sum(syncs.sites.values()) == 9
    assert sum(syncs.generation_sites.values()) == 1
    assert all("test_compute_benchmark.py" in site for site in syncs.sites)
    assert not hasattr(x.cpu(), "_compute_host") and x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # methods restored


def _options(method: str, stock: bool = False, **changes) -> dict:
    options = {**compute.SCALE_BASE, **compute.SCALE_OPTIONS.get(method, {}), **changes}
    return {k: v for k, v in options.items() if k in compute.STRUCTURE_KEYS} if stock else options


def measure_all(workdir: str) -> dict:
    """Every method and stock TRL at the scale base and with accumulation 4 (vLLM IS correction on)."""
    out = {}
    for method in [*METHODS, "stock", "stock_gpg"]:
        stock = method.startswith("stock")
        base = "gpg" if method == "stock_gpg" else ("grpo" if stock else method)
        for accumulation in (2, 4):
            options = _options(base, stock, gradient_accumulation_steps=accumulation)
            out[f"{method}|{accumulation}"] = compute.measure(
                base, options, vllm=True, is_correction=True, completion_length=compute.SCALE_LENGTH,
                workdir=Path(workdir), stock=stock,
            )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """:func:`measure_all` in a fresh interpreter: the counts are those of a process that ran nothing before (what
    ran earlier in a test session, e.g. other trainers, changes which one-off paths the counted cycle takes)."""
    workdir = tmp_path_factory.mktemp("compute")
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); import test_compute_benchmark as t; "
        f"print('RESULT ' + json.dumps(t.measure_all({str(workdir)!r}), default=str))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return {tuple(k.split("|")[:1]) + (int(k.split("|")[1]),): v for k, v in json.loads(line[7:]).items()}


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("accumulation", [2, 4])
def test_counts_equal_the_formulas(runs, method, accumulation):
    options = _options(method, gradient_accumulation_steps=accumulation)
    measured = runs[method, accumulation]
    assert measured["ambiguous_rollouts"] == 0  # every rollout distinct: kept vs dropped is well defined
    assert compute.check_against_formula(method, options, measured, vllm=True, is_correction=True) == []


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_forward_rows_over_dropped_rollouts(runs):
    # D3S at its schedule start keeps 2 of 4 rollouts per prompt: 16 rows generated, 8 kept. It selects them before
    # TRL's old (IS correction) and reference (beta) forwards, which then cover the 8 kept rows only: 8 + 8 rows,
    # none over a dropped rollout (they were 16 before the selection moved ahead of those forwards). No-grad rows:
    # 8 old log-probs + 8 of D3S's entropy forward for its batch-wide token ranking (steps_per_generation 2).
    d3s = runs["d3s", 2]
    assert d3s["generated_rollouts"] == 16 and d3s["dropped_rollouts"] == 8
    assert d3s["dropped_forward_rows"] == 0 and d3s["policy_grad_rows"] == 8
    assert d3s["policy_nograd_rows"] == 8 + 8 and d3s["ref_rows"] == 8
    for method in METHODS:
        if method != "d3s":
            assert runs[method, 2]["dropped_rollouts"] == 0 and runs[method, 2]["dropped_forward_rows"] == 0


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
@pytest.mark.parametrize("method", list(METHODS))
def test_host_syncs_are_stock_trl_plus_a_constant(runs, method):
    stock = "stock_gpg" if method == "gpg" else "stock"
    excess = runs[method, 2]["host_syncs"] - runs[stock, 2]["host_syncs"]
    per_micro_step = ((runs[method, 4]["host_syncs"] - runs[method, 2]["host_syncs"]) - (
        runs[stock, 4]["host_syncs"] - runs[stock, 2]["host_syncs"])) / 2  # fmt: skip
    assert (excess, per_micro_step) == (SYNC_EXCESS[method], SYNC_EXCESS_PER_MICRO_STEP[method])
    # Generation (transformers' generate) syncs are the same for every method: they are not the method's.
    assert runs[method, 2]["generation_host_syncs"] == runs["stock", 2]["generation_host_syncs"]


def test_committed_results_agree_with_the_formulas():
    results = json.loads((ROOT / "benchmarks" / "results" / "compute.json").read_text())
    # every method but grpo, which is every row's baseline (a grpo recipe's row, smollm2_reasoning_gym's, is its own)
    assert {r["method"] for r in results["runs"]} - {"grpo"} == set(METHODS) - {"grpo"}
    recipes = {p.stem for p in (ROOT / "examples" / "recipes").glob("*.yaml")}
    assert recipes <= {r["setting"].split(" + ")[0] for r in results["runs"]}
    for run in results["runs"]:
        for method, counts, options in (
            (run["method"], run["counts"], run["options"]),
            ("grpo", run["grpo"], {k: v for k, v in run["options"].items() if k in compute.STRUCTURE_KEYS}),
        ):
            mismatches = compute.check_against_formula(
                method, options, counts, vllm=run["vllm"], is_correction=run["is_correction"]
            )
            assert mismatches == [], (run["setting"], method)
    acceptance = next(r for r in results["runs"] if r["setting"] == "d3s_qwen2.5_math_7b + IS on + beta 0.04")
    assert acceptance["is_correction"] and acceptance["options"]["beta"] == 0.04
