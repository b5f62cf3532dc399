"""SGPO: Stepwise Guided Policy Optimization (Chen et al., TMLR; arXiv 2505.11595) on TRL's ``GRPOTrainer``.

GRPO gives every completion of an all-negative group (no correct answer) the same reward, hence no gradient. SGPO
asks a step-wise judge for the first wrong step ``k`` of each of those completions, turns it into the reasoning
trajectory score ``RTS = (k - 1) / K`` and the partial credit ``sigmoid(beta * (RTS - gamma))``, strictly between
0 and 1, and feeds that to the unchanged GRPO advantage and loss. Groups with a correct answer stay binary GRPO
and are never judged; judging is switched on only during the first ``sgpo_num_epochs`` epochs. Maths in
:mod:`grpo_family.algorithms.sgpo`, judges in :mod:`grpo_family.rewards.judges`, ``docs/methods/sgpo.md``.

Data flow per generation batch (the rewards are already gathered from every process, docs/methods/sgpo.md §3.6 adapted so
that the judge is asked once per completion, not once per process):

1. correctness ``c`` = the correctness reward function's value ``>= correctness_threshold`` (NaN = incorrect);
   which groups are judged (``judge_scope``) is decided on the gathered values, identically everywhere;
2. every process sends the whole text of its own to-be-judged completions (reasoning included, also where TRL
   parsed it into ``reasoning_content``; docs/methods/sgpo.md §2.2), with problem, gold answer and reference solution from
   its dataset rows, to the main process (``gather_object``);
3. the main process splits each into steps (:func:`~grpo_family.rewards.steps.split_steps`), calls the judge
   once for the whole batch (concurrently inside the judge), under a deadline, and broadcasts the verdicts
   (``broadcast_object_list``);
4. every process builds the same rewards: the correctness column is replaced by the SGPO reward in judged
   places, failures are NaN (advantage 0), and GRPO's group advantage runs on the result, stored in
   ``batch["rewards"]`` so the logged reward describes what was trained on.

A judge that is down, slow or talking nonsense costs at most ``judge_batch_timeout`` seconds per generation batch
and turns into NaN rewards (zero advantage) with a warning and the ``sgpo/judge_failures`` metric; training goes on.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
import textwrap
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object

from ..algorithms.grpo import is_constant, weighted_reward_sum
from ..algorithms.sgpo import (
    MODES,
    NO_ERROR_POLICIES,
    SCOPES,
    groups_to_judge,
    sgpo_rewards,
    trajectory_score,
    verdict_grid,
)
from ..rewards.extract import completion_message, completion_text
from ..rewards.judges import (
    HeuristicReferenceJudge,
    JudgeRequest,
    OpenAICompatibleJudge,
    ProgrammaticJudge,
    TransformersJudge,
    has_final_answer,
)
from ..rewards.steps import SPLITTERS, split_steps
from .base import GRPOFamilyConfig, GRPOFamilyTrainer

logger = logging.getLogger(__name__)

JUDGE_TYPES = ("programmatic", "openai", "transformers", "heuristic")
_GRACE_S = 1.0  # beyond judge_batch_timeout, for a judge that honours the deadline itself to hand back its results


@dataclass
class SGPOConfig(GRPOFamilyConfig):
    r"""Configuration for :class:`SGPOTrainer` (fields below; every ``GRPOConfig`` field works too).

    Partial credit: ``sigmoid(sgpo_beta * (RTS - sgpo_gamma))``. The paper says its two parameters are "taken as 10
    and 0.5"; read as slope 10 and midpoint 0.5 (the only reading where a "threshold" makes sense for RTS in
    [0, 1]; docs/methods/sgpo.md §12 A1). The literal reading (slope 0.5, midpoint 10) squeezes all partial credit into
    [0.0067, 0.0110] and behaves almost like ``partial_credit_mode="linear"``.

    The paper's loss is verl's GRPO: ``beta=0.001`` (k3 KL), ``epsilon=0.2``, token-mean (``loss_type="dapo"``,
    TRL's default); TRL's default ``beta`` is 0.0, so set it in a recipe. Keep ``mask_truncated_completions=False``
    (TRL's default): truncated but sound negatives are where SGPO's signal comes from.
    """

    sgpo_beta: float = field(
        default=10.0,
        metadata={
            "help": "Slope of the partial-credit sigmoid (beta_s). Default 10 (paper: '10 and 0.5', Sec. 12 A1)."
        },
    )
    sgpo_gamma: float = field(
        default=0.5,
        metadata={"help": "Midpoint of the partial-credit sigmoid (gamma_s). Default 0.5 (paper, Sec. 12 A1)."},
    )
    partial_credit_mode: str = field(
        default="sigmoid",
        metadata={
            "help": "'sigmoid' (paper Eq. 2, default) or 'linear' (reward = RTS: the 'w/o {beta, gamma}' ablation)."
        },
    )
    judge_scope: str = field(
        default="all_negative",
        metadata={
            "help": "Which groups are judged: 'all_negative' (no correct completion; the paper's experiments, "
            "default) or 'all_incorrect' (every incorrect completion of every group; Eq. 2 read literally)."
        },
    )
    sgpo_no_error_policy: str = field(
        default="full_credit",
        metadata={
            "help": "What a 'no wrong step' verdict (NONE) gives an incorrect response: 'full_credit' (RTS = 1; the "
            "paper; default) or 'last_step' (k = K, RTS = (K-1)/K, for a response that states a final answer, which "
            "is wrong by definition; one without an answer, e.g. truncated, keeps RTS = 1). 'States a final answer' "
            "is read from the judged text outside its <think> block: a complete \\boxed{}, an <answer></answer> "
            "block, an 'Answer:' line, 'the final answer is ...' or '#### ...' (grpo_family.rewards.judges."
            "has_final_answer). docs/methods/sgpo.md §7, §12 A12."
        },
    )
    sgpo_num_epochs: float | None = field(
        default=3.0,
        metadata={
            "help": "Judged rewards only while the (fractional) epoch counter is below this; plain GRPO afterwards. "
            "Default 3.0 (paper: first 3 of 12 epochs). None = always on."
        },
    )
    sgpo_max_steps: int | None = field(
        default=None,
        metadata={"help": "Alternative gate: judged rewards only before this optimizer step. Default None (no gate)."},
    )
    correctness_reward: str | None = field(
        default=None,
        metadata={
            "help": "Name of the reward function that decides correctness (its __name__ / TRL reward name); None = "
            "the first reward function. Its value is replaced by the SGPO reward where the judge scores; the other "
            "reward functions are added with their weights as usual."
        },
    )
    correctness_threshold: float = field(
        default=1.0,
        metadata={
            "help": "A completion is correct iff the correctness reward is >= this (NaN = incorrect). Default 1.0."
        },
    )
    step_splitter: str = field(
        default="paragraph",
        metadata={
            "help": "Where the step splitter's fallback chain starts: 'paragraph' (blank lines; default), 'line' or "
            "'sentence' (docs/methods/sgpo.md §2.2)."
        },
    )
    judge_max_steps: int | None = field(
        default=None,
        metadata={"help": "Merge steps into at most this many blocks before judging (bounds prompts). Default None."},
    )
    require_reference: bool = field(
        default=False,
        metadata={
            "help": "Judge only prompts with a reference solution (others keep GRPO's binary reward). Default False: "
            "the gold answer stands in for a missing reference (docs/methods/sgpo.md §12 A13)."
        },
    )
    judge_problem_column: str | None = field(
        default=None,
        metadata={"help": "Dataset column with the problem text; None = the last user message of the prompt."},
    )
    judge_answer_column: str = field(
        default="answer", metadata={"help": "Dataset column with the gold final answer (default 'answer')."}
    )
    judge_reference_column: str = field(
        default="solution",
        metadata={"help": "Dataset column with the reference solution shown to the judge (default 'solution')."},
    )
    judge_type: str = field(
        default="programmatic",
        metadata={
            "help": "'programmatic' (exact checker of the bundled arithmetic task; offline; default), 'openai' (any "
            "OpenAI-compatible endpoint, e.g. `vllm serve`; the paper's setting), 'transformers' (a local model) or "
            "'heuristic' (HeuristicReferenceJudge: flags the first stated result that is not a number of the "
            "reference solution or gold answer; crude, CPU only, for smoke tests and CI). A judge object passed to "
            "the trainer (judge=...) overrides this."
        },
    )
    judge_base_url: str | None = field(
        default=None,
        metadata={"help": "OpenAI-compatible API root, e.g. 'http://judge-host:8000/v1' (judge_type='openai')."},
    )
    judge_model: str | None = field(
        default=None,
        metadata={
            "help": "Served model name (openai; paper: o4-mini, Claude 3.7, DeepSeek-V3-0324, Qwen3-235B-A22B, "
            "QwQ-32B) or model path / Hub id (transformers)."
        },
    )
    judge_api_key_env: str = field(
        default="JUDGE_API_KEY",
        metadata={
            "help": "Environment variable holding the judge API key (never put the key itself in a config). Unset = "
            "no Authorization header. Default 'JUDGE_API_KEY'."
        },
    )
    num_judge_votes: int = field(
        default=1,
        metadata={
            "help": "Independent judge votes per completion, majority on the error position. Default 1 (paper: 1; 4 in Table 4)."
        },
    )
    judge_temperature: float | None = field(
        default=None, metadata={"help": "Judge sampling temperature; None = 0.0 for one vote, 0.6 for several."}
    )
    judge_max_tokens: int = field(
        default=16384,
        metadata={"help": "Judge completion budget per vote (reasoning judges need many). Default 16384."},
    )
    judge_structured_output: bool = field(
        default=False,
        metadata={
            "help": "judge_type='openai': constrain each verdict to the JSON {\"first_error_step\": j or null} "
            "(j within the response's steps) with the OpenAI API's response_format JSON schema, enforced by vLLM's "
            "structured outputs; no unparseable verdicts, but no written reasoning before the verdict. Default off."
        },
    )
    judge_timeout: float = field(
        default=600.0, metadata={"help": "Seconds for one judge HTTP request. Default 600 (reasoning judges)."}
    )
    judge_max_retries: int = field(
        default=2,
        metadata={
            "help": "Retries of a failed / unparseable judge request, with exponential backoff (judge_type='openai' "
            "only: the local 'transformers' judge does not retry). Default 2."
        },
    )
    judge_concurrency: int = field(default=64, metadata={"help": "Judge requests in flight at once. Default 64."})
    judge_batch_timeout: float = field(
        default=900.0,
        metadata={
            "help": "Deadline in seconds for judging one generation batch; what is still pending becomes a failure "
            "(NaN reward, advantage 0) and training goes on. Default 900."
        },
    )
    judge_prompt_template_path: str | None = field(
        default=None,
        metadata={
            "help": "Judge prompt template file ([system] / [user] sections, placeholders {problem}, "
            "{reference_solution}, {gold_answer}, {steps}, {num_steps}); None = the library's "
            "grpo_family/rewards/judge_prompt.txt."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if not (self.sgpo_beta > 0 and math.isfinite(self.sgpo_beta) and math.isfinite(self.sgpo_gamma)):
            raise ValueError(
                f"sgpo_beta must be finite and > 0 and sgpo_gamma finite (got {self.sgpo_beta}, {self.sgpo_gamma}); "
                "the paper's values are sgpo_beta=10, sgpo_gamma=0.5."
            )
        for name, value, allowed in (
            ("partial_credit_mode", self.partial_credit_mode, MODES),
            ("judge_scope", self.judge_scope, SCOPES),
            ("step_splitter", self.step_splitter, SPLITTERS),
            ("judge_type", self.judge_type, JUDGE_TYPES),
            ("sgpo_no_error_policy", self.sgpo_no_error_policy, NO_ERROR_POLICIES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
        if self.sgpo_num_epochs is not None and not self.sgpo_num_epochs >= 0:
            raise ValueError(f"sgpo_num_epochs must be >= 0 or None (always on), got {self.sgpo_num_epochs}.")
        if self.sgpo_max_steps is not None and self.sgpo_max_steps < 0:
            raise ValueError(f"sgpo_max_steps must be >= 0 or None, got {self.sgpo_max_steps}.")
        if self.judge_max_steps is not None and self.judge_max_steps < 1:
            raise ValueError(f"judge_max_steps must be >= 1 or None, got {self.judge_max_steps}.")
        if not math.isfinite(self.correctness_threshold):
            raise ValueError(f"correctness_threshold must be finite, got {self.correctness_threshold}.")
        if self.num_judge_votes < 1 or self.judge_concurrency < 1 or self.judge_max_retries < 0:
            raise ValueError(
                "num_judge_votes and judge_concurrency must be >= 1 and judge_max_retries >= 0 (got "
                f"{self.num_judge_votes}, {self.judge_concurrency}, {self.judge_max_retries})."
            )
        if not (self.judge_timeout > 0 and self.judge_batch_timeout > 0 and self.judge_max_tokens >= 1):
            raise ValueError("judge_timeout and judge_batch_timeout must be > 0 and judge_max_tokens >= 1.")
        if self.judge_batch_timeout + _GRACE_S >= self.ddp_timeout:
            raise ValueError(
                f"judge_batch_timeout ({self.judge_batch_timeout:g}s) must stay below ddp_timeout ({self.ddp_timeout}s): "
                "the other processes wait for the main process's judge inside a collective that times out after "
                "ddp_timeout. Lower judge_batch_timeout or raise ddp_timeout."
            )
        if self.judge_api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.judge_api_key_env):
            # Not echoed: this is most likely the key itself, which must not reach a log or a traceback.
            raise ValueError(
                "judge_api_key_env must be the NAME of the environment variable holding the judge API key (default "
                "'JUDGE_API_KEY'), not the key itself: export the key (e.g. `export JUDGE_API_KEY=...`) and pass "
                "the variable's name. The value given is not a valid variable name."
            )
        if self.judge_temperature is not None and not (
            math.isfinite(self.judge_temperature) and self.judge_temperature >= 0
        ):
            raise ValueError(f"judge_temperature must be finite and >= 0, or None, got {self.judge_temperature}.")
        if self.judge_structured_output and self.judge_type != "openai":
            raise ValueError(
                f"judge_structured_output applies to judge_type='openai' (a served judge), not {self.judge_type!r}."
            )
        if self.judge_temperature == 0 and self.num_judge_votes > 1:
            logger.warning("num_judge_votes > 1 with judge_temperature 0: the votes will be identical.")


def make_judge(args: SGPOConfig):
    """The judge ``args`` describe (``judge_type`` and the ``judge_*`` fields)."""
    if args.judge_type == "programmatic":
        return ProgrammaticJudge()
    if args.judge_type == "heuristic":
        return HeuristicReferenceJudge()
    if args.judge_type == "openai":
        if not args.judge_base_url or not args.judge_model:
            raise ValueError(
                "judge_type='openai' needs judge_base_url (e.g. 'http://judge-host:8000/v1' for `vllm serve`) and "
                "judge_model (the served model name), or pass a judge object: SGPOTrainer(..., judge=...)."
            )
        return OpenAICompatibleJudge(
            args.judge_base_url,
            args.judge_model,
            api_key_env=args.judge_api_key_env,
            num_votes=args.num_judge_votes,
            temperature=args.judge_temperature,
            max_tokens=args.judge_max_tokens,
            timeout=args.judge_timeout,
            max_retries=args.judge_max_retries,
            concurrency=args.judge_concurrency,
            batch_timeout=args.judge_batch_timeout,
            prompt_template=args.judge_prompt_template_path,
            structured=args.judge_structured_output,
        )
    if not args.judge_model:
        raise ValueError("judge_type='transformers' needs judge_model (a model path or Hub id), or pass judge=...")
    return TransformersJudge(
        args.judge_model,
        model_kwargs={"dtype": "auto"},
        num_votes=args.num_judge_votes,
        temperature=args.judge_temperature,
        max_new_tokens=args.judge_max_tokens,
        prompt_template=args.judge_prompt_template_path,
    )


def _problem_text(row: dict, column: str | None) -> str:
    if column is not None:
        return str(row.get(column) or "")
    prompt = row.get("prompt")
    if isinstance(prompt, str) or prompt is None:
        return prompt or ""
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return completion_text((users or prompt or [None])[-1])  # one message: completion_text reads it as given


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


def check_judge_columns(args: SGPOConfig, dataset, judge) -> None:
    """Set-up check: the judge's dataset columns exist in ``dataset`` (and, for the programmatic judge given no
    judge object, the first problem is one it can check); raises ``ValueError`` naming the column otherwise."""
    columns = getattr(dataset, "column_names", None)
    if not columns:
        return
    if args.judge_problem_column is not None and args.judge_problem_column not in columns:
        raise ValueError(
            f"judge_problem_column {args.judge_problem_column!r} is not a training-set column ({columns})."
        )
    if args.judge_answer_column not in columns:
        raise ValueError(
            f"judge_answer_column {args.judge_answer_column!r} is not a training-set column ({columns}): the "
            "judge would never see the gold answer. Set judge_answer_column to the gold final answer's column."
        )
    if args.judge_reference_column not in columns:
        if args.require_reference:
            raise ValueError(
                f"require_reference=True but the training set has no {args.judge_reference_column!r} column "
                f"({columns}): SGPO would never judge. Set judge_reference_column, or require_reference=False."
            )
        logger.warning(
            "SGPO: no %r column in the training set; the judge will see the gold answer (column %r) as the reference.",
            args.judge_reference_column,
            args.judge_answer_column,
        )
    if judge is None and args.judge_type == "programmatic" and len(dataset) > 0:
        row = dataset[0]
        probe = JudgeRequest(
            _problem_text(row, args.judge_problem_column),
            row.get(args.judge_reference_column),
            row.get(args.judge_answer_column),
            (),
        )
        if not ProgrammaticJudge().supports(probe):
            raise ValueError(
                "judge_type='programmatic' checks the bundled arithmetic task only, and the first training "
                f"problem is not one ({probe.problem[:80]!r}). Use judge_type='openai' (e.g. a `vllm serve` "
                "judge) or 'transformers', or pass your own judge: SGPOTrainer(..., judge=...)."
            )


def judge_item(index: int, row: dict, completion: Any, args: SGPOConfig) -> dict:
    """What the main process needs to judge one completion (global flat ``index``) of a dataset ``row``."""
    gold = row.get(args.judge_answer_column)
    reference = row.get(args.judge_reference_column)
    return {
        "index": index,
        "text": _judge_text(completion),
        "problem": _problem_text(row, args.judge_problem_column),
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
    worker.join(batch_timeout + _GRACE_S)
    if worker.is_alive():  # left to finish in the background; its answer is ignored
        return None, f"no answer within judge_batch_timeout={batch_timeout:g}s"
    if "error" in box:
        return None, box["error"]
    if len(box["verdicts"]) != len(requests):
        return None, f"{len(box['verdicts'])} verdicts for {len(requests)} requests"
    return box["verdicts"], ""


def judge_items(judge, items: list[dict], args: SGPOConfig) -> dict:
    """Main process: steps, one batched judge call, verdicts per global completion index, and the call's stats."""
    results, requests, owners, answered, skipped = {}, [], [], [], 0
    for item in items:
        if args.require_reference and not item["reference"]:
            skipped += 1
            continue
        steps = split_steps(item["text"], splitter=args.step_splitter, max_steps=args.judge_max_steps)
        if not steps:  # empty completion: RTS = 0 without asking (docs/methods/sgpo.md §2.4)
            results[item["index"]] = (None, 0, "", False)
            continue
        requests.append(JudgeRequest(item["problem"], item["reference"], item["gold"], tuple(steps)))
        owners.append(item["index"])
        # Only "last_step" reads it (a NONE verdict on a response with a wrong final answer -> k = K).
        answered.append(args.sgpo_no_error_policy == "last_step" and has_final_answer(item["text"]))
    stats = {"requests": len(requests), "calls": 0, "latency": None, "skipped": skipped}
    if requests:
        start = time.perf_counter()
        verdicts, reason = call_judge(judge, requests, args.judge_batch_timeout)
        stats["latency"] = time.perf_counter() - start
        for n, (index, request) in enumerate(zip(owners, requests)):
            if verdicts is None:
                results[index] = (math.nan, request.num_steps, reason, answered[n])
                continue
            value, calls, why = _clean_verdict(verdicts[n], request.num_steps)
            stats["calls"] += calls
            results[index] = (value, request.num_steps, why, answered[n])
    return {"results": results, "stats": stats}


class SGPOTrainer(GRPOFamilyTrainer):
    """SGPO (Chen et al., "Stepwise Guided Policy Optimization: Coloring Your Incorrect Reasoning in GRPO", TMLR,
    arXiv 2505.11595): judge-based partial credit in all-negative groups, GRPO everywhere else.

    Args (beyond :class:`~trl.GRPOTrainer`'s):
        judge: a step judge object (``judge(requests) -> verdicts``, see :mod:`grpo_family.rewards.judges`); by
            default one is built from the config's ``judge_*`` fields. Only the main process calls it.

    Evaluation batches are scored as plain GRPO (correctness only): the judge is a training signal.

    Metrics (``sgpo/...``, train mode): ``active``, ``frac_all_negative``, ``judged_groups``, ``judge_requests``
    (completions sent), ``judge_calls`` (model calls: votes and retries), ``judge_failures``,
    ``judge_failure_rate``, ``judge_latency_s``, ``rts_mean``/``rts_min``/``rts_max``, ``frac_degenerate_judged``.
    """

    method_name = "sgpo"
    _tag_names = ["trl", "grpo", "grpo_family", "sgpo"]
    _name = "SGPO"
    _paper = {
        "title": "Stepwise Guided Policy Optimization: Coloring Your Incorrect Reasoning in GRPO",
        "id": "2505.11595",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{chen2025sgpo,
                title        = {{Stepwise Guided Policy Optimization: Coloring Your Incorrect Reasoning in GRPO}},
                author       = {Peter Chen and Xiaopeng Li and Ziniu Li and Xi Chen and Tianyi Lin},
                journal      = {Transactions on Machine Learning Research},
                year         = 2025,
                eprint       = {arXiv:2505.11595},
            }"""),
    }

    def __init__(self, model, reward_funcs=None, args: SGPOConfig | None = None, *pos, judge=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = SGPOConfig(f"{str(name).split('/')[-1]}-SGPO")
        elif not isinstance(args, SGPOConfig):
            raise TypeError(f"SGPOTrainer needs an SGPOConfig, got {type(args).__name__}.")
        super().__init__(model, reward_funcs, args, *pos, **kwargs)
        names = list(self.reward_func_names)
        wanted = args.correctness_reward
        if wanted is not None and wanted not in names:
            raise ValueError(f"correctness_reward {wanted!r} is not one of the reward functions {names}.")
        self._correct_index = 0 if wanted is None else names.index(wanted)
        check_judge_columns(args, self.train_dataset, judge)
        # Only the main process calls the judge; a local model judge is loaded there only.
        if judge is None and self.accelerator.is_main_process:
            judge = make_judge(args)
            if isinstance(judge, TransformersJudge):
                judge.model.to(self.accelerator.device)
        elif judge is None and args.judge_type == "openai":
            make_judge(args)  # same validation on every process
        self.judge = judge

    # ------------------------------------------------------------------ window
    def sgpo_active(self) -> bool:
        """Whether judged rewards apply now (docs/methods/sgpo.md §2.7): epoch < sgpo_num_epochs and step < sgpo_max_steps."""
        args = self.args
        epoch = self.state.epoch or 0.0
        if args.sgpo_num_epochs is not None and not epoch < args.sgpo_num_epochs:
            return False
        return args.sgpo_max_steps is None or self.state.global_step < args.sgpo_max_steps

    # ------------------------------------------------------------------ advantage stage
    def _compute_advantages(self, rewards: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        if batch["mode"] != "train":  # evaluation reports plain correctness; the judge is a training signal
            return super()._compute_advantages(rewards, batch)
        if not self.sgpo_active():
            self.log_method_metric("active", 0.0)
            return super()._compute_advantages(rewards, batch)
        args = self.args
        per_func = batch["rewards_per_func"]
        num_generations = batch["num_generations"]
        column = per_func[:, self._correct_index].view(-1, num_generations)
        correct = column >= args.correctness_threshold  # NaN -> False: unscorable counts as incorrect
        judged_groups = groups_to_judge(correct, scope=args.judge_scope)
        candidates = (judged_groups[:, None] & ~correct & ~torch.isnan(column)).reshape(-1)
        verdicts, stats = self._judge_candidates(candidates, batch)
        first_error, num_steps, answered, scored = verdict_grid(verdicts, column.size(0), num_generations)
        scored = scored.to(column.device)
        credit = sgpo_rewards(
            correct,
            first_error,
            num_steps,
            beta=args.sgpo_beta,
            gamma=args.sgpo_gamma,
            mode=args.partial_credit_mode,
            scope=args.judge_scope,
            no_error_policy=args.sgpo_no_error_policy,
            has_final_answer=answered,
        ).to(column.device, column.dtype)

        # Same operations as the base class, so unjudged completions keep bit-identical rewards.
        new_per_func = per_func.clone()
        new_per_func[:, self._correct_index] = torch.where(scored, credit, column).reshape(-1)
        new_rewards = weighted_reward_sum(new_per_func, self.reward_weights.to(per_func.device))
        failed = (scored & torch.isnan(credit)).reshape(-1)
        new_rewards[failed] = torch.nan  # a failed verdict leaves the completion unscorable (advantage 0)
        new_rewards = new_rewards.view_as(rewards)
        batch["rewards_per_func"] = new_per_func
        batch["rewards"] = new_rewards

        self._log_sgpo(correct, scored, failed.view_as(scored), new_rewards, verdicts, stats)
        if bool(scored.any()) and int(failed.sum()) == int(scored.sum()):
            # Every judged completion failed (the judge refuses or garbles every request): decided on gathered
            # verdicts, so alike on every process; the base class counts it like a reward function failing on every
            # completion (the policy for runs that cannot learn).
            batch.setdefault("stage_extras", {}).setdefault("failing", []).append("SGPO judge")
        return super()._compute_advantages(new_rewards, batch)

    def _judge_candidates(self, candidates: torch.Tensor, batch: dict[str, Any]) -> tuple[dict, dict]:
        """Verdicts per global flat index of the gathered ``candidates`` (P * G bools) and the judge's stats: each
        process sends its own candidates to the main process, which judges them in one call and broadcasts."""
        if not bool(candidates.any()):  # a global decision: every process takes part in the collectives below, or none
            return {}, {"requests": 0, "calls": 0, "latency": None, "skipped": 0}
        rows = batch["inputs"]
        start = self.accelerator.process_index * len(rows)
        mine = candidates[start : start + len(rows)].tolist()  # one device-to-host copy
        local = [
            judge_item(start + i, row, batch["completions"][i], self.args) for i, row in enumerate(rows) if mine[i]
        ]
        items = gather_object(local)
        payload = [judge_items(self.judge, items, self.args) if self.accelerator.is_main_process else None]
        payload = broadcast_object_list(payload)[0]
        return payload["results"], payload["stats"]

    # ------------------------------------------------------------------ metrics
    def _log_sgpo(self, correct, scored, failed, rewards, verdicts: dict, stats: dict) -> None:
        log = self.log_method_metric
        log("active", 1.0)
        log("frac_all_negative", float((~correct.any(dim=1)).float().mean()))
        judged = scored.any(dim=1)
        log("judged_groups", float(judged.sum()))
        log("judge_requests", float(stats["requests"]))
        log("judge_calls", float(stats["calls"]))
        num_failed = int(failed.sum())
        log("judge_failures", float(num_failed))
        if stats["requests"]:
            log("judge_failure_rate", num_failed / stats["requests"])
        if stats["latency"] is not None:
            log("judge_latency_s", stats["latency"])
        rts = [
            trajectory_score(value, steps, no_error_policy=self.args.sgpo_no_error_policy, has_final_answer=has_answer)
            for value, steps, _, has_answer in verdicts.values()
            if not (isinstance(value, float) and math.isnan(value))
        ]
        if rts:
            log("rts_mean", sum(rts) / len(rts))
            log("rts_min", min(rts))
            log("rts_max", max(rts))
        if bool(judged.any()):  # judged groups whose rewards are all equal (fewer than two scored: equal too)
            log("frac_degenerate_judged", float(is_constant(rewards[judged], dim=1).float().mean()))
        if num_failed and self.accelerator.is_main_process:
            reasons = sorted({why for _, _, why, _ in verdicts.values() if why})
            logger.warning(
                "SGPO judge failed on %d of %d judged completions (%s); their rewards are NaN (advantage 0) and "
                "training goes on.",
                num_failed,
                stats["requests"],
                "; ".join(reasons[:3]) or "unknown reason",
            )
