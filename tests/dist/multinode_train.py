"""Run by tests/test_multinode.py under two `accelerate launch --num_machines 2` launchers (one process per "node",
each launcher's working directory standing for that node's local disk, each node with its own fresh
``$GRPO_FAMILY_CACHE``), or under one 2-process launcher as the single-node reference:

    multinode_train.py SHARED_DIR TESTS_DIR RESULT_JSON LAYOUTS [METHOD ...]

For every METHOD (default: all of METHODS), in every layout of the comma-separated LAYOUTS ("node-local": a relative ``output_dir`` with
``save_on_each_node``, so each node writes and reads its own disk; "shared": ``output_dir`` under SHARED_DIR), run A
trains 3 steps and saves ``checkpoint-2``; run B, a new trainer, resumes from it and trains step 3. Rank 0 writes
RESULT_JSON: per layout and method, a digest of A's and B's final weights and whether every node held checkpoint-2.
Layout "reference" is "shared" with run A only (the single-node reference); layout "kill" trains the first METHOD
and kills node 1's process (SIGKILL) as step 2 begins; layout "fail" trains it and raises in node 1's process as
step 2 begins, which then stays alive until SHARED_DIR/release exists. The model is the bundled tiny model's warm start (2 steps), built by each node into its own cache.
"""

import hashlib
import json
import os
import signal
import sys
import time

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import AutoModelForCausalLM, TrainerCallback

from grpo_family import METHODS
from grpo_family.tasks import make_arithmetic_dataset
from grpo_family.tasks.tiny_model import load_warm_start, warm_start_dir

sys.path.insert(0, sys.argv[2])  # tests/ (conftest, method_cases)
from conftest import tiny_config_kwargs  # noqa: E402
from method_cases import case  # noqa: E402


def digest(model) -> str:
    sha = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        sha.update(name.encode() + tensor.detach().to(torch.float32).numpy().tobytes())
    return sha.hexdigest()


class KillNode1(TrainerCallback):
    """Node 1's process dies at the start of step 2, as a machine that loses power would."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1 and PartialState().process_index == 1:
            print("node 1: killed at step 2", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class FailOnNode1(TrainerCallback):
    """Node 1's process raises as step 2 begins, as a bug in its own code would."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1 and PartialState().process_index == 1:
            raise RuntimeError("node 1: a bug at step 2")


def train(method, model_dir, tokenizer, output_dir, checkpoint=None, callbacks=None, **overrides) -> str:
    config_cls, trainer_cls = METHODS[method]
    cases = case(method)
    # 4 completions per process per step, 2 processes: 2 prompts a step, 2 steps an epoch (as tests/test_resume.py)
    settings = dict(max_steps=3, save_strategy="steps", save_steps=2, per_device_train_batch_size=4)
    trainer = trainer_cls(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=list(cases.resume_rewards or cases.rewards),
        args=config_cls(**tiny_config_kwargs(output_dir, **{**settings, **cases.resume_options, **overrides})),
        train_dataset=make_arithmetic_dataset("train", 64, seed=0).select(range(4)),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=checkpoint)
    return digest(trainer.model)


def main():
    shared_dir, _, result_path, layouts, *methods = sys.argv[1:]
    state = PartialState()
    _, tokenizer = load_warm_start(num_steps=2)  # built by this node's first process into its own cache
    model_dir = warm_start_dir(0, None, {"num_steps": 2})
    results = {}
    if layouts == "fail":
        try:
            train(methods[0], model_dir, tokenizer, "out/failed", callbacks=[FailOnNode1()], save_strategy="no")
        except RuntimeError as error:
            print(f"node 1: raised {error}", flush=True)
            # Alive with its sockets open, as a process whose launcher catches the error: no backend tells node 0.
            released = os.path.join(shared_dir, "release")
            for _ in range(600):
                if os.path.exists(released):
                    break
                time.sleep(0.5)
            os._exit(3)
        raise SystemExit("node 0 trained past the step at which node 1 failed")
    if layouts == "kill":
        train(methods[0], model_dir, tokenizer, "out/killed", callbacks=[KillNode1()], save_strategy="no")
        raise SystemExit("node 0 trained past the step at which node 1 was killed")
    for layout in layouts.split(","):
        for method in methods or list(METHODS):
            root = os.path.join("out" if layout == "node-local" else shared_dir, method)
            options = {"save_on_each_node": layout == "node-local"}
            full = train(method, model_dir, tokenizer, root, **options)
            has_checkpoint = gather_object([os.path.isfile(f"{root}/checkpoint-2/trainer_state.json")])
            if layout == "reference":
                results.setdefault(layout, {})[method] = {"full": full}
                continue
            at_checkpoint = digest(AutoModelForCausalLM.from_pretrained(f"{root}/checkpoint-2"))
            resumed = train(method, model_dir, tokenizer, root + "-resumed", f"{root}/checkpoint-2", **options)
            results.setdefault(layout, {})[method] = {
                "full": full, "resumed": resumed, "at_checkpoint": at_checkpoint,
                "checkpoint_on_every_node": all(has_checkpoint),
            }  # fmt: skip
            if state.is_main_process:
                print(f"{layout} {method}: {results[layout][method]}", flush=True)
    if state.is_main_process:
        with open(result_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
    PartialState().destroy_process_group()  # gloo's worker threads stop while the interpreter lives: exiting with the group alive can abort (SIGABRT)
