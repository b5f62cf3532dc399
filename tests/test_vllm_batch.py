"""Every method's overrides keep working when the generation batch carries what TRL's vLLM path adds to it
(``sampling_per_token_logps`` and, with ``vllm_importance_sampling_correction``, ``importance_sampling_ratio``),
without vLLM.

How the vLLM batch is made: TRL 1.16 has exactly one place where vLLM's output enters a batch,
``GRPOTrainer._generate_single_turn``, which returns ``(completion_ids, sampled-token logprobs)`` when
``use_vllm`` is set and ``(completion_ids, None)`` for ``generate``. :func:`fake_vllm` replaces that one method on
the trainer instance: it samples with ``generate`` and returns, as vLLM would, the sampled tokens' log-probs
(the policy's own, scored exactly as TRL scores ``old_per_token_logps``, plus bounded noise standing for the
sampler/trainer mismatch). ``trainer.use_vllm`` is then set, so everything downstream is TRL's unmodified vLLM
code: padding the sampler log-probs, computing ``old_per_token_logps`` for the correction, the importance-sampling
ratio in every ``vllm_importance_sampling_mode``, its metrics, and its use in the loss. (Passing ``use_vllm=True``
in the config is not possible without vLLM: TRL builds its vLLM engine or client in ``__init__``.)

Checked per method: two steps with finite losses and weights, the method's own metric logged, and in every loss
call the vLLM columns still describe the rows they sit on (sampler log-probs within the noise of the old
log-probs, the ratio equal to TRL's formula). Method specifics: CW-GRPO's weights use the sampler log-probs
exactly when its config says so; D3S trims the vLLM columns with the completion columns it drops; GPG ignores the
ratio by default (``vllm_importance_sampling_correction=False``) and applies it when asked, also on a batch merged
from several generation rounds (``beta_th``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from method_cases import case
from transformers import AutoModelForCausalLM
from trl.trainer.utils import pad

from grpo_family import METHODS

sys.path.insert(0, str(Path(__file__).resolve().parent / "dist"))
from gpg_common import flagged_dataset, flat_or_dense_reward  # noqa: E402

NOISE = 0.05  # |sampler log-prob - trainer log-prob| per token, the "vLLM mismatch" of the fake
# tol: two scorings of the same tokens batched differently sum float32 terms in other orders: the log-softmax's
# log-sum-exp over the vocabulary (at most 512 terms of size <= 1 after the max shift) to within 512 x 2^-23 ~ 6e-5.
TOL = 1e-4

# Each method's tiny-run options, rewards, own metric and vLLM importance-sampling mode (TRL's four modes spread over
# the methods; GPG: its own default, no correction, tested below) are its case (tests/method_cases/<method>.py).
METHOD_METRIC = {name: case(name).metric for name in METHODS if case(name).metric}


# ---------------------------------------------------------------------------------------------------- the fake
def fake_vllm(trainer, monkeypatch, *, cut=None, nan_token=None, seed=0) -> None:
    """Make ``trainer`` take TRL's vLLM path with ``generate`` standing in for vLLM's sampler.

    ``cut(row) -> int`` truncates row ``row`` of each generation call to that many sampled tokens plus EOS
    (vLLM's completions end at EOS too); ``nan_token=(row, position)`` makes that log-prob ``None``, which is how
    vLLM reports a token it could not score.
    """
    plain = trainer._generate_single_turn  # bound to the class's method: reads trainer.use_vllm at call time
    generator = torch.Generator().manual_seed(seed)
    pad_id, eos_id = trainer._tokenizer.pad_token_id, trainer.eos_token_ids[0]

    def generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        trainer.use_vllm = False
        try:
            completion_ids, logprobs = plain(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        finally:
            trainer.use_vllm = True
        assert logprobs is None
        if cut is not None:
            completion_ids = [
                ids if eos_id in ids[: cut(r)] else ids[: cut(r)] + [eos_id] for r, ids in enumerate(completion_ids)
            ]
        # Score the sampled tokens as TRL scores old_per_token_logps (same padding, same helper, same temperature).
        prompts = pad([torch.tensor(p) for p in prompt_ids], padding_value=pad_id, padding_side="left")
        prompt_mask = pad(
            [torch.ones(len(p), dtype=torch.long) for p in prompt_ids], padding_value=0, padding_side="left"
        )
        completions = pad([torch.tensor(c) for c in completion_ids], padding_value=pad_id, padding_side="right")
        completion_mask = pad([torch.ones(len(c), dtype=torch.long) for c in completion_ids], padding_value=0)
        device = trainer.accelerator.device
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model,
                torch.cat([prompts, completions], dim=1).to(device),
                torch.cat([prompt_mask, completion_mask], dim=1).to(device),
                completions.size(1),
            )
        noise = (torch.rand(logps.shape, generator=generator, dtype=torch.float64) * 2 - 1) * NOISE
        sampled = (logps.double().cpu() + noise).tolist()
        logprobs = [row[: len(ids)] for row, ids in zip(sampled, completion_ids)]
        if nan_token is not None:
            row, position = nan_token
            logprobs[row][position] = None
        return completion_ids, logprobs

    monkeypatch.setattr(trainer, "_generate_single_turn", generate_single_turn)
    monkeypatch.setattr(trainer, "use_vllm", True)


def record_loss_inputs(trainer, monkeypatch) -> list[dict]:
    """Every loss call's inputs as the method handed them to its loss (cloned before the loss edits them)."""
    calls = []
    compute_loss = trainer.compute_loss

    def record(model, inputs, *args, **kwargs):
        calls.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(model, inputs, *args, **kwargs)

    monkeypatch.setattr(trainer, "compute_loss", record)
    return calls


def record_batches(trainer, monkeypatch) -> list[dict]:
    """Every generation batch in TRL's row order (the loss calls see its rows shuffled)."""
    batches = []
    generate = trainer._generate_and_score_completions

    def record(inputs):
        out = generate(inputs)
        batches.append({k: v.detach().clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
        return out

    monkeypatch.setattr(trainer, "_generate_and_score_completions", record)
    return batches


def expected_ratio(trainer, inputs: dict) -> torch.Tensor:
    """TRL's importance-sampling ratio of ``inputs``'s rows from their own old and sampler log-probs."""
    mask = inputs["completion_mask"]
    diff = torch.nan_to_num((inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]) * mask, nan=0.0)
    mode = trainer.vllm_importance_sampling_mode
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    low = trainer.vllm_importance_sampling_clip_min
    high = trainer.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return ratio.clamp(min=low, max=high)
    outside = (ratio < (low if low is not None else -math.inf)) | (ratio > (high if high is not None else math.inf))
    return ratio.masked_fill(outside, 0.0)


def check_vllm_columns(trainer, inputs: dict) -> None:
    """The vLLM columns of one loss call still belong to its rows and columns."""
    completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"].bool()
    sampler = inputs["sampling_per_token_logps"]
    assert sampler.shape == completion_ids.shape
    finite = torch.isfinite(sampler)
    assert finite[mask].sum() >= mask.sum() - 1  # at most the one token the fake made "unscorable"
    if "old_per_token_logps" in inputs:
        gap = (sampler - inputs["old_per_token_logps"])[mask & finite].abs()
        assert gap.max() <= NOISE + TOL  # a row or column shifted against the others would be far off
    if trainer.vllm_importance_sampling_correction:
        ratio = inputs["importance_sampling_ratio"]
        expected = expected_ratio(trainer, inputs)
        assert ratio.shape == expected.shape
        rows = mask.any(1)  # D3S's inert padding rows (no valid token) carry a copied row's ratio
        if ratio.size(1) == 1:
            # tol: the same exp(trainer - sampler log-prob) recomputed: a few roundings of ratios at most ~2 (2 x 2^-23
            # each, < 2e-6); a row or token shifted against the others is off by the 0.05 noise.
            assert torch.allclose(ratio[rows], expected[rows], atol=1e-5)
        else:
            # tol: as above.
            assert torch.allclose(ratio[mask], expected[mask], atol=1e-5)
    else:
        assert "importance_sampling_ratio" not in inputs


def _build(name, config_kwargs, tiny_model_dir, tiny_tokenizer, train_dataset, reward_funcs=None, **overrides):
    Config, Trainer = METHODS[name]
    kwargs = {**case(name).options, **overrides}
    return Trainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=reward_funcs or list(case(name).rewards),
        args=Config(**config_kwargs(**kwargs)),
        train_dataset=train_dataset,
        processing_class=tiny_tokenizer,
    )


def _train_logs(trainer) -> list[dict]:
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]


# ---------------------------------------------------------------------------------------------------- every method
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_trains_on_a_vllm_batch(
    name, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, monkeypatch
):
    mode = case(name).vllm_is_mode
    correction = {"vllm_importance_sampling_mode": mode} if mode else {}
    trainer = _build(name, config_kwargs, tiny_model_dir, tiny_tokenizer, arithmetic_train, **correction)
    assert trainer.vllm_importance_sampling_correction == (mode is not None)  # GPG: off by its config default
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    fake_vllm(trainer, monkeypatch)
    calls = record_loss_inputs(trainer, monkeypatch)
    logs = _train_logs(trainer)

    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    after = dict(trainer.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(after[n], before[n]) for n in before)
    if name in METHOD_METRIC:
        assert all(math.isfinite(h[METHOD_METRIC[name]]) for h in logs)
    # TRL's vLLM bookkeeping ran, on every step, exactly when the correction is on.
    assert all(("sampling/importance_sampling_ratio/mean" in h) == (mode is not None) for h in logs)
    assert len(calls) == 2
    for inputs in calls:
        check_vllm_columns(trainer, inputs)


# ---------------------------------------------------------------------------------------------------- CW-GRPO
@pytest.mark.parametrize(
    ("source", "correction", "nan", "expected"),
    [
        # Default (docs/methods/cw_grpo.md §2.4 step 1: never the inference engine's log-probs): no old log-probs, so the policy's,
        # here from the loss's own forward (steps_per_generation=1), not the sampler's.
        (None, False, False, "policy"),
        (None, True, False, "old"),  # TRL computed old_per_token_logps for the correction: those
        ("sampler", True, False, "old"),  # old_per_token_logps first, also when the sampler's are allowed
        ("sampler", False, False, "sampler"),  # opt-in: no old log-probs, so the sampler's (no extra forward)
        ("sampler", False, True, "forward"),  # vLLM could not score a token: the policy's, by an extra forward
    ],
)
def test_cw_grpo_weights_use_the_configured_logps(
    source, correction, nan, expected, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, monkeypatch
):
    options = {} if source is None else {"cw_logps_source": source}
    trainer = _build(
        "cw_grpo", config_kwargs, tiny_model_dir, tiny_tokenizer, arithmetic_train, max_steps=1,
        vllm_importance_sampling_correction=correction, **options,
    )  # fmt: skip
    fake_vllm(trainer, monkeypatch, nan_token=(0, 0) if nan else None)
    seen = []
    weights = trainer._covariance_weights

    def observe(logps, advantages, mask, num_generations):
        seen.append((logps.clone(), mask.clone()))
        return weights(logps, advantages, mask, num_generations)

    monkeypatch.setattr(trainer, "_covariance_weights", observe)
    batches = record_batches(trainer, monkeypatch)
    logs = _train_logs(trainer)

    assert len(seen) == 1 and len(batches) == 1 and math.isfinite(logs[0]["loss"])
    assert logs[0]["cw_grpo/extra_forward"] == float(expected == "forward")
    logps, mask = seen[0]
    inputs = batches[0]
    sampler = inputs["sampling_per_token_logps"]
    mask = mask & inputs["completion_mask"].bool()
    if expected == "sampler":
        assert torch.equal(logps[mask], sampler.float()[mask])
    elif expected == "old":
        assert torch.equal(logps[mask], inputs["old_per_token_logps"].float()[mask])
        assert not torch.equal(logps[mask], sampler.float()[mask])
    else:  # the policy's own log-probs: within the fake's noise of the sampler's, but not them
        finite = torch.isfinite(sampler)
        gap = (logps - sampler.float())[mask & finite].abs()
        assert 0 < gap.max() <= NOISE + TOL
    check_vllm_columns(trainer, inputs)


# ---------------------------------------------------------------------------------------------------- D3S
def length_reward(completions, completion_ids, **kwargs):
    """Rewards by completion length (tokens incl. EOS) chosen so that D3S's max-variance subset drops the longest
    rollout of every group: with rewards (0, 2, 2, 1) for lengths 2..5 its advantage (-0.26) is nearest the mean."""
    return [{2: 0.0, 3: 2.0, 4: 2.0, 5: 1.0}.get(len(ids), 0.5) for ids in completion_ids]


def test_d3s_trims_the_vllm_columns_with_the_rows_it_drops(
    tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, monkeypatch
):
    trainer = _build(
        "d3s", config_kwargs, tiny_model_dir, tiny_tokenizer, arithmetic_train, reward_funcs=[length_reward],
        vllm_importance_sampling_mode="token_truncate",  # a (B, T) ratio, trimmed like the completion columns
    )  # fmt: skip
    G = trainer.num_generations
    fake_vllm(trainer, monkeypatch, cut=lambda row: row % G + 1)  # lengths 2, 3, 4, 5 in every group
    widths = []
    trim = trainer._trim_completion_columns

    def observe(output):
        before = output["completion_ids"].size(1)
        trim(output)
        widths.append((before, {k: tuple(v.shape) for k, v in output.items() if isinstance(v, torch.Tensor)}))

    monkeypatch.setattr(trainer, "_trim_completion_columns", observe)
    calls = record_loss_inputs(trainer, monkeypatch)
    logs = _train_logs(trainer)

    assert all(math.isfinite(h["loss"]) and math.isfinite(h["d3s/kept_rollouts"]) for h in logs)
    assert widths and all(before == 5 for before, _ in widths)
    for _, shapes in widths:
        for key in ("completion_mask", "old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio"):
            assert shapes[key] == shapes["completion_ids"], key
    assert any(shapes["completion_ids"][1] < before for before, shapes in widths)  # the longest rollouts went
    for inputs in calls:
        check_vllm_columns(trainer, inputs)
        assert inputs["completion_mask"][:, -1].any()  # no all-padding column left behind


def count_scoring_rows(trainer, monkeypatch) -> list[tuple[str, int]]:
    """(model, rows) of every no-grad scoring forward after sampling (TRL's old / reference log-probs; ``labels``
    tells them from the forwards of ``generate``, and the fake sampler's own scoring is left out) of the policy and,
    with ``beta > 0``, of the reference model."""
    calls, sampling = [], []
    generate_single_turn = trainer._generate_single_turn

    def sample(*args, **kwargs):
        sampling.append(True)
        try:
            return generate_single_turn(*args, **kwargs)
        finally:
            sampling.pop()

    monkeypatch.setattr(trainer, "_generate_single_turn", sample)

    def hook(name):
        def count(module, args, kwargs):
            if "labels" in kwargs and not torch.is_grad_enabled() and not sampling:
                calls.append((name, kwargs["input_ids"].size(0)))

        return count

    trainer.model.register_forward_pre_hook(hook("policy"), with_kwargs=True)
    if trainer.ref_model is not None:
        trainer.ref_model.register_forward_pre_hook(hook("reference"), with_kwargs=True)
    return calls


@pytest.mark.parametrize(
    "setting",
    [
        {"vllm": True, "vllm_importance_sampling_mode": "token_truncate"},
        {"beta": 0.04},
        {"num_iterations": 2},
        {"steps_per_generation": 2, "gradient_accumulation_steps": 1, "d3s_token_scope": "micro"},
    ],
    ids=["vllm_is", "beta", "num_iterations", "steps_per_generation"],
)
def test_d3s_forwards_no_rollout_it_drops(
    setting, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, monkeypatch
):
    """TRL computes old log-probs (vLLM's importance-sampling correction, num_iterations > 1, steps_per_generation >
    gradient_accumulation_steps) and reference log-probs (beta > 0) before any reward exists; D3S selects its rows
    before those forwards, so they see the kept rollouts only (issue 20), and the values are those of a full
    forward."""
    setting = dict(setting)
    vllm = setting.pop("vllm", False)
    trainer = _build("d3s", config_kwargs, tiny_model_dir, tiny_tokenizer, arithmetic_train, **setting)
    if vllm:
        fake_vllm(trainer, monkeypatch)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    calls = count_scoring_rows(trainer, monkeypatch)
    loss_inputs = record_loss_inputs(trainer, monkeypatch)
    batches = record_batches(trainer, monkeypatch)
    logs = _train_logs(trainer)

    passes = ("old_per_token_logps" in loss_inputs[0]) + (trainer.beta != 0.0)  # old; reference log-probs
    assert passes >= 1
    kept = [h["d3s/kept_rollouts"] for h in logs if "d3s/kept_rollouts" in h]  # per generation batch
    rollouts = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    assert all(0 < k < rollouts for k in kept), "nothing was dropped: the check would prove nothing"
    generation_calls = len(batches)
    assert len(calls) == passes * generation_calls
    assert sorted(rows for _, rows in calls) == sorted(
        int(b["completion_mask"].any(1).sum()) for b in batches for _ in range(passes)
    )
    models = {"policy"} if "old_per_token_logps" in loss_inputs[0] else set()
    assert {name for name, _ in calls} == models | ({"reference"} if trainer.beta else set())
    # The kept rows' log-probs are a full forward's: the first loss call of the run is the initial policy's.
    inputs = loss_inputs[0]
    mask = inputs["completion_mask"].bool()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    with torch.no_grad():
        logits = initial(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1].float()
    expected = (logits / trainer.temperature).log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1))
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        if key in inputs:
            # tol: TOL (two scorings of the same tokens, derived where it is defined)
            torch.testing.assert_close(inputs[key][mask], expected.squeeze(-1)[mask], atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "setting",
    [
        {"max_completion_length": 2, "mask_truncated_completions": True},  # (nearly) every rollout is dropped
        {"pad_to_multiple_of": 16},  # the batch keeps columns past the kept rows' longest completion
    ],
    ids=["empty_selection", "pad_to_multiple_of"],
)
def test_d3s_kept_row_forwards_leave_nothing_undefined(
    setting, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, monkeypatch
):
    """The reference forward over the kept rows only: a step whose selection is empty (no forward at all) and
    columns the forward did not reach (padding) still give finite log-probs in every loss call, a finite loss and
    finite weights."""
    trainer = _build(
        "d3s", config_kwargs, tiny_model_dir, tiny_tokenizer, arithmetic_train, beta=0.04, **setting
    )  # fmt: skip
    loss_inputs = record_loss_inputs(trainer, monkeypatch)
    logs = _train_logs(trainer)
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert all(torch.isfinite(inputs["ref_per_token_logps"]).all() for inputs in loss_inputs)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    if "max_completion_length" in setting:
        assert any(h["d3s/kept_rollouts"] == 0 for h in logs), "no empty selection: the case was not exercised"
    else:
        assert any(i["completion_ids"].size(1) > int(i["completion_mask"].sum(1).max()) for i in loss_inputs)


# ---------------------------------------------------------------------------------------------------- GPG
@pytest.mark.parametrize("correction", [False, True])
def test_gpg_applies_the_ratio_only_when_configured(
    correction, tiny_model_dir, tiny_tokenizer, config_kwargs, monkeypatch
):
    # Half the prompts have flat rewards and beta_th=0.75 forces extra generation rounds, so the batch trained on
    # is merged row by row from several rounds, vLLM columns included.
    trainer = _build(
        "gpg", config_kwargs, tiny_model_dir, tiny_tokenizer, flagged_dataset(32, lambda i: i % 4 >= 2),
        reward_funcs=[flat_or_dense_reward], max_steps=1, shuffle_dataset=False, beta_th=0.75,
        max_generation_rounds=8, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        vllm_importance_sampling_correction=correction, vllm_importance_sampling_mode="token_truncate",
    )  # fmt: skip
    fake_vllm(trainer, monkeypatch)
    calls = record_loss_inputs(trainer, monkeypatch)
    logs = _train_logs(trainer)

    assert logs[0]["gpg/rounds"] > 1 and math.isfinite(logs[0]["loss"])
    assert len(calls) == 2
    for inputs in calls:
        check_vllm_columns(trainer, inputs)  # no ratio at all without the correction
    # With the correction the loss is linear in the ratio; without it the sampler's log-probs do not enter it.
    inputs = {k: v.clone() for k, v in calls[0].items()}
    trainer.model.eval()  # no gradient-scale hook (alpha acts on gradients only)
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, dict(inputs))
        plain = {k: v for k, v in inputs.items() if k not in ("sampling_per_token_logps", "importance_sampling_ratio")}
        without_vllm = trainer.compute_loss(trainer.model, plain)
        if correction:
            doubled = {**inputs, "importance_sampling_ratio": 2 * inputs["importance_sampling_ratio"]}
            # tol: the loss is linear in the ratio and doubling rounds nothing; the terms not scaled by it round within
            # 64 x 2^-23 ~ 7.6e-6 of the loss (at most 64 float32 additions).
            assert torch.allclose(trainer.compute_loss(trainer.model, doubled), 2 * loss, rtol=1e-5)
    assert loss != 0
    assert torch.equal(loss, without_vllm) != correction
