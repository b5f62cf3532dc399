"""A 2-process scenario (tests/dist_suite.py), ``run(out, model_dir, problem, answer, solution)``: an SGPO run where every rank
records the judge requests it made, the gathered base and trained rewards, and its own completions, for the test
to check that the judge is asked once per completion (on the main process only) and that both ranks agree. The reward
marks every completion wrong, so every group is all-negative and judged, whatever the policy samples."""

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast

from grpo_family.rewards.extract import completion_text
from grpo_family.judges import ProgrammaticJudge
from grpo_family.trainers.sgpo import SGPOConfig, SGPOTrainer
from conftest import tiny_config_kwargs


def never_correct(completions, **kwargs):
    return [0.0] * len(completions)


class CountingJudge(ProgrammaticJudge):
    def __init__(self):
        super().__init__()
        self.calls = []

    def judge(self, requests):
        self.calls.append([list(r.steps) for r in requests])
        return super().judge(requests)


class Recording(SGPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []

    def transform_rewards(self, batch):
        self.base = batch.rewards.clone()
        super().transform_rewards(batch)

    def compute_advantages(self, batch):
        advantages = super().compute_advantages(batch)
        self.records.append(
            {
                "base": self.base,
                "trained": batch.rewards.clone(),
                "advantages": advantages.clone(),
                "texts": [completion_text(c) for c in batch.completions],
                "judge_calls": len(self.judge.calls),
            }
        )
        return advantages


def run(out_dir, model_dir, problem, answer, solution):
    prompt = [{"role": "user", "content": problem}]
    data = Dataset.from_dict({"prompt": [prompt] * 32, "answer": [answer] * 32, "solution": [solution] * 32})
    # 6 completions per process, groups of 4: the middle group straddles the two processes.
    config = SGPOConfig(
        **tiny_config_kwargs(
            out_dir,
            per_device_train_batch_size=6,
            num_generations=4,
            max_steps=2,
            max_completion_length=32,
            learning_rate=1e-5,  # the second batch still samples the memorised mixture
        )
    )
    trainer = Recording(
        model=model_dir,
        reward_funcs=[never_correct],
        args=config,
        train_dataset=data,
        processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),  # not AutoTokenizer's Qwen2Tokenizer
        judge=CountingJudge(),
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save({"records": trainer.records, "calls": trainer.judge.calls}, f"{out_dir}/rank{rank}.pt")
