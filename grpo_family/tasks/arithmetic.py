"""Multi-step integer arithmetic with one checkable step per line: the bundled offline task.

A problem is an expression over small non-negative integers with `+`, `-` and `*`::

    prompt:    Compute 7+5*3-4.
    solution:  5*3=15
               7+15=22
               22-4=18
               Answer: 18

The reference solution applies one operator per line in the standard order (every `*` first, left to right, then
`+`/`-` left to right); every intermediate value lies in `[0, max_value]`, so no line needs a minus sign. The final
line is `Answer: N`. Most problems of the default difficulty *need precedence*: a `*` follows a `+` or `-`, so
evaluating strictly left to right (`left_to_right`, the classic student error the warm start is taught to make
often) gives a wrong answer. `arithmetic_reward` checks only the final answer, under the answer contract every
grpo_family reward uses (`docs/answer_extraction.md`); `check_steps` locates the first wrong line
(the programmatic step judge SGPO can use); `split_into_steps` is the matching segmenter (one step per non-empty
line).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from datasets import Dataset

from grpo_family.rewards.contract import VALUE_SLOTS, AnswerReward, read_answer
from grpo_family.rewards.extract import completion_text
from grpo_family.rewards.values import integer_value, read_number

__all__ = [
    "DIFFICULTIES",
    "DEFAULT_DIFFICULTY",
    "ArithmeticReward",
    "Difficulty",
    "arithmetic_reward",
    "check_steps",
    "extract_answer",
    "left_to_right",
    "make_arithmetic_dataset",
    "needs_precedence",
    "read_arithmetic_answer",
    "solve",
    "split_into_steps",
]

OPERATORS = "+-*"


@dataclass(frozen=True)
class Difficulty:
    """How hard the generated problems are.

    Each problem has between `min_ops` and `max_ops` operators drawn from `operators`, operands drawn uniformly
    from `[min_operand, max_operand]`, and every intermediate value of the reference solution in `[0, max_value]`
    (problems breaking that are redrawn). With `precedence_share` set, that share of the problems *needs
    precedence* (`needs_precedence`) and the rest does not, and the left-to-right evaluation's intermediate values
    must lie in `[0, max_value]` too (so the warm start's wrong-order solutions are well formed); with None the
    operators are drawn uniformly.
    """

    name: str
    min_ops: int
    max_ops: int
    min_operand: int = 1
    max_operand: int = 9
    max_value: int = 99
    operators: str = OPERATORS
    precedence_share: float | None = None


DIFFICULTIES = {
    # 1-2 operations, operators drawn uniformly; handy for debugging (the warm start: 0.74 greedy).
    "easy": Difficulty("easy", min_ops=1, max_ops=2, max_operand=9),
    # The embedded default: 9 in 10 problems need precedence, which the warm start gets right in about 1 sample in
    # 5 (its teacher often evaluated left to right) and almost never greedily; RL fixes the order quickly.
    "default": Difficulty("default", min_ops=2, max_ops=3, max_operand=9, precedence_share=0.9),
    # Most groups of 8 samples are all wrong under the warm start: the regime SGPO targets.
    "hard": Difficulty("hard", min_ops=4, max_ops=5, max_operand=19, max_value=199),
}
DEFAULT_DIFFICULTY = DIFFICULTIES["default"]

# Every expression belongs to exactly one split, by a stable hash of its text (1 in 10 goes to "eval"), so the
# splits never overlap whatever the seeds.
_EVAL_BUCKETS = 10

# No two unbounded whitespace runs side by side: "1+2=3" + 10^5 spaces + "x" would backtrack quadratically.
_STEP_RE = re.compile(r"^\s*(\d+)\s*([-+*])\s*(\d+)\s*=\s*(\d+)(?:\s*\.)?\s*$")
_ANSWER_LINE_RE = re.compile(r"^\s*answer\s*:\s*(-?\d+)(?:\s*\.)?\s*$", re.IGNORECASE)
_EXPR_RE = re.compile(r"\d+(?:\s*[-+*]\s*\d+)+")


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _split_of(expression: str) -> str:
    bucket = int(hashlib.sha256(expression.encode()).hexdigest(), 16) % _EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def solve(numbers: list[int], ops: list[str]) -> list[tuple[int, str, int, int]]:
    """The reference steps `(a, op, b, a op b)`: each `*` left to right, then `+`/`-` left to right."""
    numbers, ops, steps = list(numbers), list(ops), []
    while ops:
        i = ops.index("*") if "*" in ops else 0
        a, op, b = numbers[i], ops[i], numbers[i + 1]
        c = _apply(a, op, b)
        steps.append((a, op, b, c))
        numbers[i : i + 2] = [c]
        del ops[i]
    return steps


def left_to_right(numbers: list[int], ops: list[str]) -> list[tuple[int, str, int, int]]:
    """The steps of strict left-to-right evaluation, ignoring precedence (wrong where `needs_precedence`)."""
    steps, value = [], numbers[0]
    for op, b in zip(ops, numbers[1:]):
        steps.append((value, op, b, _apply(value, op, b)))
        value = steps[-1][3]
    return steps


def needs_precedence(ops: list[str]) -> bool:
    """Whether a `*` follows a `+` or `-`: the problems where left-to-right evaluation is a different order."""
    return any(a in "+-" and b == "*" for a, b in zip(ops, ops[1:]))


def _format_solution(steps: list[tuple[int, str, int, int]]) -> str:
    lines = [f"{a}{op}{b}={c}" for a, op, b, c in steps]
    return "\n".join(lines + [f"Answer: {steps[-1][3]}"])


def _resolve_difficulty(difficulty: str | Difficulty) -> Difficulty:
    if isinstance(difficulty, Difficulty):
        return difficulty
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose from {sorted(DIFFICULTIES)} or pass a Difficulty")
    return DIFFICULTIES[difficulty]


def make_arithmetic_dataset(
    split: str = "train",
    num_examples: int = 1000,
    seed: int = 0,
    difficulty: str | Difficulty = "default",
) -> Dataset:
    """A deterministic `datasets.Dataset` of arithmetic problems.

    Columns: `prompt` (TRL conversational, one user message), `problem` (the user text), `answer` (gold final
    answer as a string), `solution` (reference solution, one step per line, ending with `Answer: N`) and
    `num_steps` (lines in the solution, the answer line included). The same `(split, num_examples, seed,
    difficulty)` always gives the same rows. Train and eval never share an expression. Rows are distinct while
    the split has enough distinct expressions; after that repeats are allowed.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    diff = _resolve_difficulty(difficulty)
    rng = random.Random(f"grpo_family-arithmetic-{diff}-{split}-{seed}")
    rows: dict[str, list] = {"prompt": [], "problem": [], "answer": [], "solution": [], "num_steps": []}
    seen: set[str] = set()
    attempts, max_attempts = 0, 200 * max(1, num_examples)
    while len(rows["answer"]) < num_examples:
        want_precedence = diff.precedence_share is not None and rng.random() < diff.precedence_share
        while True:  # redraw until a problem of the wanted kind fits the split and the value range
            attempts += 1
            num_ops = rng.randint(diff.min_ops, diff.max_ops)
            numbers = [rng.randint(diff.min_operand, diff.max_operand) for _ in range(num_ops + 1)]
            ops = [rng.choice(diff.operators) for _ in range(num_ops)]
            expression = "".join(f"{n}{op}" for n, op in zip(numbers, ops)) + str(numbers[-1])
            if _split_of(expression) != split or (expression in seen and attempts < max_attempts):
                continue
            steps = solve(numbers, ops)
            if any(not 0 <= c <= diff.max_value for *_, c in steps):
                continue
            if diff.precedence_share is None:
                break
            wrong_order = left_to_right(numbers, ops)
            if needs_precedence(ops) == want_precedence and all(0 <= c <= diff.max_value for *_, c in wrong_order):
                break
        seen.add(expression)
        problem = f"Compute {expression}."
        rows["prompt"].append([{"role": "user", "content": problem}])
        rows["problem"].append(problem)
        rows["answer"].append(str(steps[-1][3]))
        rows["solution"].append(_format_solution(steps))
        rows["num_steps"].append(len(steps) + 1)
    return Dataset.from_dict(rows)


def read_arithmetic_answer(text: str | None, mode: str = "train") -> tuple[Fraction | None, str]:
    """``(number, "")``: the one number a completion's answer slot holds under the answer contract
    (`docs/answer_extraction.md`: the final region after `</think>`, no hiding markup, exactly one slot — `Answer: N`,
    `The answer is N`, a box, an `<answer>` tag, or a one-line final region — and nothing after it); the number is
    a numeral (sign, thousands separators, decimals), number words, or either with a scale word. ``(None, why)``
    when the completion breaks the contract."""
    reading = read_answer(text or "", VALUE_SLOTS, mode)
    if reading.value is None:
        return None, reading.violation
    return read_number(reading.value, prose=mode != "strict")


def extract_answer(text: str, mode: str = "train") -> int | None:
    """The integer the completion's final answer is (see `read_arithmetic_answer`), or None: the completion breaks
    the answer contract, or its number is not an integer (`18.5`)."""
    number, _ = read_arithmetic_answer(text, mode)
    return number.numerator if number is not None and number.denominator == 1 else None


class ArithmeticReward(AnswerReward):
    """TRL reward function of the bundled task: 1.0 if the completion's one answer (see `read_arithmetic_answer`)
    equals the gold integer, else 0.0.

    `completions` are strings or conversational messages (the last assistant message is read; see
    `grpo_family.rewards.completion_text`); a None completion is no answer (0.0). `answer` is the dataset column,
    one per completion (a length mismatch is a ValueError, never a silent truncation). None (TRL's "not scorable")
    only where the gold answer itself is not an integer. ``mode``: ``"train"`` (default, the answer contract) or
    ``"eval"`` (the last slot counts, text after it is ignored). Logs the share of completions that break the
    contract as ``arithmetic_reward/contract_violations`` via TRL's ``log_metric``; running totals in ``.counts``.
    """

    def __init__(self, *, mode: str = "train", name: str = "arithmetic_reward"):
        super().__init__(mode, name)

    def __repr__(self) -> str:
        return f"ArithmeticReward(mode={self.mode!r})"

    def _gold(self, gold: Any) -> int | None:
        return None if isinstance(gold, bool) else integer_value(str(gold).strip())

    def _score(self, text: str, gold: int, mode: str) -> tuple[float, bool]:
        number, violation = read_arithmetic_answer(text, mode)
        return (1.0 if number == gold else 0.0), bool(violation)


arithmetic_reward = ArithmeticReward()


def split_into_steps(response) -> list[str]:
    """One step per non-empty line, stripped (string or conversational messages)."""
    return [line.strip() for line in completion_text(response).splitlines() if line.strip()]


def _parse_problem(problem) -> tuple[list[int], list[str]] | None:
    if not isinstance(problem, str):  # a prompt column entry: list of messages
        problem = "\n".join(str(m.get("content") or "") for m in problem if m.get("role") == "user")
    if "=" in problem:  # a solution, not a problem
        return None
    match = _EXPR_RE.search(problem)
    if match is None:
        return None
    tokens = re.findall(r"\d+|[-+*]", match.group(0))
    return [int(t) for t in tokens[0::2]], tokens[1::2]


def _legal_reductions(state: tuple, a: int, op: str, b: int) -> list[tuple]:
    """States reachable from `state` by reducing an adjacent `a op b` without changing the value."""
    numbers, ops = state
    out = []
    for i, o in enumerate(ops):
        if o != op or numbers[i] != a or numbers[i + 1] != b:
            continue
        before = ops[i - 1] if i > 0 else None
        after = ops[i + 1] if i + 1 < len(ops) else None
        # `*` binds tightest and associates, so it can always be reduced. A `+`/`-` cannot be reduced next to a
        # `*` (precedence) or right after a `-` (x-a+b is not x-(a+b)).
        if op != "*" and ("*" in (before, after) or before == "-"):
            continue
        out.append((numbers[:i] + (_apply(a, op, b),) + numbers[i + 2 :], ops[:i] + ops[i + 1 :]))
    return out


def check_steps(problem_or_solution, response) -> int | None:
    """1-based index of the first wrong step of `response` (see `split_into_steps`), or None if none is wrong.

    With a problem (the prompt text, the `prompt` column's messages, or a bare expression) the checker tracks the
    partially evaluated expression. A computation line `a op b=c` is right iff `a op b` is an adjacent pair of the
    current expression whose reduction keeps the expression's value (`*` before `+`/`-`, no `+`/`-` reduction
    right after a `-`) and `c` is its true value; so false arithmetic, values that are not in the problem or
    earlier results, and skipped or out-of-order operations are all errors, while any valid order is accepted.
    An `Answer: N` line is right iff `N` is the value of the problem. Any other line (prose, malformed, an
    operation after the expression is fully reduced) is wrong. A response that stops early with only right
    steps has no wrong step (None).

    Given a reference solution instead (lines `a op b=c`, ending with `Answer: N`), the only accepted order is the
    reference's: line j is right iff it equals the reference's line j (whitespace ignored) and the answer line
    iff its number is the reference answer.
    """
    steps = split_into_steps(response)
    parsed = _parse_problem(problem_or_solution)
    if parsed is None:
        reference = split_into_steps(problem_or_solution)
        gold = extract_answer("\n".join(reference))
        computations = ["".join(s.split()) for s in reference if _STEP_RE.match(s)]
        done = 0  # computation lines matched so far
        for j, line in enumerate(steps):
            answer = _ANSWER_LINE_RE.match(line)
            if answer is not None:
                if integer_value(answer.group(1)) != gold:
                    return j + 1
            elif done >= len(computations) or "".join(line.split()).rstrip(".") != computations[done]:
                return j + 1
            else:
                done += 1
        return None
    numbers, ops = parsed
    gold = solve(numbers, ops)[-1][3] if ops else numbers[0]
    states = {(tuple(numbers), tuple(ops))}
    for j, line in enumerate(steps):
        answer = _ANSWER_LINE_RE.match(line)
        if answer is not None:
            if integer_value(answer.group(1)) != gold:
                return j + 1
            continue
        step = _STEP_RE.match(line)
        if step is None or any(len(step.group(g)) > 1000 for g in (1, 3, 4)):  # no such number in a problem
            return j + 1
        a, op, b, c = int(step.group(1)), step.group(2), int(step.group(3)), int(step.group(4))
        if _apply(a, op, b) != c:
            return j + 1
        states = {new for state in states for new in _legal_reductions(state, a, op, b)}
        if not states:
            return j + 1
    return None
