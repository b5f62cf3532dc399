"""Run by tests/dist_suite.py under `accelerate launch --config_file accelerate_configs/cpu_2proc.yaml`:

    suite.py SPEC_JSON

Runs the scenarios listed in SPEC_JSON one after the other in these 2 processes: for each, ``run(out, *args,
**kwargs)`` of ``tests/dist/<module>.py``, which writes what its test reads into its own folder ``out``. The process
group is created once and shared; every scenario starts from the state the first one started from (torch's, Python's
and NumPy's random generators, the environment, the working directory, torch's thread count and default dtype), and
its trainers are freed before the next one starts.

A scenario that raises writes its traceback to ``out/error_rank<r>.txt`` and ends the launch (the other rank may be
waiting in a collective the failed one will never join): tests/dist_suite.py runs the scenarios not started yet in a
new launch. ``out/started_rank<r>`` marks a scenario begun, ``out/done`` one that both ranks finished.
"""

import gc
import importlib
import json
import os
import random
import sys
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "dist")]  # the scenarios' modules, conftest's helpers

import numpy as np  # noqa: E402
import torch  # noqa: E402
from accelerate import PartialState  # noqa: E402


def snapshot() -> dict:
    return {
        "torch": torch.get_rng_state(), "random": random.getstate(), "numpy": np.random.get_state(),
        "environ": dict(os.environ), "cwd": os.getcwd(), "threads": torch.get_num_threads(),
        "dtype": torch.get_default_dtype(),
    }  # fmt: skip


def restore(start: dict) -> None:
    torch.set_rng_state(start["torch"])
    random.setstate(start["random"])
    np.random.set_state(start["numpy"])
    os.environ.clear()
    os.environ.update(start["environ"])
    os.chdir(start["cwd"])
    torch.set_num_threads(start["threads"])
    torch.set_default_dtype(start["dtype"])


def main():
    scenarios = json.loads(Path(sys.argv[1]).read_text())
    state = PartialState(cpu=True)  # MULTI_CPU over gloo, as the training arguments' use_cpu selects
    assert state.num_processes == 2 and torch.distributed.is_initialized()
    rank = state.process_index
    start = snapshot()
    for spec in scenarios:
        out = Path(spec["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"started_rank{rank}").touch()
        print(f"rank {rank}: scenario {out.name}", flush=True)
        restore(start)
        try:
            importlib.import_module(spec["module"]).run(out, *spec["args"], **spec["kwargs"])
        except BaseException:  # noqa: BLE001 - the scenario's test reports it
            (out / f"error_rank{rank}.txt").write_text(traceback.format_exc())
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)  # torchrun then stops the other rank, wherever it waits
        restore(start)
        gc.collect()  # the scenario's trainers and models
        state.wait_for_everyone()
        if state.is_main_process:
            (out / "done").touch()


if __name__ == "__main__":
    main()
    PartialState().destroy_process_group()  # gloo's worker threads stop while the interpreter lives: exiting with the group alive can abort (SIGABRT)
