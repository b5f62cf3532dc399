"""The timing benchmarks start: every run of ``benchmarks/speed.py``, ``bench_gpg.py``, ``bench_sgpo.py`` and
``bench_cw_grpo.py`` builds its config with the scripts' default arguments (a learning rate of 0, which the bounds
refuse, and a ``max_steps`` given twice, stopped them before their first step), and the learning rate they time at
(``harness.FROZEN_LEARNING_RATE``) leaves the weights unchanged, so every run does the same work. No training: a
few seconds in all.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers import Trainer, TrainingArguments

from grpo_family import METHODS
from grpo_family.tasks import load_warm_start

harness = importlib.import_module("benchmarks.harness")
speed = importlib.import_module("benchmarks.speed")
bench_gpg = importlib.import_module("benchmarks.bench_gpg")
bench_sgpo = importlib.import_module("benchmarks.bench_sgpo")
bench_cw_grpo = importlib.import_module("benchmarks.bench_cw_grpo")


@pytest.mark.parametrize("name", ["stock_trl", *METHODS])
def test_speed_builds_every_methods_config(name, tmp_path):
    args = speed.parse_args([])
    config = speed.make_config(name, args.steps + 1, args.device, tmp_path, {"beta": args.beta})
    assert config.learning_rate == harness.FROZEN_LEARNING_RATE


@pytest.mark.parametrize("name", list(bench_gpg.RUNS))
def test_bench_gpg_builds_every_runs_config(name, tmp_path):
    args = bench_gpg.parse_args([])
    config = bench_gpg.make_config(name, args.steps + 1, args.device, tmp_path, args.learning_rate)
    assert config.learning_rate == harness.FROZEN_LEARNING_RATE


def test_bench_sgpo_builds_every_runs_config(tmp_path):
    args = bench_sgpo.parse_args([])
    names = ["grpo", "sgpo_programmatic", *(f"sgpo_http_{ms:g}ms" for ms in args.latency_ms)]
    for name in names:
        config = bench_sgpo.make_config(name, args.steps + 1, args.device, tmp_path)
        assert config.learning_rate == harness.FROZEN_LEARNING_RATE


def test_bench_cw_grpo_builds_every_runs_config(tmp_path):
    """The entropy runs and every timing configuration, with the run's own steps winning over the shared
    settings' ``max_steps``."""
    args = bench_cw_grpo.parse_args([])
    for method in bench_cw_grpo.METHODS:
        for seed in args.seeds:
            assert bench_cw_grpo.make_config(method, tmp_path, args.steps, seed).max_steps == args.steps
        for common, cw_only, _ in bench_cw_grpo.TIMING_CONFIGS.values():
            extra = {**common, **(cw_only if method == "cw_grpo" else {})}
            steps = (args.timing_steps + 1) * common.get("num_iterations", 1)
            assert bench_cw_grpo.make_config(method, tmp_path, steps, 0, **extra).max_steps == steps


def _adam_steps(model, lr: float, tmp_path, steps: int = 3) -> None:
    """``steps`` updates of the optimizer a Trainer builds from its default arguments, each from the gradient of
    the language-model loss on a random batch (nonzero almost everywhere)."""
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=lr, use_cpu=True, report_to="none")
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    optimizer = optimizer_cls(model.parameters(), **kwargs)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_frozen_learning_rate_leaves_every_weight_unchanged(tmp_path):
    """AdamW at ``FROZEN_LEARNING_RATE`` moves no float32 weight, zero and the smallest ones included (the bound in
    benchmarks/harness.py), while a small real rate moves them: the digest check is not vacuous."""
    model, _ = load_warm_start(seed=0)
    with torch.no_grad():
        first = next(model.parameters())
        first.view(-1)[:8] = 0.0  # zero weights: any update that does not round to nothing moves them
    before = harness.weights_digest(model)
    _adam_steps(model, harness.FROZEN_LEARNING_RATE, tmp_path / "frozen")
    harness.check_frozen(before, model, "AdamW at the frozen rate")
    _adam_steps(model, 1e-6, tmp_path / "learning", steps=1)
    with pytest.raises(RuntimeError, match="the weights changed"):
        harness.check_frozen(before, model, "AdamW at 1e-6")


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # the benchmarks pin their own; give the rest of the session its own back


SMALLEST = {  # each benchmark's smallest run: 12-35 s on 2 CPU cores
    "speed": ["--methods", "grpo", "--reps", "1", "--steps", "1"],
    "bench_gpg": ["--reps", "1", "--steps", "1"],
    "bench_sgpo": ["--reps", "1", "--steps", "1", "--latency-ms", "0"],
    "bench_cw_grpo": ["--steps", "1", "--seeds", "0", "--timing-reps", "1", "--timing-steps", "1"],
}


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
@pytest.mark.parametrize("script", list(SMALLEST))
def test_smallest_run_writes_its_report(script, tmp_path, keep_threads):
    """The whole script, report included (bench_cw_grpo's report step once named its timer like its runs)."""
    module = importlib.import_module(f"benchmarks.{script}")
    out = tmp_path / f"{script}.md"
    text = module.main([*SMALLEST[script], "--output", str(out)])
    assert out.read_text() == text and text.startswith("# ") and "|---|" in text
