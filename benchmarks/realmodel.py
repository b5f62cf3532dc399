"""The real model (SmolLM2-135M-Instruct, ``smollm2-135m-instruct``) on this machine: which reasoning-gym task it can
learn, what the demo gains, and what a step costs. Writes ``benchmarks/results/realmodel.md`` and ``.json``.

    python benchmarks/realmodel.py                  # every stage not yet in realmodel.json, then the report
    python benchmarks/realmodel.py --stages tasks   # one stage (tasks, demo, cost, vllm)
    python benchmarks/realmodel.py --redo demo      # measure a stage again
    python benchmarks/realmodel.py --render         # rewrite realmodel.md from realmodel.json (no run)

Stages (each result is written to ``realmodel.json`` as soon as it exists, so an interrupted run resumes where it
stopped; a stage's entries record the machine's load average and CPU time beside wall time):

1. ``tasks``: before any training, the model's pass@1 and pass@8 (the unbiased estimator of Chen et al. 2021 over 8
   samples at the demo's temperature, 0.7) and greedy accuracy on the first held-out problems of several reasoning-gym tasks,
   scored by the ``reasoning_gym`` reward. A task it can learn has pass@8 well above pass@1 (about 0.2-0.8).
2. ``demo``: the README's real-model command (``DEMO_COMMAND``) for 3 seeds: held-out greedy accuracy before and
   after, wall and CPU time of the whole command.
3. ``cost``: every method's training step on the real model against stock ``trl.GRPOTrainer`` with the demo's
   settings, interleaved (each repetition runs every entry once, each in a fresh process), CPU time beside wall
   time, the process's peak RSS, and grpo with 1 and 2 torch threads (the faster is the project's default).
4. ``vllm``: vLLM's CPU build against ``generate`` in sampled tokens per second on the real model, run by the vLLM
   environment's Python (``--vllm-python``, default ``$GRPO_FAMILY_VLLM_PYTHON``; README, "vLLM on a CPU
   machine") through ``benchmarks/vllm_cpu.py --measure``; without that environment the report says it was not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STATE = RESULTS / "realmodel.json"
RESULT = "RESULT "  # prefix of a child process's result line
MODEL = "smollm2-135m-instruct"
STAGES = ("tasks", "demo", "cost", "vllm")

# Candidate tasks for the demo, each at a setting a 135M model might solve sometimes: short answers, few steps.
TASKS: dict[str, dict] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
                         "allow_parentheses": False, "allow_negation": False},
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "word_sequence_reversal": {"min_words": 3, "max_words": 3},
    "word_sorting": {"min_words": 3, "max_words": 3, "min_word_length": 3, "max_word_length": 6},
    "number_sorting": {"min_numbers": 3, "max_numbers": 3, "min_decimals": 0, "max_decimals": 0, "min_value": 0,
                       "max_value": 20},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 3},
    "spell_backward": {"min_word_len": 3, "max_word_len": 4},
    "gcd": {"max_value": 20},
}  # fmt: skip
TASK_PROBLEMS = 16  # held-out problems per task
TASK_TRAIN_SIZE = 400  # training problems generated before the held-out ones (small tasks have few distinct ones)
TASK_SAMPLES = 8  # samples per problem (pass@1 and pass@8 from them)
TASK_MAX_NEW_TOKENS = 48
# Sampling as in the demo: at temperature 1 over the whole vocabulary a 135M model's samples are mostly noise
# (chain_sum: pass@8 0.0 at temperature 1 against 0.04 greedy).
TASK_TEMPERATURE = 0.7

DEMO_RECIPE = "examples/recipes/smollm2_reasoning_gym.yaml"
DEMO_COMMAND = f"accelerate launch examples/train.py --config {DEMO_RECIPE}"
DEMO_SEEDS = (42, 43, 44)
COST_ENTRIES = (  # (label, method or "trl", torch threads)
    ("trl", "trl", 1), ("grpo", "grpo", 1), ("ms_grpo", "ms_grpo", 1), ("cw_grpo", "cw_grpo", 1), ("d3s", "d3s", 1),
    ("sgpo", "sgpo", 1), ("gpg", "gpg", 1), ("grpo, 2 threads", "grpo", 2),
)  # fmt: skip


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).
    (The one place this benchmark estimates pass@k; grpo_family.eval can replace it.)"""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def machine() -> str:
    import torch

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"


def load_state() -> dict:
    return json.loads(STATE.read_text()) if STATE.exists() else {}


def save_state(state: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = STATE.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, STATE)


def child(args: list[str], env: dict | None = None, timeout: int = 3600) -> dict:
    """Run this script's ``--child`` mode in a fresh process; its RESULT line, plus the child's CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, __file__, "--child", *args]
    result = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=timeout)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{result.stderr[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (line,) = [line for line in result.stdout.splitlines() if line.startswith(RESULT)]
    out = json.loads(line.removeprefix(RESULT))
    out["process_cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)
    return out


# ------------------------------------------------------------------------------------------------ 1. tasks
def measure_task(task: str) -> dict:
    """In a child: greedy and sampled completions on the task's first held-out problems, scored."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_family.collator import prepare_dataset
    from grpo_family.models import resolve_model
    from grpo_family.preflight import load_data
    from grpo_family.rewards import reasoning_gym_reward
    from grpo_family.rewards.reasoning_gym import extract_reasoning_gym_answer
    from grpo_family.tasks import generate_completions

    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    path = resolve_model(MODEL)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    raw = load_data(f"reasoning_gym/{task}", options={"size": TASK_TRAIN_SIZE, **TASKS[task]}, eval_size=TASK_PROBLEMS)
    rows = prepare_dataset(raw["test"])
    prompts, entries = list(rows["prompt"]), list(rows["reasoning_gym_entry"])
    greedy = generate_completions(model, tokenizer, prompts, max_new_tokens=TASK_MAX_NEW_TOKENS)
    greedy_scores = reasoning_gym_reward(greedy, reasoning_gym_entry=entries)
    torch.manual_seed(0)
    repeated = [p for p in prompts for _ in range(TASK_SAMPLES)]
    sampled = generate_completions(model, tokenizer, repeated, max_new_tokens=TASK_MAX_NEW_TOKENS, do_sample=True,
                                   temperature=TASK_TEMPERATURE, top_k=0, top_p=1.0)  # fmt: skip
    scores = reasoning_gym_reward(sampled, reasoning_gym_entry=[e for e in entries for _ in range(TASK_SAMPLES)])
    correct = [int(sum(scores[i * TASK_SAMPLES : (i + 1) * TASK_SAMPLES])) for i in range(len(prompts))]
    n = TASK_SAMPLES
    return {
        "task": task,
        "options": TASKS[task],
        "settings": {
            "problems": TASK_PROBLEMS,
            "max_new_tokens": TASK_MAX_NEW_TOKENS,
            "temperature": TASK_TEMPERATURE,
        },
        "problems": len(prompts),
        "samples": n,
        "pass@1": sum(pass_at_k(n, c, 1) for c in correct) / len(correct),
        "pass@8": sum(pass_at_k(n, c, 8) for c in correct) / len(correct),
        "greedy": sum(greedy_scores) / len(greedy_scores),
        "committed_answer_share": sum(extract_reasoning_gym_answer(c) is not None for c in sampled) / len(sampled),
        "example_question": prompts[0][-1]["content"],
        "example_gold": rows[0]["answer"],
        "example_completions": sampled[:3],
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def stage_tasks(state: dict) -> None:
    done = state.setdefault("tasks", {})
    for task in TASKS:
        settings = {"problems": TASK_PROBLEMS, "max_new_tokens": TASK_MAX_NEW_TOKENS, "temperature": TASK_TEMPERATURE}
        if task in done and done[task].get("options") == TASKS[task] and done[task].get("settings") == settings:
            continue
        load = os.getloadavg()[0]
        print(f"tasks: {task} {TASKS[task]}", flush=True)
        done[task] = {**child(["task", task], env={"OMP_NUM_THREADS": "1"}), "load_average": round(load, 2)}
        print(f"  pass@1 {done[task]['pass@1']:.3f}  pass@8 {done[task]['pass@8']:.3f}", flush=True)
        save_state(state)


# ------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="*", choices=STAGES, default=list(STAGES))
    parser.add_argument("--redo", nargs="*", choices=STAGES, default=[])
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        result = {"task": lambda: measure_task(rest[0])}[kind]()
        result["max_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
        print(RESULT + json.dumps(result), flush=True)
        return
    state = load_state()
    for stage in args.redo:
        state.pop(stage, None)
    if not args.render:
        state.setdefault("runs", []).append({"date": str(date.today()), "machine": machine(), "stages": args.stages})
        for stage in args.stages:
            {"tasks": stage_tasks}[stage](state)
        save_state(state)


if __name__ == "__main__":
    main()
