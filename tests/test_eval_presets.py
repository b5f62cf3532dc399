"""Every evaluation preset equals its row(s) in docs/evaluation.md's preset table, which cites the paper's section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grpo_family.errors import EvalSetupError
from grpo_family.eval.core import check_ks, default_ks
from grpo_family.eval.presets import PRESETS, Decoding, get_preset

DOC = Path(__file__).resolve().parents[1] / "docs" / "evaluation.md"
PAPER = {"gpg": "GPG", "cw_grpo": "CW-GRPO", "ms_grpo": "MS-GRPO", "d3s": "D3S", "sgpo": "SGPO"}


def preset_rows() -> list[dict[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("| preset | applies to |") :].split("\n\n")[0].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in table[2:]]


def documented(row: dict[str, str]) -> tuple[Decoding, tuple[str, ...]]:
    tokens = row["max_new_tokens"]
    decoding = Decoding(
        temperature=float(row["temperature"]),
        top_p=float(row["top_p"]),
        num_samples=int(row["samples"]),
        max_new_tokens=None if tokens == "context" else int(tokens),
    )
    return decoding, tuple(m.strip() for m in row["metrics"].split(","))


def test_the_table_covers_every_preset_and_cites_each_paper():
    rows = preset_rows()
    assert {r["preset"] for r in rows} == set(PRESETS)
    for row in rows:
        if row["preset"] in PAPER:
            source = row["source"]
            assert source.startswith(PAPER[row["preset"]] + " "), source  # the paper named first
            assert re.search(r"§\d|App\. [A-Z]", source), f"{row['preset']}: no section cited: {source}"


@pytest.mark.parametrize("row", preset_rows(), ids=lambda r: f"{r['preset']}: {r['applies to']}")
def test_each_preset_equals_its_documented_settings(row):
    preset = PRESETS[row["preset"]]
    # The size a row applies to: SGPO's rule switches at 100 problems.
    size = 30 if "under 100" in row["applies to"] else 500
    assert preset.resolve(size) == documented(row)


def test_sgpo_switches_at_100_problems_and_others_do_not():
    sgpo = PRESETS["sgpo"]
    assert sgpo.resolve(99)[0].num_samples == 16 and sgpo.resolve(99)[1] == ("avg@16",)
    assert sgpo.resolve(100)[0].greedy and sgpo.resolve(100)[1] == ("greedy_accuracy",)
    for name in set(PRESETS) - {"sgpo"}:
        assert PRESETS[name].resolve(30) == PRESETS[name].resolve(500)


def test_explicit_settings_override_the_preset():
    decoding, metrics = PRESETS["d3s"].resolve(500, temperature=0.6, num_samples=8, top_p=None)
    assert (decoding.temperature, decoding.num_samples, decoding.top_p) == (0.6, 8, 0.9)  # None: not given
    assert metrics == ("pass@1", "pass@8", "pass@16")
    assert default_ks(decoding, metrics) == [1, 8]  # pass@16 needs 16 samples: dropped from the defaults
    with pytest.raises(EvalSetupError, match="needs at least 16 samples"):
        check_ks([16], decoding, "test")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_samples": 4}, "identical samples"),  # greedy with n > 1
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"num_samples": 0, "temperature": 1.0}, "num_samples"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_impossible_decodings_are_refused(overrides, message):
    with pytest.raises(EvalSetupError, match=message):
        get_preset("greedy").resolve(10, **overrides)


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(EvalSetupError, match="greedy, gpg, cw_grpo, ms_grpo, d3s, sgpo"):
        get_preset("lighteval")
