"""``python -m grpo_family.eval`` end to end: the demo's output evaluated from the command line gives the demo's own
accuracy; the outputs; ``--compare``; the commands of docs/evaluation.md; and everything refused before the model
loads."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_family.eval import cli

ROOT = Path(__file__).resolve().parents[1]
DEMO_STEPS = ["--max_steps", "2", "--num_eval_examples", "24", "--held_out_every", "0", "--held_out_samples", "2",
              "--per_device_train_batch_size", "16", "--num_generations", "4", "--report_to", "none"]  # fmt: skip


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory) -> Path:
    """examples/train.py's embedded default, 2 steps: a training output folder with results.json."""
    out = tmp_path_factory.mktemp("demo") / "grpo"
    result = subprocess.run(
        [sys.executable, "examples/train.py", "--method", "grpo", "--output_dir", str(out), *DEMO_STEPS],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def test_the_cli_on_the_demos_output_gives_the_demos_accuracy(demo_output, tmp_path):
    demo = json.loads((demo_output / "results.json").read_text())
    out = tmp_path / "eval"
    args = ["--model", str(demo_output), "--dataset", "arithmetic", "--limit", "24", "--max_new_tokens", "40"]
    assert cli.main([*args, "--output_dir", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    summary = results["benchmarks"]["arithmetic"]["summary"]
    assert summary["greedy_accuracy"] == demo["accuracy_after"]  # one scoring path: the same number
    assert results["model"]["kind"] == "training output" and results["versions"]["torch"]
    assert results["settings"]["max_new_tokens"] == 40 and results["benchmarks"]["arithmetic"]["decoding"] == {
        "temperature": 0.0, "top_p": 1.0, "top_k": 0, "num_samples": 1, "max_new_tokens": 40}  # fmt: skip
    lines = (out / "samples-arithmetic.jsonl").read_text().splitlines()
    assert len(lines) == 24 and json.loads(lines[0])["samples"]
    assert "| arithmetic |" in (out / "results.md").read_text()
    # The demo's sampled held-out metrics came from the same path too.
    assert set(demo["held_out_after"]) >= {"held_out_accuracy", "held_out/pass@1", "held_out/pass@2", "held_out/avg@2"}


def test_compare_pairs_problems_and_refuses_different_ones(demo_output, tmp_path):
    base = ["--model", str(demo_output), "--dataset", "arithmetic", "--max_new_tokens", "40", "--no_math_verify"]
    greedy, sampled, fewer = tmp_path / "greedy", tmp_path / "sampled", tmp_path / "fewer"
    assert cli.main([*base, "--limit", "24", "--output_dir", str(greedy)]) == 0
    assert cli.main([*base, "--limit", "24", "--temperature", "1", "--num_samples", "4", "--output_dir",
                     str(sampled)]) == 0  # fmt: skip
    assert cli.main([*base, "--limit", "12", "--output_dir", str(fewer)]) == 0
    from grpo_family.eval.report import compare

    same = compare(str(greedy), str(greedy))
    assert same["rows"] and all((r["diff"], r["low"], r["high"]) == (0.0, 0.0, 0.0) for r in same["rows"])
    mixed = {r["metric"]: r for r in compare(str(greedy), str(sampled))["rows"]}
    assert set(mixed) == {"pass@1"}  # the only metric both runs have
    row = mixed["pass@1"]
    assert row["low"] <= row["diff"] <= row["high"] and row["problems"] == 24 and row["resamples"] == 10_000
    assert cli.main(["--compare", str(greedy), str(fewer)]) == 2  # different problems: refused


def test_the_commands_of_the_evaluation_doc_run(demo_output, tmp_path, monkeypatch):
    """docs/evaluation.md's commands, parsed and run as written (in this process), from a folder whose
    outputs/grpo is the demo's output."""
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    commands = [c for block in re.findall(r"```bash\n(.*?)```", doc, re.S) for c in block.strip().splitlines()]
    assert any("--compare" in c for c in commands) and any("--dataset arithmetic" in c for c in commands)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "grpo").symlink_to(demo_output)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "grpo_family.eval"], command
        assert cli.main(argv[3:] if "--compare" in argv else [*argv[3:], "--limit", "8"]) == 0, command
    assert (demo_output / "eval-greedy" / "results.json").is_file()  # the documented default output folder


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "arithmetic", "--preset", "lighteval"], "Unknown preset 'lighteval'"),
        (["--dataset", "aime2024"], "Unknown dataset 'aime2024'"),
        (["--dataset", "arithmetic", "--preset", "d3s", "--k", "64"], "k=\\[64\\] needs at least 64 samples"),
        (["--dataset", "arithmetic", "--num_samples", "4"], "identical samples"),
        (["--dataset", "arithmetic", "--reward", "nosuch"], "Unknown reward function 'nosuch'"),
        (["--dataset", "NOGOLD"], "none of its 2 rows has a gold answer"),
        (["--dataset", "arithmetic", "--model", "./no/such/model"], "no such directory"),
        (["--model", "MODEL"], "Give --dataset"),
    ],
)
def test_refused_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch, capsys, args, message):
    nogold = tmp_path / "nogold.jsonl"
    nogold.write_text('{"question": "q1", "answer": null}\n{"question": "q2", "answer": null}\n')
    monkeypatch.setattr(cli, "make_backend", lambda *a: pytest.fail("the model was loaded"))
    args = [str(nogold) if a == "NOGOLD" else tiny_model_dir if a == "MODEL" else a for a in args]
    if "--model" not in args:
        args = ["--model", tiny_model_dir, *args]
    assert cli.main(args) == 2
    assert re.search(message, capsys.readouterr().err), capsys.readouterr()
