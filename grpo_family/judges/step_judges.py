"""Step judges for SGPO: the first wrong step of a response split into numbered steps (docs/methods/sgpo.md §3).

One small interface, four implementations::

    judge.judge(requests: list[JudgeRequest]) -> list[JudgeVerdict]

A :class:`JudgeRequest` holds the problem, a reference solution (falls back to the gold answer), the gold answer
and the response already split into steps by :func:`grpo_family.judges.steps.split_steps`, so every judge sees
the same numbering and ``K``. A :class:`JudgeVerdict` holds the ``M`` votes and their majority
(:func:`grpo_family.algorithms.sgpo.vote_first_error`), each an ``int`` (1-based first wrong step), ``None`` (no
wrong step) or ``float("nan")`` (:data:`FAIL`: the judge failed, timed out or said something unparseable or out
of range). A verdict never raises: every failure becomes :data:`FAIL`, which SGPO turns into a NaN reward (zero
advantage).

* :class:`OpenAICompatibleJudge` -- any ``/v1/chat/completions`` endpoint (``vllm serve``, SGLang, a hosted
  API): concurrent requests, per-request timeout, bounded retries with exponential backoff, a deadline for the
  whole batch, ``M`` independent votes, API key read from an environment variable at request time (never stored,
  logged or shown in a repr). Standard library only (``urllib`` + ``concurrent.futures``).
* :class:`TransformersJudge` -- a local causal LM + tokenizer (objects or a path), greedy or sampled votes; for
  single-machine and notebook use.
* :class:`ProgrammaticJudge` -- an exact step checker; by default the bundled arithmetic task's
  :func:`grpo_family.tasks.arithmetic.check_steps`, which makes SGPO testable and runnable offline.
* :class:`HeuristicReferenceJudge` -- a crude, deterministic check of the numbers a response states against the
  numbers of the reference solution (docs/methods/sgpo.md §3.5, item 4): any task with numeric answers, CPU only, for smoke
  tests and CI.

The two LLM judges share the prompt template (:class:`PromptTemplate`, default ``judge_prompt.txt`` next to this
file, docs/methods/sgpo.md §3.3; pass your own file to replace it) and the parser (:func:`parse_verdict`, docs/methods/sgpo.md §3.4).

Importing this module needs only the standard library (and the answer helpers of :mod:`grpo_family.rewards`); torch and
transformers are imported when a verdict is voted or a local model is used.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import functools
import http.client
import ipaddress
import json
import logging
import math
import os
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "DEFAULT_PROMPT_PATH",
    "FAIL",
    "HeuristicReferenceJudge",
    "JudgeRequest",
    "JudgeVerdict",
    "OpenAICompatibleJudge",
    "ProgrammaticJudge",
    "PromptTemplate",
    "StepJudge",
    "TransformersJudge",
    "final_answer_step",
    "has_final_answer",
    "parse_verdict",
    "reference_numbers",
    "stated_results",
    "strip_reasoning",
]

logger = logging.getLogger(__name__)

FAIL = float("nan")  # the failure verdict, as in grpo_family.algorithms.sgpo
DEFAULT_PROMPT_PATH = Path(__file__).with_name("judge_prompt.txt")

Verdict = int | float | None  # int = first wrong step (1-based), None = no error, nan = failure


def _is_fail(verdict: Verdict) -> bool:
    return isinstance(verdict, float) and math.isnan(verdict)


# ---------------------------------------------------------------------------------------------------- data types
@dataclass(frozen=True)
class JudgeRequest:
    """One incorrect response to judge.

    ``steps`` come from :func:`grpo_family.judges.steps.split_steps` (``K = len(steps)``). ``reference_solution``
    may be ``None`` or empty: the prompt then shows the gold answer as the reference (docs/methods/sgpo.md §3.3).
    """

    problem: str
    reference_solution: str | None
    gold_answer: str | None
    steps: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple(self.steps))

    @property
    def num_steps(self) -> int:
        return len(self.steps)


@dataclass
class JudgeVerdict:
    """The votes for one request and their majority ``first_error`` (int / ``None`` / :data:`FAIL`).

    ``raw`` holds each vote's raw judge text (``""`` where none came back) and ``reasons`` why a vote failed
    (``""`` for a valid vote). ``num_calls`` counts the model calls made, retries included (a greedy
    :class:`TransformersJudge` generates once for its ``M`` identical votes: 1); ``None`` = not reported, which
    SGPO counts as one call per vote.
    """

    votes: list[Verdict]
    first_error: Verdict
    raw: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    num_calls: int | None = None

    @property
    def failed(self) -> bool:
        return _is_fail(self.first_error)

    @classmethod
    def from_votes(
        cls,
        votes: list[Verdict],
        num_steps: int,
        raw: list[str],
        reasons: list[str],
        num_calls: int | None = None,
    ) -> JudgeVerdict:
        from ..algorithms.sgpo import vote_first_error  # torch; imported only when judging

        return cls(list(votes), vote_first_error(votes, num_steps), list(raw), list(reasons), num_calls)

    @classmethod
    def failure(cls, reason: str, num_votes: int = 1, num_calls: int = 0) -> JudgeVerdict:
        return cls([FAIL] * num_votes, FAIL, [""] * num_votes, [reason] * num_votes, num_calls)


@runtime_checkable
class StepJudge(Protocol):
    """What :class:`grpo_family.trainers.sgpo.SGPOTrainer` needs from a judge (docs/methods/sgpo.md §3.5)."""

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeVerdict]: ...


# ---------------------------------------------------------------------------------------------------- prompt
_PLACEHOLDER = re.compile(r"\{(problem|reference_solution|gold_answer|steps|num_steps)\}")
_SECTION = re.compile(r"^\[(system|user)\][ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class PromptTemplate:
    """The judge prompt: a system and a user message with ``{problem}``, ``{reference_solution}``,
    ``{gold_answer}``, ``{steps}`` (the numbered steps, ``[1] ...``) and ``{num_steps}`` placeholders.

    A template file starts each message with a line ``[system]`` or ``[user]``; a file without such lines is one
    user message. Only those five placeholders are replaced (one pass, so braces in maths or in the inserted text
    are left alone). ``{steps}`` is required: a judge that cannot see the steps cannot locate an error.
    """

    system: str
    user: str

    def __post_init__(self):
        if "{steps}" not in self.system + self.user:
            raise ValueError("A judge prompt template needs the {steps} placeholder (the numbered candidate steps).")

    @classmethod
    def parse(cls, text: str) -> PromptTemplate:
        parts = _SECTION.split(text)
        if len(parts) == 1:
            return cls("", text.strip())
        sections = {"system": "", "user": ""}
        for name, body in zip(parts[1::2], parts[2::2]):
            sections[name] = body.strip()
        return cls(sections["system"], sections["user"])

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> PromptTemplate:
        """The template in ``path`` (UTF-8), or the library's default (docs/methods/sgpo.md §3.3) for ``None``."""
        return cls.parse(Path(path or DEFAULT_PROMPT_PATH).read_text(encoding="utf-8"))

    def render(self, request: JudgeRequest) -> tuple[str, str]:
        from .steps import number_steps

        gold = "" if request.gold_answer is None else str(request.gold_answer).strip()
        reference = (request.reference_solution or "").strip() or gold or "(not given)"
        values = {
            "problem": str(request.problem).strip(),
            "reference_solution": reference,
            "gold_answer": gold or "(not given)",
            "steps": number_steps(list(request.steps)),
            "num_steps": str(request.num_steps),
        }

        def fill(text: str) -> str:
            return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)

        return fill(self.system), fill(self.user)

    def messages(self, request: JudgeRequest) -> list[dict[str, str]]:
        """OpenAI-style chat messages for ``request`` (no system message when the template has none)."""
        system, user = self.render(request)
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _as_template(template: PromptTemplate | str | os.PathLike | None) -> PromptTemplate:
    return template if isinstance(template, PromptTemplate) else PromptTemplate.load(template)


# ---------------------------------------------------------------------------------------------------- parsing
_THINK_TAG = re.compile(r"<(/?)(think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>", re.IGNORECASE)
# FIRST_ERROR_STEP: 3 / first error step = NONE / **FIRST_ERROR_STEP:** `3` / "first_error_step": null / Step 3
_VERDICT = re.compile(
    r"first[\s_-]*error[\s_-]*step[\s*`'\"]*[:=][\s*`'\"\[(]*(?:step\s*)?(none|null|\d+)\b", re.IGNORECASE
)


def _drop_think_blocks(text: str) -> str:
    """``re.sub(r"<(think|thinking|reasoning)>.*?</\\1>", "", text, flags=re.I | re.S)`` in O(n log n).

    The regex rescans the rest of the text from every opening tag that is never closed, which is quadratic: judge
    output of a few thousand unclosed ``<think>`` tags took minutes. Here every tag is found once, and each opening
    tag's first closing tag of the same name is found by bisection.
    """
    tags = [(m.start(), m.end(), bool(m.group(1)), m.group(2).lower()) for m in _THINK_TAG.finditer(text)]
    closes: dict[str, list[tuple[int, int]]] = {}
    for start, end, is_close, name in tags:
        if is_close:
            closes.setdefault(name, []).append((start, end))
    starts = {name: [s for s, _ in spans] for name, spans in closes.items()}
    kept, pos = [], 0
    for start, end, is_close, name in tags:
        if is_close or start < pos or name not in closes:
            continue
        i = bisect.bisect_left(starts[name], end)  # the first closing tag of the same name after this one
        if i == len(starts[name]):
            continue
        kept.append(text[pos:start])
        pos = closes[name][i][1]
    kept.append(text[pos:])
    return "".join(kept)


_LEADING_THINK_OPEN = re.compile(r"\s*<(?:think|thinking|reasoning)>", re.IGNORECASE)


def strip_reasoning(text: str) -> str:
    """``text`` without reasoning blocks (docs/methods/sgpo.md §3.4 step 1).

    Removes ``<think>...</think>`` (also ``thinking``/``reasoning``) blocks; keeps only what follows a stray
    closing tag (templates that open the block in the prompt); drops an unclosed block to the end only when it
    starts the answer (after optional whitespace, once closed blocks are removed: a judge cut off mid-thought
    has not answered). An opening tag anywhere else is text, e.g. a judge quoting a candidate's step
    ``[1] <think>``, and does not swallow the verdict after it. Linear in ``len(text)`` (up to a log factor).
    """
    text = _drop_think_blocks(text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    if _LEADING_THINK_OPEN.match(text):
        return ""
    return text


def _parse(text: Any, num_steps: int) -> tuple[Verdict, str]:
    if not isinstance(text, str) or not text.strip():
        return FAIL, "empty judge output"
    matches = list(_VERDICT.finditer(strip_reasoning(text)))
    if not matches:
        return FAIL, "no FIRST_ERROR_STEP verdict in the judge output"
    value = matches[-1].group(1).lower()
    if value in ("none", "null"):
        return None, ""
    if len(value.lstrip("0")) > 9:  # int() refuses > 4300 digits (ValueError); no response has 10^9 steps anyway
        return FAIL, f"first error step {value[:12]}... out of range 1..{num_steps}"
    step = int(value)
    if not 1 <= step <= num_steps:
        return FAIL, f"first error step {step} out of range 1..{num_steps}"
    return step, ""


def parse_verdict(text: str | None, num_steps: int) -> Verdict:
    """The verdict in a judge's answer (docs/methods/sgpo.md §3.4): the **last** ``FIRST_ERROR_STEP: <j | NONE>`` outside
    reasoning blocks (JSON ``{"first_error_step": <int | null>}`` and markdown decoration accepted).

    Returns an ``int`` in ``1..num_steps``, ``None`` (no error) or :data:`FAIL` (no verdict, out of range, empty
    or non-text output). Never raises.
    """
    return _parse(text, num_steps)[0]


# ---------------------------------------------------------------------------------------------------- final answer
# "Answer: 14", "**Final Answer:** 14", "> answer: x = 3" at the start of a line; "the final answer is 14"; GSM8K's
# "#### 72". Character classes that exclude what follows them, so no backtracking: linear in the text.
_ANSWER_LINE = re.compile(
    r"^[ \t>#*_-]*(?:the[ \t]+)?(?:final[ \t]+)?answer[ \t*_]*:[ \t*`$]*[-\w\\]", re.IGNORECASE | re.MULTILINE
)
_FINAL_ANSWER_IS = re.compile(r"\bfinal[ \t]+answer[ \t]+is[ \t:*`$]*[-\w\\]", re.IGNORECASE)
_HASH_ANSWER = re.compile(r"^[ \t]*####[ \t]*[-\w\\$]", re.MULTILINE)


def _states_answer(text: str) -> bool:
    # Imported here: grpo_family.rewards re-exports this module, so a module-level import would be circular.
    from ..rewards.extract import last_boxed, last_tag_content

    return bool(
        last_boxed(text) is not None
        or last_tag_content(text, "answer") is not None
        or _ANSWER_LINE.search(text)
        or _FINAL_ANSWER_IS.search(text)
        or _HASH_ANSWER.search(text)
    )


def has_final_answer(text: str) -> bool:
    """Whether a response states a final answer, outside its reasoning block (:func:`strip_reasoning`).

    A final answer is a complete ``\\boxed{...}`` (the last box of the text; an unfinished box is none), a complete
    ``<answer>...</answer>`` block, a line starting ``Answer:`` / ``Final answer:`` (markdown allowed), "the final
    answer is ...", or GSM8K's ``#### ...``. A response cut off inside ``<think>`` has none. The answer's
    correctness is not checked: SGPO only asks about incorrect responses. A truncated response whose template
    opened the reasoning block in the prompt (no ``<think>`` in the completion) is read whole, so a boxed
    intermediate result there counts as an answer.
    """
    return isinstance(text, str) and _states_answer(strip_reasoning(text))


def final_answer_step(steps: Sequence[str]) -> int | None:
    """1-based index of the step holding the response's final answer (see :func:`has_final_answer`), or ``None``
    when the response has none: the last step that states an answer, or the last step if the answer spans steps.
    """
    steps = list(steps)
    if not steps or not has_final_answer("\n\n".join(steps)):
        return None
    for j in range(len(steps), 0, -1):
        if _states_answer(steps[j - 1]):
            return j
    return len(steps)


# ---------------------------------------------------------------------------------------------------- OpenAI
class _VoteError(Exception):
    def __init__(self, reason: str, retryable: bool, raw: str = ""):
        super().__init__(reason)
        self.reason, self.retryable, self.raw = reason, retryable, raw


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server_error_text(data: bytes, limit: int = 300) -> str:
    """The explanation in an HTTP error body, on one line: OpenAI's and vLLM's ``{"error": {"message": ...}}``,
    older vLLM's ``{"message": ...}``, FastAPI's ``{"detail": ...}``, else the body's text."""
    text = data.decode("utf-8", "replace")
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        found = error.get("message") if isinstance(error, dict) else error
        found = found or payload.get("message") or payload.get("detail")
        if found:
            text = found if isinstance(found, str) else json.dumps(found)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verdict_schema(num_steps: int) -> dict[str, Any]:
    """JSON schema of a structured verdict for a ``num_steps``-step response: ``{"first_error_step": j}`` with
    ``1 <= j <= num_steps``, or ``null`` when no step is wrong (what :func:`parse_verdict` reads)."""
    step = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": num_steps}, {"type": "null"}]}
    return {
        "type": "object",
        "properties": {"first_error_step": step},
        "required": ["first_error_step"],
        "additionalProperties": False,
    }


def _message_text(payload: Any) -> str | None:
    """``choices[0].message.content`` as text (reasoning fields are ignored); ``None`` if absent."""
    try:
        content = payload["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return content if isinstance(content, str) else None


class OpenAICompatibleJudge:
    """Step judge behind an OpenAI-compatible chat-completions endpoint (docs/methods/sgpo.md §3.5, item 1).

    For example ``vllm serve Qwen/QwQ-32B --port 8000 --tensor-parallel-size 4`` on GPUs the training does not
    use, then ``OpenAICompatibleJudge("http://judge-host:8000/v1", "Qwen/QwQ-32B", num_votes=4)``.

    Args:
        base_url: the API root (``.../v1``); ``/chat/completions`` is appended unless already there.
        model: the served model name.
        api_key_env: environment variable holding the API key, read at each request and sent as a bearer token;
            unset or empty -> no ``Authorization`` header (a local ``vllm serve`` without ``--api-key``). The key
            is never stored on the object, logged or put in a failure reason.
        num_votes: ``M`` independent requests per response, majority-voted (docs/methods/sgpo.md §2.10).
        temperature: ``None`` -> 0.0 for one vote, 0.6 for several (identical greedy votes would be pointless).
        max_tokens: completion budget of each request (reasoning judges need a lot; default 16384, docs/methods/sgpo.md §5).
        timeout: seconds for one HTTP request (connect and each read).
        max_retries: extra attempts after a timeout, connection error, HTTP 408/409/425/429/5xx, malformed JSON or
            an unparseable / out-of-range verdict; other HTTP errors (400, 401, 404, ...) fail at once.
        backoff: seconds before the first retry, doubled at each retry (with jitter in ``[0.5, 1]``), capped at
            ``max_backoff``.
        concurrency: requests in flight at once (threads).
        batch_timeout: deadline in seconds for a whole :meth:`judge` call; requests still pending then are
            :data:`FAIL`. ``None`` -> ``(max_retries + 1) * timeout`` plus the backoffs plus 1 s.
        prompt_template: a :class:`PromptTemplate`, a path to a template file, or ``None`` for the default.
        extra_body: extra JSON fields for every request (``top_p``, ``seed``, ``chat_template_kwargs``, ...).
        structured: constrain each reply to the verdict JSON (:func:`verdict_schema`, the step range of that
            request) with the OpenAI API's ``response_format`` JSON schema, which vLLM's server enforces with
            its structured-output backend: no unparseable or out-of-range verdict, at the price of no written
            reasoning before it (a reasoning model's ``<think>`` part stays free where the server parses it).

    Before its first request the judge reads the served models (``GET .../models``). Where the server reports
    the model's context (vLLM's ``max_model_len``) and ``max_tokens`` does not fit in it, requests leave
    ``max_tokens`` to the server, which bounds each reply by the context the prompt leaves (vLLM would refuse
    every request with HTTP 400), with a warning; a model the server does not serve is warned about too. A failed
    request's reason carries the server's explanation (``HTTP 400: This model's maximum context length is ...``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "JUDGE_API_KEY",
        num_votes: int = 1,
        temperature: float | None = None,
        max_tokens: int = 16384,
        timeout: float = 600.0,
        max_retries: int = 2,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        concurrency: int = 64,
        batch_timeout: float | None = None,
        prompt_template: PromptTemplate | str | os.PathLike | None = None,
        extra_body: dict[str, Any] | None = None,
        structured: bool = False,
    ):
        if not base_url:
            raise ValueError("OpenAICompatibleJudge needs base_url, e.g. 'http://127.0.0.1:8000/v1'.")
        if not model:
            raise ValueError("OpenAICompatibleJudge needs the served model name (model=...).")
        if num_votes < 1 or concurrency < 1 or max_retries < 0 or max_tokens < 1:
            raise ValueError("need num_votes >= 1, concurrency >= 1, max_retries >= 0 and max_tokens >= 1.")
        if not (timeout > 0 and backoff >= 0 and max_backoff >= 0):
            raise ValueError("need timeout > 0, backoff >= 0 and max_backoff >= 0.")
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.num_votes = num_votes
        self.temperature = (0.0 if num_votes == 1 else 0.6) if temperature is None else float(temperature)
        self.max_tokens = max_tokens
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.concurrency = concurrency
        if batch_timeout is None:
            waits = sum(min(self.max_backoff, self.backoff * 2**a) for a in range(max_retries))
            batch_timeout = (max_retries + 1) * self.timeout + waits + 1.0  # 1 s for the last answer to land
        self.batch_timeout = float(batch_timeout)
        self.template = _as_template(prompt_template)
        self.extra_body = dict(extra_body or {})
        self.structured = bool(structured)
        self.served_context: int | None = None  # the served model's max_model_len, once read from the server
        self._models_checked = False
        # Loopback servers are reached directly; anything else honours the usual *_proxy variables.
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.url) else []
        self._opener = urllib.request.build_opener(*handlers)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(url={self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"num_votes={self.num_votes}, temperature={self.temperature}, timeout={self.timeout}, "
            f"max_retries={self.max_retries}, concurrency={self.concurrency})"
        )

    # -------------------------------------------------------------- one HTTP request
    def _api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""

    def _post(self, body: bytes, timeout: float) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=timeout) as response:
                data = response.read()
        except urllib.error.HTTPError as error:
            code = error.code
            try:
                detail = _server_error_text(error.read(65536))
            except (OSError, http.client.HTTPException):
                detail = ""
            finally:
                error.close()
            retryable = code in (408, 409, 425, 429) or code >= 500
            raise _VoteError(f"HTTP {code}: {detail}" if detail else f"HTTP {code}", retryable) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            kind = "timeout" if isinstance(reason, TimeoutError) else "connection error"
            detail = reason if isinstance(reason, str) else type(reason).__name__
            raise _VoteError(f"{kind}: {detail}", True) from None
        except OSError as error:  # anything else the socket layer raises
            raise _VoteError(f"connection error: {type(error).__name__}", True) from None
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise _VoteError("malformed JSON response", True, data[:2000].decode("utf-8", "replace")) from None

    def _check_served_model(self, timeout: float) -> None:
        """Once: the served models' list; bounds ``max_tokens`` by the served context (see the class docstring)."""
        if self._models_checked:
            return
        models_url = self.url.removesuffix("/chat/completions") + "/models"
        headers = {"Accept": "application/json"}
        if self._api_key():
            headers["Authorization"] = f"Bearer {self._api_key()}"
        try:
            with self._opener.open(urllib.request.Request(models_url, headers=headers), timeout=timeout) as r:
                served = json.loads(r.read()).get("data") or []
        except urllib.error.HTTPError as error:  # answered, without a models list: nothing to read, ever
            error.close()
            self._models_checked = True
            return
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return  # not reachable now (asked again next batch) or not a models list: the requests will say why
        self._models_checked = True
        entry = next((m for m in served if isinstance(m, dict) and m.get("id") == self.model), None)
        if entry is None:
            names = ", ".join(str(m.get("id")) for m in served if isinstance(m, dict)) or "none"
            logger.warning("SGPO judge: %s serves %s, not %r: requests will fail.", models_url, names, self.model)
            return
        context = entry.get("max_model_len")
        if isinstance(context, int) and not isinstance(context, bool) and context > 0:
            self.served_context = context
            if self.max_tokens >= context:
                logger.warning(
                    "SGPO judge: max_tokens %d does not fit in the context of %r, %d tokens (the server's "
                    "max_model_len); requests leave max_tokens to the server, which bounds each reply by what the "
                    "prompt leaves of the context. Pass a judge_max_tokens below %d to set a budget.",
                    self.max_tokens, self.model, context, context,
                )  # fmt: skip

    def _request_body(self, request: JudgeRequest) -> bytes:
        body: dict[str, Any] = {
            **self.extra_body,
            "model": self.model,
            "messages": self.template.messages(request),
            "temperature": self.temperature,
        }
        if self.served_context is None or self.max_tokens < self.served_context:
            body["max_tokens"] = self.max_tokens
        if self.structured:
            schema = {"name": "verdict", "schema": verdict_schema(request.num_steps), "strict": True}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        return json.dumps(body).encode()

    def _vote(self, request: JudgeRequest, deadline: float, counter: list[int]) -> tuple[Verdict, str, str]:
        """One vote with retries: ``(verdict, raw text, failure reason)``."""
        body = self._request_body(request)
        reason, raw = "", ""
        for attempt in range(self.max_retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return FAIL, self._redact(raw), self._redact(reason) or "batch deadline"
            with self._lock:
                counter[0] += 1
            request_timeout = min(self.timeout, remaining)
            try:
                raw = _message_text(self._post(body, request_timeout))
                if raw is None:
                    raise _VoteError("no message content in the response", True)
                verdict, reason = _parse(raw, request.num_steps)
                if not _is_fail(verdict):
                    return verdict, self._redact(raw), ""
                retryable = True
            except _VoteError as error:
                reason, retryable, raw = error.reason, error.retryable, error.raw or (raw or "")
                if request_timeout < self.timeout and reason.startswith("timeout"):
                    # cut by the batch's deadline, not by its own timeout (a loaded machine can return this vote
                    # before the batch stops waiting for it)
                    return FAIL, self._redact(raw), "batch deadline"
            if not retryable or attempt == self.max_retries:
                break
            wait = min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)
            if time.monotonic() + wait >= deadline:
                break
            time.sleep(wait)
        return FAIL, self._redact(raw or ""), self._redact(reason)

    def _redact(self, text: str) -> str:
        key = self._api_key()  # a server may echo what it was sent; never let the key reach a log
        return text.replace(key, "***") if key else text

    # -------------------------------------------------------------- the batch
    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeVerdict]:
        """Verdicts for ``requests``, all votes in flight concurrently, within :attr:`batch_timeout` seconds."""
        requests = list(requests)
        deadline = time.monotonic() + self.batch_timeout
        votes = [[FAIL] * self.num_votes for _ in requests]
        raws = [[""] * self.num_votes for _ in requests]
        reasons = [["batch deadline"] * self.num_votes for _ in requests]
        calls = [[0] for _ in requests]
        jobs = [(i, v) for i, r in enumerate(requests) if r.num_steps > 0 for v in range(self.num_votes)]
        if jobs:
            with self._lock:
                self._check_served_model(min(self.timeout, max(0.1, deadline - time.monotonic())))
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=min(self.concurrency, len(jobs)), thread_name_prefix="sgpo-judge"
            )
            try:
                futures = {pool.submit(self._vote, requests[i], deadline, calls[i]): (i, v) for i, v in jobs}
                done, _ = concurrent.futures.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
                for future in done:
                    i, v = futures[future]
                    try:
                        votes[i][v], raws[i][v], reasons[i][v] = future.result()
                    except Exception as error:  # noqa: BLE001 - a vote must never take the batch down
                        reasons[i][v] = f"{type(error).__name__}"
            finally:
                # Requests past the deadline are abandoned: their threads end at their own socket timeout.
                pool.shutdown(wait=False, cancel_futures=True)
        verdicts = []
        for i, request in enumerate(requests):
            if request.num_steps == 0:  # nothing to judge (SGPO gives RTS = 0 without asking)
                verdicts.append(JudgeVerdict([], None, [], [], 0))
                continue
            verdicts.append(JudgeVerdict.from_votes(votes[i], request.num_steps, raws[i], reasons[i], calls[i][0]))
        return verdicts


# ---------------------------------------------------------------------------------------------------- transformers
class TransformersJudge:
    """Step judge running a local ``transformers`` causal LM (docs/methods/sgpo.md §3.5, item 2): for debugging, notebooks
    and single machines. It shares the GPU with the policy, so keep it small.

    Args:
        model: a causal LM object, or a path / Hub id loaded with ``AutoModelForCausalLM`` (``model_kwargs``).
        tokenizer: a tokenizer object or path; ``None`` -> loaded from ``model``'s path or ``name_or_path``.
        num_votes: ``M`` votes per response, majority-voted. Greedy votes are identical, so with ``M > 1`` and
            ``temperature == 0`` one greedy answer is generated and counted ``M`` times (``num_calls`` = 1: one
            generation; ``M`` when sampled).
        temperature: ``None`` -> 0.0 (greedy) for one vote, 0.6 (sampled) for several.
        max_new_tokens: generation budget per vote.
        prompt_template: a :class:`PromptTemplate`, a path, or ``None`` for the default (the same as the API judge).
        batch_size: prompts per ``generate`` call.
        max_input_tokens: prompts longer than this fail without generating (``None``: no limit).

    There are no retries: an unparseable or out-of-range vote is :data:`FAIL` at once (a greedy retry would repeat
    the same answer). ``judge_max_retries`` of :class:`~grpo_family.trainers.sgpo.SGPOConfig` applies to the
    OpenAI-compatible judge only.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        num_votes: int = 1,
        temperature: float | None = None,
        max_new_tokens: int = 1024,
        prompt_template: PromptTemplate | str | os.PathLike | None = None,
        batch_size: int = 4,
        max_input_tokens: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if num_votes < 1 or max_new_tokens < 1 or batch_size < 1:
            raise ValueError("need num_votes >= 1, max_new_tokens >= 1 and batch_size >= 1.")
        if isinstance(model, str | os.PathLike):
            source = str(model)
            model = AutoModelForCausalLM.from_pretrained(source, **(model_kwargs or {}))
        else:
            source = getattr(model, "name_or_path", None) or getattr(
                getattr(model, "config", None), "_name_or_path", None
            )
        if tokenizer is None and not source:
            raise ValueError("TransformersJudge: pass tokenizer= (the model object has no path to load it from).")
        if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or source))
        self.model, self.tokenizer = model.eval(), tokenizer
        self.num_votes = num_votes
        self.temperature = (0.0 if num_votes == 1 else 0.6) if temperature is None else float(temperature)
        self.max_new_tokens = max_new_tokens
        self.template = _as_template(prompt_template)
        self.batch_size = batch_size
        self.max_input_tokens = max_input_tokens

    def _prompt(self, request: JudgeRequest) -> str:
        messages = self.template.messages(request)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return "\n\n".join(m["content"] for m in messages) + "\n\n"

    def _generate(self, prompts: list[str]) -> list[list[str]]:
        import torch

        tok = self.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        enc = enc.to(self.model.device)
        sample = self.temperature > 0
        copies = self.num_votes if sample else 1
        with torch.no_grad():
            out = self.model.generate(
                **enc,
                max_new_tokens=self.max_new_tokens,
                do_sample=sample,
                num_return_sequences=copies,
                pad_token_id=pad_id,
                eos_token_id=tok.eos_token_id,
                **(
                    {"temperature": self.temperature}
                    if sample
                    else {"temperature": None, "top_p": None, "top_k": None}
                ),
            )
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        per_prompt = [texts[i * copies : (i + 1) * copies] for i in range(len(prompts))]
        return [t if sample else t * self.num_votes for t in per_prompt]

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeVerdict]:
        requests = list(requests)
        verdicts: list[JudgeVerdict | None] = [None] * len(requests)
        todo = []
        for i, request in enumerate(requests):
            if request.num_steps == 0:
                verdicts[i] = JudgeVerdict([], None, [], [], 0)
                continue
            try:
                prompt = self._prompt(request)
                length = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            except Exception as error:  # noqa: BLE001 - a bad request fails alone
                verdicts[i] = JudgeVerdict.failure(f"prompt: {type(error).__name__}: {error}", self.num_votes)
                continue
            if self.max_input_tokens is not None and length > self.max_input_tokens:
                verdicts[i] = JudgeVerdict.failure(
                    f"prompt of {length} tokens > {self.max_input_tokens}", self.num_votes
                )
                continue
            todo.append((i, prompt))
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            try:
                outputs = self._generate([p for _, p in chunk])
            except Exception as error:  # noqa: BLE001 - e.g. out of memory: these requests fail, training goes on
                logger.warning("TransformersJudge: generation failed (%s: %s)", type(error).__name__, error)
                calls = self.num_votes if self.temperature > 0 else 1  # the model was called, and failed
                for i, _ in chunk:
                    verdicts[i] = JudgeVerdict.failure(f"generate: {type(error).__name__}", self.num_votes, calls)
                continue
            for (i, _), texts in zip(chunk, outputs):
                parsed = [_parse(t, requests[i].num_steps) for t in texts]
                calls = self.num_votes if self.temperature > 0 else 1
                verdicts[i] = JudgeVerdict.from_votes(
                    [v for v, _ in parsed], requests[i].num_steps, texts, [r for _, r in parsed], calls
                )
        return verdicts  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------- programmatic
def _arithmetic_check() -> Callable[[Any, str], int | None]:
    from ..tasks.arithmetic import check_steps

    return check_steps


class ProgrammaticJudge:
    """Exact step checker as a judge (docs/methods/sgpo.md §3.5's deterministic judge, made exact for a checkable task).

    ``check(problem_or_solution, response_text) -> int | None`` returns the 1-based index of the first wrong
    **non-empty line** of ``response_text`` (or ``None``); the default is the bundled arithmetic task's
    :func:`~grpo_family.tasks.arithmetic.check_steps`, which accepts any valid order of operations. The judge
    writes each step on its own line(s), checks, and maps the wrong line back to the step that contains it, so
    whatever the splitter, its ``K`` and numbering are the ones used (a paragraph of several lines is wrong if any
    of its lines is).

    With the default checker, a request whose problem is not an arithmetic expression fails (it would otherwise
    be read as a reference solution and judged against nothing); :meth:`supports` says so up front.
    ``source="reference"`` checks against the reference solution instead (only the reference's order is right).
    """

    def __init__(self, check: Callable[[Any, str], int | None] | None = None, *, source: str = "problem"):
        if source not in ("problem", "reference"):
            raise ValueError(f"source must be 'problem' or 'reference', got {source!r}.")
        self._default = check is None
        self.check = _arithmetic_check() if check is None else check
        self.source = source
        self.num_votes = 1

    def _source(self, request: JudgeRequest) -> Any:
        return request.problem if self.source == "problem" else (request.reference_solution or "")

    def supports(self, request: JudgeRequest) -> bool:
        """Whether this judge can check ``request``'s task (always True with a custom ``check``).

        With the arithmetic checker: the problem parses as an expression, i.e. a response that is just the gold
        answer line has no wrong step (an unparseable problem is read as a solution and that line fails)."""
        if not self._default:
            return True
        if request.gold_answer is None or not str(request.gold_answer).strip():
            return False
        try:
            return self.check(request.problem, f"Answer: {str(request.gold_answer).strip()}") is None
        except Exception:  # noqa: BLE001
            return False

    def _one(self, request: JudgeRequest) -> JudgeVerdict:
        if request.num_steps == 0:
            return JudgeVerdict([], None, [], [], 0)
        if self.source == "problem" and not self.supports(request):
            return JudgeVerdict.failure("not a problem this checker understands")
        lines_per_step = [sum(1 for line in step.splitlines() if line.strip()) for step in request.steps]
        try:
            line = self.check(self._source(request), "\n".join(request.steps))
        except Exception as error:  # noqa: BLE001 - a checker bug fails this request only
            return JudgeVerdict.failure(f"check: {type(error).__name__}: {error}")
        if line is None:
            return JudgeVerdict([None], None, ["NONE"], [""], 1)
        seen = 0
        for j, count in enumerate(lines_per_step, start=1):
            seen += count
            if line <= seen:
                return JudgeVerdict([j], j, [str(line)], [""], 1)
        return JudgeVerdict.failure(f"checker returned line {line} beyond the response")

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeVerdict]:
        return [self._one(r) for r in requests]


# ---------------------------------------------------------------------------------------------------- heuristic
# A number literal: 12, 12.0, .5, 1,000 (thousands separators); its sign is a "-" (or a Unicode minus) glued to it
# and not glued to a word or closing bracket before it ("x-3" and "5-3" subtract, "-3", "(-3" and "x = -3" are
# negative). A fraction is "a/b" or \frac{a}{b} (\dfrac, \tfrac).
_LIT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?|\.\d+)"
_SIGN = r"(?:(?<![\w)\]}])[-\u2212])?"
_FRAC = rf"\\[dt]?frac[ \t]*\{{[ \t]*{_SIGN}{_LIT}[ \t]*\}}[ \t]*\{{[ \t]*{_LIT}[ \t]*\}}"
_NUMBER = re.compile(rf"{_SIGN}(?<![\w.]){_LIT}")
_FRACTION = re.compile(rf"{_SIGN}(?:(?<![\w.]){_LIT}[ \t]*/[ \t]*{_LIT}(?![\d.])|{_FRAC})")
# What a step states as a result: the number that is the whole right-hand side of an "=" (not <=, >=, !=, ==):
# "= 12", "= -3", "=$1/2$", "= \frac{1}{2}." but not "= 12 + 3" (an operand), "= 3x" or "= 2^5".
_VALUE = rf"[-\u2212]?(?:{_FRAC}|(?<![\w.]){_LIT}(?:[ \t]*/[ \t]*{_LIT})?)"
_RESULT = re.compile(
    rf"(?<![<>!=])=(?!=)[ \t]*(?:\$|\\\(|\\\[)?[ \t]*(?P<value>(?>{_VALUE}))"
    r"(?![ \t]*(?:[-+*/^\u00d7\u00b7\u00f7\u2212]|\\(?:cdot|times|div)(?![A-Za-z])))(?![\w(^]|\.\d|,\d{3})"
)
# A number alone in a box: "\boxed{12}", "\boxed{ $-3$ }", "\boxed{\frac{1}{2}}", "\boxed{0.5.}".
_BOXED = re.compile(rf"\\(?:boxed|fbox)[ \t]*\{{[ \t$]*(?P<value>(?>{_VALUE}))[ \t$.]*\}}")


_MAX_DIGITS = 1000  # longer literals are not read (int() refuses > 4300 digits; no reference has such numbers)


def _to_fraction(literal: str) -> Fraction | None:
    literal = literal.replace(",", "")
    return Fraction(literal) if len(literal) <= _MAX_DIGITS else None


@functools.lru_cache(maxsize=4096)
def _value(text: str) -> Fraction | None:
    """Exact value (a ``Fraction``) of one number written as ``_VALUE`` matches it: ``12``, ``12.0``, ``-3``,
    ``1/2``, ``0.5``, ``\\frac{1}{2}``, ``1,000``; ``None`` for a zero denominator or a literal of more than 1000
    digits."""
    text = text.strip().replace("\u2212", "-")
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("-").strip()
    if "frac" in text:
        num, den = re.findall(r"\{\s*(-?[\d.,]+)\s*\}", text)
    elif "/" in text:
        num, den = text.split("/")
    else:
        num, den = text, "1"
    num, den = _to_fraction(num.strip()), _to_fraction(den.strip())
    return None if num is None or den is None or den == 0 else sign * num / den


def reference_numbers(text: str | None) -> set[Fraction]:
    """Every number in ``text`` as an exact ``Fraction`` (see :class:`HeuristicReferenceJudge`): each literal (with
    its sign) and the value of each fraction ``a/b`` or ``\\frac{a}{b}`` (whose parts count as literals too)."""
    if not text:
        return set()
    text = str(text)
    values = {_value(m.group(0)) for m in _NUMBER.finditer(text)}
    values |= {_value(m.group(0)) for m in _FRACTION.finditer(text)}
    values.discard(None)
    return values


def stated_results(step: str) -> list[tuple[Fraction, str]]:
    """``(value, as written)`` for each result a step states: the number that is the whole right-hand side of an
    ``=`` and a number alone in a ``\\boxed{}`` (see :class:`HeuristicReferenceJudge`), in order of appearance."""
    found = [(m.start("value"), m.group("value")) for m in _RESULT.finditer(step)]
    found += [(m.start("value"), m.group("value")) for m in _BOXED.finditer(step)]
    results = []
    for _, written in sorted(found):
        value = _value(written)
        if value is not None:
            results.append((value, written))
    return results


class HeuristicReferenceJudge:
    """A cheap, deterministic reference checker for smoke tests and CI (docs/methods/sgpo.md §3.5, item 4); no model.

    It collects the numbers of the reference solution and the gold answer (:func:`reference_numbers`), walks
    through the steps and flags the first step that states a result (:func:`stated_results`: the number that is
    the whole right-hand side of an ``=``, or a number alone in ``\\boxed{}``) that is not among them. If no step
    is flagged and the response states a final answer (:func:`final_answer_step`; it is wrong, since only
    incorrect responses are judged), the step holding that answer is flagged; if there is none (a truncated
    response), the verdict is ``None`` (no wrong step).

    Numbers are compared as exact fractions: ``12`` = ``12.0`` = ``12.00``, ``1/2`` = ``0.5`` =
    ``\\frac{1}{2}``, ``1,000`` = ``1000``; ``-3`` is negative only with the minus glued to it and not to a word or
    closing bracket before it (``5-3`` subtracts 3, ``x = -3`` is -3); ``0.333`` is not ``1/3``. A result with
    units or prose after it (``= 12 apples``) counts, one followed by an operator (``= 12 + 3``) or a letter
    (``= 3x``) does not. Crude by design: a correct step whose result the reference never writes down is flagged.

    A request with neither a reference solution nor a gold answer fails (nothing to check against).
    """

    def __init__(self):
        self.num_votes = 1

    def _one(self, request: JudgeRequest) -> JudgeVerdict:
        try:
            return self._check(request)
        except Exception as error:  # noqa: BLE001 - a bug here fails this request only, never the batch
            return JudgeVerdict.failure(f"heuristic: {type(error).__name__}: {error}")

    def _check(self, request: JudgeRequest) -> JudgeVerdict:
        if request.num_steps == 0:
            return JudgeVerdict([], None, [], [], 0)
        reference, gold = request.reference_solution, request.gold_answer
        if not (reference and str(reference).strip()) and (gold is None or not str(gold).strip()):
            return JudgeVerdict.failure("no reference solution or gold answer to check against")
        known = reference_numbers(reference) | reference_numbers(None if gold is None else str(gold))
        for j, step in enumerate(request.steps, start=1):
            for value, written in stated_results(step):
                if value not in known:
                    raw = (
                        f"Step {j}: ERROR - states {written}, which is not a number of the reference solution or "
                        f"the gold answer.\nFIRST_ERROR_STEP: {j}"
                    )
                    return JudgeVerdict([j], j, [raw], [""], 1)
        k = final_answer_step(request.steps)
        if k is not None:
            raw = f"Step {k}: ERROR - states the final answer, which is wrong.\nFIRST_ERROR_STEP: {k}"
            return JudgeVerdict([k], k, [raw], [""], 1)
        return JudgeVerdict(
            [None], None, ["No stated result off the reference, no final answer.\nFIRST_ERROR_STEP: NONE"], [""], 1
        )

    def judge(self, requests: Sequence[JudgeRequest]) -> list[JudgeVerdict]:
        return [self._one(r) for r in requests]
