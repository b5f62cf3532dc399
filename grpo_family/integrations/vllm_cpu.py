"""vLLM on a CPU machine: the colocate weight sync TRL's own path cannot do there, and the start-up checks.

TRL 1.16 syncs weights into a colocated vLLM one parameter at a time through the model's ``load_weights``, which
calls each vLLM parameter's ``weight_loader``. vLLM's CPU backend repacks every Linear weight for its GEMM
kernels after loading and replaces the parameter, so the first sync fails with ``AttributeError: 'Parameter'
object has no attribute 'weight_loader'``. vLLM's own ``reload_weights`` (model runner) restores the checkpoint
layout, loads, and repacks again; one case it misses is a tied ``lm_head``: its packed copy of the embedding is
not rebuilt when the embedding is reloaded, so sampling keeps using the old output layer (the sampler/trainer
log-prob gap grows step after step). :func:`reload_weights_sync` does both, and :func:`install_cpu_weight_sync`
puts it in place of TRL's ``sync_weights`` only where vLLM runs on CPU; everywhere else TRL's path is unchanged.

Server mode pushes weights through vLLM's NCCL weight-transfer engine, which needs CUDA on both ends:
:func:`check_vllm_settings` stops such a run at start with the fix, instead of failing inside TRL's client (or
training on stale weights).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

# GiB of KV cache vLLM's CPU backend reserves when `VLLM_CPU_KVCACHE_SPACE` is unset. vLLM's own default is a
# share of the machine's RAM (`gpu_memory_utilization`, 0.9 in TRL) on top of the trainer's memory, which fails
# on a machine that also trains; 1 GiB holds the embedded default's whole batch many times over.
DEFAULT_CPU_KVCACHE_GIB = "1"


def engine_env(kv_cache_gib: str = DEFAULT_CPU_KVCACHE_GIB) -> dict[str, str]:
    """This process's environment for a child that runs vLLM on CPU (tests, benchmarks): offline, a bounded KV cache
    unless ``VLLM_CPU_KVCACHE_SPACE`` is set, and vLLM's compile caches kept under ``~/.cache/grpo_family`` so that
    later engines start warm (~60-100 s cold, ~15-35 s warm here) unless ``VLLM_CACHE_ROOT`` /
    ``TORCHINDUCTOR_CACHE_DIR`` say otherwise."""
    root = os.environ.get("GRPO_FAMILY_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "grpo_family"))
    cache = os.path.join(root, "vllm-compile")
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", kv_cache_gib),
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", os.path.join(cache, "vllm")),
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor")),
    }


def vllm_platform_is_cpu() -> bool:
    """Whether the installed vLLM runs on CPU (the ``vllm-cpu`` build); False without vLLM (TRL says to install it)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False

    return current_platform.is_cpu()


def check_vllm_settings(args: Any) -> None:
    """Stop at start, with the fix, a vLLM setting that cannot work on this machine, and turn off TRL's
    importance-sampling correction where structured outputs make it meaningless. No-op without ``use_vllm``."""
    if not getattr(args, "use_vllm", False):
        return
    if getattr(args, "vllm_structured_outputs_regex", None) and getattr(
        args, "vllm_importance_sampling_correction", False
    ):
        # vLLM masks every token the regex forbids and renormalises: its (processed) log-probs are those of the
        # constrained distribution, the trainer's of the unconstrained one, so trainer/sampler ratios are not a
        # sampler mismatch but the regex's mask (2e-11 seen on the embedded default), and would scale the loss away.
        args.vllm_importance_sampling_correction = False
        logger.warning(
            "--vllm_structured_outputs_regex: vLLM samples from the distribution restricted to the regex and reports "
            "its log-probs renormalised over the allowed tokens; the trainer's are not, so TRL's importance-sampling "
            "ratios would measure the regex (they fell to 2e-11), not a sampler mismatch, and scale the loss towards "
            "0. The importance-sampling correction (--vllm_importance_sampling_correction) is off for this run."
        )
    mode = getattr(args, "vllm_mode", "colocate")
    if mode == "server" and (getattr(args, "use_cpu", False) or not torch.cuda.is_available()):
        raise ValueError(
            "--vllm_mode server cannot train on this machine: after every step TRL pushes the new weights to the "
            "vLLM server through vLLM's NCCL weight-transfer engine, which needs a CUDA GPU on the trainer and on "
            "the server, and this trainer runs on CPU. Without the push, every step would sample from the initial "
            "weights. On a CPU machine use --vllm_mode colocate (vLLM runs inside each training process and "
            "receives the weights in memory); a `trl vllm-serve` / `vllm serve` server still works here for "
            "generation alone, e.g. as a judge (--judge_base_url)."
        )
    if mode == "colocate" and getattr(args, "vllm_model_impl", "vllm") == "transformers":
        raise ValueError(
            "--vllm_model_impl transformers cannot run colocated: vLLM's Transformers backend decorates the "
            "transformers model class itself for torch.compile (vllm.compilation.decorators.support_torch_compile), "
            "in the process that also trains a model of that class, whose next forward then fails "
            "(AttributeError: 'Qwen2Model' object has no attribute 'do_not_compile'). Use --vllm_model_impl vllm "
            "(the default) with --vllm_mode colocate; the Transformers backend works in a server of its own process."
        )
    if mode == "colocate" and vllm_platform_is_cpu():
        if getattr(args, "vllm_enable_sleep_mode", False):
            raise ValueError(
                "--vllm_enable_sleep_mode needs a GPU: vLLM's CPU backend has no sleep mode. Drop the flag."
            )
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = DEFAULT_CPU_KVCACHE_GIB
            logger.warning(
                "VLLM_CPU_KVCACHE_SPACE is unset: reserving %s GiB of KV cache for vLLM on CPU (vLLM's default "
                "reserves most of the RAM). Export VLLM_CPU_KVCACHE_SPACE=<GiB> to choose.",
                DEFAULT_CPU_KVCACHE_GIB,
            )


def retie_lm_head(model: torch.nn.Module, tie_word_embeddings: bool) -> bool:
    """Rebuild the packed output layer of a vLLM model whose ``lm_head`` shares the input embedding's weight.

    ``reload_weights`` writes the new embedding into the shared parameter but only re-processes the layers it
    loaded, and the tied ``lm_head`` (never in the checkpoint) keeps the packed copy made at start-up. Returns
    whether a tied head was found and rebuilt.
    """
    lm_head = getattr(model, "lm_head", None)
    if not tie_word_embeddings or lm_head is None or getattr(lm_head, "quant_method", None) is None:
        return False
    embedding = next(
        (m for m in model.modules() if m is not lm_head and getattr(m, "weight", None) is lm_head.weight), None
    )
    if embedding is None:  # a vLLM model that re-created the parameter: tie it again before packing
        embedding = model.get_submodule("model.embed_tokens")
        lm_head.weight = embedding.weight
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True


def reload_weights_sync(vllm_generation: Any) -> Callable[[], None]:
    """A ``sync_weights`` for TRL's ``VLLMGeneration`` in colocate mode that works on vLLM's CPU backend.

    The parameters come from TRL's own iterator (``_iter_named_params``: it gathers ZeRO-3 shards and merges PEFT
    adapters, and every process must walk it because gathering is collective); each is copied before vLLM takes
    it, since a gathered ZeRO-3 tensor is released when the iterator moves on.
    """

    def sync_weights() -> None:
        llm = vllm_generation.llm
        runner = llm.llm_engine.model_executor.driver_worker.model_runner
        weights = ((name, tensor.detach().clone()) for name, tensor in vllm_generation._iter_named_params())
        runner.reload_weights(weights_iterator=weights)
        hf_config = runner.model_config.hf_config
        tied = getattr(hf_config.get_text_config(), "tie_word_embeddings", False)
        retie_lm_head(runner.get_model(), tied)
        llm.reset_prefix_cache()

    return sync_weights


def install_cpu_weight_sync(trainer: Any) -> bool:
    """Give ``trainer``'s colocated vLLM the CPU-capable sync where vLLM runs on CPU; returns whether it did."""
    if not getattr(trainer, "use_vllm", False) or trainer.vllm_mode != "colocate" or not vllm_platform_is_cpu():
        return False
    trainer.vllm_generation.sync_weights = reload_weights_sync(trainer.vllm_generation)
    return True


def shutdown_colocated_vllm(trainer: Any) -> bool:
    """Shut ``trainer``'s colocated vLLM engine down now; returns whether there was one.

    vLLM tears its engine down in a finalizer at interpreter exit, destroying its process groups and then the
    default one. A script that ends training the usual way (``accelerator.end_training()``, which destroys the
    default group first) leaves vLLM's groups invalid by then, and every rank printed vLLM's ``ValueError: Invalid
    process group specified`` traceback at exit (exit code 0). Called before that, vLLM destroys its groups while
    they are valid (the default one too, so ``end_training`` finds nothing left to destroy); nothing may use
    torch.distributed afterwards.
    """
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if llm is None:
        return False
    llm.llm_engine.engine_core.shutdown()
    return True
