"""Peak GPU memory per training process for a recipe: a back-of-envelope estimator (issue 23, "layouts that fit").

    python benchmarks/memory.py                      # every recipe in examples/recipes/, a markdown table
    python benchmarks/memory.py examples/recipes/d3s_qwen2.5_math_7b.yaml

The estimate (GB = 1e9 bytes) is the sum of

* **weights**: bf16, 2 bytes/param, sharded over the processes under ZeRO-3; a **reference model** of the same size
  when ``beta != 0`` (TRL builds one), sharded the same way;
* **gradients**: bf16, 2 bytes/param, sharded under ZeRO-2/3;
* **optimizer states**: AdamW. Under DeepSpeed ZeRO (bf16) an fp32 master copy and two fp32 moments, 12 bytes/param,
  sharded over the processes; without DeepSpeed (single GPU, DDP) the two moments in the parameters' dtype
  (bf16: 4 bytes/param), not sharded;
* **activations** with gradient checkpointing: each layer's input hidden state kept (tokens x hidden x 2 bytes x
  layers) plus one layer recomputed in full during the backward (~34 bytes per token and hidden unit, Korthikanti
  et al. 2022 with flash attention); without checkpointing every layer's full set;
* **logits** of the per-device micro-batch over the completion tokens (TRL keeps only those): the policy's loss pass
  holds the bf16 logits, their temperature-scaled copy and the gradient (3 x 2 bytes per element); the no-grad
  old/reference (and D3S entropy) passes hold 2 x 2 bytes. They do not coexist, so the peak counts the larger;
* **vLLM colocated**: ``vllm_gpu_memory_utilization`` (TRL's default 0.3) of the GPU, reserved for weights and KV
  cache; with ``vllm_enable_sleep_mode`` the engine sleeps while the policy trains, so the peak is the larger of
  training without it and the resident state plus it; a vLLM *server* runs on other GPUs and costs the training
  GPUs nothing;
* **overhead**: 2 GB of CUDA context, NCCL buffers and allocator fragmentation.

A layout *fits* when the estimate leaves at least ``MARGIN`` (15 %) of the GPU free. The hardware and layout each
recipe states in its header (process count, ZeRO stage, GPU memory) are read from its ``# Memory layout:`` line
(:func:`layout_of`); the model sizes in
``MODELS`` (from each model's ``config.json``: hidden size, layers, vocabulary; parameters from the model card).
The prompt length is ``max_prompt_length`` when a recipe sets it, else ``PROMPT_TOKENS``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9
MARGIN = 0.15
OVERHEAD_GB = 2.0
PROMPT_TOKENS = 512  # MATH / DAPO / AIME / GSM8K questions with the system prompt stay under this
VLLM_DEFAULT_SHARE = 0.3  # TRL's vllm_gpu_memory_utilization default
ACT_BYTES_PER_TOKEN_HIDDEN = 34  # one transformer layer's activations, bf16, flash attention


@dataclass(frozen=True)
class Model:
    params: float
    hidden: int
    layers: int
    vocab: int


MODELS = {
    "Qwen/Qwen2.5-Math-7B": Model(7.62e9, 3584, 28, 152064),
    "Qwen/Qwen2.5-Math-7B-Instruct": Model(7.62e9, 3584, 28, 152064),
    "Qwen/Qwen2.5-Math-1.5B": Model(1.54e9, 1536, 28, 151936),
    "Qwen/Qwen2.5-0.5B-Instruct": Model(0.494e9, 896, 24, 151936),
    "Qwen/Qwen2.5-7B": Model(7.62e9, 3584, 28, 152064),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": Model(1.78e9, 1536, 28, 151936),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": Model(7.62e9, 3584, 28, 152064),
}


@dataclass(frozen=True)
class Layout:
    hardware: str  # as the recipe states it
    gpu_gb: float
    processes: int  # training processes
    zero: int  # 0: single GPU or DDP; 2 or 3: DeepSpeed ZeRO stage


# The line a recipe states its memory layout in, among its header comments: the hardware as written for people, then
# what the estimate needs. "none" for a recipe that runs on a CPU (no estimate).
LAYOUT_LINE = re.compile(
    r"^# Memory layout: (?:(?P<none>none)\b.*|(?P<hardware>.+); (?P<gpu_gb>\d+(?:\.\d+)?) GB per GPU, "
    r"(?P<processes>\d+) training process(?:es)?, (?:ZeRO-(?P<zero>[23])|no ZeRO))$",
)
LAYOUT_FORMAT = (
    "'# Memory layout: <hardware as stated>; <N> GB per GPU, <P> training processes, ZeRO-<2|3> (or: no ZeRO)', or "
    "'# Memory layout: none (runs on a CPU)'"
)


def layout_of(path: Path) -> Layout | None:
    """The layout ``path``'s header states (its ``# Memory layout:`` line); None for a CPU recipe. A recipe without
    the line, or with a line out of format, is an error that shows the format."""
    stated = [line for line in path.read_text().splitlines() if line.startswith("# Memory layout:")]
    if len(stated) != 1:
        raise KeyError(
            f"{path.name}: {len(stated)} '# Memory layout:' lines in its header; state one: {LAYOUT_FORMAT}"
        )
    match = LAYOUT_LINE.fullmatch(stated[0])
    if match is None:
        raise KeyError(f"{path.name}: {stated[0]!r} is not in the format {LAYOUT_FORMAT}")
    if match["none"]:
        return None
    return Layout(match["hardware"], float(match["gpu_gb"]), int(match["processes"]), int(match["zero"] or 0))


def weights_gb(params: float, bytes_per_param: float = 2, shards: int = 1) -> float:
    return params * bytes_per_param / shards / GB


def optimizer_gb(params: float, zero: int, processes: int) -> float:
    """AdamW: fp32 master + 2 fp32 moments (12 B/param) sharded under ZeRO; 2 bf16 moments (4 B/param) without."""
    return params * 12 / processes / GB if zero >= 1 else params * 4 / GB


def logits_gb(tokens: int, vocab: int, bytes_per_element: float = 2) -> float:
    return tokens * vocab * bytes_per_element / GB


def activations_gb(tokens: int, model: Model, checkpointing: bool = True) -> float:
    layer = tokens * model.hidden * ACT_BYTES_PER_TOKEN_HIDDEN
    if not checkpointing:
        return layer * model.layers / GB
    return (tokens * model.hidden * 2 * model.layers + layer) / GB


def estimate(recipe: dict, layout: Layout) -> dict[str, float]:
    """Peak memory per training GPU, GB, by part; ``total`` is their sum (the larger of the two logit passes)."""
    model = MODELS[recipe["model_name_or_path"]]
    n, zero = layout.processes, layout.zero
    rows = recipe.get("per_device_train_batch_size", 8)
    completion = recipe.get("max_completion_length", 512)
    prompt = recipe.get("max_prompt_length") or PROMPT_TOKENS
    parts = {
        "weights": weights_gb(model.params, shards=n if zero == 3 else 1),
        "reference": weights_gb(model.params, shards=n if zero == 3 else 1) if recipe.get("beta", 0.0) else 0.0,
        "gradients": weights_gb(model.params, shards=n if zero >= 2 else 1),
        "optimizer": optimizer_gb(model.params, zero, n),
        "activations": activations_gb(
            rows * (prompt + completion), model, recipe.get("gradient_checkpointing", False)
        ),
        "logits_loss": logits_gb(rows * completion, model.vocab, 3 * 2),
        "logits_no_grad": logits_gb(rows * completion, model.vocab, 2 * 2),
        "vllm": layout.gpu_gb * recipe.get("vllm_gpu_memory_utilization", VLLM_DEFAULT_SHARE)
        if recipe.get("use_vllm") and recipe.get("vllm_mode", "colocate") == "colocate"
        else 0.0,
        "overhead": OVERHEAD_GB,
    }
    parts["total"] = sum(v for k, v in parts.items() if k != "logits_no_grad") + max(
        0.0, parts["logits_no_grad"] - parts["logits_loss"]
    )
    if recipe.get("vllm_enable_sleep_mode") and parts["vllm"]:
        # TRL puts the engine to sleep (weights offloaded, KV cache freed) once it has generated and wakes it for
        # the next generation: vLLM's share and the loss pass's activations and logits never coexist.
        resident = sum(parts[k] for k in ("weights", "reference", "gradients", "optimizer", "overhead"))
        parts["total"] = max(parts["total"] - parts["vllm"], resident + parts["vllm"])
    return parts


def fits(total_gb: float, gpu_gb: float, margin: float = MARGIN) -> bool:
    return total_gb <= (1 - margin) * gpu_gb


def table(paths: list[Path]) -> str:
    lines = [
        "| recipe | stated hardware | per-device x GA x processes | estimate / GPU (GB) | margin | fits |",
        "|---|---|---|---|---|---|",
    ]
    for path in paths:
        layout = layout_of(path)
        if layout is None:
            continue
        recipe = yaml.safe_load(path.read_text())
        est = estimate(recipe, layout)["total"]
        batch = (
            f"{recipe.get('per_device_train_batch_size', 8)} x {recipe.get('gradient_accumulation_steps', 1)}"
            f" x {layout.processes}"
        )
        margin = 1 - est / layout.gpu_gb
        ok = "yes" if fits(est, layout.gpu_gb) else "**no**"
        lines.append(f"| `{path.stem}` | {layout.hardware} | {batch} | {est:.0f} of {layout.gpu_gb:.0f} | "
                     f"{margin:.0%} | {ok} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]] or sorted((ROOT / "examples/recipes").glob("*.yaml"))
    print(table(args))
