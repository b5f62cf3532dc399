"""The grpo_family section of the model card: method, paper, hyperparameters and final metrics."""

from __future__ import annotations

import dataclasses
import os

from .redaction import _card_value


class ModelCardMixin:
    """Appends a training-details section to TRL's card. ``_card_base_config`` is the config class whose fields are
    not the method's own (the base trainer sets it); every other field of ``self.args`` is listed."""

    _card_base_config: type

    # The GRPO knobs a reader needs to reproduce a run; the method's own config fields are added to these.
    _CARD_HYPERPARAMETERS = (
        "learning_rate", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
        "max_completion_length", "temperature", "beta", "epsilon", "loss_type", "scale_rewards", "max_steps",
        "num_train_epochs", "seed",
    )  # fmt: skip

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card (method name, tags, paper title, id and citation) plus hyperparameters and final metrics."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        path = os.path.join(self.args.output_dir, "README.md")
        if not self.is_world_process_zero() or not os.path.exists(path):
            return
        base_fields = {f.name for f in dataclasses.fields(self._card_base_config)}
        method_fields = [f.name for f in dataclasses.fields(self.args) if f.name not in base_fields]
        rows = [
            (name, _card_value(getattr(self.args, name))) for name in (*method_fields, *self._CARD_HYPERPARAMETERS)
        ]
        final = {}
        for entry in self.state.log_history:  # the last value of each metric (secrets never reach the logs)
            final.update({k: v for k, v in entry.items() if isinstance(v, int | float)})
        section = [
            f"\n## {self._name} training details (grpo_family)\n",
            f"Method: `{self.method_name}` ({self._name}); paper: {self._paper.get('title', 'n/a')}.\n",
            "| hyperparameter | value |\n|---|---|",
            *(f"| {name} | {value} |" for name, value in rows),
            "\nFinal training metrics:\n\n| metric | value |\n|---|---|",
            *(f"| {k} | {v:.6g} |" for k, v in sorted(final.items())),
        ]
        with open(path, "a") as f:
            f.write("\n".join(section) + "\n")
