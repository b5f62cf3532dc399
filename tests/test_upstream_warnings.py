"""The deprecation notices the libraries under the trainers print and no user can act on are silenced where the
trainers are imported (``grpo_family/trainers/__init__.py``), each by its exact message: torch's for the collectives
DeepSpeed's ZeRO-3 calls at every step (402 of the 1,140 lines of a 2-process ZeRO-3 demo) and transformers' for the
gradient-checkpointing names TRL still uses. The check runs in a fresh interpreter (pytest's own filters would hide
the notices), the same code before and after the import: it fails if a notice is not silenced, if another one is,
and when a library stops printing one (then its filter can go)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# DeepSpeed's two calls (no process group here: the notice comes first, then "Default process group has not been
# initialized"), TRL reading transformers' old gradient_checkpointing name, and a notice nobody silences.
CODE = """
import tempfile, torch, torch.distributed as dist
from trl import GRPOConfig
for fn in (dist.all_gather_into_tensor, dist.reduce_scatter_tensor):
    try:
        fn(torch.zeros(2), torch.zeros(1))
    except ValueError:
        pass
GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True)
warnings.warn("`torch.distributed.all_reduce` is deprecated", FutureWarning)
"""
SILENCED = (
    "`torch.distributed.all_gather_into_tensor` is deprecated",
    "`torch.distributed.reduce_scatter_tensor` is deprecated",
    "`gradient_checkpointing` is deprecated",
)


def test_upstream_deprecation_notices_are_silenced_by_their_message():
    """One fresh interpreter (``-W always``: every notice shows, each time) runs CODE before and after importing
    the trainers, whose filters go in front of that one."""
    block = "".join(f"        {line}\n" for line in CODE.strip().splitlines())
    script = (
        "import json, warnings\n"
        "shown = []\n"
        "for step in ('before', 'after'):\n"
        "    if step == 'after':\n"
        "        import grpo_family.trainers\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        f"{block}"
        "    shown.append([str(w.message) for w in seen if issubclass(w.category, FutureWarning)])\n"
        "print(json.dumps(shown))\n"
    )
    out = subprocess.run([sys.executable, "-W", "always", "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    for notice in SILENCED:  # the libraries still print them (when one stops, its filter can go)
        assert any(m.startswith(notice) for m in before), (notice, before)
    assert after == ["`torch.distributed.all_reduce` is deprecated"]
