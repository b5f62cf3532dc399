"""Resume without loss: for every method, a run interrupted after step 2 and resumed from its checkpoint ends with the
same weights and the same logged metrics as the uninterrupted run (CPU, fixed seed), bit for bit.

Run A trains 4 optimizer steps and saves ``checkpoint-2`` on the way; run B is a new trainer object (same arguments,
another output directory) that resumes from A's ``checkpoint-2`` and trains steps 3-4. A fresh object restores only
what the checkpoint holds, so this is the same as resuming a run killed after step 2. The training set has 4
prompts (2 optimizer steps per epoch), so the resumed steps are in epoch 1: the prompt order, the optimizer, the LR
schedule, the RNG of generation sampling and every method's own state must all come back from the checkpoint.

Each method runs with settings under which its state matters between step 2 and step 4: MS-GRPO in the accelerated
(sampled) mode, D3S with a schedule that changes every step, SGPO with the programmatic judge and an epoch window
that closes at step 4, GPG with beta_th resampling that draws extra prompts. Further tests show the comparison is
not vacuous (a checkpoint with another micro-step counter, which seeds MS-GRPO's draws, without the global RNG
state, or a sampler that forgets the epoch gives different weights), resume inside a generation batch
(steps_per_generation > gradient accumulation, num_iterations > 1: TRL's buffered generations go into the
checkpoint), and a 2-process resume (slow).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_config_kwargs
from hypothesis import given, settings
from hypothesis import strategies as st
from method_cases import case
from transformers import AutoModelForCausalLM
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from grpo_family import METHODS, GRPOFamilyTrainer
from grpo_family.runtime.resume import EpochAlignedSampler

TESTS = Path(__file__).resolve().parent
MAX_STEPS = 4
CHECKPOINT_STEP = 2
NUM_PROMPTS = 4  # 8 completions per step, G = 4: 2 prompts per step, 2 steps per epoch
# Metrics that measure wall-clock time: they can never be equal between two runs.
TIMING_KEYS = {"step_time", "sgpo/judge_latency_s"}


# Per method: config options and reward functions under which its state matters across a checkpoint (its case,
# tests/method_cases/<method>.py).
SETUPS = {m: (case(m).resume_options, list(case(m).resume_rewards or case(m).rewards)) for m in METHODS}


def _trainer(method, model_dir, tokenizer, dataset, output_dir, **overrides):
    config_cls, trainer_cls = METHODS[method]
    options, rewards = SETUPS[method]
    settings = dict(max_steps=MAX_STEPS, save_strategy="steps", save_steps=CHECKPOINT_STEP, **options)
    kwargs = tiny_config_kwargs(output_dir, **{**settings, **overrides})
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return trainer_cls(
        model=model, reward_funcs=rewards, args=config_cls(**kwargs), train_dataset=dataset, processing_class=tokenizer
    )


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _step_logs(trainer) -> dict[int, dict]:
    """The per-step log entries (not the end-of-training summary), by step."""
    return {e["step"]: e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e}


@pytest.fixture(scope="module")
def dataset(arithmetic_train):
    data = arithmetic_train.select(range(NUM_PROMPTS))
    parities = {int(a) % 2 for a in data["answer"]}
    assert parities == {0, 1}  # GPG's reward needs degenerate and informative groups
    return data


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tiny_tokenizer, dataset, tmp_path_factory):
    """Run A, once per module and (method, options): final weights, per-step logs and its checkpoint (``save_steps``
    steps in, default 2)."""
    cache = {}

    def run(method, **overrides):
        key = (method, tuple(sorted(overrides.items())))
        if key not in cache:
            output_dir = tmp_path_factory.mktemp(method)
            trainer = _trainer(method, tiny_model_dir, tiny_tokenizer, dataset, output_dir, **overrides)
            trainer.train()
            step = overrides.get("save_steps", CHECKPOINT_STEP)
            cache[key] = (_weights(trainer), _step_logs(trainer), os.path.join(output_dir, f"checkpoint-{step}"))
        return cache[key]

    return run


def _resume(method, model_dir, tokenizer, dataset, checkpoint, output_dir, **overrides):
    trainer = _trainer(method, model_dir, tokenizer, dataset, output_dir, **overrides)
    trainer.train(resume_from_checkpoint=checkpoint)
    assert trainer.state.global_step == MAX_STEPS
    return _weights(trainer), _step_logs(trainer)


def _assert_same_logs(got: dict, expected: dict, first_step: int = CHECKPOINT_STEP + 1, last_step: int = MAX_STEPS):
    """Every metric of every step after the checkpoint is equal (NaN == NaN), timings aside."""
    for step in range(first_step, last_step + 1):
        assert step in got and step in expected, f"no log entry for step {step}"
        a, b = expected[step], got[step]
        assert a.keys() == b.keys(), f"step {step}: metric keys differ: {a.keys() ^ b.keys()}"
        diff = {k: (a[k], b[k]) for k in a if k not in TIMING_KEYS and not _same(a[k], b[k])}
        assert not diff, f"step {step}: metrics differ (uninterrupted, resumed): {diff}"


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _assert_same_weights(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    changed = [k for k in got if not torch.equal(got[k], expected[k])]
    assert not changed, f"{len(changed)} of {len(got)} tensors differ after resuming, e.g. {changed[:3]}"


@pytest.mark.parametrize("method", list(METHODS))
def test_resume_is_lossless(method, uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, tmp_path):
    expected_weights, expected_logs, checkpoint = uninterrupted(method)
    at_checkpoint = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    # Steps 3-4 moved the weights, so equal final weights say something about them.
    assert any(not torch.equal(at_checkpoint[k], expected_weights[k]) for k in expected_weights)

    weights, logs = _resume(method, tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path / "resumed")
    _assert_same_weights(weights, expected_weights)
    _assert_same_logs(logs, expected_logs)

    # The method's state did change between the checkpoint and the end (so it had to be restored).
    if case(method).resume_check is not None:
        case(method).resume_check(expected_logs)


# ---------------------------------------------------------------------------------------------------- not vacuous
def _assert_resume_differs(method, uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path):
    """Resuming from ``checkpoint`` gives other final weights than the uninterrupted run; returns the step-3 logs
    (resumed, uninterrupted)."""
    expected_weights, expected_logs, _ = uninterrupted(method)
    weights, logs = _resume(method, tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path / "resumed")
    assert any(not torch.equal(weights[k], expected_weights[k]) for k in weights)
    return logs[CHECKPOINT_STEP + 1], expected_logs[CHECKPOINT_STEP + 1]


def test_ms_grpo_resume_with_another_step_counter_differs(
    uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, tmp_path
):
    # MS-GRPO keeps no state of its own: it seeds each call's scale and subgroup draws from (seed, global_step, TRL's
    # micro-step counter), and the checkpoint restores both counters. A checkpoint whose state holds another micro-step
    # counter resumes with other draws, i.e. other advantages from the same completions.
    _, _, source = uninterrupted("ms_grpo")
    checkpoint = _copy_checkpoint(source, tmp_path)
    state_file = os.path.join(checkpoint, "grpo_family_state_0.pt")
    saved = torch.load(state_file, weights_only=True)
    assert saved["step"] == CHECKPOINT_STEP and not any(key.startswith("ms_grpo") for key in saved)
    torch.save({**saved, "step": 0}, state_file)  # generation still happens at every step (0 % 1 == 0)
    resumed, expected = _assert_resume_differs(
        "ms_grpo", uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path
    )
    assert resumed["ms_grpo/abs_diff_to_grpo"] != expected["ms_grpo/abs_diff_to_grpo"]
    assert resumed["reward"] == expected["reward"]  # same completions: only the advantages changed


def test_resume_without_rng_state_samples_other_completions(
    uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, tmp_path
):
    # Generation samples from torch's global RNG: without rng_state.pth the resumed run samples other completions.
    _, _, source = uninterrupted("grpo")
    checkpoint = _copy_checkpoint(source, tmp_path)
    os.remove(os.path.join(checkpoint, "rng_state.pth"))
    resumed, expected = _assert_resume_differs(
        "grpo", uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path
    )
    assert resumed["reward"] != expected["reward"]


def test_resume_with_trls_sampler_trains_on_other_prompts(
    uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, tmp_path, monkeypatch
):
    # TRL's RepeatSampler shuffles epoch e with its e-th draw, but a resumed run's new sampler starts at the first:
    # epoch 1 (the resumed steps) would repeat epoch 0's order. EpochAlignedSampler fixes that.
    generator = torch.Generator().manual_seed(0)
    assert not torch.equal(
        torch.randperm(NUM_PROMPTS, generator=generator), torch.randperm(NUM_PROMPTS, generator=generator)
    )
    _, _, checkpoint = uninterrupted("grpo")
    monkeypatch.setattr(GRPOFamilyTrainer, "_get_train_sampler", GRPOTrainer._get_train_sampler)
    resumed, expected = _assert_resume_differs(
        "grpo", uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path
    )
    assert resumed["num_tokens"] != expected["num_tokens"]  # other prompts, other prompt lengths


@settings(max_examples=50, deadline=None)
@given(
    num_samples=st.integers(1, 12),
    batch_size=st.integers(1, 4),
    mini_repeat_count=st.integers(1, 3),
    repeat_count=st.integers(1, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    resume_epoch=st.integers(0, 3),
)
def test_epoch_aligned_sampler_is_trls_order_and_resumes_at_any_epoch(
    num_samples, batch_size, mini_repeat_count, repeat_count, shuffle, seed, resume_epoch
):
    def trl_sampler():
        return RepeatSampler(list(range(num_samples)), mini_repeat_count, batch_size, repeat_count, shuffle, seed)

    reference = trl_sampler()
    passes = [list(reference) for _ in range(resume_epoch + 2)]  # TRL: epoch e = the e-th pass of one sampler
    trainer_state = {"epoch": 0}
    aligned = EpochAlignedSampler(trl_sampler(), lambda: trainer_state["epoch"])
    assert len(aligned) == len(reference)
    for epoch in range(resume_epoch + 2):  # an uninterrupted run: TRL's order, epoch by epoch
        trainer_state["epoch"] = epoch
        assert list(aligned) == passes[epoch]
    # A run resumed in `resume_epoch` builds a new sampler: the same order from there on.
    trainer_state["epoch"] = resume_epoch
    resumed = EpochAlignedSampler(trl_sampler(), lambda: trainer_state["epoch"])
    assert list(resumed) == passes[resume_epoch]
    trainer_state["epoch"] = resume_epoch + 1
    assert list(resumed) == passes[resume_epoch + 1]


# ---------------------------------------------------------------------------------------------------- mid-buffer
MID_BUFFER = {
    # steps_per_generation 2: the checkpoint after step 1 falls between the two steps of one generation batch.
    "grpo-steps_per_generation": ("grpo", dict(steps_per_generation=2)),
    # num_iterations 2: step 2 re-trains on step 1's generations.
    "grpo-num_iterations": ("grpo", dict(num_iterations=2)),
    "d3s-steps_per_generation": ("d3s", dict(steps_per_generation=2)),  # its loss denominators live in the buffer
    "cw_grpo-steps_per_generation": ("cw_grpo", dict(steps_per_generation=2)),  # weights from an extra forward
}


@pytest.mark.parametrize(
    "case",
    [
        case if case == "grpo-steps_per_generation" else pytest.param(case, marks=pytest.mark.slow)
        for case in MID_BUFFER
    ],
)
def test_resume_inside_a_generation_batch_is_lossless(
    case, uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, tmp_path
):
    # TRL keeps the generations of one batch in memory for the steps that train on them; a checkpoint in between
    # must carry them (and TRL's micro-step counter), or the resumed run generates again, at the wrong step.
    method, options = MID_BUFFER[case]
    options = dict(options, save_steps=1)
    expected_weights, expected_logs, checkpoint = uninterrupted(method, **options)
    assert "buffered_inputs" in torch.load(os.path.join(checkpoint, "grpo_family_state_0.pt"), weights_only=True)
    weights, logs = _resume(method, tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path / "b", **options)
    _assert_same_weights(weights, expected_weights)
    _assert_same_logs(logs, expected_logs, first_step=2)


def test_resume_inside_a_generation_batch_without_the_buffer_differs(
    uninterrupted, tiny_model_dir, tiny_tokenizer, dataset, tmp_path, monkeypatch
):
    options = dict(steps_per_generation=2, save_steps=1)
    expected_weights, expected_logs, checkpoint = uninterrupted("grpo", **options)
    monkeypatch.setattr(GRPOFamilyTrainer, "_restore_resume_state", lambda self, state: None)  # TRL's behaviour
    weights, logs = _resume("grpo", tiny_model_dir, tiny_tokenizer, dataset, checkpoint, tmp_path / "b", **options)
    assert any(not torch.equal(weights[k], v) for k, v in expected_weights.items())
    assert "reward" in logs[2] and "reward" not in expected_logs[2]  # it generated again at step 2


# ---------------------------------------------------------------------------------------------------- 2 processes
@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_resume_is_lossless(tiny_model_dir, tmp_path):
    # Per-process state files (each rank's buffered generations and micro-step counter, which seeds MS-GRPO's draws)
    # and the shuffle of later epochs when accelerate shards and skips the batches. 4 completions per process and
    # step, steps_per_generation 2 (one generation batch = the 4 prompts = 2 steps = 1 epoch): checkpoint-3 is in the
    # middle of epoch 1 and of its generation batch; step 4 trains on the buffered generations, steps 5-6 on epoch
    # 2's shuffle.
    from test_distributed import launch

    config = dict(
        per_device_train_batch_size=4, steps_per_generation=2, max_steps=6, save_strategy="steps", save_steps=3,
        num_scales=2, subgroups_per_scale=2, selection="random",
    )  # fmt: skip
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    launch("resume_run.py", "ms_grpo", tiny_model_dir, str(full), str(TESTS), json.dumps(config))
    checkpoint = full / "checkpoint-3"
    for rank in (0, 1):
        assert "buffered_inputs" in torch.load(checkpoint / f"grpo_family_state_{rank}.pt", weights_only=True)
    launch("resume_run.py", "ms_grpo", tiny_model_dir, str(resumed), str(TESTS), json.dumps(config), str(checkpoint))
    expected, got = torch.load(full / "result.pt"), torch.load(resumed / "result.pt")
    assert got["logs"][3]["epoch"] == 1.5 and got["logs"][5]["epoch"] == 2.5
    _assert_same_weights(got["weights"], expected["weights"])
    _assert_same_logs(got["logs"], expected["logs"], first_step=4, last_step=6)


def _copy_checkpoint(source: str, tmp_path) -> str:
    target = tmp_path / "checkpoint-copy"
    shutil.copytree(source, target)
    return str(target)


def test_resume_true_skips_a_checkpoint_cut_short(tiny_model_dir, tiny_tokenizer, dataset, tmp_path, caplog):
    """A run killed while writing checkpoint-3 (simulated: a folder with the weights only) used to make
    ``resume_from_checkpoint=True`` pick it and fail ("Can't find a valid checkpoint"); now it warns, skips it and
    resumes from the newest complete one."""
    from grpo_family.runtime.run_folder import COMPLETE_MARKER

    out = tmp_path / "out"
    first = _trainer("grpo", tiny_model_dir, tiny_tokenizer, dataset, out, max_steps=2, save_strategy="steps",
                     save_steps=1)  # fmt: skip
    first.train()
    assert all((out / f"checkpoint-{k}" / COMPLETE_MARKER).exists() for k in (1, 2))
    partial = out / "checkpoint-3"
    partial.mkdir()
    shutil.copy(out / "checkpoint-2" / "config.json", partial / "config.json")
    resumed = _trainer("grpo", tiny_model_dir, tiny_tokenizer, dataset, out, max_steps=3, save_strategy="no")
    with caplog.at_level("WARNING", logger="grpo_family.trainers.base"):
        resumed.train(resume_from_checkpoint=True)
    assert "Skipping" in caplog.text and "checkpoint-3" in caplog.text
    assert resumed.state.global_step == 3
    assert [h["step"] for h in resumed.state.log_history if "loss" in h] == [1, 2, 3]  # steps 1-2 from checkpoint-2
