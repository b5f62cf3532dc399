"""The keys of TRL's generation output the base class handles by name: the multimodal inputs a forward passes on,
and how each per-row tensor is padded (``tests/test_trl_contract.py`` pins them against the installed TRL)."""

from __future__ import annotations

__all__ = ["FORWARD_KEYS", "LEFT_PADDED", "PER_ROW", "RIGHT_PADDED"]

# Multimodal inputs TRL's generation batch may carry; forwards over a batch pass them like TRL's own forwards do.
FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
# Per-row tensors of TRL's generation output padded on the left (prompt side) / on the right (completion side), and
# per-row values without a width: how rows of several generation rounds are merged into one batch.
LEFT_PADDED = {"prompt_ids", "prompt_mask"}
RIGHT_PADDED = {
    "completion_ids", "completion_mask", "tool_mask", "old_per_token_logps", "sampling_per_token_logps",
    "ref_per_token_logps", "importance_sampling_ratio",
}  # fmt: skip
PER_ROW = {"advantages"}
