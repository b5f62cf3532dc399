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
        (["--dataset", "arithmetic", "--preset", "lighteval"], "--preset must be one of \\('greedy', "),
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


# Issue 44's inputs to the evaluation command: each refused by name before the model loads (each was a NaN, a raw
# message or a silently wrong number).
@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch_size", "-4"], r"--batch_size must be an integer >= 1; got -4"),  # exited 0 with NaN
        (["--batch_size", "0"], r"--batch_size must be an integer >= 1; got 0"),
        (["--k", "0"], r"--k must be a list of at least 1 values, each an integer >= 1, or None; got \[0\]"),
        (["--limit", "0"], r"--limit must be an integer >= 1, or None; got 0"),
        (["--threshold", "2"], r"--threshold must be in \(0, 1\] \(a finite number\); got 2.0. A sample is correct"),
        (["--top_p", "0"], r"--top_p must be in \(0, 1\]"),
        (["--config", "examples/recipes/ms_grpo_small.yaml"], r"give it as --recipe examples/recipes/ms_grpo_small"),
        (["--recipe", "no/such.yaml"], r"--recipe no/such.yaml: no such file"),
    ],
)
def test_bad_options_are_refused_by_their_bounds(tiny_model_dir, monkeypatch, capsys, args, message):
    monkeypatch.setattr(cli, "make_backend", lambda *a: pytest.fail("the model was loaded"))
    monkeypatch.chdir(ROOT)
    assert cli.main(["--model", tiny_model_dir, "--dataset", "arithmetic", *args]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_the_parser_and_the_bounded_arguments_hold_the_same_options():
    """Every flag of the parser is a field of EvalArguments (whose bounds tests/test_bounds.py walks), and back."""
    import dataclasses

    dests = {a.dest for a in cli.build_parser()._actions if a.dest != "help"}
    assert dests == {f.name for f in dataclasses.fields(cli.EvalArguments)}


def test_a_truncated_weight_file_is_refused_naming_it(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(whole // 2)
    monkeypatch.setattr(cli, "make_backend", lambda *a: pytest.fail("the model was loaded"))
    assert cli.main(["--model", str(model), "--dataset", "arithmetic"]) == 2
    err = capsys.readouterr().err
    assert f"{weights} is incomplete or damaged ({whole // 2} bytes on disk, {whole} bytes by its header)" in err


def test_the_greedy_preset_has_a_length_cap():
    from grpo_family.eval.presets import GREEDY_MAX_NEW_TOKENS, get_preset

    assert get_preset("greedy").resolve(10)[0].max_new_tokens == GREEDY_MAX_NEW_TOKENS == 1024


def test_a_recipe_gives_its_data_settings():
    """--recipe reads a training recipe's dataset, builder config, test split, columns, system prompt, reward and
    completion length (the command line wins where it gives them)."""
    recipe = str(ROOT / "examples" / "recipes" / "ms_grpo_small.yaml")
    args = cli.parse_args(["--model", "m", "--recipe", recipe])
    assert args.datasets == ["openai/gsm8k"] and (args.config, args.split) == ("main", "test")
    assert (args.dataset_preset, args.system_prompt, args.reward) == ("gsm8k", "boxed", "math_accuracy")
    assert args.max_new_tokens == 512
    given = cli.parse_args(["--model", "m", "--recipe", recipe, "--dataset", "x.jsonl", "--max_new_tokens", "9"])
    assert given.datasets == ["x.jsonl"] and given.max_new_tokens == 9


@pytest.fixture
def problems_file(tmp_path) -> Path:
    path = tmp_path / "problems.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    return path


def test_a_recipe_evaluates_end_to_end_with_a_progress_bar(tiny_model_dir, problems_file, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"method: grpo\ndataset_name: {problems_file}\nsystem_prompt: Be brief.\n"
                      "max_completion_length: 5\nreward_funcs: [math_accuracy]\n")  # fmt: skip
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_dir, "--recipe", str(recipe), "--output_dir", str(out), "--no_math_verify"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "at most 5 new tokens" in err and "generating (n=1, up to 5 tokens)" in err  # the cap and the bar
    results = json.loads((out / "results.json").read_text())
    bench = next(iter(results["benchmarks"].values()))
    assert bench["decoding"]["max_new_tokens"] == 5 and bench["dataset"]["system_prompt"] == "Be brief."
    assert bench["summary"]["problems"] == 2 and "greedy_accuracy_stderr" in bench["summary"]
    first = json.loads((out / next(p.name for p in out.glob("samples-*.jsonl"))).read_text().splitlines()[0])
    assert first["prompt"][0] == {"role": "system", "content": "Be brief."}


def test_an_evaluation_never_writes_over_a_training_run(tiny_model_dir, problems_file, tmp_path, capsys):
    """--output_dir naming the training run's own folder: the run's results.json is kept, the evaluation goes into
    the eval-<preset> subfolder and says so."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run)
    training = json.dumps({"accuracy_before": 0.25, "accuracy_after": 0.8})
    (run / "results.json").write_text(training)
    argv = ["--model", str(run), "--dataset", str(problems_file), "--max_new_tokens", "3", "--no_math_verify"]
    assert cli.main([*argv, "--output_dir", str(run)]) == 0
    assert (run / "results.json").read_text() == training
    assert "benchmarks" in json.loads((run / "eval-greedy" / "results.json").read_text())
    assert f"writing this evaluation into {run / 'eval-greedy'} instead" in capsys.readouterr().err
    assert cli.main([*argv, "--output_dir", str(run / "eval-greedy")]) == 0  # an evaluation's own folder: rewritten
    (run / "eval-greedy" / "results.json").write_text(training)  # another command's results there too: refused
    assert cli.main([*argv, "--output_dir", str(run)]) == 2
    assert "an evaluation never writes over another command's results" in capsys.readouterr().err


def test_compare_says_what_a_training_folder_is(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "eval-greedy").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"accuracy_before": 0.25, "accuracy_after": 0.8}))
    (run / "eval-greedy" / "results.json").write_text(json.dumps({"benchmarks": {}}))
    assert cli.main(["--compare", str(run), str(run)]) == 2
    err = capsys.readouterr().err
    assert "a training output folder (examples/train.py's results.json" in err
    assert f"Evaluations found inside it: {run / 'eval-greedy'}" in err
    assert cli.main(["--compare", str(run / "eval-greedy"), str(run / "eval-greedy"), "--output_dir", str(run)]) == 2
    assert "an evaluation never writes into another command's folder" in capsys.readouterr().err
