"""Every public function of ``grpo_family/algorithms/``: time, ratio to ``group_advantages``, share of a step.

    python benchmarks/advantages.py            # realistic sizes + a measured grpo step on the embedded default
    python benchmarks/advantages.py --quick    # tiny sizes, a random-initialised tiny model, < 20 s (CI smoke run)

Three tables go to ``benchmarks/results/advantages.md`` (``--output`` elsewhere):

1. **Per-batch functions at realistic sizes**: prompts B in {256, 1024} x completions per prompt G in {8, 16, 64};
   per-token functions get 512 tokens per completion (B*G rows x 512, padded; lengths uniform in 128..512).
   Each figure is the median over ``--reps`` repetitions; every repetition times ``group_advantages`` on the
   same (B, G) rewards (after one untimed call, so its caches are warm) and then the function, back to back; the
   ratio is median(function) / median(``group_advantages``), consistent with the times printed. Each function is
   called once first (the "first call" column, which includes building MS-GRPO's value-class tables and greedy
   subgroup selections), and calls faster than 2 ms are looped so one timing lasts at least 2 ms. The "% of
   assumed real step" column is an **assumption**, not a measurement: a real-scale GRPO step taken as 184 s for
   256 prompts x 8 completions (the GRPO reference of the MS-GRPO paper's Table 6: 3B/7B models, outputs up to
   2048 tokens), scaled linearly with B*G.
2. **Per-call helpers** whose cost does not depend on the batch (schedules, scale weights, option checks,
   cached subgroup selections, the gradient-scale wrapper), per call.
3. **At the embedded default's size** (8 prompts x 8 completions x 40 tokens, the batch of ``examples/train.py
   --method grpo`` with no model given) every function again, as a share of one **measured** grpo training step
   on the bundled warm-started tiny model (generation, reward, loss, backward, optimizer; median over ``--steps``
   steps after a dropped first one).

Everything runs with one torch thread (``torch.set_num_threads(1)``), the training step too (so it is slower
than the default multi-threaded run), and every time is **CPU time**, not wall-clock: the function timings are
the benchmark thread's CPU time (``time.thread_time``; with one torch thread the kernels run in that thread) and
the step is the process's CPU time between TRL's step-begin and step-end callbacks (``time.process_time``). On a
machine shared with other jobs, wall-clock mostly measures who else is running; CPU time measures the work.
TRL's wall-clock ``step_time`` is reported beside it.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from grpo_family.algorithms import cw_grpo, d3s, gpg, grpo, ms_grpo, sgpo  # noqa: E402

MODULES = {"grpo": grpo, "ms_grpo": ms_grpo, "cw_grpo": cw_grpo, "d3s": d3s, "sgpo": sgpo, "gpg": gpg}
ASSUMED_STEP_SECONDS = 184.0  # MS-GRPO paper, Table 6: GRPO, 256 prompts x G=8, 3B/7B models (an assumption here)
ASSUMED_STEP_COMPLETIONS = 256 * 8
MIN_TIMING = 2e-3  # seconds; faster calls are looped
# The tables MS-GRPO reuses across calls, kept by the caller as a trainer keeps them for a run.
MS_CACHE = ms_grpo.MultiscaleCache()


def public_functions() -> list[str]:
    """``module.function`` for every function in the ``__all__`` of each algorithms module (classes and
    constants excluded: ``CovarianceStats`` is what ``covariance_stats`` returns)."""
    return [
        f"{name}.{fn}"
        for name, module in MODULES.items()
        for fn in module.__all__
        if inspect.isfunction(getattr(module, fn))
    ]


# --------------------------------------------------------------------------------------------------- timing


def _loop_seconds(fn: Callable[[], object], loops: int) -> float:
    """CPU seconds of this thread for ``loops`` calls (one torch thread: the kernels run here)."""
    start = time.thread_time()
    for _ in range(loops):
        fn()
    return time.thread_time() - start


def _calibrate(fn: Callable[[], object]) -> int:
    """Calls per timing so that one timing lasts at least ``MIN_TIMING``."""
    loops = 1
    while True:
        elapsed = _loop_seconds(fn, loops)
        if elapsed >= MIN_TIMING or loops >= 100_000:
            return loops
        loops = min(100_000, max(loops * 2, int(loops * MIN_TIMING / max(elapsed, 1e-9) * 1.2)))


@dataclass
class Timing:
    seconds: float  # median per call
    ratio: float  # median(function) / median(group_advantages), interleaved repetitions
    first: float  # the first (cold) call


def measure(fn: Callable[[], object], baseline: Callable[[], object], reps: int) -> Timing:
    first = _loop_seconds(fn, 1)
    if first > 1.0:  # slow cases: fewer repetitions keep the whole run in minutes
        reps = min(reps, 3)
    loops, base_loops = _calibrate(fn), _calibrate(baseline)
    times, base_times = [], []
    for _ in range(reps):
        baseline()  # untimed: after a large call the caches are cold, which would inflate the baseline
        base_times.append(_loop_seconds(baseline, base_loops) / base_loops)
        times.append(_loop_seconds(fn, loops) / loops)
    return Timing(statistics.median(times), statistics.median(times) / statistics.median(base_times), first)


# ---------------------------------------------------------------------------------------------------- inputs


@dataclass
class Inputs:
    """Realistic inputs for one (B, G, T): rewards of several kinds and padded per-token tensors."""

    B: int
    G: int
    T: int

    def __post_init__(self):
        gen = torch.Generator().manual_seed(0)
        B, G, T = self.B, self.G, self.T
        self.binary = (torch.rand(B, G, generator=gen) < torch.rand(B, 1, generator=gen)).float()  # correctness
        self.levels = torch.tensor([0.0, 0.5, 1.0, 1.5])[torch.randint(0, 4, (B, G), generator=gen)]  # format+acc
        self.uniform = torch.rand(B, G, generator=gen)  # continuous rewards
        self.per_func = torch.stack([self.binary, self.levels], dim=-1)  # two reward functions
        self.weights = torch.ones(2)
        N = B * G
        lengths = torch.randint(max(1, T // 4), T + 1, (N,), generator=gen)
        self.mask = torch.arange(T)[None, :] < lengths[:, None]
        self.logps = torch.where(self.mask, -3 * torch.rand(N, T, generator=gen), 0.0)
        self.entropies = torch.where(self.mask, 2 * torch.rand(N, T, generator=gen), 0.0)
        self.advantages = grpo.group_advantages(self.binary).reshape(-1)
        self.per_token_loss = torch.where(self.mask, torch.randn(N, T, generator=gen), 0.0)
        self.keep = d3s.token_keep_mask(self.advantages, self.entropies, self.mask, 0.2)
        # SGPO: correctness, one voted judge verdict and a step count per completion
        self.correct = self.binary.bool()
        steps = torch.randint(1, 9, (B, G), generator=gen)
        first = (torch.rand(B, G, generator=gen) * (steps + 1)).long()  # 0 -> no error (None)
        self.num_steps = steps.tolist()
        self.first_error = [[None if f == 0 else int(f) for f in row] for row in first.tolist()]
        self.votes = [[v, v, None, math.nan] for row in self.first_error for v in row]  # 4 votes, one failure
        self.rts = torch.rand(B, G, generator=gen)
        flat_errors = [v for row in self.first_error for v in row]
        flat_steps = [v for row in self.num_steps for v in row]
        self.verdicts = {i: (f, n, "", True) for i, (f, n) in enumerate(zip(flat_errors, flat_steps))}
        self.rollout_index = torch.arange(N)
        self.count_table = d3s.chunk_count_table(
            list(self.mask.sum(1).chunk(4)), list(self.keep.sum(1).chunk(4)), list(self.rollout_index.chunk(4))
        )


def batch_cases(x: Inputs) -> list[tuple[str, str, bool, Callable[[], object]]]:
    """``(module.function, case, per_token, call)`` for every function whose cost depends on the batch."""
    B, G = x.B, x.G
    flat = x.B * x.G
    per_completion = [(row, k) for row, k in zip(x.first_error, x.num_steps)]
    rounds = [x.binary, x.binary.roll(1, dims=0)]  # GPG resampling: two generation rounds of the same batch size
    round_masks = [gpg.degenerate_groups(r) for r in rounds]
    cases = [
        (
            "grpo.group_advantages",
            "binary rewards, scale=group (the baseline)",
            False,
            lambda: grpo.group_advantages(x.binary),
        ),
        (
            "grpo.group_advantages",
            "binary rewards, scale=batch",
            False,
            lambda: grpo.group_advantages(x.binary, scale="batch"),
        ),
        ("grpo.nanstd", "per group", False, lambda: grpo.nanstd(x.binary, dim=1)),
        ("grpo.is_constant", "per group", False, lambda: grpo.is_constant(x.binary, 1)),
        ("grpo.zero_std_mask", "binary rewards", False, lambda: grpo.zero_std_mask(x.binary)),
        (
            "grpo.normalize_then_sum_advantages",
            "2 reward functions",
            False,
            lambda: grpo.normalize_then_sum_advantages(x.per_func, x.weights),
        ),
        (
            "ms_grpo.multiscale_advantages",
            "exact, binary rewards",
            False,
            lambda: ms_grpo.multiscale_advantages(x.binary, cache=MS_CACHE),
        ),
    ]
    if G <= 16:  # 4 levels at G = 64 need 17**4 count vectors: exact mode refuses and asks for M, K
        cases.append(
            (
                "ms_grpo.multiscale_advantages",
                "exact, rewards in {0, .5, 1, 1.5}",
                False,
                lambda: ms_grpo.multiscale_advantages(x.levels, cache=MS_CACHE),
            )
        )
    if G <= 8 or (G <= 16 and B <= 256):  # continuous rewards enumerate every subgroup: 65 519 per prompt at G = 16
        cases.append(
            (
                "ms_grpo.multiscale_advantages",
                "exact, continuous rewards (enumeration)",
                False,
                lambda: ms_grpo.multiscale_advantages(x.uniform, cache=MS_CACHE),
            )
        )
    seeded = torch.Generator()
    cases += [
        (
            "ms_grpo.multiscale_advantages",
            "accelerated M=4, K=8, continuous rewards",
            False,
            lambda: ms_grpo.multiscale_advantages(
                x.uniform, num_scales=4, subgroups_per_scale=8, generator=seeded.manual_seed(0), cache=MS_CACHE
            ),
        ),
        (
            "ms_grpo.draw_scales",
            "M=4, per prompt",
            False,
            lambda: ms_grpo.draw_scales(B, G, num_scales=4, generator=seeded.manual_seed(0)),
        ),
        (
            "cw_grpo.covariance_weights",
            "group scope",
            True,
            lambda: cw_grpo.covariance_weights(x.logps, x.advantages, x.mask, G),
        ),
        (
            "cw_grpo.covariance_stats",
            "group scope",
            True,
            lambda: cw_grpo.covariance_stats(x.logps, x.advantages, x.mask, G),
        ),
        (
            "d3s.max_variance_subset",
            "pool of B*G, k = B*G/4",
            False,
            lambda: d3s.max_variance_subset(x.advantages, flat // 4),
        ),
        (
            "d3s.select_rollouts",
            "pooled, G/4 per prompt",
            False,
            lambda: d3s.select_rollouts(x.advantages, G, max(1, G // 4)),
        ),
        (
            "d3s.select_rollouts",
            "per group, G/4 per prompt",
            False,
            lambda: d3s.select_rollouts(x.advantages, G, max(1, G // 4), scope="group"),
        ),
        (
            "d3s.token_keep_mask",
            "batch scope, K=0.2",
            True,
            lambda: d3s.token_keep_mask(x.advantages, x.entropies, x.mask, 0.2),
        ),
        (
            "d3s.token_keep_mask",
            "sequence scope, K=0.2",
            True,
            lambda: d3s.token_keep_mask(x.advantages, x.entropies, x.mask, 0.2, scope="sequence"),
        ),
        (
            "d3s.masked_token_loss",
            "token_mean_kept",
            True,
            lambda: d3s.masked_token_loss(x.per_token_loss, x.keep, x.mask),
        ),
        (
            "d3s.token_keep_mask_in_rollout_order",
            "batch scope, K=0.2, rows reversed",
            True,
            lambda: d3s.token_keep_mask_in_rollout_order(
                x.advantages, x.entropies, x.mask, torch.arange(flat).flip(0), 0.2
            ),
        ),
        (
            "d3s.token_keep_mask_over_parts",
            "two parts of B*G/2 rows, K=0.2",
            True,
            lambda: d3s.token_keep_mask_over_parts(
                list(zip(*(t.chunk(2) for t in (x.advantages, x.entropies, x.mask, x.rollout_index)))), 0.2
            ),
        ),
        (
            "d3s.chunk_count_table",
            "4 micro-steps",
            False,
            lambda: d3s.chunk_count_table(
                list(x.mask.sum(1).chunk(4)), list(x.keep.sum(1).chunk(4)), list(x.rollout_index.chunk(4))
            ),
        ),
        (
            "grpo.weighted_reward_sum",
            "2 reward functions",
            False,
            lambda: grpo.weighted_reward_sum(x.per_func.reshape(-1, 2), x.weights),
        ),
        (
            "sgpo.verdict_grid",
            "every completion judged",
            False,
            lambda: sgpo.verdict_grid(x.verdicts, B, G),
        ),
        (
            "d3s.planned_kept_tokens",
            "per-row valid counts, K=0.2",
            False,
            lambda: d3s.planned_kept_tokens(x.mask.sum(1), 0.2),
        ),
        (
            "d3s.normalization_weights",
            "seq_mean_kept",
            True,
            lambda: d3s.normalization_weights(
                x.keep,
                x.mask,
                "seq_mean_kept",
                kept_tokens=int(x.keep.sum()),
                num_rollouts=flat,
                rows_with_tokens=flat,
            ),
        ),
        (
            "sgpo.is_failure",
            "one call per completion",
            False,
            lambda: [sgpo.is_failure(v) for row in x.first_error for v in row],
        ),
        (
            "sgpo.trajectory_score",
            "one call per completion",
            False,
            lambda: [sgpo.trajectory_score(v, k) for row, ks in per_completion for v, k in zip(row, ks)],
        ),
        (
            "sgpo.vote_first_error",
            "one call per completion, 4 votes",
            False,
            lambda: [sgpo.vote_first_error(v, 8) for v in x.votes],
        ),
        ("sgpo.partial_credit", "sigmoid", False, lambda: sgpo.partial_credit(x.rts)),
        ("sgpo.groups_to_judge", "all_negative", False, lambda: sgpo.groups_to_judge(x.correct)),
        ("sgpo.sgpo_rewards", "all_negative", False, lambda: sgpo.sgpo_rewards(x.correct, x.first_error, x.num_steps)),
        ("gpg.degenerate_groups", "binary rewards", False, lambda: gpg.degenerate_groups(x.binary)),
        ("gpg.count_degenerate_groups", "binary rewards", False, lambda: gpg.count_degenerate_groups(x.binary)),
        ("gpg.gpg_advantages", "f_norm=none", False, lambda: gpg.gpg_advantages(x.binary)),
        ("gpg.gpg_alpha", "binary rewards", False, lambda: gpg.gpg_alpha(x.binary)),
        ("gpg.informative_fraction", "binary rewards", False, lambda: gpg.informative_fraction(x.binary)),
        ("gpg.plan_assembly", "2 rounds, 1 process", False, lambda: gpg.plan_assembly(round_masks, 1)),
        ("gpg.assemble_rewards", "2 rounds, 1 process", False, lambda: gpg.assemble_rewards(rounds, 1)),
        ("gpg.informative_share", "2 rounds, 1 process", False, lambda: gpg.informative_share(rounds, 1)),
        ("gpg.gpg_loss", "group normalisation (Eq. 5)", True, lambda: gpg.gpg_loss(x.logps, x.advantages, x.mask, G)),
        ("gpg.group_token_weights", "from the mask", True, lambda: gpg.group_token_weights(x.mask, G)),
        (
            "gpg.loss_row_weights",
            "token normalisation",
            True,
            lambda: gpg.loss_row_weights(x.mask, G, normalization="token"),
        ),
    ]
    return cases


def helper_cases(G: int) -> list[tuple[str, str, Callable[[], object]]]:
    """Functions called once per step (or once per run) whose cost does not depend on the batch."""
    loss = torch.tensor(1.0, requires_grad=True)
    counts = torch.tensor([[40.0, 8, 4, 4], [38, 8, 4, 3], [40, 8, 4, 4], [36, 7, 4, 4]], dtype=torch.float64)
    return [
        ("ms_grpo.scale_weights", f"G={G}, uniform", lambda: ms_grpo.scale_weights(G)),
        (
            "ms_grpo.validate_multiscale_options",
            f"G={G}, M=4, K=8",
            lambda: ms_grpo.validate_multiscale_options(G, num_scales=4, subgroups_per_scale=8),
        ),
        ("ms_grpo.dss_intervals", f"G={G}, M=4", lambda: ms_grpo.dss_intervals(G, 2, 4)),
        (
            "ms_grpo.diverse_subgroups",
            f"G={G}, tau=G/2, K=8 (cached)",
            lambda: ms_grpo.diverse_subgroups(G, G // 2, 8, cache=MS_CACHE),
        ),
        (
            "ms_grpo.num_subgroups",
            f"G={G}, M=4, K=8",
            lambda: ms_grpo.num_subgroups(G, num_scales=4, subgroups_per_scale=8),
        ),
        ("d3s.schedule", f"G={G}, step 100 of 300", lambda: d3s.schedule(100, 300, num_generations=G)),
        ("d3s.default_samples_start", f"G={G}", lambda: d3s.default_samples_start(G)),
        (
            "d3s.step_counts",
            "2 of 4 micro-steps",
            lambda: d3s.step_counts(counts, [0, 1], "token_mean_kept"),
        ),
        (
            "d3s.loss_denominator",
            "literal_eq10",
            lambda: d3s.loss_denominator("literal_eq10", valid_tokens=1000, kept_tokens=200, num_rollouts=8),
        ),
        ("gpg.scale_grad", "scalar loss, forward only", lambda: gpg.scale_grad(loss, 2.0)),
    ]


# ------------------------------------------------------------------------------------------ a training step


@dataclass
class Step:
    cpu: float  # median process CPU seconds per step
    wall: float  # median TRL step_time (wall-clock)
    B: int
    G: int
    T: int
    what: str


def measured_step(quick: bool, steps: int, workdir: Path) -> Step:
    """One grpo (``GRPOFamilyTrainer``) training step: median CPU and wall time over ``steps`` after a dropped first."""
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig

    from grpo_family import METHODS
    from grpo_family.tasks import (
        DEFAULT_GRPO_ARGS,
        arithmetic_reward,
        build_tiny_model,
        build_tokenizer,
        load_warm_start,
        make_arithmetic_dataset,
    )

    if quick:  # a random-initialised tiny model: no warm start to train or load
        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
        args = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=8, beta=0.0)
        what = "a random-initialised 2-layer tiny model"
    else:
        model, tokenizer = load_warm_start(seed=0)
        args = {k: v for k, v in DEFAULT_GRPO_ARGS.items() if k not in ("max_steps", "logging_steps")}
        what = "the embedded default (`DEFAULT_GRPO_ARGS`, warm-started bundled tiny model, arithmetic task)"
    path = workdir / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    config_cls, trainer_cls = METHODS["grpo"]
    fixed = dict(output_dir=str(workdir / "run"), max_steps=steps + 1, logging_steps=1, use_cpu=True, bf16=False,
                 report_to="none", save_strategy="no", disable_tqdm=True, seed=0)  # fmt: skip
    config = config_cls(**{**args, **fixed})
    assert isinstance(config, GRPOConfig)
    trainer = trainer_cls(
        model=str(path),
        reward_funcs=[arithmetic_reward],
        args=config,
        train_dataset=make_arithmetic_dataset("train", 200, seed=0),
        processing_class=PreTrainedTokenizerFast.from_pretrained(path),
    )
    cpu = harness.step_timer()  # generation, rewards, loss, backward and optimizer all lie inside a step
    trainer.add_callback(cpu)
    trainer.train()
    wall = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
    G = args["num_generations"]
    B = args["per_device_train_batch_size"] // G
    return Step(statistics.median(cpu.times[1:]), statistics.median(wall), B, G, args["max_completion_length"], what)


# ---------------------------------------------------------------------------------------------------- report


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and a random tiny model (< 20 s)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure (default 7; 2 with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps (default 5; 2 with --quick)")
    parser.add_argument("--output", default=str(harness.RESULTS / "advantages.md"))
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 7)
    steps = args.steps or (2 if args.quick else 5)
    torch.set_num_threads(1)
    load_start, run = harness.load_average(), harness.Timer()
    with tempfile.TemporaryDirectory(prefix="grpo-family-advantages-") as tmp:  # first: the part most likely to fail
        step = measured_step(args.quick, steps, Path(tmp))
    step_seconds, eB, eG, eT = step.cpu, step.B, step.G, step.T
    torch.set_num_threads(1)  # the trainer may have touched it

    prompts, group_sizes, tokens = ((16,), (4, 8), 16) if args.quick else ((256, 1024), (8, 16, 64), 512)
    max_tokens = 2**23  # per-token functions up to ~8.4M tokens (1024 x 16 x 512); beyond: GBs of float64 temporaries
    rows, skipped = [], []
    for B in prompts:
        for G in group_sizes:
            x = Inputs(B, G, tokens)
            baseline = lambda x=x: grpo.group_advantages(x.binary)  # noqa: E731
            for name, case, per_token, call in batch_cases(x):
                if per_token and B * G * tokens > max_tokens:
                    skipped.append(f"`{name}` ({case}) at {B} x {G} x {tokens} tokens")
                    continue
                timing = measure(call, baseline, reps)
                share = timing.seconds / (ASSUMED_STEP_SECONDS * B * G / ASSUMED_STEP_COMPLETIONS)
                rows.append((name, case, B, G, tokens if per_token else 0, timing, share))
                print(f"{name:40s} {case:45s} B={B:5d} G={G:3d}: {timing.seconds * 1e3:10.3f} ms  x{timing.ratio:.1f}")

    ref = Inputs(prompts[0], group_sizes[0], tokens)
    helpers = [
        (name, case, measure(call, lambda: grpo.group_advantages(ref.binary), reps))
        for name, case, call in helper_cases(group_sizes[-1])
    ]

    embedded = Inputs(eB, eG, eT)
    e_base = lambda: grpo.group_advantages(embedded.binary)  # noqa: E731
    embedded_rows = [(name, case, measure(call, e_base, reps)) for name, case, _, call in batch_cases(embedded)]
    embedded_rows += [(name, case, measure(call, e_base, reps)) for name, case, call in helper_cases(eG)]

    covered = {r[0] for r in rows} | {h[0] for h in helpers} | {e[0] for e in embedded_rows}
    missing = sorted(set(public_functions()) - covered)
    if missing:
        raise RuntimeError(f"functions without a benchmark case: {missing}")
    load_end = harness.load_average()
    lines = [
        "# Algorithm functions: time, ratio to `group_advantages`, share of a training step",
        "",
        f"Command: `{harness.command_line(__file__, argv)}` (regenerates this file; `--quick` is the CI smoke run).",
        "",
        f"Machine: {platform.platform()}, {harness.machine_line(torch=False)}, Python {platform.python_version()}, torch "
        f"{torch.__version__}, CPU, **1 torch thread** (`torch.set_num_threads(1)`). "
        f"Load average (1/5/15 min, as `uptime` prints it) at start {load_start[0]:.2f} / {load_start[1]:.2f} / "
        f"{load_start[2]:.2f}, at end {load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f} on {os.cpu_count()} cores: "
        "the machine is shared, so every time below is **CPU time** of the work itself (`time.thread_time` for the "
        "functions, `time.process_time` for the step), not wall-clock; contention still perturbs it (caches, "
        f"memory bandwidth), and function and baseline are timed in alternation. {reps} repetitions per "
        f"figure; whole run {run.wall:.0f} s of wall-clock.",
        "",
    ]
    lines += reading(rows, embedded_rows, step_seconds)
    lines += [
        "",
        "## 1. Per-batch functions at realistic sizes",
        "",
        f"B prompts x G completions; per-token functions on B*G rows x {tokens} tokens (lengths uniform in "
        f"{max(1, tokens // 4)}..{tokens}; `tokens` 0 = per-sequence inputs). Ratio: median function time / median `group_advantages` time on the "
        "same B x G binary rewards, the two timed in alternation. **% of assumed real step** "
        f"is an assumption, not a measurement: {ASSUMED_STEP_SECONDS:.0f} s per 256 x 8 completions (GRPO in the "
        "MS-GRPO paper's Table 6: 3B/7B models, outputs up to 2048 tokens), scaled linearly with B*G.",
        "",
        "| function | case | prompts | G | tokens | median ms | ratio to group_advantages | first call ms | % of assumed real step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, case, B, G, T, t, share in rows:
        lines.append(
            f"| `{name}` | {case} | {B} | {G} | {T} | {fmt(t.seconds * 1e3)} | {fmt(t.ratio)} | "
            f"{fmt(t.first * 1e3)} | {share * 100:.2g} |"
        )
    if skipped:
        lines += ["", "Not run (memory on a shared machine): " + "; ".join(skipped) + "."]
    lines += [
        "",
        "## 2. Per-call helpers (cost independent of the batch)",
        "",
        f"Ratio to `group_advantages` on {prompts[0]} x {group_sizes[0]} binary rewards.",
        "",
        "| function | case | median µs | ratio to group_advantages | first call µs |",
        "|---|---|---|---|---|",
    ]
    for name, case, t in helpers:
        lines.append(f"| `{name}` | {case} | {fmt(t.seconds * 1e6)} | {fmt(t.ratio)} | {fmt(t.first * 1e6)} |")
    lines += [
        "",
        "## 3. At the embedded default's size, as a share of a measured grpo step",
        "",
        f"Measured step: **{step_seconds:.4g} s** of CPU time (median over {steps} steps after a dropped first one; "
        f"TRL's wall-clock `step_time` of the same steps: {step.wall:.3f} s; {step.what}; {eB} prompts x {eG} "
        f"completions x {eT} tokens; 1 torch thread). Every function at that size, in CPU time; "
        "the ratio is to `group_advantages` on the same rewards.",
        "",
        "| function | case | median ms | ratio to group_advantages | % of measured step |",
        "|---|---|---|---|---|",
    ]
    for name, case, t in embedded_rows:
        lines.append(
            f"| `{name}` | {case} | {fmt(t.seconds * 1e3)} | {fmt(t.ratio)} | {t.seconds / step_seconds * 100:.2g} |"
        )
    return harness.write_report(args.output, "\n".join(lines) + "\n")


def reading(rows, embedded_rows, step_seconds) -> list[str]:
    """A few sentences computed from the numbers, so they stay true when the file is regenerated."""
    if not rows:
        return []
    per_seq = [r for r in rows if r[4] == 0]
    worst_seq = max(per_seq, key=lambda r: r[5].seconds)
    worst_tok = max((r for r in rows if r[4] > 0), key=lambda r: r[5].seconds, default=None)
    biggest = max(rows, key=lambda r: r[6])
    embedded_total = sum(t.seconds for _, _, t in embedded_rows)
    coldest = max(rows, key=lambda r: r[5].first)
    self_ratios = [r[5].ratio for r in rows if r[0] == "grpo.group_advantages" and "baseline" in r[1]]
    out = [
        "**Reading the tables.** At realistic sizes the slowest per-sequence function is "
        f"`{worst_seq[0]}` ({worst_seq[1]}) at {fmt(worst_seq[5].seconds * 1e3)} ms for {worst_seq[2]} x {worst_seq[3]} "
        f"({fmt(worst_seq[5].ratio)}x `group_advantages`)"
    ]
    if worst_tok is not None:
        out[0] += (
            f"; the slowest per-token one is `{worst_tok[0]}` ({worst_tok[1]}) at {fmt(worst_tok[5].seconds * 1e3)} ms "
            f"for {worst_tok[2]} x {worst_tok[3]} x {worst_tok[4]} tokens"
        )
    verdict = (
        "so on one CPU thread no algorithm function is a meaningful part of a real step"
        if biggest[6] < 0.01
        else "the one function that would be a visible part of a real step on one CPU thread"
    )
    out[0] += (
        f". The largest share of the assumed real-scale step is {biggest[6] * 100:.2g}% "
        f"(`{biggest[0]}`, {biggest[1]}, {biggest[2]} x {biggest[3]}), {verdict}; on a GPU or with more threads these "
        f"kernels run faster still. At the embedded default's toy size all the rows of table 3 together take "
        f"{fmt(embedded_total * 1e3)} ms, {embedded_total / step_seconds * 100:.2g}% of the measured "
        f"{step_seconds:.2f} CPU-seconds grpo step (a method calls only its own few of them, each row being one step's worth "
        "of calls). The ratios to `group_advantages` are large for per-token functions by construction (hundreds of "
        "times more inputs than per-sequence rewards): they say how much heavier than GRPO's own normalisation a "
        "method's maths is, not how much it slows training. The baseline's ratio to itself (the first row of each "
        f"size, ideally 1) ranges over {fmt(min(self_ratios))}..{fmt(max(self_ratios))}: that is the timing noise of "
        "this run, so ratios within that factor of each other are indistinguishable. The most expensive first call is "
        f"`{coldest[0]}` ({coldest[1]}) at {fmt(coldest[5].first * 1e3)} ms for {coldest[2]} x {coldest[3]}, against "
        f"{fmt(coldest[5].seconds * 1e3)} ms once its caches are built (a one-time cost at the start of training)."
    )
    return out


if __name__ == "__main__":
    main()
