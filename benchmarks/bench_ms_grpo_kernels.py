"""MS-GRPO advantage kernels as a ratio to plain GRPO group normalisation, on the same rewards.

    python benchmarks/bench_ms_grpo_kernels.py                 # B=1024 prompts, CPU, torch's default threads
    python benchmarks/bench_ms_grpo_kernels.py --reps 31 --threads 1

Cases (``multiscale_advantages`` from ``grpo_family.algorithms.ms_grpo``):

* exact, binary rewards, G=64: value-class tables (the fast path);
* exact, rewards in {0, 0.5, 1, 1.5} (format + accuracy style), G=16: tables of the batch's value set;
* accelerated, uniform rewards, G=16, M=4, K=8 (greedy diverse subgroups);
* exact enumeration, uniform rewards, G=12 (4 083 subgroups per prompt).

The baseline is ``group_advantages`` from ``grpo_family.algorithms.grpo`` (TRL's maths) on the same tensor.
Each case is first called once ("cold": builds its cached tables or subgroup selections); then every
repetition times the baseline and the case back to back (best of a few inner calls each) and the figure is
the median over repetitions of case / baseline, so drift in the machine's speed hits both alike. Writes
``benchmarks/results/ms_grpo_kernels.md`` and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from grpo_family.algorithms.grpo import group_advantages  # noqa: E402
from grpo_family.algorithms.ms_grpo import MultiscaleCache, multiscale_advantages, num_subgroups  # noqa: E402


def timed(fn, device, inner):
    """Wall seconds of the fastest of ``inner`` calls (CUDA synchronised at both ends)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    best = float("inf")
    for _ in range(inner):
        with harness.Timer(sync=sync) as timer:
            fn()
        best = min(best, timer.wall)
    return best


def cases(B, device):
    gen = torch.Generator().manual_seed(0)
    binary = (torch.rand(B, 64, generator=gen) < torch.rand(B, 1, generator=gen)).float().to(device)
    levels = torch.tensor([0.0, 0.5, 1.0, 1.5])[torch.randint(0, 4, (B, 16), generator=gen)].to(device)
    uniform16 = torch.rand(B, 16, generator=gen).to(device)
    uniform12 = torch.rand(B, 12, generator=gen).to(device)
    seeded = torch.Generator(device=device)
    return [
        ("exact, value-class tables", "binary", binary, {}),
        ("exact, value-class tables", "{0, 0.5, 1, 1.5}", levels, {}),
        ("accelerated M=4, K=8", "uniform", uniform16, dict(num_scales=4, subgroups_per_scale=8, generator=seeded)),
        ("exact, enumeration", "uniform", uniform12, {}),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--inner", type=int, default=3, help="calls per timing; the fastest counts")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(harness.RESULTS / "ms_grpo_kernels.md"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load = harness.load_average()[0]

    rows = []
    for name, rewards_kind, rewards, kwargs in cases(args.prompts, device):
        G = rewards.shape[1]
        if "generator" in kwargs:
            kwargs["generator"].manual_seed(0)
        kwargs["cache"] = MultiscaleCache()  # the run's tables, as a trainer keeps them
        cold = timed(lambda: multiscale_advantages(rewards, **kwargs), device, 1)  # noqa: B023
        ratios, base_times, ms_times = [], [], []
        for _ in range(args.reps):
            base = timed(lambda: group_advantages(rewards), device, args.inner)  # noqa: B023
            ms = timed(lambda: multiscale_advantages(rewards, **kwargs), device, args.inner)  # noqa: B023
            ratios.append(ms / base)
            base_times.append(base)
            ms_times.append(ms)
        budget = {k: v for k, v in kwargs.items() if k not in ("generator", "cache")}
        rows.append(
            dict(
                case=name,
                rewards=rewards_kind,
                G=G,
                subgroups=num_subgroups(G, **budget),
                ratio=statistics.median(ratios),
                ms=statistics.median(ms_times) * 1e3,
                base=statistics.median(base_times) * 1e3,
                cold=cold * 1e3,
            )
        )

    lines = [
        "# MS-GRPO advantage kernels vs GRPO group normalisation",
        "",
        f"`{harness.command_line(__file__)}` — B = {args.prompts} prompts, device {device}, "
        f"torch threads: {torch.get_num_threads()}, {os.cpu_count()} CPUs (1-min load average at start: {load:.1f}), "
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}. Median over {args.reps} repetitions of "
        f"(MS time / `group_advantages` time on the same rewards), best of {args.inner} calls each; caches warm "
        "(the first, cold call — building value-class tables or greedy selections — is listed separately).",
        "",
        "| case | rewards | G | subgroups / prompt | ratio to GRPO | MS (ms) | GRPO (ms) | cold first call (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['rewards']} | {r['G']} | {r['subgroups']:.4g} | **{r['ratio']:.1f}x** | "
            f"{r['ms']:.2f} | {r['base']:.3f} | {r['cold']:.0f} |"
        )
    lines += [
        "",
        "Subgroups per prompt are those the exact definition sums over (expected count for the accelerated scheme);",
        "the value-class tables compute the same exact result from at most prod(n_d + 1) count vectors per prompt,",
        "for every prompt at once, tables of the batch's value set cached across calls.",
    ]
    harness.write_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
