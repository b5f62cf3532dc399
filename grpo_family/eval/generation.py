"""Generation backends: ``generate`` (transformers, batched, left padding) and ``vllm`` (vLLM's offline engine, CPU
or GPU). Both take the same conversational prompts, render them with the tokenizer's chat template (so they see the
same token ids), and return, per prompt, its samples with their token counts and whether they were cut off.

``generate``: prompts in order, each repeated ``num_samples`` times in a row, ``batch_size // num_samples`` problems
per call (at least one), left-padded; sampling draws from torch's global generator seeded, for each batch, with
``seed`` + the index of the batch's first problem, inside ``torch.random.fork_rng`` (the caller's random state is
left as it was, so an evaluation during training does not change the training run; ``seed=None`` draws from the
caller's generator as it stands, advancing it). ``progress=True`` shows a progress bar over the problems.
``TrainerVLLMBackend``: the training run's own vLLM engine (TRL's colocated ``LLM`` or its server client), for
evaluation during training.
``vllm``: one request per prompt with ``n = num_samples``, the engine seeded with ``seed``; the weights in the dtype
of the checkpoint unless ``dtype`` says otherwise (vLLM's own ``auto`` would serve a float32 checkpoint in bfloat16,
whose greedy tokens can differ from float32's), token ids decoded with our tokenizer.

A sample is *truncated* when it ends without an end-of-sequence token (it used all ``max_new_tokens``); its
``num_tokens`` counts the generated tokens before the end-of-sequence token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from ..errors import EvalSetupError
from .presets import Decoding

__all__ = ["GenerateBackend", "Generation", "Sample", "TrainerVLLMBackend", "VLLMBackend", "chat_prompts",
           "evaluate_accuracy", "generate_completions", "generate_texts"]  # fmt: skip

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    text: str
    num_tokens: int
    truncated: bool


@dataclass
class Generation:
    """``samples[i]``: prompt ``i``'s samples in sampling order. ``max_new_tokens``: the length actually allowed
    (a request beyond the model's context is capped to it). ``seconds``: generation wall time."""

    samples: list[list[Sample]]
    max_new_tokens: int
    seconds: float
    backend: str
    extra: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for row in self.samples for s in row)


def chat_prompts(tokenizer, prompts: list) -> list[str]:
    """Prompt texts: conversations through the chat template (generation prompt added); plain strings as they are."""
    return [
        p if isinstance(p, str) else tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]


def _eos_ids(model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return {i for i in ids if i is not None}


def _context_cap(context: int | None, prompt_lengths: list[int], max_new_tokens: int | None) -> int:
    """``max_new_tokens`` capped (with a warning) to what the model's context leaves after the longest prompt. A
    prompt already past the context (a RoPE model extrapolates, unreliably) leaves ``max_new_tokens`` as asked."""
    room = None if context is None else context - max(prompt_lengths, default=0)
    if max_new_tokens is None:
        if room is None or room < 1:
            raise ValueError(
                f"cannot size the generation: the model's context ({context}) leaves no room after the longest prompt "
                f"({max(prompt_lengths, default=0)} tokens); give max_new_tokens"
            )
        return room
    if room is not None and room < 1:
        logger.warning(
            "The longest prompt (%d tokens) is past the model's context (%d): generating %d tokens beyond it.",
            max(prompt_lengths), context, max_new_tokens,
        )  # fmt: skip
    elif room is not None and max_new_tokens > room:
        logger.warning(
            "max_new_tokens %d exceeds what the model's context (%d tokens) leaves after the longest prompt: "
            "generating at most %d tokens.", max_new_tokens, context, room,
        )  # fmt: skip
        return room
    return max_new_tokens


def _rng_fork(device):
    import torch

    devices = [device] if getattr(device, "type", "cpu") == "cuda" else []
    return torch.random.fork_rng(devices=devices)


def _sampling_kwargs(decoding: Decoding) -> dict:
    if decoding.greedy:  # None: no warper, and no "generation flags are not valid" warning
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": decoding.temperature, "top_p": decoding.top_p, "top_k": decoding.top_k}


class GenerateBackend:
    """transformers' ``model.generate`` in batches of ``batch_size`` sequences, left padding."""

    name = "generate"

    def __init__(self, model, tokenizer, *, batch_size: int = 64):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    def generate(self, prompts: list, decoding: Decoding, *, seed: int | None = 0, first_index: int = 0,
                 problems_per_batch: int | None = None, progress: bool = False) -> Generation:  # fmt: skip
        """Batches of ``problems_per_batch`` problems (default: ``batch_size // num_samples``, at least one problem's
        samples), each sampling batch seeded with ``seed`` + the global index of its first problem (``first_index``
        + its position), so a problem's samples depend on its batch, not on what was generated before it."""
        import torch
        from tqdm.auto import tqdm

        model, tokenizer = self.model, self.tokenizer
        texts = chat_prompts(tokenizer, prompts)
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        context = getattr(model.config, "max_position_embeddings", None)
        max_new = _context_cap(context, lengths, decoding.max_new_tokens)
        eos = _eos_ids(model, tokenizer)
        n = decoding.num_samples
        per_batch = problems_per_batch or max(1, self.batch_size // n)
        flat: list[Sample] = []
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        seeded = not decoding.greedy and seed is not None
        bar = tqdm(total=len(texts), desc=f"generating (n={n}, up to {max_new} tokens)", unit="problem",
                   disable=not progress, leave=False)  # fmt: skip
        try:
            with _rng_fork(model.device) if seeded else contextlib.nullcontext(), torch.no_grad():
                for i in range(0, len(texts), per_batch):
                    if seeded:
                        torch.manual_seed(seed + first_index + i)
                    batch = [t for t in texts[i : i + per_batch] for _ in range(n)]
                    enc = tokenizer(
                        batch, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
                    ).to(model.device)
                    ids = model.generate(
                        **enc,
                        max_new_tokens=max_new,
                        eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id,
                        **_sampling_kwargs(decoding),
                    )
                    tails = ids[:, enc["input_ids"].shape[1] :]
                    texts_out = tokenizer.batch_decode(tails, skip_special_tokens=True)
                    for tail, text in zip(tails.tolist(), texts_out):
                        end = next((j for j, t in enumerate(tail) if t in eos), None)
                        flat.append(Sample(text, len(tail) if end is None else end, end is None))
                    bar.update(len(batch) // n)
        finally:
            bar.close()
            model.train(was_training)
        seconds = time.perf_counter() - start
        samples = [flat[i * n : (i + 1) * n] for i in range(len(texts))]
        return Generation(samples, max_new, seconds, self.name, {"batch_size": self.batch_size})


def generate_texts(model, tokenizer, prompts: list, decoding: Decoding, *, batch_size: int = 64, seed=0) -> list:
    """The completion texts, one per prompt and sample in order (``num_samples`` per prompt, flattened)."""
    out = GenerateBackend(model, tokenizer, batch_size=batch_size).generate(prompts, decoding, seed=seed)
    return [s.text for row in out.samples for s in row]


def generate_completions(
    model, tokenizer, prompts: list, *, batch_size: int = 64, max_new_tokens: int = 64, do_sample: bool = False, **gen
) -> list[str]:
    """Decoded assistant completions (special tokens stripped) for conversational prompts, one per prompt: greedy,
    or sampled from torch's global generator with ``temperature`` / ``top_p`` / ``top_k`` from ``gen``
    (transformers' defaults 1.0 / 1.0 / 50 where not given). The evaluation package's ``generate`` backend
    (:class:`GenerateBackend`: batches of ``batch_size``, left padding) does the work."""
    unknown = set(gen) - {"temperature", "top_p", "top_k"}
    if unknown:
        raise TypeError(f"generate_completions: unsupported generation arguments {sorted(unknown)}")
    decoding = Decoding(max_new_tokens=max_new_tokens)
    if do_sample:
        settings = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, **gen}
        decoding = Decoding(num_samples=1, max_new_tokens=max_new_tokens, **settings)
    return generate_texts(model, tokenizer, prompts, decoding, batch_size=batch_size, seed=None)


def evaluate_accuracy(
    model,
    tokenizer,
    dataset,
    *,
    batch_size: int = 64,
    max_new_tokens: int | None = None,
    do_sample: bool = False,
    **gen,
) -> float:
    """Fraction of `dataset` rows of the bundled task (:func:`grpo_family.tasks.make_arithmetic_dataset`) whose
    generated final answer equals the gold one (greedy by default)."""
    from grpo_family.tasks.arithmetic import arithmetic_reward  # the task pulls in datasets: only when asked

    if max_new_tokens is None:
        max_new_tokens = max(len(s) for s in dataset["solution"]) + 8
    completions = generate_completions(
        model,
        tokenizer,
        list(dataset["prompt"]),
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        **gen,
    )
    rewards = arithmetic_reward(completions, list(dataset["answer"]))
    return sum(r or 0.0 for r in rewards) / max(1, len(rewards))


def _checkpoint_dtype(path: str) -> str:
    """The dtype the checkpoint was saved in (config.json), as vLLM names it; ``auto`` when it does not say."""
    import json

    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except OSError:
        return "auto"
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in ("float32", "float16", "bfloat16") else "auto"


class _NoTemplateWarmup(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Chat template warmup failed")


class VLLMBackend:
    """vLLM's offline ``LLM`` engine (``pip install -e ".[vllm]"``, or the CPU build: README, "vLLM on a CPU
    machine"). ``dtype``: ``checkpoint`` (default: the dtype the weights were saved in), or any vLLM dtype."""

    name = "vllm"

    def __init__(self, model_path: str, tokenizer, *, dtype: str = "checkpoint", seed: int = 0, **engine_kwargs):
        try:
            from vllm import LLM
        except ImportError as error:
            raise EvalSetupError(
                '--backend vllm needs vLLM: pip install -e ".[vllm]" on a GPU machine, or on a CPU machine the '
                "separate environment of README's 'vLLM on a CPU machine'. Or use --backend generate."
            ) from error
        from grpo_family.integrations.vllm_cpu import DEFAULT_CPU_KVCACHE_GIB, vllm_platform_is_cpu

        if vllm_platform_is_cpu() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = DEFAULT_CPU_KVCACHE_GIB  # unset, vLLM takes most of the RAM
            logger.warning("vLLM on CPU: VLLM_CPU_KVCACHE_SPACE=%s GiB of KV cache", DEFAULT_CPU_KVCACHE_GIB)
        # Prompts arrive as token ids and outputs are decoded with our tokenizer (skip_tokenizer_init): vLLM's own
        # chat-template warm-up then fails harmlessly and would print a traceback.
        logging.getLogger("vllm.renderers.base").addFilter(_NoTemplateWarmup())
        self.dtype = _checkpoint_dtype(model_path) if dtype == "checkpoint" else dtype
        self.tokenizer, self.seed = tokenizer, seed
        start = time.perf_counter()
        self.llm = LLM(model=model_path, dtype=self.dtype, seed=seed, skip_tokenizer_init=True, **engine_kwargs)
        self.startup_seconds = time.perf_counter() - start
        self.context = self.llm.llm_engine.model_config.max_model_len

    def generate(self, prompts: list, decoding: Decoding, *, seed: int | None = 0, progress: bool = False,
                 **_batching) -> Generation:  # fmt: skip
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if seed is not None and seed != self.seed:
            logger.warning("vLLM samples with the engine's seed %d, not %d", self.seed, seed)

        tokenizer = self.tokenizer
        ids = tokenizer(chat_prompts(tokenizer, prompts), add_special_tokens=False)["input_ids"]
        max_new = _context_cap(self.context, [len(i) for i in ids], decoding.max_new_tokens)
        eos = sorted({tokenizer.eos_token_id})
        params = SamplingParams(
            n=decoding.num_samples,
            temperature=decoding.temperature,
            top_p=decoding.top_p,
            top_k=decoding.top_k if decoding.top_k > 0 else -1,
            max_tokens=max_new,
            stop_token_ids=eos,
            detokenize=False,
        )  # no per-request seed: the engine's (vLLM's CPU build refuses per-request generators)
        start = time.perf_counter()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params, use_tqdm=progress)
        seconds = time.perf_counter() - start
        samples = []
        for output in outputs:
            row = []
            for out in output.outputs:
                tokens = list(out.token_ids)
                truncated = out.finish_reason == "length"
                if tokens and tokens[-1] in eos:
                    tokens = tokens[:-1]
                row.append(Sample(tokenizer.decode(tokens, skip_special_tokens=True), len(tokens), truncated))
            samples.append(row)
        return Generation(samples, max_new, seconds, self.name, {"dtype": self.dtype,
                                                                  "startup_seconds": self.startup_seconds})  # fmt: skip


def _vllm_sampling_params(**kwargs):
    from vllm import SamplingParams

    return SamplingParams(**kwargs)


class TrainerVLLMBackend:
    """The training run's own vLLM engine, as TRL 1.16's ``GRPOTrainer`` holds it (``trainer.vllm_generation``):
    colocate mode generates on each process's own ``LLM`` (the problems split between processes); server mode sends
    the whole set from the main process to the server (``main_only``: the server batches, and only the main process
    holds a client). :meth:`sync` pushes the current weights first when the step changed since the last push, as
    TRL's own generation does (every process calls it: under ZeRO-3 it gathers the shards). Sampling: one request per
    problem, seeded with ``seed`` + its global index in colocate mode (independent of the split); the server's
    sampling is the server's."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.engine = trainer.vllm_generation
        self.mode = self.engine.mode
        self.main_only = self.mode == "server"
        self.name = f"vllm-{self.mode}"

    def sync(self) -> None:
        trainer = self.trainer
        if trainer.state.global_step != getattr(trainer, "_last_loaded_step", None):
            self.engine.sync_weights()
            trainer._last_loaded_step = trainer.state.global_step

    def _context(self) -> int | None:
        if self.mode == "colocate":
            return self.engine.llm.llm_engine.model_config.max_model_len
        return getattr(self.trainer.model.config, "max_position_embeddings", None)

    def generate(self, prompts: list, decoding: Decoding, *, seed: int | None = 0, first_index: int = 0,
                 progress: bool = False, **_batching) -> Generation:  # fmt: skip
        engine, tokenizer = self.engine, self.trainer.processing_class
        ids = tokenizer(chat_prompts(tokenizer, prompts), add_special_tokens=False)["input_ids"]
        max_new = _context_cap(self._context(), [len(i) for i in ids], decoding.max_new_tokens)
        eos = _eos_ids(self.trainer.model, tokenizer)
        sampling = {"n": decoding.num_samples, "temperature": decoding.temperature, "top_p": decoding.top_p,
                    "top_k": decoding.top_k if decoding.top_k > 0 else -1, "max_tokens": max_new}  # fmt: skip
        start = time.perf_counter()
        if self.mode == "colocate":
            seeded = seed is not None and not decoding.greedy
            params = [_vllm_sampling_params(**sampling, seed=seed + first_index + i if seeded else None)
                      for i in range(len(ids))]  # fmt: skip
            if engine.enable_sleep_mode:  # as TRL's own generation: weights back if they were discarded, then KV
                if engine._llm_weights_sleeping:
                    engine.sync_weights()
                engine.llm.wake_up(tags=["kv_cache"])
            outputs = engine.llm.generate([{"prompt_token_ids": i} for i in ids], sampling_params=params,
                                          use_tqdm=progress)  # fmt: skip
            if engine.enable_sleep_mode:
                engine.llm.sleep(level=2)
                engine._llm_weights_sleeping = True
            rows = [[list(o.token_ids) for o in output.outputs] for output in outputs]
        else:
            sampling["top_k"] = decoding.top_k
            out = engine.vllm_client.generate(prompts=ids, **sampling)
            flat = out["completion_ids"]
            n = decoding.num_samples
            rows = [flat[i * n : (i + 1) * n] for i in range(len(ids))]
        seconds = time.perf_counter() - start
        samples = []
        for row in rows:
            decoded = []
            for tokens in row:
                end = next((j for j, t in enumerate(tokens) if t in eos), None)
                kept = tokens if end is None else tokens[:end]
                decoded.append(Sample(tokenizer.decode(kept, skip_special_tokens=True), len(kept), end is None))
            samples.append(decoded)
        return Generation(samples, max_new, seconds, self.name, {"engine": f"the training run's vLLM ({self.mode})"})
