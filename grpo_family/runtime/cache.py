"""A folder built once, shared by every process that needs it (the warm start of the tiny model; a converted model):
one process builds it under a :class:`~grpo_family.runtime.pidlock.PidLock` and publishes it whole, the others wait; a
builder that was killed is noticed at once (its PID is gone) and another process builds instead; a folder that is
incomplete or corrupt is named and rebuilt.

A published folder holds :data:`MANIFEST`: the size of every file. :func:`cache_problem` compares the folder with it
(a truncated file, a missing one); :func:`load_cached` also rebuilds once when loading raises (a corrupt file of the
right size). :func:`load_cached` publishes a folder only after its own loader has loaded it from the temporary folder,
so a build that wrote too little (the files a loader needs are not guessed here) raises instead of being published.

Any process may build, global rank 0 or not: :func:`save_model_folder` writes a model folder itself, because
``save_pretrained`` of transformers 5.x writes nothing but the tokenizer on a rank other than 0 once torch.distributed
is initialised.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from ..errors import CacheBuildError
from .pidlock import PidLock

logger = logging.getLogger(__name__)

MANIFEST = "grpo_family_manifest.json"
T = TypeVar("T")


def cache_root() -> Path:
    """Where the caches built once live: ``$GRPO_FAMILY_CACHE``, else ``~/.cache/grpo_family``."""
    root = os.environ.get("GRPO_FAMILY_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "grpo_family"


def save_model_folder(model, tokenizer, folder: str | os.PathLike) -> None:
    """Write what ``save_pretrained`` writes for ``model`` and ``tokenizer`` (config, generation config, tokenizer,
    ``model.safetensors`` without tied duplicates), from whichever process calls it.

    ``PreTrainedModel.save_pretrained`` of transformers 5.x writes config and weights only where
    ``torch.distributed.get_rank() == 0`` once torch.distributed is initialised, whatever ``is_main_process`` says
    (``should_save_on_this_rank``); a cache is built by whichever process holds its lock, so the model's files are
    written here through the same public pieces instead."""
    from safetensors.torch import save_file
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.dtype = str(model.dtype).split(".")[1]
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    if model.can_generate():
        model.generation_config.save_pretrained(folder)
    state_dict = remove_tied_weights_from_state_dict(model.state_dict(), model)
    tensors = {name: tensor.detach().contiguous() for name, tensor in state_dict.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


@contextmanager
def one_process_build() -> Iterator[None]:
    """Build a cache folder as the one process it is: outside a live ZeRO-3 configuration.

    While ``TrainingArguments`` hold a DeepSpeed ZeRO-3 config, transformers creates every model partitioned across
    the ranks (``deepspeed.zero.Init``: parameters of shape ``[0]``) and loads weights with collectives. A cache is
    built by whichever single process holds its lock, so its model must be whole and local: a conversion copying
    weights into a partitioned model failed with "size mismatch ... current model is torch.Size([0])" on the first
    ZeRO-3 launch with a fresh cache. transformers keeps that config behind a module-level weak reference, with a
    public setter and unsetter but no getter, hence the one private read."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:  # transformers without its DeepSpeed integration: nothing can be live
        yield
        return
    live = getattr(hf_deepspeed, "_hf_deepspeed_config_weak_ref", None)
    config = live() if live is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


def write_manifest(folder: Path) -> None:
    """Record the size of every file under ``folder`` (written last: its presence means the folder is whole)."""
    sizes = {
        str(path.relative_to(folder)): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"files": sizes}, indent=1))


def cache_problem(folder: Path, legacy_complete: Callable[[Path], bool] | None = None) -> str | None:
    """None when ``folder`` is whole; otherwise what is wrong with it. A folder published before manifests existed
    counts as whole when ``legacy_complete(folder)`` says so."""
    if not folder.is_dir():
        return "missing"
    manifest = folder / MANIFEST
    if not manifest.is_file():
        if legacy_complete is not None and legacy_complete(folder):
            return None
        return f"no {MANIFEST} (it was not written completely)"
    try:
        sizes = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as error:
        return f"its {MANIFEST} is unreadable ({type(error).__name__})"
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, {size} when it was written"
    return None


def build_once(
    path: str | os.PathLike,
    build: Callable[[Path], None],
    *,
    what: str,
    timeout: float = 600.0,
    legacy_complete: Callable[[Path], bool] | None = None,
    rebuild_if_older_than: float | None = None,
    verify: Callable[[Path], object] | None = None,
) -> Path:
    """``path``, built by ``build(tmp)`` (which writes the folder's files into ``tmp``) unless it is already whole.

    One process builds (the holder of ``<path>.lock``), into a temporary sibling folder published with
    ``os.replace``, so nobody sees a half-written folder; the others wait up to ``timeout`` seconds for a live
    builder, and take over at once from one that died. ``rebuild_if_older_than``: build even if the folder looks whole
    (its content failed to load), unless another process rebuilt it since (:func:`_published`). ``verify(tmp)`` runs
    on the built folder before it is published: when it raises, nothing is published and :class:`CacheBuildError`
    names the problem. ``what`` names the folder in messages."""
    path = Path(path)
    lock = PidLock(path.with_name(path.name + ".lock"))
    deadline = time.monotonic() + timeout
    waited_for = None
    rebuild = rebuild_if_older_than is not None
    while rebuild or cache_problem(path, legacy_complete) is not None:
        holder = lock.acquire()
        if holder is not None:
            if holder != waited_for:
                logger.warning("Waiting for %s to finish building %s (%s).", holder.describe(), what, path)
                waited_for = holder
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Waited {timeout:.0f}s for {holder.describe()} to build {what} in {path}. If that process is "
                    f"stuck, stop it (kill {holder.pid}) and run again."
                )
            time.sleep(0.5)
            continue
        try:
            problem = cache_problem(path, legacy_complete)
            if rebuild and problem is None and _published(path) <= rebuild_if_older_than:
                problem = "its files could not be loaded"
            if problem is not None:
                if problem != "missing":
                    logger.warning("%s in %s is incomplete or corrupt (%s): rebuilding it.", what, path, problem)
                tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
                try:
                    with one_process_build():
                        build(tmp)
                    if verify is not None:
                        try:
                            with one_process_build():
                                verify(tmp)
                        except Exception as error:  # noqa: BLE001 - any loader's error means the same here
                            raise CacheBuildError(
                                f"{what} was built but its loader cannot load it ({type(error).__name__}: "
                                f"{str(error)[:300]}); nothing was published in {path}. This is a bug in the code "
                                "that builds it: report it with this message."
                            ) from error
                    write_manifest(tmp)
                    if path.exists():
                        shutil.rmtree(path)
                    os.replace(tmp, path)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            rebuild = False
        finally:
            lock.release()
    return path


def load_cached(
    path: str | os.PathLike,
    build: Callable[[Path], None],
    load: Callable[[Path], T],
    *,
    what: str,
    timeout: float = 600.0,
    legacy_complete: Callable[[Path], bool] | None = None,
) -> T:
    """``load(path)`` of the folder :func:`build_once` makes (published only once ``load`` has loaded it); when loading
    the published folder raises (a corrupt file), the folder is named in a warning, rebuilt once and loaded again."""
    path = build_once(path, build, what=what, timeout=timeout, legacy_complete=legacy_complete, verify=load)
    published = _published(path)
    try:
        return load(path)
    except Exception as error:  # noqa: BLE001 - any loader's error means the same here
        logger.warning("%s in %s could not be loaded (%s: %s): rebuilding it.", what, path, type(error).__name__,
                       str(error)[:200])  # fmt: skip
    path = build_once(
        path,
        build,
        what=what,
        timeout=timeout,
        legacy_complete=legacy_complete,
        rebuild_if_older_than=published,
        verify=load,
    )
    return load(path)


def _published(path: Path) -> float:
    """When ``path`` was last published (its manifest's, else the folder's modification time)."""
    manifest = path / MANIFEST
    return (manifest if manifest.exists() else path).stat().st_mtime
