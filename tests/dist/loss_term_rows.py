"""A method with a registered loss term on 2 processes: what every loss call's term saw and gave back, per rank.

A 2-process scenario (tests/dist_suite.py), ``run(out, method, model_dir, overrides)``; tests call
:func:`loss_term_calls` on its output, which puts the two ranks' rows of each loss call together (rank-major, widths
padded), as the term's gathered input."""

from __future__ import annotations

from pathlib import Path

import torch


def loss_term_calls(out_dir: Path) -> list[dict]:
    """From the scenario's output, per loss call: ``union`` = (logps, old_logps, advantages, mask, extra_loss, advantages_out) of both ranks'
    rows, ``per_rank`` = each rank's own (logps, advantages, mask) padded to the union's width, and the call's
    ``micro_step`` / ``global_step``."""
    ranks = [torch.load(out_dir / f"rank{r}.pt") for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) > 0
    calls = []
    for records in zip(*ranks):
        width = max(r["logps"].size(1) for r in records)

        def pad(t, width=width):
            return torch.nn.functional.pad(t, (0, width - t.size(1))) if t is not None and t.dim() == 2 else t

        def union(key):
            parts = [pad(r[key]) for r in records]
            return None if parts[0] is None else torch.cat(parts)

        keys = ("logps", "old_logps", "advantages", "mask", "extra", "advantages_out")
        per_rank = [(pad(r["logps"]), r["advantages"], pad(r["mask"])) for r in records]
        assert records[0]["micro_step"] == records[1]["micro_step"]
        calls.append({"union": tuple(union(k) for k in keys), "per_rank": per_rank, **{
            k: records[0][k] for k in ("micro_step", "global_step")}})  # fmt: skip
    return calls


def run(out_dir, method, model_dir, overrides=None):
    from conftest import digit_share_reward, tiny_config_kwargs
    from transformers import PreTrainedTokenizerFast

    from grpo_family import METHODS
    from grpo_family.tasks import make_arithmetic_dataset

    overrides = overrides or {}
    config_cls, trainer_cls = METHODS[method]

    class Recording(trainer_cls):
        calls: list = []

        def _apply_loss_term(self, call):
            old = call.old_logps if call.old_logps is not None else call.logps
            record = {
                "logps": call.logps.detach().clone(), "old_logps": old.detach().clone(),
                "advantages": call.advantages.detach().clone(), "mask": call.loss_mask.bool().clone(),
                "micro_step": call.micro_step, "global_step": call.global_step,
            }  # fmt: skip
            super()._apply_loss_term(call)
            record["extra"] = None if call.extra_loss is None else call.extra_loss.detach().clone()
            record["advantages_out"] = call.advantages.detach().clone()
            self.calls.append(record)

    # 6 completions per process, groups of 4: the middle group straddles the two processes.
    kwargs = tiny_config_kwargs(out_dir, per_device_train_batch_size=6, num_generations=4, max_steps=2)
    trainer = Recording(
        model=model_dir,
        reward_funcs=[digit_share_reward],
        args=config_cls(**{**kwargs, "max_completion_length": 12, **overrides}),
        train_dataset=make_arithmetic_dataset("train", 32, seed=0),
        processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
    )
    trainer.train()
    torch.save(trainer.calls, f"{out_dir}/rank{trainer.accelerator.process_index}.pt")
