"""Write the generated parts of the documentation from the code and the committed results.

    python docs/generate.py           # rewrite every generated block
    python docs/generate.py --check   # name the stale blocks and exit 1 (tests/test_docs.py runs it)

A block is the text between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` in README.md or a page of
docs/. The blocks come from the one list of each thing: the stages (``grpo_family.trainers.stages.STAGES``), the
methods (``grpo_family.METHODS``: each trainer's ``summary``, paper and stages) and the learning benchmark's results
(``benchmarks/results/learning.json``) and the real-model runs (``benchmarks/results/realmodel_runs/``), the
evaluation presets (``grpo_family.eval.PRESETS``) and the package's floors
(``grpo_family.layers.FLOORS``), so adding a stage, a method, a benchmark run or a module never means editing a table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated: \2 -->)", re.S)
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _overrides() -> dict[str, list[str]]:
    """Stage hook -> the methods whose trainer class overrides it (``loss_term``, ``surrogate``: the methods that
    name one)."""
    from grpo_family import METHODS
    from grpo_family.trainers.base import GRPOFamilyTrainer
    from grpo_family.trainers.stages import STAGES

    out: dict[str, list[str]] = {}
    for stage in STAGES:
        for method, (_, trainer) in METHODS.items():
            if stage.hook in ("loss_term", "surrogate"):  # named by a class attribute
                overridden = getattr(trainer, stage.hook) is not None
            else:
                overridden = getattr(trainer, stage.hook) is not getattr(GRPOFamilyTrainer, stage.hook)
            if overridden:
                out.setdefault(stage.hook, []).append(method)
    return out


def stages_block() -> str:
    from grpo_family.trainers.stages import stage_table

    return stage_table(_overrides())


def methods_block() -> str:
    """README's table of methods: name, paper, what it changes."""
    from grpo_family import METHODS

    lines = ["| method | paper | what changes vs GRPO |", "|---|---|---|"]
    for method, (_, trainer) in METHODS.items():
        lines.append(f"| `{method}` | *{trainer._paper['title']}* | {trainer.summary} |")
    lines += ["", f"All {len(METHODS)} are registered in `grpo_family.METHODS` (name -> `(Config, Trainer)`) and selected "
              "with `--method`."]  # fmt: skip
    return "\n".join(lines)


def method_stages_block() -> str:
    """docs/architecture.md's table: each method's classes and the stages it overrides."""
    from grpo_family import METHODS
    from grpo_family.trainers.base import GRPOFamilyTrainer

    overrides = _overrides()
    lines = ["| method | config | trainer | stages it overrides | own loss | document |", "|---|---|---|---|---|---|"]
    for method, (config, trainer) in METHODS.items():
        stages = ", ".join(f"`{hook}`" for hook, methods in overrides.items() if method in methods) or "-"
        own_loss = "yes" if trainer is not GRPOFamilyTrainer and "compute_loss" in vars(trainer) else "-"
        module = config.__module__.replace(".", "/") + ".py"  # the file that defines the config
        lines.append(
            f"| `{method}` | [`{config.__name__}`](../{module}) | `{trainer.__name__}` | {stages} | {own_loss} "
            f"| [{method}.md](methods/{method}.md) |"
        )
    return "\n".join(lines)


def learning_block() -> str:
    """README's learning results, from ``benchmarks/results/learning.json``."""
    results = json.loads((ROOT / "benchmarks" / "results" / "learning.json").read_text())
    summary = results["summary"]["default"]
    methods = summary["methods"]
    steps = max(run["steps"] for run in results["runs"])
    seeds = len(results["meta"]["seeds"])
    start, grpo_gain = summary["start_accuracy"], methods["grpo"]["final_mean"] - summary["start_accuracy"]
    names = list(methods)
    lines = [
        "| | warm start | " + " | ".join(names) + " |",
        "|---" * (len(names) + 2) + "|",
        f"| held-out greedy accuracy after {steps} steps, mean ± sd over {seeds} seeds | {start:.3f} | "
        + " | ".join(f"{m['final_mean']:.3f} ± {m['final_std']:.3f}" for m in methods.values())
        + " |",
        "| gain over the warm start (share of grpo's gain) | | "
        + " | ".join(
            f"{m['final_mean'] - start:+.3f} ({(m['final_mean'] - start) / grpo_gain:.2f})" for m in methods.values()
        )
        + " |",
        "| training loop, s per run (one thread, machine shared with other work) | | "
        + " | ".join(f"{m['seconds']:.0f}" for m in methods.values())
        + " |",
    ]
    return "\n".join(lines)


def claims_block() -> str:
    """README's claims table, from ``benchmarks/results/claims.json`` (``benchmarks/claims.py`` writes both)."""
    from benchmarks.claims import readme_block

    return readme_block(json.loads((ROOT / "benchmarks" / "results" / "claims.json").read_text()))


def realmodel_learning_block() -> str:
    """README's real-model learning summary, from ``benchmarks/results/realmodel_runs/`` (``benchmarks/realmodel.py``
    writes the run files and this block)."""
    from benchmarks.realmodel import SECOND_TASK_DIR, learning_summary, load_learning_runs

    return learning_summary(load_learning_runs(), second=load_learning_runs(SECOND_TASK_DIR))


def presets_block() -> str:
    """README's table of evaluation presets, from ``grpo_family.eval.PRESETS`` (sources: docs/evaluation.md)."""
    from grpo_family.eval.presets import PRESETS

    def row(preset, decoding, metrics, applies):
        length = decoding.max_new_tokens or "context"
        return (f"| `{preset.name}` | {preset.paper} | {applies} | {decoding.temperature:g} | {decoding.top_p:g} | "
                f"{decoding.num_samples} | {length} | {', '.join(metrics)} |")  # fmt: skip

    lines = ["| preset | paper | applies to | temperature | top_p | samples | max new tokens | metrics |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for preset in PRESETS.values():
        if preset.small_decoding is None:
            lines.append(row(preset, preset.decoding, preset.metrics, "every benchmark"))
        else:  # SGPO's rule: its small-benchmark decoding first, then the rest
            small = f"benchmarks under {preset.small_below} problems"
            lines.append(row(preset, preset.small_decoding, preset.small_metrics, small))
            lines.append(row(preset, preset.decoding, preset.metrics, "the rest"))
    return "\n".join(lines)


def floors_block() -> str:
    """docs/architecture.md §1's layer table: each unit's floor (``grpo_family.layers.FLOORS``, the rule
    tests/test_import_layers.py enforces) and the units it imports, read from the source."""
    from grpo_family.layers import FLOORS, ROOT, unit_imports

    def name(unit: str) -> str:
        return "the package itself (`METHODS`, the lazy exports)" if unit == ROOT else f"`{unit}`"

    imports = unit_imports()
    lines = ["| floor | unit | imports from the package (read from the code) |", "|---|---|---|"]
    for unit in sorted(FLOORS, key=lambda u: (FLOORS[u], u == ROOT, u)):
        used = ", ".join(f"`{u}`" for u in sorted(imports.get(unit, ()), key=lambda u: (FLOORS.get(u, -1), u)))
        lines.append(f"| {FLOORS[unit]} | {name(unit)} | {used or '-'} |")
    return "\n".join(lines)


BLOCKS = {
    "floors": floors_block,
    "stages": stages_block,
    "methods": methods_block,
    "method-stages": method_stages_block,
    "learning": learning_block,
    "presets": presets_block,
    "claims": claims_block,
    "realmodel-learning": realmodel_learning_block,
}


def render(text: str, only: str | None = None) -> str:
    """``text`` with every generated block (or those named ``only``) rewritten from the committed results."""

    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in BLOCKS:
            raise KeyError(f"unknown generated block {name!r}; known: {sorted(BLOCKS)}")
        if only is not None and name != only:
            return match.group(0)
        return f"{match.group(1)}{BLOCKS[name]()}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a block is stale instead of rewriting it")
    parser.add_argument(
        "--only", choices=sorted(BLOCKS), help="the blocks of this name only (a benchmark that rewrote one result)"
    )
    args = parser.parse_args(argv)
    stale = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        new = render(text, args.only)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if stale and args.check:
        print("Stale generated blocks in " + ", ".join(stale) + ": run `python docs/generate.py`.")
        return 1
    print(("Rewrote " + ", ".join(stale)) if stale else "Every generated block is current.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
