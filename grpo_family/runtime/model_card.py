"""The model card's training-details section: the method, its hyperparameters and the final metrics."""

from __future__ import annotations

import dataclasses
from typing import Any

from .redaction import _card_value

# The GRPO knobs a reader needs to reproduce a run; the method's own config fields are added to these.
CARD_HYPERPARAMETERS = (
    "learning_rate", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
    "max_completion_length", "temperature", "beta", "epsilon", "loss_type", "scale_rewards", "max_steps",
    "num_train_epochs", "seed",
)  # fmt: skip


def training_details(
    args: Any, base_config: type, log_history: list[dict], *, name: str, method_name: str, paper: dict
) -> str:
    """The section appended to TRL's card: every field of ``args`` that ``base_config`` does not define (the
    method's own options), :data:`CARD_HYPERPARAMETERS`, and the last value of each logged metric."""
    base_fields = {f.name for f in dataclasses.fields(base_config)}
    method_fields = [f.name for f in dataclasses.fields(args) if f.name not in base_fields]
    rows = [(field, _card_value(getattr(args, field))) for field in (*method_fields, *CARD_HYPERPARAMETERS)]
    final = {}
    for entry in log_history:  # the last value of each metric (secrets never reach the logs)
        final.update({k: v for k, v in entry.items() if isinstance(v, int | float)})
    section = [
        f"\n## {name} training details (grpo_family)\n",
        f"Method: `{method_name}` ({name}); paper: {paper.get('title', 'n/a')}.\n",
        "| hyperparameter | value |\n|---|---|",
        *(f"| {field} | {value} |" for field, value in rows),
        "\nFinal training metrics:\n\n| metric | value |\n|---|---|",
        *(f"| {k} | {v:.6g} |" for k, v in sorted(final.items())),
    ]
    return "\n".join(section) + "\n"
