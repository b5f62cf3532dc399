"""A 2-process scenario (tests/dist_suite.py), ``run(folder)``: each rank works in
folder/rank<R> (a node-local disk each): rank 0's out/ holds a complete checkpoint-2, rank 1's
holds a complete checkpoint-1 and what a node other than the first gets of checkpoint-2 without --save_on_each_node
(its RNG file). Every rank must resolve `--resume_from_checkpoint true` to the same out/checkpoint-2 and then stop
with one message naming rank 1 and the fix; a crash of the main process's decision must reach rank 1 as an error.
Rank 0 writes every rank's outcomes to folder/outcomes.json.
"""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from accelerate import PartialState
from accelerate.utils import gather_object

from grpo_family.runtime.run_folder import LAYOUT_SETTINGS, check_resume, decided_on_main, resolve_checkpoint, run_settings
from grpo_family.runtime.run_folder import COMPLETE_MARKER


def complete_checkpoint(folder: Path, args) -> None:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": int(folder.name.split("-")[1])}))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "grpo_family_run.json").write_text(json.dumps(run_settings(args, "grpo", 2)))
    (folder / COMPLETE_MARKER).write_text("done\n")


def outcome(decide) -> str:
    try:
        return f"value {decide()}"
    except Exception as error:  # noqa: BLE001 - reported to the test
        return f"{type(error).__name__}: {error}"


def crash():
    raise KeyError("a bug in the decision")


def run(out_dir):
    state = PartialState(cpu=True)
    assert state.num_processes == 2 and torch.distributed.is_initialized()
    node = Path(out_dir, f"rank{state.process_index}")
    node.mkdir(parents=True)
    os.chdir(node)  # tests/dist/suite.py returns to its own folder after the scenario
    args = SimpleNamespace(**dict.fromkeys(LAYOUT_SETTINGS, 1), max_steps=4, num_train_epochs=1.0)
    if state.process_index == 0:
        complete_checkpoint(Path("out/checkpoint-2"), args)
    else:
        complete_checkpoint(Path("out/checkpoint-1"), args)
        Path("out/checkpoint-2").mkdir()
        Path("out/checkpoint-2/rng_state_1.pth").write_bytes(b"rng")
    resolved = outcome(lambda: resolve_checkpoint(True, "out"))
    checked = outcome(lambda: check_resume("out/checkpoint-2", args, "grpo", 2))
    crashed = outcome(lambda: decided_on_main(crash))
    results = gather_object([{"resolved": resolved, "checked": checked, "crashed": crashed}])
    if state.is_main_process:
        Path(out_dir, "outcomes.json").write_text(json.dumps(results))
