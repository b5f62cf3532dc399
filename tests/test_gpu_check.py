"""The GPU check (`.ci/gpu`, `benchmarks/gpu.py`, docs/gpu_check.md) kept runnable on a machine without a GPU.

* the dry run goes through `.ci/gpu run` as a lent machine runs it: the bundle (here only this package's wheel,
  built offline; the rest is in this environment) installed with `pip --no-index --no-deps --target`, then
  `benchmarks/gpu.py` on the CPU (`--device cpu`: the tiny shape, one timed step), from the wheel, not the tree;
  every method of METHODS, stock TRL and `grpo_ref` train with finite losses and a non-zero gradient norm;
* a bundle built from other sources than the tree is caught, and the tree's code is measured instead;
* `.ci/gpu size` counts what travels (the tree git does not ignore plus the bundle) and refuses more than 64 MiB;
* the time budget skips larger shapes, repetitions and trainers, and says so in gpu.json and gpu.md;
* the tokenizer padded to a real vocabulary size encodes as the plain one and decodes its padding pieces;
* the DeepSpeed lane runs the dry run with its 1-process ZeRO-3 launch.
"""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from grpo_family import METHODS
from grpo_family.tasks import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ["stock_trl", *METHODS, "grpo_ref"]
LIMIT = 64 * 2**20


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


gpu = _load_benchmark()


def ci_gpu(*args: str, bundle: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "GPU_BUNDLE": str(bundle),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python3: this environment's
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu"), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )


def build_wheel(source: Path, out: Path) -> Path:
    """This package's wheel, offline (setuptools is in the environment: torch requires it)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("grpo_family-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def dry_run(wheel, tmp_path_factory):
    """`.ci/gpu run -- --device cpu` with a bundle of this package's wheel: (process, gpu.json, gpu.md)."""
    tmp = tmp_path_factory.mktemp("gpu-dry-run")
    (tmp / "bundle").mkdir()
    shutil.copy(wheel, tmp / "bundle")
    out = tmp / "out"
    done = ci_gpu("run", "--", "--device", "cpu", "--no-zero3", "--output-dir", str(out), bundle=tmp / "bundle")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    return done, json.loads((out / "gpu.json").read_text()), (out / "gpu.md").read_text()


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_dry_run_trains_every_method_from_the_bundled_wheel(dry_run):
    done, report, _ = dry_run
    assert "the bundle's grpo_family differs" not in done.stderr
    installed = Path(report["versions"]["grpo_family_from"])
    assert installed.name == "grpo_family" and installed.parent.name == "site", installed  # the wheel's copy
    assert not installed.is_relative_to(ROOT)
    assert report["device"].startswith("CPU") and report["versions"]["trl"] and report["versions"]["torch"]
    assert report["date"] and report["zero3"] == {"skipped": "--no-zero3"}
    runs = report["shapes"]["tiny"]["runs"]
    assert list(runs) == TRAINERS
    for name, (run,) in runs.items():
        assert "error" not in run, (name, run)
        assert run["finite"] and run["max_grad_norm"] > 0, (name, run)
        assert len(run["step_times"]) == report["settings"]["steps"] == 1
        assert run["tokens"] and all(t > 0 for t in run["tokens"]), (name, run)
        assert run["steps"] == 2  # warm-up + timed
    assert report["shapes"]["tiny"]["rep_seconds"] and not report["skipped_shapes"]


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_dry_run_table_has_a_row_per_trainer_with_ratios(dry_run):
    _, report, table = dry_run
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert set(TRAINERS) <= set(rows)
    stock = rows["stock_trl"].split("|")
    assert stock[3].strip() == "1.000" and stock[5].strip() == "1.000"  # stock against itself
    for name in TRAINERS:
        cells = [c.strip() for c in rows[name].split("|")[1:-1]]
        assert float(cells[1]) > 0 and float(cells[2]) > 0 and float(cells[3]) > 0, rows[name]
        assert cells[7] == "yes", rows[name]
    assert "GPG (beta 0, no reference model)" in table
    assert f"Command: `{report['command']}`" in table


def test_a_stale_bundle_is_caught_and_the_tree_is_measured(wheel, tmp_path):
    """The bundle's wheel holds a module the tree does not (as after a file was deleted since `prepare`)."""
    (tmp_path / "bundle").mkdir()
    stale = shutil.copy(wheel, tmp_path / "bundle")
    with zipfile.ZipFile(stale, "a") as archive:
        archive.writestr("grpo_family/removed_since.py", "")
    done = ci_gpu("run", "--", "--help", bundle=tmp_path / "bundle")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "the bundle's grpo_family differs from this tree's" in done.stderr
    assert "removed_since.py" in done.stdout
    assert f"grpo_family from {ROOT / 'grpo_family'}" in done.stdout


def tracked_and_untracked_bytes() -> int:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
        cwd=ROOT,
    ).stdout.split(b"\0")
    return sum(os.lstat(ROOT / os.fsdecode(p)).st_size for p in listed if p and os.path.lexists(ROOT / os.fsdecode(p)))


def size_line(stdout: str) -> dict[str, int]:
    (line,) = [line for line in stdout.splitlines() if line.startswith("GPU_SIZE ")]
    return {k: int(v) for k, v in (field.split("=") for field in line.split()[1:])}


def test_size_counts_the_tree_and_the_bundle(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "sub").mkdir(parents=True)
    (bundle / "a.whl").write_bytes(b"x" * 1000)
    (bundle / "sub" / "b.whl").write_bytes(b"y" * 2345)
    done = ci_gpu("size", bundle=bundle)
    sizes = size_line(done.stdout)
    assert sizes["bundle_bytes"] == 3345
    assert sizes["tree_bytes"] == tracked_and_untracked_bytes() > 100_000
    assert sizes["total_bytes"] == sizes["tree_bytes"] + 3345 and sizes["limit_bytes"] == LIMIT
    assert "of the 64.0 MiB" in done.stdout
    # The verdict follows the sum, whatever this checkout holds beside the tracked files (a venv created in it that
    # git does not ignore would travel, and is refused: the checkout decides, not the test's assumption about it).
    assert done.returncode == (0 if sizes["total_bytes"] <= LIMIT else 1), done.stderr
    assert ("over the limit" in done.stderr) == (sizes["total_bytes"] > LIMIT)


def test_size_refuses_a_bundle_over_the_limit(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    with open(bundle / "huge.whl", "wb") as f:
        f.truncate(LIMIT)  # sparse: 64 MiB on paper, which with the tree is over
    done = ci_gpu("size", bundle=bundle)
    assert done.returncode == 1
    assert "over the limit" in done.stderr
    assert size_line(done.stdout)["total_bytes"] > LIMIT
    missing = ci_gpu("size", bundle=tmp_path / "none")
    assert missing.returncode == 1 and "bash .ci/gpu prepare" in missing.stderr


def test_the_budget_skips_larger_shapes_and_says_so(tmp_path, monkeypatch):
    """A fake trainer run costs 1 s per 10M parameters of its shape on a fake clock; the budget fits one repetition
    of SmolLM2-135M (every trainer x 13.5 s), enough to start Qwen2.5-0.5B (the check's estimate: that repetition x
    the square root of the parameter ratio) plus half a run, so Qwen2.5-0.5B stops inside its repetition; Qwen2.5-1.5B
    is not started. Derived from the number of trainers, so a new method does not change what is tested."""
    now = [0.0]
    params = {shape: gpu.shape_params(shape) for shape in ("smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b")}
    assert 134e6 < params["smollm2-135m"] < 136e6 and 493e6 < params["qwen2.5-0.5b"] < 495e6  # the real counts
    assert 1.5e9 < params["qwen2.5-1.5b"] < 1.6e9
    small_rep = len(TRAINERS) * params["smollm2-135m"] / 1e7
    budget = (
        small_rep * (1 + math.sqrt(params["qwen2.5-0.5b"] / params["smollm2-135m"])) + params["qwen2.5-0.5b"] / 2e7
    )

    def fake_run(name, model_dir, args, workdir):
        cost = params[model_dir] / 1e7
        now[0] += cost
        steps = [cost / 2] * args.steps
        return dict(steps=args.steps + 1, step_times=steps, tokens=[100.0] * args.steps, losses=[0.0] * 2,
                    grad_norms=[1.0] * 2, finite=True, max_grad_norm=1.0, seconds=cost)  # fmt: skip

    monkeypatch.setattr(gpu.Clock, "now", staticmethod(lambda: now[0]))
    monkeypatch.setattr(gpu, "build_model_dir", lambda shape, device, workdir: (shape, params[shape]))
    monkeypatch.setattr(gpu, "run_once", fake_run)
    threads = torch.get_num_threads()
    try:
        status = gpu.main(
            ["--device", "cpu", "--shapes", *params, "--reps", "2", "--budget-s", str(budget), "--no-zero3"]
            + ["--output-dir", str(tmp_path)]
        )
    finally:
        torch.set_num_threads(threads)
        gpu.hf_logging.enable_progress_bar()
    assert status == 0
    assert now[0] <= budget
    report = json.loads((tmp_path / "gpu.json").read_text())
    small, medium = report["shapes"]["smollm2-135m"], report["shapes"]["qwen2.5-0.5b"]
    assert all(len(runs) == 1 for runs in small["runs"].values()) and len(small["runs"]) == len(TRAINERS)
    assert small["rep_seconds"] == [pytest.approx(len(TRAINERS) * params["smollm2-135m"] / 1e7)]
    assert any(reason.startswith("repetition 2:") for reason in small["skipped"])
    assert 0 < len(medium["runs"]) < len(TRAINERS) and not medium["rep_seconds"]  # stopped inside its repetition
    assert any("and after" in reason for reason in medium["skipped"])
    assert list(report["shapes"]) == ["smollm2-135m", "qwen2.5-0.5b"]
    assert report["skipped_shapes"]["qwen2.5-1.5b"].startswith("not started")
    table = (tmp_path / "gpu.md").read_text()
    assert "## Shapes skipped for time" in table and "- qwen2.5-1.5b: not started" in table


def test_padded_tokenizer_has_the_real_vocabulary_size_and_encodes_as_the_plain_one():
    plain, padded = build_tokenizer(), build_tokenizer(vocab_size=49152)
    assert len(padded) == 49152 and len(plain) < 200
    text = "Compute 12 + 3 * (4 - 1).\nAnswer: 21"
    plain_ids, padded_ids = plain(text)["input_ids"], padded(text)["input_ids"]
    assert padded.decode(padded_ids) == plain.decode(plain_ids) == text
    # The characters keep their ids; only the whole-word tokens move behind the padding.
    assert [padded.convert_ids_to_tokens(i) for i in padded_ids] == [plain.convert_ids_to_tokens(i) for i in plain_ids]
    pieces = padded.convert_ids_to_tokens(list(range(len(plain) - 5, 49152 - 5)))
    assert len(set(pieces)) == len(pieces) and {len(p) for p in pieces} == {2, 3}
    joined = "".join(pieces[:500])
    assert max(padded(joined)["input_ids"]) < len(plain)  # encoding never produces a padding piece
    assert padded.decode(padded(joined)["input_ids"]) == joined
    with pytest.raises(ValueError, match="vocab_size=50 is below"):
        build_tokenizer(vocab_size=50)


@pytest.mark.deepspeed
def test_dry_run_with_the_zero3_launch(tmp_path):
    pytest.importorskip("deepspeed")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--methods", "grpo"]
        + ["--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    zero3 = json.loads((tmp_path / "gpu.json").read_text())["zero3"]
    assert zero3["zero_stage"] == 3 and zero3["shape"] == "tiny", zero3
    assert zero3["steps"] == 2 and zero3["finite"] and zero3["max_grad_norm"] > 0, zero3
    assert "DeepSpeed ZeRO-3 (1 process" in (tmp_path / "gpu.md").read_text()
