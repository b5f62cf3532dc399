"""A 2-process scenario (tests/dist_suite.py), ``run(out)``: the tiny model's warm start built into an empty
``out/warm-start`` by global rank 1 (rank 0 waits at a barrier until rank 1 has built and loaded it, so rank 1 holds
the cache lock), then loaded by rank 0. Each rank's outcome (an error, or a digest of the weights it loaded) is
gathered; rank 0 writes them to ``out/outcomes.json`` ([rank 0's, rank 1's]).
"""

import hashlib
import json

import torch
from accelerate import PartialState
from accelerate.utils import gather_object

from grpo_family.tasks.tiny_model import load_warm_start


def outcome(cache_dir: str) -> str:
    try:
        model, _ = load_warm_start(cache_dir, num_steps=2)
    except Exception as error:  # noqa: BLE001 - the test reports whatever the build or load raised
        return f"error: {type(error).__name__}: {str(error)[:300]}"
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().to(torch.float32).numpy().tobytes())
    return f"loaded {digest.hexdigest()}"


def run(out_dir):
    cache_dir = f"{out_dir}/warm-start"
    state = PartialState(cpu=True)  # MULTI_CPU over gloo, as the training arguments' use_cpu selects
    assert state.num_processes == 2 and torch.distributed.is_initialized()
    results = [outcome(cache_dir)] if state.process_index == 1 else []
    state.wait_for_everyone()
    if state.process_index == 0:
        results = [outcome(cache_dir)]
    results = gather_object(results)  # [rank 0's, rank 1's]
    if state.is_main_process:
        with open(f"{out_dir}/outcomes.json", "w") as f:
            json.dump(results, f)
