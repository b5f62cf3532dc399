"""Multi-process and multi-node behaviour: caches built by any rank, decisions shared by every rank, and (marker
``multinode``, .ci/multinode) two accelerate launchers on 127.0.0.1 standing in for two machines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_distributed import launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.multiprocess
def test_a_cache_built_by_rank_1_loads_on_every_rank(tmp_path):
    """transformers 5.x's ``save_pretrained`` writes config and weights only on global rank 0 once torch.distributed
    is initialised: a warm start built by rank 1 (rank 0 held back at a barrier, so rank 1 takes the cache lock) was
    published with its tokenizer files only, and loading it failed on both ranks."""
    stdout = launch("cache_nonzero_builder.py", str(tmp_path / "warm-start"), timeout=600)
    assert "rank 1: loaded" in stdout


def test_a_cache_folder_its_loader_cannot_load_is_not_published(tmp_path):
    """What a rank other than 0 got from ``save_pretrained`` (tokenizer files, no config, no weights) is refused
    before publishing, by the loader itself, with a message; nothing is left at the cache's path."""
    from grpo_family.cache import CacheBuildError, load_cached
    from grpo_family.tasks.tiny_model import build_tokenizer

    def build_tokenizer_only(folder: Path) -> None:
        build_tokenizer().save_pretrained(folder)

    def load(folder: Path):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(folder)

    with pytest.raises(CacheBuildError, match="cannot load it"):
        load_cached(tmp_path / "cache", build_tokenizer_only, load, what="A test folder")
    assert not (tmp_path / "cache").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.multiprocess
def test_resume_decisions_are_made_once_and_shared(tmp_path):
    """Node-local output folders (a working folder per rank): each rank used to pick its own newest checkpoint and
    judge it alone, so rank 1 stopped alone ("not written completely") while rank 0 went on to wait at the next
    collective. Now rank 0 decides, and the file check is all-gathered: both ranks stop with one message."""
    import json

    stdout = launch("resume_decisions.py", str(tmp_path), timeout=600)
    rank0, rank1 = json.loads(stdout.split("OUTCOMES ", 1)[1].splitlines()[0])
    assert rank0["resolved"] == rank1["resolved"] == "value out/checkpoint-2"  # rank 1's own newest is checkpoint-1
    assert rank0["checked"] == rank1["checked"]
    assert rank0["checked"].startswith("PreflightError: Not every process can continue:")
    assert "rank 1 on " in rank0["checked"] and "rank 0 on " not in rank0["checked"]
    assert (
        "has no trainer_state.json" in rank0["checked"]
        and "give --output_dir on a disk all nodes share" in (rank0["checked"])
    )
    assert rank0["crashed"] == "KeyError: 'a bug in the decision'"
    assert rank1["crashed"].startswith("PreflightError: The main process (rank 0) failed before training: KeyError")


def test_no_doc_or_recipe_teaches_the_deprecated_vllm_server_command():
    """TRL 1.16 deprecates `trl vllm-serve` (removed in 2.0; trl/scripts/vllm_serve.py prints its replacement):
    the docs, README and recipes teach `VLLM_SERVER_DEV_MODE=1 vllm serve <model> --weight-transfer-config
    '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1`."""
    import re

    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples" / "recipes").glob("*")]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in files
        if path.is_file()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"trl\s+vllm-serve", line)
    ]
    assert found == [], f"the deprecated `trl vllm-serve` is taught at {found}"
