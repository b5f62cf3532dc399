"""A 2-process scenario (tests/dist_suite.py), ``run(out, model_dir)``, or, in the vLLM lane's environment
(tests/test_eval_vllm.py), one process with a colocated vLLM engine:

    python eval_callback.py MODEL_DIR OUT_DIR TESTS_DIR vllm

Trains grpo for 2 steps with an EvaluationCallback (greedy and 4 samples per held-out problem) evaluating before
training and at every step, and saves every rank's evaluation history and the problems it generated at the last
evaluation, for the test to compare across ranks and with a single-process evaluation.
"""

import json
import sys
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from grpo_family import METHODS
from grpo_family.eval import EvalData, EvaluationCallback
from grpo_family.tasks import arithmetic_reward, make_arithmetic_dataset

# tests/ (for the conftest helpers), found from this file: the test also imports this module, under pytest's own argv
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import digit_share_reward, tiny_config_kwargs  # noqa: E402

HELD_OUT = 12
SETTINGS = dict(every=1, max_new_tokens=40, num_samples=4, temperature=1.0, ks=[1, 4], seed=5)


def run(out_dir, model_dir, vllm=False):
    engine = {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 128} if vllm else {}
    config_cls, trainer_cls = METHODS["grpo"]
    held_out = EvalData.held_out(make_arithmetic_dataset("eval", HELD_OUT, seed=0), arithmetic_reward)
    callback = EvaluationCallback(held_out, arithmetic_reward, **SETTINGS)
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=[digit_share_reward],
        args=config_cls(
            **tiny_config_kwargs(
                out_dir, per_device_train_batch_size=4, num_generations=4, max_steps=2, learning_rate=5e-3, **engine
            )
        ),
        train_dataset=make_arithmetic_dataset("train", 32, seed=0),
        processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
        callbacks=[callback],
    )
    callback.bind(trainer)
    callback.initial = callback.evaluate()
    trainer.train()
    with open(f"{out_dir}/rank{trainer.accelerator.process_index}.json", "w") as f:
        history = {str(step): metrics for step, metrics in callback.history.items()}
        json.dump({"history": history, "generated": callback.generated, "backend": callback.backend_name,
                   "last_loaded_step": getattr(trainer, "_last_loaded_step", None)}, f)  # fmt: skip


if __name__ == "__main__":
    run(sys.argv[2], sys.argv[1], vllm=sys.argv[4:5] == ["vllm"])
