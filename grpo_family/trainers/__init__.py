"""Trainers: one thin GRPOTrainer subclass per method.

Importing them silences two deprecation notices that come from the libraries under the trainers, name nothing the
user can change, and would otherwise repeat: each filter matches one library's exact message, nothing wider.
"""

import warnings

# transformers 5 renamed gradient checkpointing to activation checkpointing; TRL 1.16 still calls the old names
# (four notices per run, also in notebooks and Python scripts).
warnings.filterwarnings("ignore", message=r"`\w*gradient_checkpointing\w*` is deprecated", category=FutureWarning)
# torch 2.13 deprecated the two collectives DeepSpeed 0.19 calls for ZeRO-3's parameter all-gathers and gradient
# reduce-scatters (deepspeed/comm/torch.py); they printed at every step: 402 of the 1,140 lines of a 2-process
# ZeRO-3 demo.
warnings.filterwarnings(
    "ignore",
    message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    category=FutureWarning,
)
