"""SGPO judge overhead per training step, as a ratio to ``grpo``'s step time, interleaved in one process.

    python benchmarks/bench_sgpo.py                              # warm-started tiny model, hard problems, CPU
    python benchmarks/bench_sgpo.py --reps 5 --steps 6 --difficulty default --latency-ms 0 200

Runs, each from the same model, data and batch settings (benchmarks/speed.py's BASE_ARGS: 32 completions per step,
G = 8, 48 new tokens, a learning rate that leaves the weights unchanged, checked after each run; the bundled
arithmetic task, "hard" problems by default so that most groups are all wrong):

* ``grpo``: ``GRPOFamilyTrainer`` (the library's ``grpo``), the reference;
* ``sgpo_programmatic``: ``SGPOTrainer`` with the exact arithmetic checker as judge (in process);
* ``sgpo_http_<L>ms``: ``SGPOTrainer`` with ``OpenAICompatibleJudge`` talking to a loopback OpenAI-compatible
  server (``http.server`` on 127.0.0.1, one thread per request) that parses the judge prompt, answers with the
  programmatic verdict, and waits ``L`` ms per request first (a stand-in for a served model's latency).

SGPO judges during the whole run (``sgpo_num_epochs=None``). Per-step time is TRL's ``step_time`` (generation +
scoring + judging + forward/backward + optimizer), the first step of each run dropped as warm-up; the order of the
runs rotates between repetitions, and a figure is the median over repetitions of the per-repetition ratio to
``grpo``. The judge's own wall time per generation batch (``sgpo/judge_latency_s``) and the number of completions
judged per step are reported too. Network: 127.0.0.1 only. Writes ``benchmarks/results/sgpo.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.speed import BASE_ARGS, model_path  # noqa: E402
from grpo_family import GRPOFamilyTrainer  # noqa: E402
from grpo_family.judges import JudgeRequest, OpenAICompatibleJudge, ProgrammaticJudge  # noqa: E402
from grpo_family.tasks import arithmetic_reward, check_steps, make_arithmetic_dataset  # noqa: E402
from grpo_family.trainers.sgpo import SGPOConfig, SGPOTrainer  # noqa: E402

_STEP = re.compile(r"^\[(\d+)\] ?(.*)$")


def parse_judge_prompt(user: str) -> JudgeRequest:
    """Problem and numbered steps back out of the default judge prompt (what a served model would read)."""
    problem = user.split("### Problem\n", 1)[1].split("\n\n### Reference", 1)[0].strip()
    candidate = user.split("### Candidate solution", 1)[1].split("\n### What to do", 1)[0]
    steps: list[list[str]] = []
    for line in candidate.splitlines()[1:]:
        match = _STEP.match(line)
        if match and int(match.group(1)) == len(steps) + 1:
            steps.append([match.group(2)])
        elif steps and line.strip():
            steps[-1].append(line)
    return JudgeRequest(problem, None, None, tuple("\n".join(s) for s in steps))


class LoopbackJudgeServer:
    """OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 answering with the programmatic verdict."""

    def __init__(self, latency_s: float):
        checker = ProgrammaticJudge(check=check_steps)  # the prompt's problem is the arithmetic expression
        self.requests = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with lock:
                    owner.requests += 1
                time.sleep(latency_s)
                request = parse_judge_prompt(body["messages"][-1]["content"])
                verdict = checker.judge([request])[0].first_error
                content = f"Checked each step.\nFIRST_ERROR_STEP: {'NONE' if verdict is None else verdict}"
                data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def make_config(name: str, steps: int, device: str, workdir: Path):
    """The config of one run of ``name`` (``grpo`` or an ``sgpo_*`` run): speed.py's ``BASE_ARGS``, and for SGPO
    judging during the whole run."""
    common = dict(output_dir=str(workdir / name), max_steps=steps, use_cpu=device == "cpu", bf16=device == "cuda")
    if name == "grpo":
        return GRPOConfig(**common, **BASE_ARGS)
    return SGPOConfig(**common, **BASE_ARGS, sgpo_num_epochs=None, step_splitter="line")


def run_once(name: str, model: str, dataset, steps: int, device: str, workdir: Path, servers: dict) -> dict:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model)  # AutoTokenizer would build a Qwen2Tokenizer
    kwargs = dict(model=model, reward_funcs=[arithmetic_reward], train_dataset=dataset, processing_class=tokenizer)
    args = make_config(name, steps, device, workdir)
    if name == "grpo":
        trainer = GRPOFamilyTrainer(args=args, **kwargs)
    else:
        judge = None
        if name.startswith("sgpo_http"):
            judge = OpenAICompatibleJudge(servers[name].url, "loopback-judge", timeout=60.0, concurrency=64)
        trainer = SGPOTrainer(args=args, judge=judge, **kwargs)
    before = harness.weights_digest(trainer.model)
    trainer.train()
    harness.check_frozen(before, trainer.model, name)  # BASE_ARGS' learning rate leaves the weights unchanged
    history = trainer.state.log_history
    step_times = [h["step_time"] for h in history if "step_time" in h][1:]
    latencies = [h["sgpo/judge_latency_s"] for h in history if "sgpo/judge_latency_s" in h][1:]
    judged = [h["sgpo/judge_requests"] for h in history if "sgpo/judge_requests" in h][1:]
    negative = [h["sgpo/frac_all_negative"] for h in history if "sgpo/frac_all_negative" in h][1:]
    return {
        "step_time": statistics.median(step_times),
        "judge_latency": statistics.median(latencies) if latencies else None,
        "judged": statistics.mean(judged) if judged else None,
        "all_negative": statistics.mean(negative) if negative else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run (one more is run as warm-up)")
    parser.add_argument("--difficulty", default="hard", choices=["easy", "default", "hard"])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 100.0], help="loopback judge latencies")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output", default=str(harness.RESULTS / "sgpo.md"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-family-sgpo-"))
    model = model_path("tiny", workdir)
    dataset = make_arithmetic_dataset("train", 2000, seed=0, difficulty=args.difficulty)
    servers = {f"sgpo_http_{ms:g}ms": LoopbackJudgeServer(ms / 1000) for ms in args.latency_ms}
    names = ["grpo", "sgpo_programmatic", *servers]
    results: dict[str, list[dict]] = {n: [] for n in names}
    try:
        for rep in range(args.reps):
            for name in harness.rotation(names, rep):
                results[name].append(run_once(name, model, dataset, args.steps + 1, args.device, workdir, servers))
            print(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{n} {results[n][-1]['step_time']:.3f}s" for n in names))
    finally:
        for server in servers.values():
            server.close()

    bsz, gens = BASE_ARGS["per_device_train_batch_size"], BASE_ARGS["num_generations"]
    lines = [
        "# SGPO judge overhead vs `grpo`",
        "",
        f"Command: `{harness.command_line(__file__, argv)}`",
        f"Machine: {harness.machine_line()}, device {args.device}; warm-started tiny model, bundled arithmetic task "
        f"({args.difficulty} problems); "
        f"{args.reps} interleaved repetitions of {args.steps} timed steps ({bsz} completions per step, G={gens}, "
        f"{BASE_ARGS['max_completion_length']} new tokens). Judging on during the whole run; loopback judge = "
        "OpenAI-compatible HTTP server on 127.0.0.1 answering with the exact verdict after the stated latency.",
        "",
        "| run | median step time (s) | ratio to grpo (median of per-rep ratios) | min / max ratio | judge wall time "
        "per step (s) | judge time / grpo step time | completions judged per step | all-negative groups |",
        "|---|---|---|---|---|---|---|---|",
    ]
    reference = [r["step_time"] for r in results["grpo"]]
    grpo_step = statistics.median(reference)
    for name in names:
        rows = results[name]
        ratios = [r["step_time"] / g for r, g in zip(rows, reference)]
        lat = [r["judge_latency"] for r in rows if r["judge_latency"] is not None]
        judged = [r["judged"] for r in rows if r["judged"] is not None]
        negative = [r["all_negative"] for r in rows if r["all_negative"] is not None]
        lines.append(
            f"| {name} | {statistics.median(r['step_time'] for r in rows):.3f} | {statistics.median(ratios):.3f} | "
            f"{min(ratios):.3f} / {max(ratios):.3f} | "
            f"{f'{statistics.median(lat):.4f}' if lat else '-'} | "
            f"{f'{statistics.median(lat) / grpo_step:.2%}' if lat else '-'} | "
            f"{f'{statistics.mean(judged):.1f}' if judged else '-'} | "
            f"{f'{statistics.mean(negative):.0%}' if negative else '-'} |"
        )
    lines += [
        "",
        "The judge's wall time (`sgpo/judge_latency_s`: splitting, prompt rendering, the concurrent requests, "
        "parsing) is what SGPO adds per generation batch, plus one gather + broadcast of the texts and verdicts; the "
        "column 'judge time / grpo step time' is the robust overhead figure, the step-time ratios mostly show the "
        "noise between runs. With a served LLM "
        "judge the wall time is about one request's latency, not the sum over requests (requests run concurrently, "
        "up to judge_concurrency). CPU timings on a shared 2-core machine are noisy.",
    ]
    return harness.write_report(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
