"""What ``--model`` names, resolved before anything loads: a model folder, a training output folder (the model saved
at its root, else its newest ``checkpoint-N``), a LoRA adapter folder (its base model from ``adapter_config.json``),
or a Hub id (offline: it must be in the cache, or be the Hub model a local alias was made from, whose installed
stand-in is used). Each failure says what was expected and how to fix it."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from ..errors import EvalSetupError, ModelNotInstalledError

__all__ = ["ResolvedModel", "load_model", "resolve_model"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# A tokenizer saved from a `tokenizers` object (the bundled tiny model's): AutoTokenizer would swap in the model
# type's own class (Qwen2Tokenizer), which rebuilds a byte-level pipeline and drops characters such as newlines.
_PLAIN_FAST_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


@dataclass(frozen=True)
class ResolvedModel:
    """``path``: a folder with ``config.json`` or a Hub id; ``adapter``: a LoRA adapter folder on top of it;
    ``kind``: ``folder``, ``training output``, ``checkpoint``, ``lora``, ``hub`` or ``local alias``; ``tokenizer``: where the
    tokenizer is read from."""

    given: str
    path: str
    kind: str
    tokenizer: str
    adapter: str | None = None

    def describe(self) -> str:
        base = f"{self.kind}: {self.path}"
        return base if self.adapter is None else f"{base} + LoRA adapter {self.adapter}"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in _TOKENIZER_FILES)


def _local_stand_in(hub_id: str, what: str) -> ResolvedModel | None:
    """The installed local model made from Hub model ``hub_id`` (a LoRA adapter trained on the alias
    ``smollm2-135m-instruct`` names ``HuggingFaceTB/SmolLM2-135M-Instruct`` as its base, so that it works once pushed),
    or None where there is none."""
    from grpo_family.models import LOCAL_MODELS
    from grpo_family.models import resolve_model as resolve_alias

    model = next((m for m in LOCAL_MODELS.values() if m.hub_id.lower() == hub_id.lower()), None)
    if model is None:
        return None
    try:
        path = resolve_alias(model.alias)
    except ModelNotInstalledError as err:
        raise EvalSetupError(f"{what} {hub_id!r}: not in the local Hub cache, and its local stand-in: {err}") from None
    return ResolvedModel(hub_id, path, "local alias", path)


def _resolve_hub(given: str, what: str) -> ResolvedModel:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(given, "config.json")
    if isinstance(cached, str):
        return ResolvedModel(given, given, "hub", given)
    if _offline() and (stand_in := _local_stand_in(given, what)) is not None:
        return stand_in
    if _offline():
        raise EvalSetupError(
            f"{what} {given!r}: no such local folder, and no Hub model of that name in the local cache "
            "(HF_HUB_OFFLINE is set). Give the folder of a saved model (examples/train.py writes one to its "
            f"output_dir, e.g. outputs/grpo), or download the Hub model once with network: hf download {given}"
        )
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(given)
    except Exception as error:  # noqa: BLE001 - not found, gated, no network: the same advice
        raise EvalSetupError(
            f"{what} {given!r}: no such local folder, and the Hub does not give a model of that name "
            f"({type(error).__name__}). Give the folder of a saved model (examples/train.py writes one to its "
            "output_dir, e.g. outputs/grpo) or an existing Hub id."
        ) from error
    return ResolvedModel(given, given, "hub", given)


def resolve_model(given: str, what: str = "--model") -> ResolvedModel:
    """Resolve ``given`` without loading weights; :class:`EvalSetupError` when it names nothing usable."""
    from grpo_family.models import LOCAL_MODELS
    from grpo_family.models import resolve_model as resolve_alias
    from grpo_family.preflight import looks_local

    if given.lower() in LOCAL_MODELS:  # a local alias (smollm2-135m-instruct): its converted checkpoint
        try:
            path = resolve_alias(given)
        except ModelNotInstalledError as err:
            raise EvalSetupError(f"{what} {given}: {err}") from None
        return ResolvedModel(given, path, "local alias", path)
    path = os.path.expanduser(given)
    if os.path.isfile(path):
        raise EvalSetupError(f"{what} {given}: a file, not a model folder. Give the folder holding config.json.")
    if not os.path.isdir(path):
        if looks_local(given):
            raise EvalSetupError(
                f"{what} {given}: no such directory. Give the folder of a saved model (config.json and weights), "
                "a training output folder, a LoRA adapter folder, or a Hub id of the form org/name."
            )
        return _resolve_hub(given, what)
    adapter_config = os.path.join(path, "adapter_config.json")
    if os.path.isfile(adapter_config):
        with open(adapter_config) as f:
            base = json.load(f).get("base_model_name_or_path")
        if not base:
            raise EvalSetupError(
                f"{what} {given}: a LoRA adapter whose adapter_config.json names no base_model_name_or_path. "
                "Merge it into its base model first (PeftModel.merge_and_unload) and pass that folder."
            )
        resolved = resolve_model(base, f"{what} {given}: its base model")
        tokenizer = path if _has_tokenizer(path) else resolved.tokenizer
        return ResolvedModel(given, resolved.path, "lora", tokenizer, adapter=path)
    if os.path.isfile(os.path.join(path, "config.json")):
        if not _has_tokenizer(path):
            raise EvalSetupError(
                f"{what} {given}: the model folder has no tokenizer files ({', '.join(_TOKENIZER_FILES)}). Save the "
                "tokenizer into it (tokenizer.save_pretrained) and evaluate again."
            )
        trained = os.path.isfile(os.path.join(path, "trainer_state.json")) or os.path.isfile(
            os.path.join(path, "results.json")
        )
        return ResolvedModel(given, path, "training output" if trained else "folder", path)
    checkpoints = sorted((int(m.group(1)), entry) for entry in os.listdir(path) if (m := _CHECKPOINT.match(entry)))
    if checkpoints:
        newest = os.path.join(path, checkpoints[-1][1])
        resolved = resolve_model(newest, what)
        return ResolvedModel(given, resolved.path, "checkpoint", resolved.tokenizer, resolved.adapter)
    raise EvalSetupError(
        f"{what} {given}: the folder holds no model (config.json), LoRA adapter (adapter_config.json) or "
        "checkpoint-N folder. Give the folder examples/train.py saved (its output_dir) or a model folder."
    )


def load_tokenizer(source: str):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = os.path.join(source, "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config) as f:
            if json.load(f).get("tokenizer_class") in _PLAIN_FAST_TOKENIZERS:
                return PreTrainedTokenizerFast.from_pretrained(source)
    return AutoTokenizer.from_pretrained(source)


def load_model(resolved: ResolvedModel, *, dtype: str = "auto", device: str | None = None):
    """``(model, tokenizer)`` in eval mode, a LoRA adapter merged into its base."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype)
    if resolved.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, resolved.adapter).merge_and_unload()
    tokenizer = load_tokenizer(resolved.tokenizer)
    if tokenizer.chat_template is None:
        raise EvalSetupError(
            f"--model {resolved.given}: the tokenizer has no chat template, and evaluation prompts are "
            "conversations. Evaluate a chat model, or save a tokenizer with a chat_template into the folder."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.eval()
    return model, tokenizer
