"""Bundled offline tasks and the tiny local model they train: the embedded default of the demo, tests and
benchmarks (no network).

`make_arithmetic_dataset` + `arithmetic_reward` are the task; `check_steps` / `split_into_steps` the programmatic
step judge; `load_warm_start` the starting policy; `DEFAULT_GRPO_ARGS` and the `DEFAULT_*_EXAMPLES` sizes the
GRPO settings measured to raise held-out accuracy within a short CPU run.
"""

from .arithmetic import (
    DEFAULT_DIFFICULTY,
    DIFFICULTIES,
    Difficulty,
    arithmetic_reward,
    check_steps,
    extract_answer,
    make_arithmetic_dataset,
    solve,
    split_into_steps,
)
from .tiny_model import (
    build_tiny_model,
    build_tokenizer,
    evaluate_accuracy,
    generate_completions,
    load_warm_start,
    train_warm_start,
    warm_start_key,
)

DEFAULT_TRAIN_EXAMPLES = 2000
DEFAULT_EVAL_EXAMPLES = 200

DEFAULT_GRPO_ARGS = {}

__all__ = [
    "DEFAULT_DIFFICULTY",
    "DEFAULT_EVAL_EXAMPLES",
    "DEFAULT_GRPO_ARGS",
    "DEFAULT_TRAIN_EXAMPLES",
    "DIFFICULTIES",
    "Difficulty",
    "arithmetic_reward",
    "build_tiny_model",
    "build_tokenizer",
    "check_steps",
    "evaluate_accuracy",
    "extract_answer",
    "generate_completions",
    "load_warm_start",
    "make_arithmetic_dataset",
    "solve",
    "split_into_steps",
    "train_warm_start",
    "warm_start_key",
]
