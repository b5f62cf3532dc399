"""`benchmarks/learning.py --quick` (the CI run of the learning benchmark): its tables are well formed, every
method appears in every table, and the same seed gives the same numbers. Its values are not checked."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_family import METHODS

ROOT = Path(__file__).resolve().parents[1]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("learning_benchmark", ROOT / "benchmarks" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def learning():
    return _load_benchmark()


def run_benchmark(*args: str) -> None:
    """The script as CI and users run it (a subprocess: its worker pool needs an importable module)."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning.py"), *args], check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("learning_quick")
    run_benchmark("--quick", "--output-dir", str(out))
    return out, json.loads((out / "learning.json").read_text())


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_quick_run_covers_every_method_setting_and_seed(learning, quick_run):
    out, result = quick_run
    assert set(learning.METHOD_NAMES) == set(METHODS)
    runs = result["runs"]
    keys = {(r["method"], r["setting"], r["seed"]) for r in runs}
    assert keys == {(m, s, seed) for m in METHODS for s in learning.SETTINGS for seed in (0, 1, 2)}
    for run in runs:
        assert run["steps"] == 2
        assert [int(s) for s in run["accuracy"]] == [0, 1, 2]
        assert all(0.0 <= a <= 1.0 for a in run["accuracy"].values())
        assert len(run["entropy"]) == len(run["reward"]) == 2
    stored = json.loads((out / "learning.json").read_text())
    assert len(stored["runs"]) == len(runs)
    for setting in learning.SETTINGS:
        assert (out / f"learning_{setting}.png").stat().st_size > 1000


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_quick_markdown_is_well_formed(learning, quick_run):
    out, _ = quick_run
    text = (out / "learning.md").read_text()
    assert "Quick mode" in text
    sections = re.split(r"^## Setting `(\w+)`", text, flags=re.M)[1:]
    assert [sections[i] for i in range(0, len(sections), 2)] == list(learning.SETTINGS)
    for body in sections[1::2]:
        body = body.split("\n## ")[0]  # this setting's section only
        table = body[body.index("| method") :]  # the methods' table (the warm start's pass@k table comes first)
        rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| method")]
        assert [row.split("|")[1].strip() for row in rows] == list(METHODS)
        header = next(line for line in body.splitlines() if line.startswith("| method"))
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert len(cells) == header.count("|") - 1
            mean, sd = re.fullmatch(r"([\d.]+) ± ([\d.]+)", cells[1]).groups()
            assert 0 <= float(mean) <= 1 and float(sd) >= 0
            assert re.fullmatch(r"[+-][\d.]+ \(×([\d.]+|inf)\)", cells[2])
            assert re.fullmatch(r"-?[\d.]+|nan", cells[3])
            assert re.fullmatch(r"[+-][\d.]+", cells[5])
            assert re.fullmatch(r"[\d.]+ → [\d.]+", cells[7])
        assert re.search(r"\| greedy \| pass@1 \| pass@2 \| pass@4 \|", body)  # the warm start's ceiling
    assert "papers' claims" in text


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_same_seed_same_numbers(learning, quick_run, tmp_path):
    _, first = quick_run
    run_benchmark(
        "--quick", "--methods", "gpg", "--settings", "default", "--seeds", "1", "--output-dir", str(tmp_path)
    )
    (rerun,) = json.loads((tmp_path / "learning.json").read_text())["runs"]
    (original,) = [r for r in first["runs"] if (r["method"], r["setting"], r["seed"]) == ("gpg", "default", 1)]
    for key in ("accuracy", "entropy", "reward", "frac_reward_zero_std"):
        assert rerun[key] == original[key], key


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_from_json_rebuilds_the_same_table(learning, quick_run, tmp_path):
    out, _ = quick_run
    run_benchmark("--from-json", str(out / "learning.json"), "--output-dir", str(tmp_path))
    assert (tmp_path / "learning.md").read_text() == (out / "learning.md").read_text()
