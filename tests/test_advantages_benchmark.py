"""``benchmarks/advantages.py --quick`` runs and writes well-formed Markdown covering every algorithms function.

Checks the shape of the output (every public function listed, every table rectangular, every number parses),
never the timings themselves.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
from pathlib import Path

import pytest
import torch

import grpo_family.algorithms.cw_grpo
import grpo_family.algorithms.d3s
import grpo_family.algorithms.gpg
import grpo_family.algorithms.grpo
import grpo_family.algorithms.ms_grpo
import grpo_family.algorithms.sgpo

ROOT = Path(__file__).resolve().parents[1]
NUMERIC_HEADERS = ("prompts", "G", "tokens", "median ms", "median µs", "first call", "ratio", "%")


def algorithm_functions() -> set[str]:
    """``module.function`` for every function exported by an algorithms module, found independently of the script."""
    modules = [getattr(grpo_family.algorithms, n) for n in ("grpo", "ms_grpo", "cw_grpo", "d3s", "sgpo", "gpg")]
    return {
        f"{m.__name__.rsplit('.', 1)[1]}.{name}"
        for m in modules
        for name in m.__all__
        if inspect.isfunction(getattr(m, name))
    }


def load_benchmark():
    spec = importlib.util.spec_from_file_location("advantages_benchmark", ROOT / "benchmarks" / "advantages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table as (header cells, rows of cells); asserts each has a separator line."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            assert len(block) >= 3, f"a table needs a header, a separator and rows: {block}"
            assert all(re.fullmatch(r"-{3,}", c) for c in block[1]), f"bad separator line: {block[1]}"
            found.append((block[0], block[2:]))
        i += 1
    return found


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("advantages") / "advantages.md"
    threads = torch.get_num_threads()
    try:
        text = load_benchmark().main(["--quick", "--output", str(out)])
    finally:
        torch.set_num_threads(threads)  # the benchmark pins one thread; give the rest of the session its own
    assert out.read_text() == text
    return text


def test_header_names_the_command_machine_threads_and_load(quick_report):
    head = quick_report.split("## 1.")[0]
    assert quick_report.startswith("# ")
    assert "`python benchmarks/advantages.py --quick" in head
    assert f"torch {torch.__version__}" in head and "1 torch thread" in head and "CPU cores" in head
    loads = re.search(r"Load average .*? at start ([\d.]+) / ([\d.]+) / ([\d.]+), at end ([\d.]+)", head)
    assert loads is not None and all(math.isfinite(float(x)) for x in loads.groups())
    assert "**Reading the tables.**" in head


def test_every_table_is_rectangular_and_its_numbers_parse(quick_report):
    found = tables(quick_report)
    assert len(found) == 3
    for header, rows in found:
        assert rows, f"empty table {header}"
        numeric = [
            j for j, h in enumerate(header) if any(h == k or h.startswith(k) or k in h for k in NUMERIC_HEADERS)
        ]
        assert numeric, header
        for row in rows:
            assert len(row) == len(header), row
            assert re.fullmatch(r"`\w+\.\w+`", row[0]), row[0]
            for j in numeric:
                value = float(row[j])
                assert math.isfinite(value) and value >= 0, (header[j], row)


def test_every_algorithms_function_is_listed(quick_report):
    expected = algorithm_functions()
    assert expected == set(load_benchmark().public_functions())
    listed = [{row[0].strip("`") for row in rows} for _, rows in tables(quick_report)]
    assert expected <= listed[0] | listed[1], "tables 1-2 (sizes and helpers) miss a function"
    assert expected <= listed[2], "table 3 (share of a measured step) misses a function"
    assert listed[0] | listed[1] | listed[2] <= expected, "a row names something that is not an algorithms function"


def test_measured_step_and_shares(quick_report):
    step = re.search(r"Measured step: \*\*([\d.]+) s\*\*", quick_report)
    assert step is not None and float(step.group(1)) > 0
    header, rows = tables(quick_report)[2]
    share = header.index("% of measured step")
    ms = header.index("median ms")
    for row in rows:  # the share is the row's time over the measured step, to the printed precision
        expected = float(row[ms]) / 1e3 / float(step.group(1)) * 100
        # tol: printing rounding, not float: each printed figure has two significant digits (within 5%), the
        # ratio of two such figures within ~6%; abs 1e-3 for shares printed as 0.0.
        assert math.isclose(float(row[share]), expected, rel_tol=0.06, abs_tol=1e-3), row
