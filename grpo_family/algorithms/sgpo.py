"""SGPO: step-wise judged partial credit for all-negative groups (docs/methods/sgpo.md §2.4-2.10).

A judge verdict for one incorrect completion split into ``K`` numbered steps is

* an ``int`` ``k`` in ``1..K``: the first wrong step,
* ``None``: no wrong step found,
* ``float("nan")``: the judge failed (unparseable, out of range, timeout after retries).

The maths, in the order the trainer applies it:

1. ``vote_first_error``: ``M`` verdicts -> one (majority on position, ``None`` = ``K + 1``, ties -> smallest
   position, failures dropped; all failed -> failure). Sec. 2.10.
2. ``trajectory_score``: ``RTS = (k - 1) / K``; ``1`` for ``None`` (``no_error_policy="full_credit"``, the
   default; ``"last_step"`` reads ``None`` as ``k = K`` for a response that has a wrong final answer, Sec. 7 and
   Sec. 12 A12); ``0`` for an empty completion. Sec. 2.4.
3. ``partial_credit``: ``sigmoid(beta * (RTS - gamma))`` (paper Eq. 2) or ``RTS`` (``"linear"``, the
   "w/o {beta, gamma}" ablation), always strictly below the correct reward 1. Sec. 2.5.
4. ``sgpo_rewards``: binary correctness everywhere, partial credit for the incorrect completions of judged
   groups (``groups_to_judge``: all-negative groups by default), NaN where the judge failed. Sec. 2.6.

The advantage is GRPO's unchanged (Sec. 2.8: NaN-aware group mean/std, NaN -> advantage 0), and so is the
loss (Sec. 2.9); neither lives here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import torch

__all__ = [
    "MODES",
    "NO_ERROR_POLICIES",
    "SCOPES",
    "groups_to_judge",
    "is_failure",
    "partial_credit",
    "sgpo_rewards",
    "trajectory_score",
    "verdict_grid",
    "vote_first_error",
]

MODES = ("sigmoid", "linear")
SCOPES = ("all_negative", "all_incorrect")
NO_ERROR_POLICIES = ("full_credit", "last_step")

Verdict = int | float | None  # int = first wrong step (1-based), None = no error, nan = failure


def is_failure(verdict: Verdict) -> bool:
    """True for the failure verdict ``float("nan")``."""
    return isinstance(verdict, float) and math.isnan(verdict)


def _check_verdict(verdict: Verdict, num_steps: int) -> None:
    if verdict is None or is_failure(verdict):
        return
    if isinstance(verdict, bool) or not isinstance(verdict, int):
        raise TypeError(f"a verdict is an int, None or float('nan'), got {verdict!r}.")
    if not 1 <= verdict <= num_steps:
        raise ValueError(f"first wrong step {verdict} is outside 1..{num_steps}.")


def trajectory_score(
    first_error: Verdict,
    num_steps: int,
    *,
    no_error_policy: str = "full_credit",
    has_final_answer: bool = False,
) -> float:
    """Reasoning trajectory score RTS in ``[0, 1]`` (docs/methods/sgpo.md §2.4), NaN for a failed judge.

    ``(k - 1) / K`` for a first wrong step ``k``, ``1.0`` when no step is wrong (``None``), ``0.0`` for an
    empty completion (``num_steps == 0``: never judged, so its verdict is ignored). The denominator counts
    every step, including those after the error (paper: 5 steps, error at step 4 -> 3/5).

    ``no_error_policy`` decides what ``None`` (the judge found no wrong step) means (docs/methods/sgpo.md §7, §12 A12):
    ``"full_credit"`` (default, the paper) RTS = 1; ``"last_step"`` RTS = ``(K - 1) / K`` (``k = K``) when
    ``has_final_answer`` -- the response states a final answer, which is wrong since only incorrect responses
    are judged, so at least its answer step is wrong -- and still 1 for a response without one (truncated).
    """
    if no_error_policy not in NO_ERROR_POLICIES:
        raise ValueError(f"no_error_policy must be one of {NO_ERROR_POLICIES}, got {no_error_policy!r}.")
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}.")
    if num_steps == 0:
        return 0.0
    _check_verdict(first_error, num_steps)
    if first_error is None:
        if no_error_policy == "last_step" and has_final_answer:
            return (num_steps - 1) / num_steps
        return 1.0
    if is_failure(first_error):
        return math.nan
    return (first_error - 1) / num_steps


def vote_first_error(votes: Sequence[Verdict], num_steps: int) -> Verdict:
    """Majority vote over ``M`` independent verdicts for one completion (docs/methods/sgpo.md §2.10, §12 A11).

    Failures are dropped (all failed, or no votes -> ``nan``). ``None`` counts as position ``K + 1``. The most
    frequent position wins; ties go to the smallest position, which never over-credits, so ``None`` wins only
    with a strict plurality. The result does not depend on the order of the votes.
    """
    for v in votes:
        _check_verdict(v, num_steps)
    positions = [num_steps + 1 if v is None else v for v in votes if not is_failure(v)]
    if not positions:
        return math.nan
    counts = Counter(positions)
    winner = min(counts, key=lambda pos: (-counts[pos], pos))
    return None if winner == num_steps + 1 else winner


def partial_credit(
    rts: torch.Tensor, *, beta: float = 10.0, gamma: float = 0.5, mode: str = "sigmoid"
) -> torch.Tensor:
    """Reward of an incorrect completion from its RTS (paper Eq. 2; docs/methods/sgpo.md §2.5, E1), NaN passed through.

    ``"sigmoid"``: ``sigmoid(beta * (RTS - gamma))`` with slope ``beta`` and midpoint ``gamma`` (defaults 10 and
    0.5, docs/methods/sgpo.md §12 A1): in ``[0.006693, 0.993307]``, strictly increasing in RTS. ``"linear"``: ``RTS``.
    Either way the result is capped at the largest float below 1, so partial credit stays strictly below
    the correct-answer reward even where the sigmoid rounds to 1 (large ``beta``) or ``RTS = 1`` (linear).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
    if not (beta > 0 and math.isfinite(beta) and math.isfinite(gamma)):
        raise ValueError(f"need a finite beta > 0 and a finite gamma, got beta={beta}, gamma={gamma}.")
    credit = torch.sigmoid(beta * (rts - gamma)) if mode == "sigmoid" else rts
    below_one = 1.0 - torch.finfo(rts.dtype).eps / 2  # the largest float of this dtype below 1
    return torch.minimum(credit, torch.tensor(below_one, dtype=rts.dtype, device=rts.device))  # keeps NaN


def _as_bool(correct: torch.Tensor) -> torch.Tensor:
    if correct.dim() != 2:
        raise ValueError(f"correct must be (num_prompts, G), got shape {tuple(correct.shape)}.")
    if correct.dtype != torch.bool:
        if not torch.all((correct == 0) | (correct == 1)):
            raise ValueError("correct must be boolean (or 0/1).")
        correct = correct != 0
    return correct


def groups_to_judge(correct: torch.Tensor, *, scope: str = "all_negative") -> torch.Tensor:
    """Boolean ``(num_prompts,)``: which groups get judge-based partial credit (docs/methods/sgpo.md §2.6, §12 A5).

    ``"all_negative"`` (default, the paper's protocol): groups with no correct completion.
    ``"all_incorrect"`` (Eq. 2 read literally): every group with at least one incorrect completion.
    Only the incorrect completions of these groups are sent to the judge.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}.")
    correct = _as_bool(correct)
    return ~correct.any(dim=1) if scope == "all_negative" else ~correct.all(dim=1)


def sgpo_rewards(
    correct: torch.Tensor,
    first_error: Sequence[Sequence[Verdict]],
    num_steps: Sequence[Sequence[int]],
    *,
    beta: float = 10.0,
    gamma: float = 0.5,
    mode: str = "sigmoid",
    scope: str = "all_negative",
    no_error_policy: str = "full_credit",
    has_final_answer: Sequence[Sequence[bool]] | None = None,
) -> torch.Tensor:
    """SGPO rewards ``(num_prompts, G)`` that feed the unchanged GRPO advantage (docs/methods/sgpo.md §2.4-2.6, E2-E6).

    Args:
        correct: bool ``(num_prompts, G)``, the outcome verifier (an unparseable answer counts as incorrect).
        first_error: nested lists of verdicts (int / ``None`` / ``nan``), same shape; already voted (see
            :func:`vote_first_error`). Read only for the incorrect completions of judged groups, so any
            placeholder may stand elsewhere.
        num_steps: nested lists of step counts ``K`` (see ``grpo_family.judges.steps.split_steps``), same
            shape; read where ``first_error`` is.
        beta, gamma, mode: the partial-credit map, see :func:`partial_credit`.
        scope: which groups are judged, see :func:`groups_to_judge`.
        no_error_policy: ``"full_credit"`` (default) or ``"last_step"``, see :func:`trajectory_score`.
        has_final_answer: nested lists of bools, same shape: whether each response states a final answer; read
            with ``no_error_policy="last_step"`` (where it is required) for ``None`` verdicts.

    Returns:
        float rewards on ``correct``'s device (default dtype): ``1``/``0`` correctness, except incorrect
        completions of judged groups, which get partial credit in ``(0, 1)`` (``[0, 1)`` for ``"linear"``),
        or NaN where the judge failed. Groups outside the scope are exactly GRPO's binary rewards.
    """
    correct = _as_bool(correct)
    num_prompts, group_size = correct.shape
    if len(first_error) != num_prompts or len(num_steps) != num_prompts:
        raise ValueError("first_error and num_steps must have one row per prompt.")
    if no_error_policy not in NO_ERROR_POLICIES:
        raise ValueError(f"no_error_policy must be one of {NO_ERROR_POLICIES}, got {no_error_policy!r}.")
    if no_error_policy == "last_step" and has_final_answer is None:
        raise ValueError('no_error_policy="last_step" needs has_final_answer (which responses state an answer).')
    if has_final_answer is not None and len(has_final_answer) != num_prompts:
        raise ValueError("has_final_answer must have one row per prompt.")
    judged = groups_to_judge(correct, scope=scope)
    to_score = (judged[:, None] & ~correct).tolist()

    # Python loop only over the nested-list inputs; the reward map itself is vectorised.
    rts = torch.zeros(num_prompts, group_size, dtype=torch.float64)
    for b in range(num_prompts):
        if len(first_error[b]) != group_size or len(num_steps[b]) != group_size:
            raise ValueError(f"row {b} of first_error / num_steps must have {group_size} entries.")
        if has_final_answer is not None and len(has_final_answer[b]) != group_size:
            raise ValueError(f"row {b} of has_final_answer must have {group_size} entries.")
        for i in range(group_size):
            if to_score[b][i]:
                rts[b, i] = trajectory_score(
                    first_error[b][i],
                    int(num_steps[b][i]),
                    no_error_policy=no_error_policy,
                    has_final_answer=bool(has_final_answer[b][i]) if has_final_answer is not None else False,
                )

    dtype = torch.get_default_dtype()
    credit = partial_credit(rts.to(dtype), beta=beta, gamma=gamma, mode=mode)
    mask = torch.tensor(to_score, dtype=torch.bool).reshape(num_prompts, group_size)
    return torch.where(mask, credit, correct.cpu().to(dtype)).to(correct.device)


def verdict_grid(
    verdicts: Mapping[int, tuple], num_prompts: int, group_size: int
) -> tuple[list[list[Verdict]], list[list[int]], list[list[bool]], torch.Tensor]:
    """:func:`sgpo_rewards`' nested-list inputs from verdicts keyed by global flat index ``b * G + i``.

    ``verdicts[index]`` is ``(first_error, num_steps, reason, has_final_answer)``. Returns ``first_error`` (None
    where unjudged), ``num_steps`` (0), ``has_final_answer`` (False), each ``(num_prompts, G)`` nested lists, and the
    bool ``(num_prompts, G)`` tensor of the judged places.
    """
    first_error = [[None] * group_size for _ in range(num_prompts)]
    num_steps = [[0] * group_size for _ in range(num_prompts)]
    answered = [[False] * group_size for _ in range(num_prompts)]
    scored = torch.zeros(num_prompts * group_size, dtype=torch.bool)
    for index, (value, steps, _, has_answer) in verdicts.items():
        b, i = divmod(index, group_size)
        first_error[b][i], num_steps[b][i], answered[b][i] = value, steps, has_answer
        scored[index] = True
    return first_error, num_steps, answered, scored.view(num_prompts, group_size)
