"""How examples/train.py is started (grpo_family.launch): a --config YAML read strictly, flags the chosen path would
ignore refused, LOGLEVEL in any case, a multi-process launch that trains as one run or stops with the fix, and a
trainer that never outlives its launcher."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

from grpo_family import launch
from grpo_family.errors import PreflightError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train  # noqa: E402

ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": os.environ["PATH"], "HOME": str(Path.home()),
       "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # fmt: skip


# ---------------------------------------------------------------------------------------------------- the YAML
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- method: grpo\n- learning_rate: 1.0e-6\n", r"holds a list, not a mapping of flag names"),
        ("42\n", r"holds a int, not a mapping"),
        (
            "learning_rate: 1.0e-6\nbeta: 0.0\nlearning_rate: 5000\n",
            r"'learning_rate' is given twice \(lines 1 and 3\)",
        ),
        (
            "method: grpo\nlearnig_rate: 1.0e-6\n",
            r"unknown key\(s\) 'learnig_rate' \(did you mean 'learning_rate'\?\)",
        ),
        ("learning_rate: [1.0e-6\n", r"is not valid YAML"),
        ("num_generations: [4]\n", r"--num_generations must be an integer >= 2; got \[4\]"),
        ("reward_funcs: math_accuracy\n", None),  # the embedded default: refused below, as on the command line
    ],
    ids=["list", "scalar", "duplicate_key", "unknown_key", "malformed", "wrong_type", "inapplicable"],
)
def test_config_yaml_is_read_strictly(text, message, tmp_path):
    """A YAML list was an AttributeError; a duplicated key used its last value in silence (lr 5000 ruined the
    model, exit code 0); an unknown key was TRL's traceback; a wrong-typed value passed argparse untouched."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(PreflightError, match=message or r"--reward_funcs only applies with a model and a dataset"):
        train.parse_args(["--config", str(recipe), "--output_dir", str(tmp_path)])


def test_every_shipped_recipe_passes_the_strict_reader():
    for recipe in sorted((ROOT / "examples" / "recipes").glob("*.yaml")):
        config = launch.load_config_file(str(recipe))
        assert config.get("method"), recipe


# ---------------------------------------------------------------------------------------------------- flags
@pytest.mark.parametrize(
    "flags",
    [
        ["--reward_funcs", "nosuch"],
        ["--dataset_preset", "gsm8k"],
        ["--question_column", "q"],
        ["--reward_model_name_or_path", "org/rm"],
        ["--model_init_kwargs", '{"revision": "x"}'],
        ["--load_in_4bit", "true"],
    ],
    ids=lambda flags: flags[0][2:],
)
def test_flags_the_embedded_default_would_ignore_are_refused(flags, tmp_path):
    """Without --model_name_or_path / --dataset_name these were ignored in silence (the README says unknown rewards
    are refused); now each names itself and the fix."""
    with pytest.raises(PreflightError, match=rf"--{flags[0][2:]} only applies with a model and a dataset of your own"):
        train.parse_args([*flags, "--output_dir", str(tmp_path)])


def test_embedded_only_flags_are_refused_on_the_real_path(tmp_path):
    with pytest.raises(PreflightError, match=r"--task_difficulty only applies to the embedded default"):
        train.parse_args(["--model_name_or_path", "m", "--dataset_name", "d", "--task_difficulty", "hard"])


def test_fp16_without_a_gpu_is_refused(tmp_path):
    """--fp16 true on a CPU was ignored in silence."""
    if launch.has_accelerator():
        pytest.skip("this machine has a GPU: fp16 applies")
    with pytest.raises(PreflightError, match=r"--fp16 asks for float16 mixed precision, which needs a GPU"):
        train.parse_args(["--fp16", "true", "--output_dir", str(tmp_path)])


@pytest.mark.slow  # 20-60 s on 2 cores: whole train.py processes
def test_loglevel_takes_any_case_and_names_a_bad_value():
    """LOGLEVEL=debug was "ValueError: Unknown level: 'debug'"."""
    assert launch.log_level("debug") == launch.log_level("DEBUG") == logging.DEBUG
    assert launch.log_level(None) == logging.WARNING and launch.log_level("15") == 15
    with pytest.raises(PreflightError, match=r"LOGLEVEL='loud' is not a logging level; use one of .*DEBUG"):
        launch.log_level("loud")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), "--num_generations", "0"],
                            capture_output=True, text=True, timeout=300, env={**ENV, "LOGLEVEL": "debug"})  # fmt: skip
    assert result.returncode == 1 and "Unknown level" not in result.stderr
    assert "error: --num_generations must be an integer >= 2; got 0." in result.stderr


# ---------------------------------------------------------------------------------------------------- processes
def _accelerate(*args: str, port: int) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", str(port), *args]  # fmt: skip


@pytest.mark.slow  # 20-60 s on 2 cores: whole train.py processes
@pytest.mark.multiprocess
def test_a_two_process_launch_that_would_train_apart_stops_with_the_fix(tmp_path):
    """`accelerate launch --config_file accelerate_configs/cpu_2proc.yaml` on a CPU machine with CPU off in the
    training arguments started two independent single-process trainers writing one folder. Now both processes stop
    at start with the fix (the default of examples/train.py is CPU on a machine without a GPU: the next test)."""
    if launch.has_accelerator():
        pytest.skip("needs a machine without a GPU")
    cmd = _accelerate(str(ROOT / "examples" / "train.py"), "--use_cpu", "false", "--output_dir", str(tmp_path / "o"),
                      port=29400 + os.getpid() % 500)  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert result.returncode != 0
    assert result.stderr.count("error: This run was launched as 2 processes (WORLD_SIZE=2)") == 2, result.stderr[
        -3000:
    ]
    assert "pass --use_cpu true" in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # 20-60 s on 2 cores: whole train.py processes
@pytest.mark.multiprocess
def test_the_recipe_header_command_trains_as_one_two_process_run(tmp_path):
    """The command sgpo_small.yaml's header prints (no --use_cpu) now trains one run over gloo: the checkpoint
    records 2 processes and one generation batch of 2 x 64 completions."""
    import json

    out = tmp_path / "out"
    cmd = _accelerate(
        str(ROOT / "examples" / "train.py"), "--config", str(ROOT / "examples" / "recipes" / "sgpo_small.yaml"),
        "--max_steps", "1", "--per_device_train_batch_size", "16", "--num_generations", "8",
        "--max_completion_length", "12", "--num_eval_examples", "8", "--save_strategy", "steps", "--save_steps", "1",
        "--output_dir", str(out), port=29400 + (os.getpid() + 1) % 500,
    )  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    settings = json.loads((out / "checkpoint-1" / "grpo_family_run.json").read_text())
    assert settings["num_processes"] == 2 and settings["method"] == "sgpo"
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in result.stderr


CHILD = textwrap.dedent(
    """
    import os, sys, time
    from grpo_family.launch import stop_with_launcher
    print(stop_with_launcher(poll_seconds=0.2), flush=True)
    time.sleep(120)
    """
)
PARENT = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
    print(child.pid, flush=True)
    child.wait()
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("launcher", [True, False], ids=["under_a_launcher", "from_a_shell"])
def test_the_trainer_never_outlives_its_launcher(launcher):
    """A launcher killed with SIGTERM left train.py running as an orphan (and a resumed run then raced it). Under a
    launcher (its variables set) the child now stops with it; started from a shell (nohup), it does not."""
    env = {**ENV, **({"LOCAL_RANK": "0"} if launcher else {})}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True, env=env)
    child = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == str(launcher)  # the child's answer: the watch is on (or not)
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=30)
    # Under a launcher: wait until it dies (HANG_GUARD_S is a liveness guard); from a shell: it must still be alive
    # after 3 s (a slower machine only makes that easier).
    deadline = time.monotonic() + (HANG_GUARD_S if launcher else 3)
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert _alive(child) is not launcher
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_killed_accelerate_launch_stops_train_py(tmp_path):
    """The issue's case: SIGTERM to the `accelerate launch` process (its single-process launcher does not pass the
    signal on) used to leave train.py training as an orphan. The run's folder lock names train.py's PID."""
    import json

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu",
           str(ROOT / "examples" / "train.py"), "--max_steps", "100000", "--output_dir", str(out)]  # fmt: skip
    accelerate = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
    lock = out / ".grpo_family.lock"
    deadline = time.monotonic() + HANG_GUARD_S
    while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
        assert accelerate.poll() is None, "the launch ended early"
        time.sleep(0.2)
    trainer = json.loads(lock.read_text())["pid"]
    assert trainer != accelerate.pid and _alive(trainer)
    accelerate.send_signal(signal.SIGTERM)
    accelerate.wait(timeout=30)
    deadline = time.monotonic() + HANG_GUARD_S
    while _alive(trainer) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert not _alive(trainer), "train.py outlived its launcher"
    finally:
        if _alive(trainer):
            os.kill(trainer, signal.SIGKILL)
