"""A 2-process scenario (tests/dist_suite.py), ``run(out, model_dir)``: trains CW-GRPO twice, with the
weights made in the advantage hook (extra forward) and in the loss (the loss's own log-probs), and records on
every rank the gathered rollout log-probs, mask and GRPO advantages the weights were computed from, the weights,
and this rank's per-token advantages, for the test to recompute single-process."""

import torch
from transformers import PreTrainedTokenizerFast

from grpo_family.tasks import make_arithmetic_dataset
from grpo_family.trainers.cw_grpo import CWGRPOConfig, CWGRPOTrainer
from conftest import digit_share_reward, tiny_config_kwargs


class Recording(CWGRPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []

    def _covariance_weights(self, logps, advantages, mask, num_generations):
        weights = super()._covariance_weights(logps, advantages, mask, num_generations)
        self.records.append({"logps": logps, "advantages": advantages, "mask": mask, "weights": weights})
        return weights

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if "cw_grpo/row" not in out:  # weights made in the hook
            self.records[-1]["local"] = out["advantages"].clone()  # before TRL shuffles the rows
        return out

    def _compute_loss(self, model, inputs):
        rows = inputs.get("cw_grpo/row")  # weights made in the loss: rows shuffled, tagged with their global index
        loss = super()._compute_loss(model, inputs)  # removes the tags once the advantages are weighted
        if rows is not None:
            self.records[-1]["loss_rows"] = rows.clone()
            self.records[-1]["loss_advantages"] = inputs["advantages"].clone()
        return loss


def run(out_dir, model_dir):
    records = {}
    for reuse in (False, True):
        # 6 completions per process, groups of 4: the middle group straddles the two processes. Completions of
        # different lengths on the two processes exercise the padding to a common width.
        kwargs = tiny_config_kwargs(
            out_dir, per_device_train_batch_size=6, num_generations=4, max_steps=2, max_completion_length=16
        )
        trainer = Recording(
            model=model_dir,
            reward_funcs=[digit_share_reward],
            args=CWGRPOConfig(**kwargs, cw_reuse_loss_logps=reuse),
            train_dataset=make_arithmetic_dataset("train", 32, seed=0),
            processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),  # not AutoTokenizer's Qwen2Tokenizer
        )
        trainer.train()
        records["loss" if reuse else "hook"] = trainer.records
    torch.save(records, f"{out_dir}/rank{trainer.accelerator.process_index}.pt")
