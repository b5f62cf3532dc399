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
    left_to_right,
    make_arithmetic_dataset,
    needs_precedence,
    solve,
    split_into_steps,
)
from .tiny_model import (
    build_tiny_model,
    build_tokenizer,
    load_warm_start,
    teacher_solutions,
    train_warm_start,
    warm_start_dir,
    warm_start_key,
)

DEFAULT_TRAIN_EXAMPLES = 2000
DEFAULT_EVAL_EXAMPLES = 200

# GRPO settings of the embedded default (`examples/train.py` with no model or dataset). From the warm start (greedy
# held-out accuracy ~0.2, pass@8 ~0.8), GRPO at 5e-5 learns to do multiplication first within ~50 steps; 2e-4
# learns as fast without collapsing. `benchmarks/learning.py` measures every method with these settings.
DEFAULT_GRPO_ARGS = {
    "per_device_train_batch_size": 64,
    "num_generations": 8,
    "max_completion_length": 40,
    "learning_rate": 5e-5,
    "lr_scheduler_type": "constant",
    "beta": 0.0,
    "temperature": 1.0,
    "max_steps": 100,
    "logging_steps": 2,
    "save_strategy": "no",
    "report_to": "none",
}

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
    "extract_answer",
    "load_warm_start",
    "left_to_right",
    "make_arithmetic_dataset",
    "needs_precedence",
    "solve",
    "split_into_steps",
    "teacher_solutions",
    "train_warm_start",
    "warm_start_dir",
    "warm_start_key",
]
