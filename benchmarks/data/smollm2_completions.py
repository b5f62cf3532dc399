"""SmolLM2-135M-Instruct's own completions on the project's tasks, for the hand-graded rewards corpus.

Writes ``benchmarks/data/smollm2_raw_seed<seed>.jsonl`` (one sampled completion a row, with its task, prompt, gold and seed),
which is ungraded: each row is graded by hand against its gold before it joins ``rewards_corpus.jsonl``.
Sampling follows ``benchmarks/realmodel.py`` (temperature 0.7, one torch thread); about 3-6 minutes on one core.

    python benchmarks/data/smollm2_completions.py [seed]   # seed 0 by default
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODEL = "smollm2-135m-instruct"
SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 0
OUT = Path(__file__).with_name(f"smollm2_raw_seed{SEED}.jsonl")
TEMPERATURE = 0.7
ONE_DIGIT = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
             "allow_parentheses": False, "allow_negation": False}  # fmt: skip
# label -> (reasoning-gym task, options, system prompt: None for the collator's reasoning-gym default, problems,
# samples per problem, max new tokens); the settings of benchmarks/realmodel.py's task stage.
RG_TASKS = {
    "basic_arithmetic": ("basic_arithmetic", ONE_DIGIT, None, 6, 2, 64),
    "products": ("products", {"min_digits": 1, "max_digits": 1}, None, 6, 2, 64),
    "leg_counting": ("leg_counting", {"min_animals": 1, "max_animals": 2, "max_instances": 3}, None, 5, 2, 96),
    "gcd": ("gcd", {"max_value": 20}, None, 5, 2, 64),
    "chain_sum": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}, None, 5, 2, 64),
}
ARITHMETIC = {"problems": 12, "samples": 2, "max_new_tokens": 128}
# The bundled task's prompt is one user message. Seed 0 samples its default difficulty under no system prompt and
# the project's "math" one (grpo_family.collator); no sample was right, so seed 1 samples the easy difficulty under
# no system prompt and the real-model demo's one-line prompt (benchmarks/realmodel.py), where the model answers.
DEMO_SYSTEM_PROMPT = "Answer in one line. Example: Calculate 3 + 4.\n3 + 4 = 7. The answer is 7."
ARITHMETIC_SETTINGS = {0: ("default", ("none", "math")), 1: ("easy", ("none", "demo"))}


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_family.collator import SYSTEM_PROMPTS, prepare_dataset
    from grpo_family.eval import generate_completions
    from grpo_family.models import resolve_model
    from grpo_family.preflight import load_data
    from grpo_family.tasks.arithmetic import make_arithmetic_dataset

    torch.set_num_threads(1)
    path = resolve_model(MODEL)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    rows: list[dict] = []

    def sample(prompts, golds, extra, samples, max_new_tokens):
        torch.manual_seed(SEED)
        repeated = [p for p in prompts for _ in range(samples)]
        texts = generate_completions(model, tokenizer, repeated, max_new_tokens=max_new_tokens, do_sample=True,
                                     temperature=TEMPERATURE, top_k=0, top_p=1.0)  # fmt: skip
        for i, text in enumerate(texts):
            k = i // samples
            rows.append({"prompt": prompts[k], "gold": golds[k], "completion": text, "sample": i % samples,
                         "max_new_tokens": max_new_tokens, **extra[k]})  # fmt: skip

    for label, (task, options, system, problems, samples, max_new) in RG_TASKS.items():
        raw = load_data(f"reasoning_gym/{task}", options={"size": 100, **options}, eval_size=problems)
        data = prepare_dataset(raw["test"], system_prompt=system)
        extra = [{"task": f"reasoning_gym/{task}", "options": options, "reasoning_gym_entry": e}
                 for e in data["reasoning_gym_entry"]]  # fmt: skip
        sample(list(data["prompt"]), list(data["answer"]), extra, samples, max_new)
        print(label, len(rows), flush=True)
    difficulty, systems = ARITHMETIC_SETTINGS[SEED]
    data = make_arithmetic_dataset("eval", num_examples=ARITHMETIC["problems"], seed=SEED, difficulty=difficulty)
    prompt_texts = {**SYSTEM_PROMPTS, "demo": DEMO_SYSTEM_PROMPT}
    for j, system in enumerate(systems):
        half = range(j * len(data) // 2, (j + 1) * len(data) // 2)
        prompts = [data[i]["prompt"] if system == "none" else
                   [{"role": "system", "content": prompt_texts[system]}, *data[i]["prompt"]] for i in half]  # fmt: skip
        options = {"split": "eval", "seed": SEED, "difficulty": difficulty, "system_prompt": system}
        extra = [{"task": "arithmetic", "options": options}] * len(prompts)
        sample(prompts, [data[i]["answer"] for i in half], extra, ARITHMETIC["samples"], ARITHMETIC["max_new_tokens"])
        print("arithmetic", system, len(rows), flush=True)
    with OUT.open("w") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"n": i, "model": MODEL, "seed": SEED, "temperature": TEMPERATURE, **row}) + "\n")
    print(f"{len(rows)} completions -> {OUT}")


if __name__ == "__main__":
    main()
