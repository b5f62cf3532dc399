"""Judging a generation batch: what the main process asks the judge for each completion (from its dataset row), one
batched call under a deadline that never raises, and the verdicts per completion (docs/methods/sgpo.md §3).

SGPO's reward-transform stage (``SGPOTrainer.transform_rewards``) gathers the items of every process to the main
process, which calls :func:`judge_items`, and broadcasts the result.
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
import time
from typing import Any

from ..rewards.extract import completion_message, completion_text
from .config import GRACE_S, JudgeConfig
from .step_judges import JudgeRequest, ProgrammaticJudge, has_final_answer
from .steps import split_steps

logger = logging.getLogger(__name__)


def _problem_text(row: dict, column: str | None) -> str:
    if column is not None:
        return str(row.get(column) or "")
    prompt = row.get("prompt")
    if isinstance(prompt, str) or prompt is None:
        return prompt or ""
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return completion_text(users[-1:] or prompt)


def _judge_text(completion: Any) -> str:
    """The text the judge sees: the whole completion, reasoning included (docs/methods/sgpo.md §2.2, item 1).

    :func:`~grpo_family.rewards.extract.completion_text` (the message an answer reward reads), with the message's
    chain of thought put back in front: when the tokenizer has a response schema (TRL sets one when tools are
    used; some tokenizers ship one), TRL parses a conversational completion into ``reasoning_content`` (or
    ``thinking``, per model family) and a ``content`` holding only what follows ``</think>``. The reasoning is
    restored as ``<think>\\n...\\n</think>\\n\\n`` + content (Qwen3's rendering).
    """
    text, message = completion_text(completion), completion_message(completion)
    if message is None:
        return text
    reasoning = message.get("reasoning_content") or message.get("thinking")
    if not isinstance(reasoning, str) or not reasoning.strip():
        return text
    block = "<think>\n" + reasoning.strip("\n") + "\n</think>"
    return f"{block}\n\n{text}" if text.strip() else block


def _clean_verdict(verdict: Any, num_steps: int) -> tuple[Any, int, str]:
    """``(first_error, calls, reason)`` from whatever a judge returned: a :class:`JudgeVerdict`-like object or a
    bare verdict. Anything but ``None``, NaN or an int in ``1..K`` is a failure; never raises (it runs on the main
    process between two collectives, where an exception would leave the other processes waiting)."""
    try:
        return _read_verdict(verdict, num_steps)
    except Exception as error:  # noqa: BLE001 - e.g. a verdict object whose attributes raise
        return math.nan, 1, f"unreadable verdict ({type(error).__name__}: {error})"


def _read_verdict(verdict: Any, num_steps: int) -> tuple[Any, int, str]:
    value = getattr(verdict, "first_error", verdict)
    votes = getattr(verdict, "votes", None)
    reported = getattr(verdict, "num_calls", None)  # model calls, retries included (JudgeVerdict.num_calls)
    if isinstance(reported, numbers.Integral) and not isinstance(reported, bool) and reported >= 0:
        calls = int(reported)
    else:  # not reported: one call per vote
        calls = len(votes) if isinstance(votes, list) else 1
    reasons = [r for r in getattr(verdict, "reasons", None) or [] if r]
    if value is None:
        return None, calls, ""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and 1 <= int(value) <= num_steps:
        return int(value), calls, ""
    if isinstance(value, float) and math.isnan(value):
        return math.nan, calls, reasons[0] if reasons else "judge failure"
    return math.nan, calls, f"invalid verdict {value!r} for {num_steps} steps"


def check_judge_columns(config: JudgeConfig, dataset, judge) -> None:
    """Set-up check: the judge's dataset columns exist in ``dataset`` (and, for the programmatic judge given no
    judge object, the first problem is one it can check); raises ``ValueError`` naming the column otherwise."""
    columns = getattr(dataset, "column_names", None)
    if not columns:
        return
    if config.problem_column is not None and config.problem_column not in columns:
        raise ValueError(f"judge_problem_column {config.problem_column!r} is not a training-set column ({columns}).")
    if config.answer_column not in columns:
        raise ValueError(
            f"judge_answer_column {config.answer_column!r} is not a training-set column ({columns}): the "
            "judge would never see the gold answer. Set judge_answer_column to the gold final answer's column."
        )
    if config.reference_column not in columns:
        if config.require_reference:
            raise ValueError(
                f"require_reference=True but the training set has no {config.reference_column!r} column "
                f"({columns}): SGPO would never judge. Set judge_reference_column, or require_reference=False."
            )
        logger.warning(
            "SGPO: no %r column in the training set; the judge will see the gold answer (column %r) as the reference.",
            config.reference_column,
            config.answer_column,
        )
    if judge is None and config.type == "programmatic" and len(dataset) > 0:
        row = dataset[0]
        probe = JudgeRequest(
            _problem_text(row, config.problem_column),
            row.get(config.reference_column),
            row.get(config.answer_column),
            (),
        )
        if not ProgrammaticJudge().supports(probe):
            raise ValueError(
                "judge_type='programmatic' checks the bundled arithmetic task only, and the first training "
                f"problem is not one ({probe.problem[:80]!r}). Use judge_type='openai' (e.g. a `vllm serve` "
                "judge) or 'transformers', or pass your own judge: SGPOTrainer(..., judge=...)."
            )


def judge_item(index: int, row: dict, completion: Any, config: JudgeConfig) -> dict:
    """What the main process needs to judge one completion (global flat ``index``) of a dataset ``row``."""
    gold = row.get(config.answer_column)
    reference = row.get(config.reference_column)
    return {
        "index": index,
        "text": _judge_text(completion),
        "problem": _problem_text(row, config.problem_column),
        "gold": None if gold is None else str(gold),
        "reference": str(reference) if reference else None,
    }


def call_judge(judge, requests: list[JudgeRequest], batch_timeout: float) -> tuple[list | None, str]:
    """Run ``judge`` under ``batch_timeout``: ``(verdicts, "")`` or ``(None, reason)``; never raises."""
    box: dict[str, Any] = {}

    def run():
        try:
            box["verdicts"] = list(judge.judge(requests))
        except BaseException as error:  # noqa: BLE001 - the judge must never stop training
            box["error"] = f"{type(error).__name__}: {error}"

    worker = threading.Thread(target=run, name="sgpo-judge-batch", daemon=True)
    worker.start()
    worker.join(batch_timeout + GRACE_S)
    if worker.is_alive():  # left to finish in the background; its answer is ignored
        return None, f"no answer within judge_batch_timeout={batch_timeout:g}s"
    if "error" in box:
        return None, box["error"]
    if len(box["verdicts"]) != len(requests):
        return None, f"{len(box['verdicts'])} verdicts for {len(requests)} requests"
    return box["verdicts"], ""


def judge_items(judge, items: list[dict], config: JudgeConfig, *, read_final_answer: bool = False) -> dict:
    """Main process: steps, one batched judge call, verdicts per global completion index, and the call's stats."""
    results, requests, owners, answered, skipped = {}, [], [], [], 0
    for item in items:
        if config.require_reference and not item["reference"]:
            skipped += 1
            continue
        steps = split_steps(item["text"], splitter=config.step_splitter, max_steps=config.max_steps)
        if not steps:  # empty completion: RTS = 0 without asking (docs/methods/sgpo.md §2.4)
            results[item["index"]] = (None, 0, "", False)
            continue
        requests.append(JudgeRequest(item["problem"], item["reference"], item["gold"], tuple(steps)))
        owners.append(item["index"])
        # Only SGPO's "last_step" policy reads it (a NONE verdict on a response with a wrong final answer -> k = K).
        answered.append(read_final_answer and has_final_answer(item["text"]))
    stats = {"requests": len(requests), "calls": 0, "latency": None, "skipped": skipped}
    if requests:
        start = time.perf_counter()
        verdicts, reason = call_judge(judge, requests, config.batch_timeout)
        stats["latency"] = time.perf_counter() - start
        for n, (index, request) in enumerate(zip(owners, requests)):
            if verdicts is None:
                results[index] = (math.nan, request.num_steps, reason, answered[n])
                continue
            value, calls, why = _clean_verdict(verdicts[n], request.num_steps)
            stats["calls"] += calls
            results[index] = (value, request.num_steps, why, answered[n])
    return {"results": results, "stats": stats}


__all__ = ["call_judge", "check_judge_columns", "judge_item", "judge_items"]
