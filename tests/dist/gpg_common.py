"""Shared by tests/test_gpg_trainer.py and the 2-process script tests/dist/gpg_grads.py: test rewards, a GPG trainer
that records what it trained on and the gradients the optimizer received, and an independent float64
single-process recomputation of those gradients from the recorded tensors (plain forward pass + the tested maths
of ``grpo_family.algorithms.gpg``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from grpo_family.algorithms.gpg import gpg_advantages, gpg_alpha, gpg_loss
from grpo_family.tasks import make_arithmetic_dataset
from grpo_family.trainers.gpg import GPGTrainer

RECORDED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "gpg/row_weights")


def flat_or_dense_reward(completions, completion_ids, flat, **kwargs):
    """1.0 for every completion of a prompt marked ``flat`` (its group is degenerate); otherwise a value of the
    token ids that differs between completions, so the other groups are informative."""
    return [1.0 if f else (sum(ids) % 97) / 97 for ids, f in zip(completion_ids, flat)]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def flagged_dataset(num_rows: int, flat: callable):
    """The bundled arithmetic task with a ``flat`` column: ``flat(i)`` for row ``i``."""
    dataset = make_arithmetic_dataset("train", num_rows, seed=0)
    return dataset.add_column("flat", [bool(flat(i)) for i in range(num_rows)])


class RecordingGPG(GPGTrainer):
    """Keeps every generation batch it trained on (before TRL shuffles it) and each optimizer step's gradients."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records, self.grads = [], []

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            record = {k: out[k].detach().cpu().clone() for k in RECORDED}
            record["rewards"] = self._gpg_step_rewards.detach().cpu().clone()
            record["alpha"] = float(out["gpg/alpha"][0])
            self.records.append(record)
        return out

    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        names = {id(p): n for n, p in self.model.named_parameters()}

        def record(opt, *_):  # runs after backward, the DDP all-reduce and clipping: what the optimizer gets
            grads = {names[id(p)]: p.grad.detach().cpu().clone() for g in opt.param_groups for p in g["params"]}
            self.grads.append(grads)

        optimizer.register_step_pre_hook(record)
        return optimizer


def completion_logps(model, record) -> torch.Tensor:
    """Per-token log-probabilities of the recorded completions under ``model`` (a plain forward pass)."""
    ids = torch.cat([record["prompt_ids"], record["completion_ids"]], dim=1)
    attention = torch.cat([record["prompt_mask"], record["completion_mask"]], dim=1)
    width = record["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1]
    return logits.log_softmax(-1).gather(-1, record["completion_ids"].unsqueeze(-1)).squeeze(-1)


def reference_step(
    model_dir: str,
    records: list[dict],
    num_generations: int,
    *,
    normalization="group",
    f_norm="none",
    tol=0.0,
    max_alpha=None,
    use_alpha=True,
):
    """Single-process full-batch GPG on the rows of ``records`` (one per process, in process order), float64.

    Returns ``(loss without alpha, alpha, advantages, {name: gradient of alpha * loss})``. Each process's rows are
    scored with that process's own padding (as it trained on them); the rows are then joined into one batch.
    ``f_norm``, ``tol``, ``max_alpha`` and ``use_alpha`` mirror the config's ``scale_rewards``, ``degenerate_tol``,
    ``max_alpha`` and ``use_alpha``.
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    model.train()
    logps, masks = [], []
    width = max(r["completion_ids"].size(1) for r in records)
    for record in records:
        pad = width - record["completion_ids"].size(1)
        logps.append(F.pad(completion_logps(model, record), (0, pad)))
        masks.append(F.pad(record["completion_mask"], (0, pad)))
    rewards = records[0]["rewards"]
    advantages = gpg_advantages(rewards, f_norm=f_norm, tol=tol).reshape(-1).double()
    alpha = gpg_alpha(rewards, tol=tol, max_alpha=max_alpha) if use_alpha else 1.0
    loss = gpg_loss(torch.cat(logps), advantages, torch.cat(masks), num_generations, normalization=normalization)
    (alpha * loss).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.item(), alpha, advantages, grads
