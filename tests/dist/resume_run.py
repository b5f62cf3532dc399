"""Run under `accelerate launch --config_file accelerate_configs/cpu_2proc.yaml`:

    resume_run.py METHOD MODEL_DIR OUT_DIR TESTS_DIR JSON_CONFIG [CHECKPOINT]

Trains METHOD on the first 4 bundled arithmetic problems with the JSON config (tiny_config_kwargs overrides), from
scratch or resumed from CHECKPOINT, and saves rank 0's final weights and per-step logs to OUT_DIR/result.pt.
"""

import json
import sys

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from grpo_family import METHODS
from grpo_family.tasks import make_arithmetic_dataset

sys.path.insert(0, sys.argv[4])  # tests/ (for conftest helpers)
from conftest import digit_share_reward, tiny_config_kwargs  # noqa: E402


def main():
    method, model_dir, out_dir = sys.argv[1:4]
    overrides = json.loads(sys.argv[5])
    checkpoint = sys.argv[6] if len(sys.argv) > 6 else None
    config_cls, trainer_cls = METHODS[method]
    trainer = trainer_cls(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[digit_share_reward],
        args=config_cls(**tiny_config_kwargs(out_dir, **overrides)),
        train_dataset=make_arithmetic_dataset("train", 64, seed=0).select(range(4)),
        processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
    )
    trainer.train(resume_from_checkpoint=checkpoint)
    if trainer.accelerator.is_main_process:
        logs = {e["step"]: e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e}
        weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        torch.save({"weights": weights, "logs": logs}, f"{out_dir}/result.pt")


if __name__ == "__main__":
    main()
    PartialState().destroy_process_group()  # gloo's worker threads stop while the interpreter lives: exiting with the group alive can abort (SIGABRT)
