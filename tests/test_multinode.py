"""Multi-process and multi-node behaviour: caches built by any rank, decisions shared by every rank, and (marker
``multinode``, .ci/multinode) two accelerate launchers on 127.0.0.1 standing in for two machines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _env(**extra: str) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.multiprocess
def test_a_cache_built_by_rank_1_loads_on_every_rank(tmp_path):
    """transformers 5.x's ``save_pretrained`` writes config and weights only on global rank 0 once torch.distributed
    is initialised: a warm start built by rank 1 (rank 0 held back at a barrier, so rank 1 takes the cache lock) was
    published with its tokenizer files only, and loading it failed on both ranks."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
        "--main_process_port", str(29500 + os.getpid() % 1000),
        str(TESTS / "dist" / "cache_nonzero_builder.py"), str(tmp_path / "warm-start"),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=ROOT)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    assert "rank 1: loaded" in result.stdout


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
