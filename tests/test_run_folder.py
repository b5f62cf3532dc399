"""A run's lifecycle (grpo_family.runtime: run_folder, pidlock, cache): one run per output folder, resumes that must match
their checkpoint, a finished run left as it is, and a warm-start cache whose killed builder or corrupt files are
noticed at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import HANG_GUARD_S

from grpo_family.errors import PreflightError, RunFinishedError
from grpo_family.runtime.cache import MANIFEST, build_once, cache_problem, load_cached
from grpo_family.runtime.pidlock import Holder, PidLock, process_start
from grpo_family.runtime.run_folder import (
    LOCK_FILE,
    OutputFolderLock,
    check_resume,
    json_ready,
    plain,
    write_run_settings,
)

ROOT = Path(__file__).resolve().parents[1]
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": os.environ["PATH"], "HOME": str(Path.home()),
       "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # fmt: skip

HOLD = textwrap.dedent(
    """
    import sys, time
    from grpo_family.runtime.pidlock import PidLock
    assert PidLock(sys.argv[1]).acquire() is None
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    """
)


def _holder_process(path: Path, seconds: float = 120) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE,
                               text=True, env=ENV)  # fmt: skip
    assert process.stdout.readline().strip() == "held"
    return process


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# ---------------------------------------------------------------------------------------------------- PID locks
def test_a_lock_names_its_live_holder_and_is_taken_over_when_the_holder_dies(tmp_path):
    path = tmp_path / "x.lock"
    process = _holder_process(path)
    try:
        holder = PidLock(path).acquire()
        assert holder is not None and holder.pid == process.pid and holder.alive()
    finally:
        process.kill()
        process.wait()
    # The holder was killed (no release): its lock is stale by its PID, and taken over at once, whatever its age
    # (made brand new here; acquire() never waits, so taking it over at all is "at once").
    os.utime(path)
    lock = PidLock(path)
    assert lock.acquire() is None
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert lock.acquire() is None  # this process holds it already
    lock.release()
    assert not path.exists()


def test_a_reused_pid_or_another_host_is_told_apart(tmp_path):
    """A PID that now belongs to another process (its start time differs) is a dead holder; a holder on another
    host cannot be checked here and counts as live."""
    me = Holder.me()
    reused = Holder(os.getpid(), socket.gethostname(), (process_start(os.getpid()) or 0) + 1, time.time(), "old")
    elsewhere = Holder(_dead_pid(), "another-host", None, time.time(), "remote")
    assert me.alive() is True
    assert reused.alive() is (False if process_start(os.getpid()) is not None else True)
    assert elsewhere.alive() is None
    path = tmp_path / "y.lock"
    path.write_text(json.dumps(elsewhere.__dict__))
    assert PidLock(path).acquire() == elsewhere


# ---------------------------------------------------------------------------------------------------- output folder
def test_a_second_run_into_a_busy_output_folder_is_refused(tmp_path):
    """Two runs into one folder both exited 0 with their files clobbered; the second now stops at start naming the
    first, and a folder whose run was killed is free again."""
    process = _holder_process(tmp_path / LOCK_FILE)
    try:
        with pytest.raises(PreflightError, match=rf"--output_dir {tmp_path} is in use by another run: process "
                                                 rf"{process.pid} on"):  # fmt: skip
            OutputFolderLock(tmp_path).acquire()
    finally:
        process.kill()
        process.wait()
    with OutputFolderLock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()
    OutputFolderLock(tmp_path, is_main_process=False).acquire()  # other processes take nothing
    assert not (tmp_path / LOCK_FILE).exists()


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_two_train_py_runs_into_one_folder(tiny_model_dir, tmp_path):
    """Through examples/train.py: while a run trains, a second run into its folder exits 1 naming it; once the first
    is killed (kill -9: its lock stays behind), the next run takes the folder over at once and finishes."""
    from test_train_parity import TINY_RUN, _gsm_dir

    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "examples" / "train.py"), "--model_name_or_path", tiny_model_dir,
           "--dataset_name", str(_gsm_dir(tmp_path / "gsm")), *TINY_RUN, "--output_dir", str(out)]  # fmt: skip
    first = subprocess.Popen([*cmd, "--max_steps", "100000", "--on_unlearnable", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=ENV)  # fmt: skip
    try:
        deadline = time.monotonic() + HANG_GUARD_S  # a liveness guard while train.py starts
        while not ((out / LOCK_FILE).exists() and (out / LOCK_FILE).read_text().strip()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.2)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
        assert first.poll() is None, "the first run ended before the second started"
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 1 and f"is in use by another run: process {first.pid}" in second.stderr
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == first.pid  # left behind by the killed run
    third = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert third.returncode == 0, third.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["method"] == "grpo" and not (out / LOCK_FILE).exists()


# ---------------------------------------------------------------------------------------------------- resuming
class Args:
    per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation, generation_batch_size = 8, 1, 1, 8
    num_generations, num_iterations, shuffle_dataset, seed, data_seed = 4, 1, True, 0, None
    max_steps, num_train_epochs = 4, 3.0


def _checkpoint(tmp_path: Path, step: int, method: str = "grpo", **changes) -> Path:
    folder = tmp_path / f"checkpoint-{step}"
    folder.mkdir()
    args = Args()
    for key, value in changes.items():
        setattr(args, key, value)
    write_run_settings(folder, args, method, 1)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 2}))
    return folder


def test_resuming_with_another_method_or_layout_is_refused_listing_the_differences(tmp_path):
    """Resuming a grpo checkpoint with --method d3s, or with another --num_generations, gave no warning."""
    checkpoint = _checkpoint(tmp_path, 2)
    check_resume(checkpoint, Args(), "grpo", 1)  # the same run: fine
    args = Args()
    args.num_generations = 8
    with pytest.raises(PreflightError) as error:
        check_resume(checkpoint, args, "d3s", 2)
    message = str(error.value)
    assert "method: 'grpo' in the checkpoint, 'd3s' now" in message
    assert (
        "num_generations: 4 in the checkpoint, 8 now" in message
        and "num_processes: 1 in the checkpoint, 2 now" in message
    )
    assert "seed" not in message


def test_resuming_a_finished_run_says_so(tmp_path):
    """Resuming a finished run trained step 31 of 30 and changed the weights; now nothing runs."""
    args = Args()
    with pytest.raises(RunFinishedError, match=r"already reached the end of this run \(step 4 of --max_steps 4\)"):
        check_resume(_checkpoint(tmp_path, 4), args, "grpo", 1)
    args.max_steps = 6  # raised: the run goes on
    check_resume(tmp_path / "checkpoint-4", args, "grpo", 1)
    args.max_steps = -1  # by epochs: step 4 is epoch 2.0 of 3
    check_resume(tmp_path / "checkpoint-4", args, "grpo", 1)
    args.num_train_epochs = 2.0
    with pytest.raises(RunFinishedError, match=r"epoch 2 of --num_train_epochs 2"):
        check_resume(tmp_path / "checkpoint-4", args, "grpo", 1)


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_train_py_resume_checks(tiny_model_dir, tmp_path):
    """Through examples/train.py (one real run with checkpoints, then three resumes): a finished run resumed exits 0
    saying so and writes nothing; another method or --num_generations exits 1 listing the differences."""
    from safetensors.torch import load_file
    from test_train_parity import TINY_RUN, _gsm_dir

    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "examples" / "train.py"), "--model_name_or_path", tiny_model_dir,
           "--dataset_name", str(_gsm_dir(tmp_path / "gsm")), *TINY_RUN, "--output_dir", str(out),
           "--save_strategy", "steps", "--save_steps", "1"]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((out / "checkpoint-1" / "grpo_family_run.json").read_text())["method"] == "grpo"
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    weights = load_file(out / "model.safetensors")

    finished = subprocess.run([*cmd, "--resume_from_checkpoint", "true", "--learning_rate", "0.5"], capture_output=True,
                              text=True, timeout=300, env=ENV)  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "already reached the end of this run (step 1 of --max_steps 1)" in finished.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert all((load_file(out / "model.safetensors")[k] == v).all() for k, v in weights.items())

    other = subprocess.run([*cmd, "--max_steps", "2", "--method", "d3s", "--num_generations", "8",
                            "--resume_from_checkpoint", str(out / "checkpoint-1")], capture_output=True, text=True,
                           timeout=300, env=ENV)  # fmt: skip
    assert other.returncode == 1
    assert "error: Cannot resume" in other.stderr and "method: 'grpo' in the checkpoint, 'd3s' now" in other.stderr
    assert "num_generations: 4 in the checkpoint, 8 now" in other.stderr


# ---------------------------------------------------------------------------------------------------- caches
def _build(folder: Path) -> None:
    (folder / "weights.bin").write_bytes(os.urandom(4096))
    (folder / "config.json").write_text("{}")


def test_a_killed_build_is_noticed_at_once(tmp_path):
    """A warm-start build killed with kill -9 left its lock and the next run waited in silence up to 10 minutes; the
    lock now names a dead PID and the next process builds at once."""
    path = tmp_path / "cache"
    builder = _holder_process(path.with_name("cache.lock"))  # a builder holding the lock, then killed mid-build
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    # timeout=0: waiting on the lock at all would raise TimeoutError at once; building shows it never waited.
    assert build_once(path, _build, what="a test cache", timeout=0) == path
    assert cache_problem(path) is None


def test_a_live_builder_is_waited_for_and_named(tmp_path):
    path = tmp_path / "cache"
    builder = _holder_process(path.with_name("cache.lock"))
    try:
        with pytest.raises(TimeoutError, match=rf"Waited 1s for process {builder.pid} on .* to build a test cache"):
            build_once(path, _build, what="a test cache", timeout=1)
    finally:
        builder.kill()
        builder.wait()


def test_a_corrupt_cache_is_named_and_rebuilt(tmp_path, caplog):
    """A truncated cache file gave a SafetensorError naming neither the cache nor the fix; a cache whose file is
    cut (its size differs from the manifest) or does not load is now named in a warning and rebuilt."""
    path = build_once(tmp_path / "cache", _build, what="a test cache")
    assert json.loads((path / MANIFEST).read_text())["files"]["weights.bin"] == 4096
    (path / "weights.bin").write_bytes(b"cut")
    assert cache_problem(path) == "weights.bin is 3 bytes, 4096 when it was written"
    with caplog.at_level("WARNING", logger="grpo_family.runtime.cache"):
        build_once(path, _build, what="a test cache")
    assert f"a test cache in {path} is incomplete or corrupt (weights.bin is 3 bytes" in caplog.text
    assert (path / "weights.bin").stat().st_size == 4096

    loads = []

    def load(folder: Path) -> bytes:  # fails once: a corrupt file of the right size
        loads.append(folder)
        if len(loads) == 1:
            raise ValueError("header is corrupt")
        return (folder / "weights.bin").read_bytes()

    caplog.clear()
    with caplog.at_level("WARNING", logger="grpo_family.runtime.cache"):
        assert len(load_cached(path, _build, load, what="a test cache")) == 4096
    assert "could not be loaded (ValueError: header is corrupt): rebuilding it" in caplog.text
    # the published folder, the rebuilt one before it is published (verified by its loader), the published one again
    assert [folder.name.startswith("cache.tmp-") for folder in loads] == [False, True, False]


def test_the_warm_start_cache_is_rebuilt_when_corrupt(tmp_path, caplog):
    """The real warm start (2 supervised steps): a truncated model.safetensors is named and rebuilt."""
    from grpo_family.tasks import load_warm_start

    small = dict(num_steps=2, num_train_examples=64)
    cache = tmp_path / "warm"
    model, _ = load_warm_start(cache, **small)
    expected = {k: v.clone() for k, v in model.state_dict().items()}  # the loaded tensors map the file: copied
    del model
    weights = cache / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with caplog.at_level("WARNING", logger="grpo_family.runtime.cache"):
        again, _ = load_warm_start(cache, **small)
    assert f"warm start in {cache} is incomplete or corrupt (model.safetensors is 1000 bytes" in caplog.text
    assert all((again.state_dict()[k] == v).all() for k, v in expected.items())


# ---------------------------------------------------------------------------------------------------- reporting
def test_the_plot_leaves_out_unscored_steps(tmp_path):
    """A step where nothing could be scored logs reward None (NaN before the JSON round trip): the plot crashed on
    it ("unsupported operand type(s) for +: 'int' and 'NoneType'")."""
    from grpo_family.tasks.plot import plot_training_curve

    history = [{"step": 0, "held_out_accuracy": 0.2}, {"step": 1, "reward": None}, {"step": 2, "reward": float("nan")},
               {"step": 3, "reward": 0.5}, {"step": 3, "held_out_accuracy": None}]  # fmt: skip
    plot_training_curve(history, tmp_path / "curve.png", "t")
    assert (tmp_path / "curve.png").stat().st_size > 0
    plot_training_curve([{"step": 1, "reward": None}], tmp_path / "none.png", "t")  # nothing to draw: no file
    assert not (tmp_path / "none.png").exists()


def test_plain_and_json_ready_values():
    import numpy as np
    import torch

    value = {"a": np.float32(0.5), "b": [torch.tensor(2.0), np.int64(3)], "c": float("nan"), "d": None}
    assert plain(value) == {"a": 0.5, "b": [2.0, 3], "c": value["c"], "d": None}
    assert json.dumps(json_ready(value), allow_nan=False) == '{"a": 0.5, "b": [2.0, 3], "c": null, "d": null}'


REWARDS = '''
import numpy as np

calls = [0]


def numpy_reward(completions, **kwargs):
    """numpy float32 scores: their held-out mean was a numpy float in the log history."""
    return np.full(len(completions), 0.5, dtype=np.float32)


def unscored_once(completions, **kwargs):
    """None for every completion of its second call: the first training step is fully unscored."""
    calls[0] += 1
    return [None if calls[0] == 2 else 0.5] * len(completions)
'''


@pytest.mark.parametrize("reward", ["numpy_reward", "unscored_once"])
def test_end_of_run_reporting_survives_numpy_scores_and_unscored_steps(reward, tiny_model_dir, tmp_path, monkeypatch):
    """A numpy-returning reward crashed the write of checkpoint-2 (float32 is not JSON serializable); one fully
    unscored step crashed the end-of-run plot (its reward is logged as None): no PNG, no results.json. Both runs
    now end with the checkpoints, the plot and a strict-JSON results.json.

    examples/train.py's ``main`` with the command's arguments, in this process (the crashes were in the run, not in
    starting a process): a crash raises here."""
    from test_train_parity import TINY_RUN, _gsm_dir

    (tmp_path / "my_rewards.py").write_text(REWARDS)
    out = tmp_path / "out"
    argv = ["--model_name_or_path", tiny_model_dir, "--dataset_name", str(_gsm_dir(tmp_path / "gsm")), *TINY_RUN,
            "--output_dir", str(out), "--reward_funcs", f"my_rewards.{reward}", "--max_steps", "3",
            "--held_out_every", "1", "--save_strategy", "steps", "--save_steps", "2",
            "--on_unlearnable", "warn"]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # `my_rewards` as the command finds it in its working directory
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)  # this test's module, not another run's
    import train

    try:
        train.main(argv)
    finally:
        sys.modules.pop("my_rewards", None)
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    rewards = [h.get("reward") for h in state["log_history"] if "reward" in h]
    if reward == "unscored_once":
        assert rewards[0] is None and rewards[1] == 0.5  # step 1 unscored, step 2 scored
    results = json.loads((out / "results.json").read_text())
    assert results["method"] == "grpo" and (out / "reward_curve.png").stat().st_size > 0


@pytest.mark.slow  # 20-60 s on 2 cores: whole train.py processes
@pytest.mark.multiprocess
def test_every_process_of_a_two_process_run_sees_the_busy_folder(tmp_path):
    """One lock per run, taken by the main process: its refusal reaches the other process (which takes no lock of
    its own), so both stop at start instead of one waiting at the first collective."""
    from test_launch import _accelerate

    out = tmp_path / "out"
    holder = _holder_process(out / LOCK_FILE)
    try:
        cmd = _accelerate(str(ROOT / "examples" / "train.py"), "--output_dir", str(out),
                          port=29400 + (os.getpid() + 2) % 500)  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode != 0
    assert result.stderr.count(f"is in use by another run: process {holder.pid}") == 2, result.stderr[-3000:]


def test_the_trainer_refuses_a_checkpoint_of_another_layout(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, tmp_path
):
    """The Python API: ``trainer.train(resume_from_checkpoint=...)`` runs the same check before it loads anything."""
    from conftest import digit_share_reward, tiny_config_kwargs

    from grpo_family import D3SConfig, D3STrainer

    checkpoint = _checkpoint(tmp_path, 2)  # written by grpo, num_generations 4
    trainer = D3STrainer(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], processing_class=tiny_tokenizer,
        args=D3SConfig(**tiny_config_kwargs(tmp_path / "out")), train_dataset=arithmetic_train,
    )  # fmt: skip
    with pytest.raises(PreflightError, match=r"method: 'grpo' in the checkpoint, 'd3s' now"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 0


def test_resume_between_lora_and_full_fine_tuning_is_refused_with_the_mismatch(tmp_path):
    """A LoRA checkpoint resumed as full fine-tuning (or the reverse) used to fail on unrelated checkpoint or
    optimizer errors: the run record lacked use_peft. A record written before use_peft was recorded is not refused
    on it."""
    args = SimpleNamespace(max_steps=10, num_train_epochs=1.0, per_device_train_batch_size=8, num_generations=4)
    for saved, now in ((True, False), (False, True)):
        folder = tmp_path / f"checkpoint-{saved}"
        folder.mkdir()
        write_run_settings(folder, args, "grpo", 1, use_peft=saved)
        (folder / "trainer_state.json").write_text('{"global_step": 2}')  # a checkpoint this process holds whole
        with pytest.raises(PreflightError, match=f"use_peft: {saved} in the checkpoint, {now} now"):
            check_resume(folder, args, "grpo", 1, use_peft=now)
        check_resume(folder, args, "grpo", 1, use_peft=saved)
    older = tmp_path / "checkpoint-older"
    older.mkdir()
    write_run_settings(older, args, "grpo", 1)  # no use_peft recorded
    (older / "trainer_state.json").write_text('{"global_step": 2}')
    check_resume(older, args, "grpo", 1, use_peft=True)
