"""A tiny Qwen2-architecture model and a character-level ChatML tokenizer, built locally (no downloads).

`build_tokenizer` makes a `PreTrainedTokenizerFast` whose vocabulary is the special tokens plus every printable
ASCII character and newline, with a Qwen/ChatML chat template (`<|im_start|>role\\ncontent<|im_end|>\\n`) and
`eos = <|im_end|>`, so it behaves like a Qwen tokenizer inside TRL. `build_tiny_model` builds a randomly
initialised `Qwen2ForCausalLM` from a small config (head_dim 32, which vLLM's CPU backend serves).
`load_warm_start` gives a supervised model (cached on disk), the starting point of the offline demo, tests and
benchmarks: its teacher knew its arithmetic facts but evaluated left to right, ignoring precedence, in 4 of 5
solutions, so the model computes reliably, orders wrongly when greedy, and orders rightly in about 1 sample in 5:
a policy that can already solve most problems but does so inconsistently, which is what GRPO-style RL sharpens.
(Its held-out accuracy: :func:`grpo_family.eval.evaluate_accuracy`.)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import string
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ..runtime.cache import cache_root, load_cached, save_model_folder
from .arithmetic import (
    DEFAULT_DIFFICULTY,
    _format_solution,
    _parse_problem,
    left_to_right,
    make_arithmetic_dataset,
    solve,
)

# Bump when anything that changes the warm-start weights changes (data format, model, training loop).
WARM_START_VERSION = "2"

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
# Whole-word tokens: each saves several positions per sequence (faster warm start, training and generation).
WORD_TOKENS = ["user", "assistant", "system", "Compute ", "Answer: "]

# Qwen2.5-style ChatML template without the default system prompt (it would cost ~40 characters per prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TINY_MODEL_DEFAULTS = {  # 0.34M parameters; head_dim 128 / 4 = 32 (vLLM's CPU attention needs >= 32)
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}

# Supervised warm start: AdamW on the train split's chat-formatted prompt + a teacher's solution, loss on the
# completion only. The teacher evaluates left to right (`left_to_right`) in `left_to_right_share` of its solutions
# (a wrong order only where the problem needs precedence), else in the right order; its arithmetic is always right.
# 1000 steps took 158 s of one core (10 min wall on a busy 2-core machine); the result solves 42 of the 43
# problems among the first 400 held-out ones that need no precedence, greedily (and 0.22 of those that do). At a
# share of 0.7 the warm start's greedy answer is right on ~0.29 of the held-out problems; at 0.8, RL took several
# times longer to flip the order.
WARM_START_DEFAULTS = {
    "num_steps": 1000,
    "left_to_right_share": 0.7,
    "batch_size": 64,
    "learning_rate": 3e-3,
    "adam_beta2": 0.98,
    "warmup_steps": 20,
    "weight_decay": 0.0,
    "num_train_examples": 10000,
}


def build_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """Character-level tokenizer: specials, newline and the printable ASCII characters, one token each, plus a few
    whole-word tokens (`WORD_TOKENS`) that shorten the prompts and the answer line.

    `vocab_size` pads the vocabulary to exactly that many tokens with pieces of two, then three, printable
    characters, as a real BPE vocabulary holds: encoding never produces them (this BPE has no merges) and decoding
    writes them out, so a model of a real vocabulary's shape (embedding and logits) trains on the bundled task
    (`benchmarks/gpu.py`)."""
    chars = ["\n"] + [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
    pieces = SPECIAL_TOKENS + chars
    if vocab_size is not None:
        padding = vocab_size - len(pieces) - len(WORD_TOKENS)
        if padding < 0:
            raise ValueError(f"vocab_size={vocab_size} is below the {len(pieces) + len(WORD_TOKENS)} tokens it needs.")
        longer = ("".join(p) for n in (2, 3) for p in itertools.product(chars[1:], repeat=n))
        pieces += list(itertools.islice(longer, padding))
    vocab = {tok: i for i, tok in enumerate(pieces)}
    # A BPE with no merges splits text into single characters; Fuse joins them back without separators.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    backend.add_tokens([AddedToken(word, normalized=False, special=False) for word in WORD_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        padding_side="left",
        model_max_length=TINY_MODEL_DEFAULTS["max_position_embeddings"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int | None = 0, **overrides) -> Qwen2ForCausalLM:
    """A randomly initialised `Qwen2ForCausalLM` sized for CPU; `overrides` are `Qwen2Config` fields."""
    kwargs = {**TINY_MODEL_DEFAULTS, **overrides}
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.convert_tokens_to_ids(IM_START),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )
    if seed is not None:
        torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    return model


def warm_start_key(seed: int = 0, model_overrides: dict | None = None, train_overrides: dict | None = None) -> str:
    """Hash of everything that determines the warm-start weights (the cache directory's suffix)."""
    payload = {
        "version": WARM_START_VERSION,
        "seed": seed,
        "model": {**TINY_MODEL_DEFAULTS, **(model_overrides or {})},
        "train": {**WARM_START_DEFAULTS, **(train_overrides or {})},
        "difficulty": DEFAULT_DIFFICULTY.name,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def warm_start_dir(seed: int = 0, model_overrides: dict | None = None, train_overrides: dict | None = None) -> Path:
    """The warm start's cache folder (a model folder once :func:`load_warm_start` has built it): what
    ``python -m grpo_family.eval --model`` takes to evaluate the demo's starting policy."""
    return cache_root() / f"tiny-arith-{warm_start_key(seed, model_overrides, train_overrides)}"


def teacher_solutions(dataset, left_to_right_share: float, seed: int = 0) -> list[str]:
    """The warm start's targets: each row's solution evaluated left to right with probability
    `left_to_right_share` (the same as the reference where precedence does not matter), else the reference."""
    rng = random.Random(f"grpo_family-teacher-{seed}")
    out = []
    for problem, reference in zip(dataset["problem"], dataset["solution"]):
        numbers, ops = _parse_problem(problem)
        steps = left_to_right(numbers, ops) if rng.random() < left_to_right_share else solve(numbers, ops)
        out.append(_format_solution(steps) if steps else reference)
    return out


def _encode_sft(tokenizer, dataset, solutions: list[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and labels (-100 on prompt and padding) for prompt + solution + <|im_end|>."""
    prompts = tokenizer.apply_chat_template(list(dataset["prompt"]), add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    solutions = list(dataset["solution"]) if solutions is None else solutions
    completion_ids = tokenizer([s + IM_END for s in solutions], add_special_tokens=False)["input_ids"]
    rows = [p + c for p, c in zip(prompt_ids, completion_ids)]
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, prompt) in enumerate(zip(rows, prompt_ids)):
        input_ids[i, : len(row)] = torch.tensor(row)
        labels[i, len(prompt) : len(row)] = input_ids[i, len(prompt) : len(row)]
    return input_ids, labels


def train_warm_start(
    seed: int = 0, model_overrides: dict | None = None, log_every: int = 0, **train_overrides
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Supervised warm start from scratch (no cache): deterministic given `seed` (on one thread, whatever the
    caller's setting, so a cache built by any process holds the same weights)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_warm_start(seed, model_overrides, log_every, **train_overrides)
    finally:
        torch.set_num_threads(threads)


def _train_warm_start(
    seed: int, model_overrides: dict | None, log_every: int, **train_overrides
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    hp = {**WARM_START_DEFAULTS, **train_overrides}
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **(model_overrides or {}))
    data = make_arithmetic_dataset("train", num_examples=hp["num_train_examples"], seed=seed)
    input_ids, labels = _encode_sft(tokenizer, data, teacher_solutions(data, hp["left_to_right_share"], seed))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=hp["learning_rate"], betas=(0.9, hp["adam_beta2"]), weight_decay=hp["weight_decay"]
    )
    total, warmup = hp["num_steps"], hp["warmup_steps"]

    def lr_lambda(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    model.train()
    order = torch.randperm(len(input_ids), generator=generator)
    cursor = 0
    for step in range(total):
        if cursor + hp["batch_size"] > len(order):
            order, cursor = torch.randperm(len(input_ids), generator=generator), 0
        idx = order[cursor : cursor + hp["batch_size"]]
        cursor += hp["batch_size"]
        batch_labels = labels[idx]
        width = int((batch_labels != -100).nonzero()[:, 1].max()) + 1  # trim right padding
        ids, batch_labels = input_ids[idx, :width], batch_labels[:, :width]
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=batch_labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if log_every and ((step + 1) % log_every == 0 or step == total - 1):
            print(f"warm start: step {step + 1}/{total}, loss {loss.item():.3f}", flush=True)
    model.eval()
    return model, tokenizer


def _is_complete(path: Path) -> bool:
    """A cache written before manifests existed (grpo_family.runtime.cache): its last files are there."""
    return (path / "config.json").exists() and (path / "tokenizer_config.json").exists()


def load_warm_start(
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    *,
    model_overrides: dict | None = None,
    timeout: float = 600.0,
    **train_overrides,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The warm-started tiny model and its tokenizer, trained once and then loaded from an on-disk cache.

    `cache_dir` defaults to `$GRPO_FAMILY_CACHE/tiny-arith-<hash>` (else `~/.cache/grpo_family/...`), the hash
    covering the model config, training settings, seed and `WARM_START_VERSION`. `train_overrides` override
    `WARM_START_DEFAULTS` (e.g. `num_steps=20` for tests). Built once across processes (`grpo_family.runtime.cache`): the
    process holding `<cache_dir>.lock` trains and publishes the folder whole; the others wait up to `timeout` seconds
    for it, and take over at once if that process was killed (its PID is gone). A cache that is incomplete or does
    not load is named in a warning and rebuilt.
    """
    if cache_dir is None:
        cache_dir = warm_start_dir(seed, model_overrides, train_overrides)

    def build(folder: Path) -> None:
        steps = {**WARM_START_DEFAULTS, **train_overrides}["num_steps"]
        print(
            f"Building the warm start once ({steps} supervised steps of the tiny model, about "
            f"{max(1, round(steps * 0.16 / 60))} min on one CPU core); cached in {cache_dir}",
            flush=True,
        )
        model, tokenizer = train_warm_start(seed, model_overrides, log_every=max(1, steps // 5), **train_overrides)
        save_model_folder(model, tokenizer, folder)  # not save_pretrained: any rank may build a cache

    def load(folder: Path) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        tokenizer.chat_template = tokenizer.chat_template or CHAT_TEMPLATE
        model = Qwen2ForCausalLM.from_pretrained(folder)
        model.eval()
        return model, tokenizer

    return load_cached(
        cache_dir, build, load, what="The tiny model's warm start", timeout=timeout, legacy_complete=_is_complete
    )
