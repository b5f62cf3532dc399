"""benchmarks/rewards.py's corpus of real completion endings (issue 40): the data file is well-formed, and the
generator's counts on a slice of it match a count by hand."""

from __future__ import annotations

import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("rewards_benchmark", ROOT / "benchmarks" / "rewards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus(bench):
    return bench.load_corpus()


def test_corpus_is_well_formed(bench, corpus):
    assert bench.CORPUS.stat().st_size < 2_000_000
    assert len(corpus) >= 300
    ids = [r["id"] for r in corpus]
    assert len(set(ids)) == len(ids), [i for i, n in Counter(ids).items() if n > 1]
    pairs = Counter((r["completion"], str(r["gold"])) for r in corpus)
    assert not [p for p, n in pairs.items() if n > 1], "the same ending with the same gold twice"
    for record in corpus:
        where = record["id"]
        assert set(bench.CORPUS_FIELDS) <= set(record), where
        assert record["grade"] in bench.GRADES, where
        assert record["family"] in bench.CORPUS_FAMILIES, where
        assert record["reward"] in bench.OURS, where
        assert isinstance(record["completion"], str) and record["completion"].strip(), where
        assert str(record["gold"]).strip(), where
        source = record["source"]
        if "repo" in source:  # a public repository's file at a commit, with its licence
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", source["repo"]) and source["path"], where
            assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]) and source["licence"], where
        else:  # the project's model on one of its tasks
            assert source["model"] and source["task"] and isinstance(source["seed"], int), where
        if record["reward"] == "reasoning_gym":
            assert record["reasoning_gym_entry"]["answer"] == record["gold"], where
    # Both grades in every family the corpus holds, so no family's false positives or negatives go unmeasured.
    held = Counter((r["family"], r["grade"]) for r in corpus)
    for family in {r["family"] for r in corpus}:
        assert held[family, "correct"] and held[family, "incorrect"], family


def test_tally_counts_agreement_and_errors(bench):
    records = [{"grade": g} for g in ("correct", "correct", "incorrect", "incorrect", "correct", "incorrect")]
    scores = [1.0, 0.0, 1.0, 0.0, None, "n/a"]
    rows = [(r, {"ours": s}) for r, s in zip(records, scores)]
    assert bench.tally_corpus(rows, "ours") == Counter(n=5, agree=2, fp=1, fn=2)


def test_generator_on_a_slice(bench, corpus):
    # The first correct and the first incorrect ending of every family: each grader's counts on them equal a count
    # by hand of the same scores, and the report names every family and the false-negative verdict.
    picked: dict[tuple[str, str], dict] = {}
    for record in corpus:
        picked.setdefault((record["family"], record["grade"]), record)
    rows = [(record, bench.score_record(record)) for record in picked.values()]
    for grader in bench.GRADERS:
        scored = [(bench.GRADES[r["grade"]], row[grader]) for r, row in rows if row[grader] != "n/a"]
        expected = Counter(
            n=len(scored),
            agree=sum(got == grade and not isinstance(got, str) for grade, got in scored),
            fp=sum(got == 1.0 and grade == 0 for grade, got in scored),
            fn=sum(got != 1.0 and grade == 1 for grade, got in scored),
        )
        assert bench.tally_corpus(rows, grader) == +expected, grader
    for record, row in rows:
        shared = record["family"] in bench.VALUE_FAMILIES
        assert (row["math_verify"] != "n/a") == shared and (row["trl_given"] != "n/a") == shared, record["id"]
    lines, fn_lines = bench.corpus_report(rows, 0.0)
    text = "\n".join(lines)
    for family in {r["family"] for r, _ in rows}:
        assert f"\n| {family} | " in text, family
    assert "False negatives on the correct endings with value golds: math-verify alone" in text
    misses = sum(r["grade"] == "correct" and row["ours"] != 1.0 for r, row in rows)
    assert f"## {bench.LABELS['ours']}: {misses}" in "\n".join(fn_lines)


def test_graders_credit_a_bare_box(bench):
    # The comparison is only worth its numbers if the other graders run: a bare box with the gold is 1 for both.
    assert bench.math_verify_score(r"\boxed{\frac{63}{400}}", r"\frac{63}{400}") == 1.0
    assert bench.trl_score(r"\boxed{\frac{63}{400}}", r"\frac{63}{400}", wrap=True) == 1.0
    assert bench.math_verify_score(r"\boxed{\frac{64}{400}}", r"\frac{63}{400}") == 0.0
