"""DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU processes (gloo), for every method: `python -m pytest -m deepspeed`, with
`pip install -e ".[deepspeed]"`.

Four 2-process launches of ``tests/dist/deepspeed_runs.py`` (start-up is most of a launch's cost, so each runs
many jobs in sequence): DDP (the reference), ZeRO-3, ZeRO-2 and ZeRO-3 with the optimizer offloaded to CPU. Every
job trains with plain SGD and no gradient clipping, so a gradient scaled wrongly shows in the weights as it is.

What is checked: ZeRO-3 and ZeRO-2 end every method where DDP ends (same seed, same data); both ranks end with the
same full weights; LoRA under ZeRO-3 matches LoRA under DDP for every method; GPG's alpha is applied once and
globally under ZeRO-3 (the update with alpha is alpha times the update without, alpha = 2 only if global); D3S
finishes a whole schedule while the ranks keep different numbers of rows; a run resumed from a ZeRO-3 checkpoint
ends where the uninterrupted ZeRO-3 run ends; optimizer offload matches DDP.

The bounds (tests/tolerances.py): DDP averages gradients with an all-reduce of its buckets, ZeRO-3 with
reduce-scatters of its own flat buffers (another summation order), so float32 gradients may differ in the last bit,
and each SGD step ``w <- w - lr g`` then rounds the two runs' weights to the nearest float32, possibly to adjacent
ones: at most one ULP of ``|w|`` per step (``ULP(w) <= 2^-23 |w|``), and the updates' own rounding (the reduction
and the product by the learning rate, 2 roundings of the update per step) adds up to 2 ULP of the largest update per
step. A weight near 1.0 (an RMSNorm scale) can thus end one ULP (1.19e-7) apart after 3 steps, which one machine
showed for CW-GRPO; the others showed 0 to 7.5e-9. A resumed ZeRO-3 run is bit-exact (CPU runs are deterministic).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_family import METHODS
from tests.tolerances import EPS32, EPS64, ulp_bound

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.deepspeed

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
CONFIGS = ROOT / "accelerate_configs"
METHOD_NAMES = list(METHODS)

SGD_STEPS = 3  # deepspeed_runs.py's max_steps for the ZeRO vs DDP jobs
# The most terms summed into one weight's gradient in a step: 2 ranks x 8 rows x 32 tokens (prompts of at most 17
# tokens + 8 completion tokens). A sum of n float32 terms taken in another order differs by at most n x 2^-23 x the
# sum of their sizes (each addition rounds once), bounded here by the largest update a step makes.
SUMMED_TERMS = 2 * 8 * 32


def launch_suite(suite: str, config: Path, model_dir: str, out_dir: Path, timeout: int = 600) -> Path:
    """Run every job of ``suite`` in one 2-process launch under ``config``; fail with its output on error."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
        "--main_process_port", str(29500 + (os.getpid() + len(suite)) % 1000),
        str(TESTS / "dist" / "deepspeed_runs.py"), suite, model_dir, str(out_dir), str(TESTS),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if result.returncode != 0:
        pytest.fail(f"2-process {suite} run failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return out_dir


@pytest.fixture(scope="module")
def suites(tiny_model_dir, tmp_path_factory):
    """Lazily launched suites: ``suites("zero3")`` -> a loader ``load(job, rank)`` of that suite's records."""
    cache = {}

    def get(suite):
        if suite not in cache:
            out = tmp_path_factory.mktemp(suite)
            config = {
                "ddp": CONFIGS / "cpu_2proc.yaml",
                "zero3": CONFIGS / "zero3_cpu.yaml",
                "zero2": CONFIGS / "zero2_cpu.yaml",
                "offload": offload_config(out),
            }[suite]
            launch_suite(suite, config, tiny_model_dir, out)
            cache[suite] = lambda job, rank=0, out=out: torch.load(out / f"{job}_rank{rank}.pt", weights_only=False)
        return cache[suite]

    return get


def offload_config(out: Path) -> Path:
    """zero3_cpu.yaml with a DeepSpeed config file that offloads the optimizer to CPU. DeepSpeed refuses a torch
    optimizer with offload unless ``zero_force_ds_cpu_optimizer`` is off (its own CPU Adam would need a C++ build,
    and Adam would hide a scaling error); the file says so, which an accelerate config's own keys cannot."""
    ds = {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "zero_force_ds_cpu_optimizer": False,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
    }
    (out / "ds_offload.json").write_text(json.dumps(ds))
    lines = []
    for line in (CONFIGS / "zero3_cpu.yaml").read_text().splitlines():
        if line.startswith("deepspeed_config:"):
            lines += [line, f"  deepspeed_config_file: {out / 'ds_offload.json'}", "  zero3_init_flag: false"]
        elif not line.startswith(("  ", "#", "mixed_precision")):  # accelerate refuses keys the file decides
            lines.append(line)
    config = out / "offload.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_ranks_agree(load, job):
    r0, r1 = load(job, 0), load(job, 1)
    assert max_diff(r0["final"], r1["final"]) == 0.0, f"{job}: the two ranks end with different weights"
    return r0


def assert_matches_ddp(ddp, zero, job):
    reference, run = ddp(job), assert_ranks_agree(zero, job)
    assert run["deepspeed"] and not reference["deepspeed"]
    assert max_diff(reference["init"], run["init"]) == 0.0
    moved = max_diff(reference["final"], reference["init"])
    assert moved > 1e-4, f"{job}: the reference did not train"
    diff = max_diff(reference["final"], run["final"])
    print(f"{job}: max |ZeRO - DDP| = {diff:.3g} (largest update {moved:.3g})")
    for name, weight in reference["final"].items():
        # tol: per SGD step, one ULP of |w| (the two runs' weights may round to adjacent floats) plus the gradient's
        # summation order, SUMMED_TERMS roundings of the largest update (which also covers a last-bit difference
        # carried into the next step's forward); a gradient scaled wrongly moves the weight by the order of the update.
        bound = ulp_bound(weight, SGD_STEPS, atol=SGD_STEPS * SUMMED_TERMS * EPS32 * moved)
        excess = (run["final"][name] - weight).abs() - bound
        assert (excess <= 0).all(), f"{job}: {name} differs by {excess.max().item()} beyond the rounding bound"
    # Same completions at every step: the rewards logged are equal.
    rewards = [[e["reward"] for e in r["logs"] if "reward" in e] for r in (reference, run)]
    assert rewards[0] == rewards[1] and len(rewards[0]) >= 1


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_zero3_equals_ddp(method, suites):
    assert_matches_ddp(suites("ddp"), suites("zero3"), method)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_zero2_equals_ddp(method, suites):
    assert_matches_ddp(suites("ddp"), suites("zero2"), method)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_lora_zero3_equals_ddp(method, suites):
    assert_matches_ddp(suites("ddp"), suites("zero3"), f"lora_{method}")
    run = suites("zero3")(f"lora_{method}")
    lora = [k for k in run["final"] if "lora_" in k]
    assert lora and all((run["final"][k] == run["init"][k]).all() for k in run["final"] if "lora_" not in k)
    assert any((run["final"][k] != run["init"][k]).any() for k in lora)


def test_gpg_alpha_is_applied_once_and_globally_under_zero3(suites):
    """Rank 1's groups are all degenerate: the global alpha is 2 (per-rank alphas would be 1 and 1). The SGD update
    with alpha is alpha times the update without, so alpha reached the gradient exactly once."""
    load = suites("zero3")
    with_alpha, without = (assert_ranks_agree(load, f"gpg_alpha_{a}") for a in (True, False))
    alpha = [e["gpg/alpha"] for e in with_alpha["logs"] if "gpg/alpha" in e]
    assert alpha == [2.0]
    assert max_diff(with_alpha["init"], without["init"]) == 0.0
    num = den = norm_bound = 0.0
    worst = 0.0
    for k, init in with_alpha["init"].items():
        a, b = with_alpha["final"][k] - init, without["final"][k] - init
        largest_u = (without["final"][k] - init).abs().max().item()
        final = torch.maximum(with_alpha["final"][k].abs(), without["final"][k].abs())
        # tol: each final weight w - lr g rounds once (half a ULP of |w| each: 0.5 + 2 x 0.5 ULP for u_alpha - 2 u),
        # the subtraction of init at most half a ULP more: 2 ULP of |w|; alpha = 2 scales the loss by a power of two
        # but enters the loss's float32 sums beside unscaled terms, so the gradient is 2x to within SUMMED_TERMS
        # roundings of its size, bounded by twice the largest update.
        bound = ulp_bound(final, 2, atol=SUMMED_TERMS * EPS32 * 2 * largest_u)
        excess = (a - 2.0 * b).abs() - bound
        assert (excess <= 0).all(), f"{k}: |u_alpha - 2 u| exceeds its rounding bound by {excess.max().item()}"
        num += (a.double() * b.double()).sum().item()
        den += (b.double() * b.double()).sum().item()
        norm_bound += (bound.double() ** 2).sum().item()
        worst = max(worst, (a - 2.0 * b).abs().max().item())
    ratio = num / den
    largest = max((without["final"][k] - v).abs().max().item() for k, v in without["init"].items())
    print(f"GPG update ratio under ZeRO-3: {ratio:.9f}; max |u_alpha - 2 u| = {worst:.3g} (max |u| {largest:.3g})")
    assert largest > 1e-3
    # tol: ratio - 2 = <e, u> / <u, u> with e = u_alpha - 2 u bounded elementwise above, so by Cauchy-Schwarz
    # |ratio - 2| <= ||bound|| / ||u||; the float64 sums add a relative 2^-52 per term, far below.
    n_terms = sum(v.numel() for v in without["init"].values())
    assert abs(ratio - 2.0) <= (norm_bound / den) ** 0.5 + 4 * n_terms * EPS64 * abs(ratio)


def test_d3s_ranks_keep_different_rows_under_zero3(suites):
    """A reward that is zero on rank 1 only: the ranks keep different numbers of rows at every step of a schedule
    that moves every step, and the run finishes (each rank pads to the same row count: no deadlock), also in the
    reference log-prob forwards (beta > 0), which run over the kept rows only."""
    load = suites("zero3")
    r0, r1 = assert_ranks_agree(load, "d3s_rows"), load("d3s_rows", 1)
    steps = [e for e in r0["logs"] if "loss" in e and "train_runtime" not in e]
    assert len(steps) == 4
    kept0, kept1 = r0["kept_per_step"], r1["kept_per_step"]
    assert len(kept0) == len(kept1) == 4
    # Every rollout is kept once the schedule reaches N_s = G (the last step); before that rank 1, whose groups are
    # all degenerate, keeps fewer rows than rank 0.
    samples = [e["d3s/samples_per_prompt"] for e in steps]
    assert samples[0] < samples[-1] == 4
    for a, b, n_s in zip(kept0, kept1, samples):
        assert (a != b) == (n_s < 4), (kept0, kept1, samples)
    assert max_diff(r0["final"], r0["init"]) > 1e-3


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_zero3_resume_ends_where_the_uninterrupted_run_ends(method, suites):
    """Run A trains 4 steps under ZeRO-3 and saves checkpoint-2 (DeepSpeed's partitioned checkpoint); run B, a new
    trainer, resumes from it. The settings are test_resume.py's, under which each method's own state matters
    between steps 2 and 4. CPU runs are deterministic, so the end is bit-exact, and so are the logged rewards."""
    load = suites("zero3")
    full, resumed = assert_ranks_agree(load, f"full_{method}"), assert_ranks_agree(load, f"resumed_{method}")
    diff = max_diff(full["final"], resumed["final"])
    print(f"resume {method}: max |resumed - uninterrupted| = {diff:.3g}")
    assert diff == 0.0
    rewards = [{e["step"]: e["reward"] for e in r["logs"] if "reward" in e} for r in (full, resumed)]
    assert set(rewards[0]) == {1, 2, 3, 4} and rewards[0] == rewards[1]


def test_zero3_with_optimizer_offload_equals_ddp(suites):
    assert_matches_ddp(suites("ddp"), suites("offload"), "grpo")
