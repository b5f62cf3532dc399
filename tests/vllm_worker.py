"""One real-vLLM run per process, for `tests/test_vllm.py` (each colocated vLLM engine owns its process's
distributed state, so every run gets a fresh interpreter). Writes what it saw as JSON.

    python tests/vllm_worker.py train --method ms_grpo --model DIR --out result.json [--steps 3] [--lr 1e-2] [--regex R]
    python tests/vllm_worker.py fidelity --model DIR --out result.json
    python tests/vllm_worker.py server-error --model DIR --out result.json

``train``: 2-3 colocate steps of one method on the tiny bundled task; after every weight sync the sampler's log-probs
of a fixed probe sequence are compared with the trainer's (``sync_gaps``). ``fidelity``: the tied-embedding case
on purpose: the input embedding (which is also the output layer) is scaled, then the gap is measured without a
sync, with the sync, and with the sync minus the re-tie. ``server-error``: a server-mode trainer on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import digit_share_reward, tiny_config_kwargs  # noqa: E402
from method_cases import case  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from grpo_family import METHODS  # noqa: E402
from grpo_family.integrations import vllm_cpu  # noqa: E402
from grpo_family.tasks import arithmetic_reward, make_arithmetic_dataset  # noqa: E402


def vllm_settings(**overrides) -> dict:
    """Colocate vLLM on CPU: the memory share is vLLM's GPU setting, ignored on CPU (the KV cache is
    `VLLM_CPU_KVCACHE_SPACE`); `vllm_max_model_length` keeps its scheduler's buffers small."""
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 128, **overrides}


def build(method: str, model_dir: str, out_dir: str, steps: int, lr: float, **overrides):
    Config, Trainer = METHODS[method]
    kwargs = tiny_config_kwargs(
        out_dir, max_steps=steps, learning_rate=lr, per_device_train_batch_size=16, num_generations=8,
        max_completion_length=24, **{**vllm_settings(), **case(method).options, **overrides},
    )  # fmt: skip
    # Correctness first (what SGPO's judge colours), plus a dense reward so that groups are not all equal.
    return Trainer(
        model=model_dir,
        reward_funcs=[arithmetic_reward, digit_share_reward],
        args=Config(**kwargs),
        train_dataset=make_arithmetic_dataset("train", 64, seed=0),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )


def probe_ids(tokenizer) -> list[int]:
    row = make_arithmetic_dataset("eval", 1, seed=0)[0]
    prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if not isinstance(prompt, list) else prompt)
    return prompt + tokenizer(row["solution"], add_special_tokens=False)["input_ids"]


def sampler_gap(trainer, ids: list[int]) -> tuple[float, float]:
    """max and mean |log p_vLLM - log p_trainer| over the probe's tokens (vLLM's prompt log-probs)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    output = trainer.vllm_generation.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    sampler = torch.tensor([output.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
    model = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, :-1].float()
    policy = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].cpu()
    gap = (sampler - policy).abs()
    return gap.max().item(), gap.mean().item()


def run_train(args) -> dict:
    structured = {"vllm_structured_outputs_regex": args.regex} if args.regex else {}
    trainer = build(args.method, args.model, args.out_dir, args.steps, args.lr, **structured)
    initial = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    seen: list[str] = []  # the completions the reward scored
    scored = trainer.reward_funcs[0]

    def capturing(*args, **kwargs):
        seen.extend(c[0]["content"] if isinstance(c, list) else c for c in kwargs["completions"])
        return scored(*args, **kwargs)

    capturing.__name__ = scored.__name__
    trainer.reward_funcs[0] = capturing
    installed = trainer.vllm_generation.sync_weights.__qualname__.startswith("reload_weights_sync")
    ids = probe_ids(trainer.processing_class)
    gaps, stale_gaps = [], []
    sync = trainer.vllm_generation.sync_weights

    def checked_sync():
        stale_gaps.append(sampler_gap(trainer, ids))  # what sampling would have used without this sync
        sync()
        gaps.append(sampler_gap(trainer, ids))

    trainer.vllm_generation.sync_weights = checked_sync
    start = time.perf_counter()
    trainer.train()
    params_finite = all(torch.isfinite(p).all().item() for p in trainer.model.parameters())
    moved = any(not torch.equal(initial[name], p) for name, p in trainer.model.named_parameters())
    return {
        "cpu_sync_installed": installed,
        "sync_gaps": gaps,
        "stale_gaps": stale_gaps,
        "log_history": trainer.state.log_history,
        "params_finite": params_finite,
        "train_seconds": time.perf_counter() - start,
        "importance_sampling_correction": trainer.vllm_importance_sampling_correction,
        "weights_moved": moved,
        "completions_match_regex": bool(seen) and all(re.fullmatch(args.regex, t) for t in seen)
        if args.regex
        else None,
    }


def head_keeps_private_copy(trainer) -> bool:
    """Whether vLLM's output layer computes with a copy of its weight made at load time (packed for the CPU's GEMM
    kernels) rather than with the shared parameter itself: vLLM chooses by CPU (AMX/AVX-512 builds pack, others may
    read the parameter), and only a private copy goes stale when ``reload_weights`` skips the tied head."""
    runner = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner
    head = runner.get_model().lm_head
    x = torch.randn(3, head.weight.shape[1], generator=torch.Generator().manual_seed(0)).to(head.weight.dtype)
    with torch.no_grad():
        served = head.quant_method.apply(head, x).float()
        live = torch.nn.functional.linear(x, head.weight).float()
    # bfloat16 products of one row each: far apart only when the weights differ (here by a factor 3)
    return not torch.allclose(served, live, rtol=0.05, atol=0.05)


def run_fidelity(args) -> dict:
    trainer = build("grpo", args.model, args.out_dir, 1, 1e-6)  # never trained: any lr the bounds allow
    ids = probe_ids(trainer.processing_class)
    result = {"tied": trainer.model.lm_head.weight is trainer.model.get_input_embeddings().weight}
    result["initial"] = sampler_gap(trainer, ids)
    with torch.no_grad():
        trainer.model.get_input_embeddings().weight.mul_(3.0)  # the output layer too: they are one tensor
    result["stale"] = sampler_gap(trainer, ids)
    retie = vllm_cpu.retie_lm_head
    vllm_cpu.retie_lm_head = lambda model, tied: False  # the sync without the re-tie
    trainer.vllm_generation.sync_weights()
    result["synced_without_retie"] = sampler_gap(trainer, ids)
    result["head_keeps_private_copy"] = head_keeps_private_copy(trainer)
    vllm_cpu.retie_lm_head = retie
    trainer.vllm_generation.sync_weights()
    result["synced"] = sampler_gap(trainer, ids)
    return result


def run_server_error(args) -> dict:
    start = time.perf_counter()
    try:
        build("ms_grpo", args.model, args.out_dir, 1, 1e-6, vllm_mode="server", vllm_server_timeout=5)
    except Exception as error:  # noqa: BLE001 - the test reads the type and message
        return {"error": type(error).__name__, "message": str(error), "seconds": time.perf_counter() - start}
    return {"error": None, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["train", "fidelity", "server-error"])
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--out_dir", default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--regex", default=None, help="train: vllm_structured_outputs_regex")
    args = parser.parse_args()
    args.out_dir = args.out_dir or str(Path(args.out).with_suffix("")) + "-run"
    result = {"train": run_train, "fidelity": run_fidelity, "server-error": run_server_error}[args.what](args)
    Path(args.out).write_text(
        json.dumps(result, default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v))
    )


if __name__ == "__main__":
    main()
