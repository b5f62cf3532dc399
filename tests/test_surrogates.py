"""The surrogate seam (grpo_family/algorithms/surrogates.py, trainers/surrogate_stage.py): TRL's own objective,
registered as ``clipped_ratio`` and run through the seam, gives TRL's loss and gradient; registration refuses a
duplicate name. Tolerance: the seam adds the same per-token values in another order (TRL's objective is 0 there and
the surrogate's loss is aggregated apart): float32 sums of at most ``T`` terms per row and ``B`` rows, so
``(T + B + 4) u`` times the largest per-row magnitude (``u = 2^-24``)."""

from __future__ import annotations

import pytest
import torch
from conftest import digit_share_reward

from grpo_family import GRPOFamilyConfig, GRPOFamilyTrainer
from grpo_family.algorithms.surrogates import clipped_ratio_surrogate, get_surrogate, register_surrogate

U = 2.0**-24


def test_a_second_function_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_surrogate("clipped_ratio")(lambda *args, **kwargs: None)
    register_surrogate("clipped_ratio")(clipped_ratio_surrogate)  # the same function again: fine
    assert get_surrogate("clipped_ratio").function is clipped_ratio_surrogate
    with pytest.raises(ValueError, match="Unknown surrogate 'nope'"):
        get_surrogate("nope")
    with pytest.raises(ValueError, match="unknown loss types"):
        register_surrogate("x", loss_types=("nope",))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_trls_objective_through_the_seam_is_trls_loss(tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs,
                                                      loss_type):  # fmt: skip
    captured = {}

    class Capturing(GRPOFamilyTrainer):
        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if kwargs.get("compute_entropy"):
                captured["logps"] = out[0]
            return out

    class ThroughTheSeam(Capturing):
        surrogate = "clipped_ratio"

    config = GRPOFamilyConfig(**config_kwargs(loss_type=loss_type, gradient_accumulation_steps=2))
    trainers = [
        cls(model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train,
            processing_class=tiny_tokenizer)
        for cls in (Capturing, ThroughTheSeam)
    ]  # fmt: skip
    g = torch.Generator().manual_seed(0)
    rows, width = 8, 6
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[::2, 4:] = 0
    inputs = {
        "prompt_ids": torch.randint(0, 100, (rows, 4), generator=g), "prompt_mask": torch.ones(rows, 4, dtype=torch.long),
        "completion_ids": torch.randint(0, 100, (rows, width), generator=g), "completion_mask": mask,
        "advantages": torch.randn(rows, generator=g), "num_items_in_batch": mask.sum() * 2,
    }  # fmt: skip
    results = []
    for trainer in trainers:
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 2
        if "old_per_token_logps" not in inputs:
            with torch.no_grad():
                logps, _ = trainer.policy_forward(trainer.model, trainer.micro_batch(dict(inputs)))
            inputs["old_per_token_logps"] = logps + 0.3 * torch.randn(rows, width, generator=g)
        loss = trainer.compute_loss(trainer.model, dict(inputs))
        (grad,) = torch.autograd.grad(loss, captured["logps"])
        results.append((loss.item(), grad, trainer._metrics["train"]))
    (expected, grad_expected, trl_metrics), (got, grad_got, seam_metrics) = results
    # |per-token loss| <= max|A| * max ratio (the clip only lowers it); halved by the accumulation
    ratio = torch.exp((captured["logps"].detach() - inputs["old_per_token_logps"]).abs().max())
    scale = float(inputs["advantages"].abs().max() * ratio) / 2
    assert abs(got - expected) <= (width + rows + 4) * U * scale
    assert float((grad_got - grad_expected).abs().max()) <= (width + 4) * U * float(grad_expected.abs().max())
    assert trl_metrics["clip_ratio/region_mean"][0] > 0  # the clip was in play
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/high_max"):
        # tol: each metric is a float32 mean of 0/1 flags, gathered and averaged in two orders: a few ULP (2^-23).
        assert seam_metrics[key] == pytest.approx(trl_metrics[key], rel=1e-6), key
