"""Step judges: prompt template, verdict parser, the OpenAI-compatible judge against a real loopback HTTP server,
the local transformers judge on the tiny model, and the programmatic arithmetic judge."""

# tol(defaults): the values compared are float64 results of a few dozen operations (relative rounding under
# 100 x 2^-52 ~ 2e-14); pytest.approx's default relative 1e-6 lies far above that and far below the smallest
# difference a wrong count or formula makes here (one part in the denominators, at most a few hundred).
from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import HANG_GUARD_S

from grpo_family.judges import (
    DEFAULT_PROMPT_PATH,
    FAIL,
    HeuristicReferenceJudge,
    JudgeRequest,
    JudgeVerdict,
    OpenAICompatibleJudge,
    ProgrammaticJudge,
    PromptTemplate,
    StepJudge,
    TransformersJudge,
    final_answer_step,
    has_final_answer,
    parse_verdict,
    reference_numbers,
    stated_results,
    strip_reasoning,
    verdict_schema,
)
from grpo_family.judges.steps import split_steps

REQUEST = JudgeRequest(
    problem="Compute 2+3*4.",
    reference_solution="3*4=12\n2+12=14\nAnswer: 14",
    gold_answer="14",
    steps=("3*4=12", "2+12=15", "Answer: 15"),
)


def is_fail(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


# ---------------------------------------------------------------------------------------------------- template
def test_default_template_renders_every_field_once():
    template = PromptTemplate.load()
    assert template.system and "{steps}" in template.user
    messages = template.messages(REQUEST)
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "Compute 2+3*4." in user and "Reference final answer: 14" in user
    assert "[1] 3*4=12\n[2] 2+12=15\n[3] Answer: 15" in user
    assert "(3 steps)" in user and "FIRST_ERROR_STEP: <j>" in user
    assert not any(f"{{{p}}}" in user for p in ("problem", "steps", "gold_answer", "reference_solution"))
    assert DEFAULT_PROMPT_PATH.read_text().isascii()  # tokenizers of any vocabulary can read it


def test_template_leaves_braces_alone_and_falls_back_to_the_gold_answer():
    request = JudgeRequest(r"Find x if \boxed{x} = {steps}.", None, "7", (r"x = \frac{1}{2}", "{problem}"))
    _, user = PromptTemplate.load().render(request)
    assert r"Find x if \boxed{x} = {steps}." in user  # inserted text is not substituted again
    assert "[2] {problem}" in user and r"\frac{1}{2}" in user
    assert "### Reference solution (trusted)\n7\n" in user


def test_custom_template_file(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("[system]\nBe strict.\n[user]\nP: {problem}\nS:\n{steps}\nK={num_steps} G={gold_answer}\n")
    messages = PromptTemplate.load(path).messages(REQUEST)
    assert messages[0] == {"role": "system", "content": "Be strict."}
    assert messages[1]["content"] == "P: Compute 2+3*4.\nS:\n[1] 3*4=12\n[2] 2+12=15\n[3] Answer: 15\nK=3 G=14"
    path.write_text("Only a user turn: {steps}")
    assert PromptTemplate.load(path).messages(REQUEST) == [
        {"role": "user", "content": "Only a user turn: [1] 3*4=12\n[2] 2+12=15\n[3] Answer: 15"}
    ]
    path.write_text("[user]\nno steps here {problem}")
    with pytest.raises(ValueError, match="steps"):
        PromptTemplate.load(path)


# ---------------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text, expected",
    [
        ("Step 1: OK\nStep 2: ERROR - 2+12 is 14\nFIRST_ERROR_STEP: 2", 2),
        ("FIRST_ERROR_STEP: NONE", None),
        ("first error step = none.", None),
        ("**FIRST_ERROR_STEP:** `3`", 3),
        ("FIRST_ERROR_STEP: [1]", 1),
        ("FIRST_ERROR_STEP: Step 2.", 2),
        ('{"first_error_step": 2}', 2),
        ('{"first_error_step": null}', None),
        ("FIRST_ERROR_STEP: 1 ... on reflection\nFIRST_ERROR_STEP: 3", 3),  # the last one counts
        ("<think>FIRST_ERROR_STEP: 1</think>\nFIRST_ERROR_STEP: 2", 2),
        ("<think>long reasoning FIRST_ERROR_STEP: 1</think>\nI could not decide.", FAIL),
        ("reasoning whose <think> was opened in the prompt FIRST_ERROR_STEP: 1</think> FIRST_ERROR_STEP: 3", 3),
        ("<think>cut off mid-thought FIRST_ERROR_STEP: 2", FAIL),
        ("  \n<think>cut off after whitespace FIRST_ERROR_STEP: 2", FAIL),
        ("<think>done</think>\n<think>cut off in a second block FIRST_ERROR_STEP: 2", FAIL),
        # A judge quoting the candidate's "<think>" step keeps its verdict (the tag does not open a block there).
        (
            "Step 1: OK - `<think>` just opens the reasoning.\nStep 2: OK - sets n = 4.\n"
            "Step 3: ERROR - 2n = 8, not 9; the final answer 9 follows from it.\nFIRST_ERROR_STEP: 3",
            3,
        ),
        ("[1] <think>\nis fine. FIRST_ERROR_STEP: 2", 2),
        ("FIRST_ERROR_STEP: 4", FAIL),  # out of range for K = 3
        ("FIRST_ERROR_STEP: 0", FAIL),
        ("FIRST_ERROR_STEP: -1", FAIL),
        ("FIRST_ERROR_STEP: 99999999999999999999999", FAIL),
        ("FIRST_ERROR_STEP: <j>", FAIL),
        ("The second step is wrong.", FAIL),
        ("", FAIL),
        (None, FAIL),
        (42, FAIL),
    ],
)
def test_parse_verdict(text, expected):
    got = parse_verdict(text, 3)
    assert is_fail(got) if is_fail(expected) else got == expected


def test_strip_reasoning():
    assert strip_reasoning("a<think>x</think>b<reasoning>y</reasoning>c") == "abc"
    assert strip_reasoning("x</think>answer") == "answer"
    # An unclosed opening tag swallows the rest only where it starts the answer (a judge cut off mid-thought);
    # anywhere else it is text (e.g. quoted from a candidate's step), so the text is kept.
    assert strip_reasoning("answer<think>never closed") == "answer<think>never closed"
    assert strip_reasoning("<think>never closed") == ""
    assert strip_reasoning(" \n <THINK>never closed") == ""
    assert strip_reasoning("<think>a</think>\n<think>cut off") == ""
    assert strip_reasoning("<think>a</think>kept [1] <think> quoted") == "kept [1] <think> quoted"


def test_quoted_think_step_verdict_from_the_audit():
    # A Qwen3-style completion split with its <think> block (docs/methods/sgpo.md §2.2); a non-reasoning judge quotes step 1.
    steps = split_steps("<think>\nLet n = 4.\nThen 2n = 9.\n</think>\nAnswer: 9")
    assert len(steps) == 5 and steps[0] == "<think>"
    answer = (
        "Step 1: OK - `<think>` just opens the reasoning.\nStep 2: OK - sets n = 4.\n"
        "Step 3: ERROR - 2n = 8, not 9; the final answer 9 follows from it.\nFIRST_ERROR_STEP: 3"
    )
    assert parse_verdict(answer, len(steps)) == 3
    assert strip_reasoning(answer) == answer


# ---------------------------------------------------------------------------------------------------- loopback server
def completion(content) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }


class FakeOpenAI:
    """An OpenAI-compatible /v1/chat/completions endpoint on 127.0.0.1 (http.server in a thread).

    ``behave(body, headers, n)`` -> ``(status, payload, delay_s)`` decides each answer (``n`` = 0-based call count);
    ``payload`` is a dict (sent as JSON) or bytes (sent raw). Every request is recorded in ``requests``.
    ``GET /v1/models`` lists ``models`` (vLLM's entries: ``id``, ``max_model_len``); None answers 404."""

    def __init__(self):
        self.requests: list[dict] = []
        self.models: list[dict] | None = None
        self.model_list_reads = 0
        self.lock = threading.Lock()
        self.behave = lambda body, headers, n: (200, completion("FIRST_ERROR_STEP: 2"), 0.0)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                with owner.lock:
                    n = len(owner.requests)
                    owner.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                status, payload, delay = owner.behave(body, dict(self.headers), n)
                time.sleep(delay)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def do_GET(self):
                owner.model_list_reads += 1
                if owner.models is None or self.path != "/v1/models":
                    self.send_error(404)
                    return
                data = json.dumps({"object": "list", "data": owner.models}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            # The default listen backlog (5) overflows when 24+ requests connect at once; a dropped SYN is
            # retried by the kernel after 1 s, 3 s, 7 s, so a loaded machine could push one past the timeout.
            request_queue_size = 128

            def handle_error(self, request, client_address):
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    fake = FakeOpenAI()
    yield fake
    fake.close()


def judge_for(server, **kwargs) -> OpenAICompatibleJudge:
    kwargs = {"max_retries": 0, "timeout": 5.0, "backoff": 0.01, **kwargs}
    return OpenAICompatibleJudge(server.url, "judge-model", **kwargs)


def test_openai_judge_sends_the_prompt_and_reads_the_verdict(server, monkeypatch):
    monkeypatch.delenv("JUDGE_API_KEY", raising=False)
    server.behave = lambda body, headers, n: (200, completion("Step 1: OK\nStep 2: ERROR\nFIRST_ERROR_STEP: 2"), 0)
    judge = judge_for(server, max_tokens=123)
    assert isinstance(judge, StepJudge)
    [verdict] = judge.judge([REQUEST])
    assert verdict.first_error == 2 and verdict.votes == [2] and verdict.num_calls == 1 and not verdict.failed
    [sent] = server.requests
    assert sent["path"] == "/v1/chat/completions"
    body = sent["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_tokens"] == 123
    assert body["messages"] == PromptTemplate.load().messages(REQUEST)
    assert "Authorization" not in sent["headers"]  # no key in the environment -> no header


def test_openai_judge_key_comes_from_the_environment_and_is_never_shown(server, monkeypatch, caplog):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("MY_JUDGE_KEY", secret)
    # A hostile server echoes the Authorization header back in an unparseable answer.
    server.behave = lambda body, headers, n: (200, completion("you sent " + headers["Authorization"]), 0)
    judge = judge_for(server, api_key_env="MY_JUDGE_KEY", max_retries=1)
    with caplog.at_level(logging.DEBUG):
        [verdict] = judge.judge([REQUEST])
    assert [r["headers"]["Authorization"] for r in server.requests] == [f"Bearer {secret}"] * 2
    assert verdict.failed
    shown = repr(judge) + repr(verdict) + str(vars(judge)) + caplog.text
    assert secret not in shown and "MY_JUDGE_KEY" in repr(judge)


def test_openai_judge_timeout_fails_within_the_timeout(server):
    # The server would answer, with a valid verdict, after 30 s: a failed vote whose reason is the timeout means
    # the client gave up at its deadline (no wall-clock bound needed).
    server.behave = lambda body, headers, n: (200, completion("FIRST_ERROR_STEP: 1"), 30.0)
    [verdict] = judge_for(server, timeout=0.3).judge([REQUEST])
    assert verdict.failed and "timeout" in verdict.reasons[0]


def test_openai_judge_retries_server_errors_a_bounded_number_of_times(server):
    server.behave = lambda body, headers, n: (500, {"error": "boom"}, 0)
    [verdict] = judge_for(server, max_retries=2).judge([REQUEST])
    assert verdict.failed and verdict.reasons == ["HTTP 500: boom"] and verdict.num_calls == 3
    assert len(server.requests) == 3


def test_openai_judge_recovers_after_a_transient_error(server):
    server.behave = lambda body, headers, n: (503, {}, 0) if n == 0 else (200, completion("FIRST_ERROR_STEP: 3"), 0)
    [verdict] = judge_for(server, max_retries=2).judge([REQUEST])
    assert verdict.first_error == 3 and verdict.num_calls == 2 and len(server.requests) == 2


def test_openai_judge_does_not_retry_client_errors(server):
    server.behave = lambda body, headers, n: (401, {"error": "bad key"}, 0)
    [verdict] = judge_for(server, max_retries=3).judge([REQUEST])
    assert verdict.failed and verdict.reasons == ["HTTP 401: bad key"] and len(server.requests) == 1


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"{not json", "malformed JSON"),
        (b"", "malformed JSON"),
        ({"choices": []}, "no message content"),
        ({"choices": [{"message": {"content": None, "reasoning_content": "FIRST_ERROR_STEP: 2"}}]}, "no message"),
        (completion("I think step two is off."), "no FIRST_ERROR_STEP"),
        (completion("FIRST_ERROR_STEP: 7"), "out of range"),
    ],
)
def test_openai_judge_bad_answers_fail_after_retries(server, payload, reason):
    server.behave = lambda body, headers, n: (200, payload, 0)
    [verdict] = judge_for(server, max_retries=1).judge([REQUEST])
    assert verdict.failed and reason in verdict.reasons[0]
    assert len(server.requests) == 2  # retried once, then given up


def test_openai_judge_content_parts_and_reasoning_blocks(server):
    parts = [
        {"type": "text", "text": "<think>FIRST_ERROR_STEP: 1</think>"},
        {"type": "text", "text": "FIRST_ERROR_STEP: NONE"},
    ]
    server.behave = lambda body, headers, n: (200, completion(parts), 0)
    [verdict] = judge_for(server).judge([REQUEST])
    assert verdict.first_error is None and not verdict.failed


def test_openai_judge_majority_vote(server):
    # Four votes per request: the answers depend on the call number, so the votes arrive in any order.
    answers = {0: "FIRST_ERROR_STEP: NONE", 1: "FIRST_ERROR_STEP: 2", 2: "FIRST_ERROR_STEP: NONE", 3: "garbage"}
    server.behave = lambda body, headers, n: (200, completion(answers[n % 4]), 0)
    judge = judge_for(server, num_votes=4, concurrency=1)  # one at a time: call n is vote n
    [verdict] = judge.judge([REQUEST])
    assert sorted(map(str, verdict.votes)) == ["2", "None", "None", "nan"]
    assert verdict.first_error is None  # NONE twice beats 2 once; the failed vote does not count
    assert {r["body"]["temperature"] for r in server.requests} == {0.6}  # M > 1 -> sampled votes
    # Spec E5 row 2: [NONE, NONE, 7, 7] with K = 8 -> tie -> the smaller position, 7.
    request = JudgeRequest("p", "r", "a", tuple(f"s{i}" for i in range(8)))
    answers.update(
        {0: "FIRST_ERROR_STEP: NONE", 1: "FIRST_ERROR_STEP: 7", 2: "FIRST_ERROR_STEP: NONE", 3: "FIRST_ERROR_STEP: 7"}
    )
    server.requests.clear()
    assert judge.judge([request])[0].first_error == 7
    answers.update({i: "nope" for i in range(4)})
    server.requests.clear()
    assert judge.judge([request])[0].failed  # every vote failed


def test_openai_judge_requests_run_concurrently(server):
    # Every answer waits until all 24 requests are in flight at once: sequential requests would break the barrier
    # (and fail their verdicts) instead of passing slowly, so the test needs no wall-clock bound.
    all_in_flight = threading.Barrier(24, timeout=HANG_GUARD_S)

    def behave(body, headers, n):
        try:
            all_in_flight.wait()
        except threading.BrokenBarrierError:
            return 500, {}, 0
        return 200, completion("FIRST_ERROR_STEP: 1"), 0

    server.behave = behave
    verdicts = judge_for(server, concurrency=24, timeout=HANG_GUARD_S).judge([REQUEST] * 24)
    assert [v.first_error for v in verdicts] == [1] * 24
    assert not all_in_flight.broken


def test_openai_judge_many_slow_requests_cost_about_one_timeout(server):
    # Every answer would come after 60 s, and only once all 32 requests have arrived: all 32 failing by timeout
    # with the barrier passed means they were in flight together, so the call cost one timeout, not 32 in a row.
    all_in_flight = threading.Barrier(32, timeout=HANG_GUARD_S)

    def behave(body, headers, n):
        all_in_flight.wait()
        return 200, completion("FIRST_ERROR_STEP: 1"), 60.0

    server.behave = behave
    verdicts = judge_for(server, concurrency=32, timeout=0.5).judge([REQUEST] * 32)
    assert all(v.failed and v.reasons[0].startswith("timeout") for v in verdicts)
    assert len(server.requests) == 32 and all_in_flight.n_waiting == 0 and not all_in_flight.broken


def test_openai_judge_backoff_is_bounded(server, monkeypatch):
    server.behave = lambda body, headers, n: (500, {}, 0)
    judge = judge_for(server, max_retries=3, backoff=0.2, max_backoff=0.3)
    waits: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds):  # the judge's backoff sleeps are recorded, not slept; the server's own pass through
        if threading.current_thread().name.startswith("sgpo-judge"):
            waits.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    [verdict] = judge.judge([REQUEST])
    assert verdict.failed and len(server.requests) == 4
    gaps = [0.2, 0.3, 0.3]  # 0.2 * 2**attempt capped at 0.3, each times a jitter in [0.5, 1]
    assert len(waits) == 3 and all(0.5 * gap <= wait <= gap for wait, gap in zip(waits, gaps)), waits


def test_openai_judge_batch_deadline(server):
    server.behave = lambda body, headers, n: (200, completion("FIRST_ERROR_STEP: 1"), 60.0)
    judge = judge_for(server, timeout=60.0, max_retries=5, batch_timeout=0.5)
    verdicts = judge.judge([REQUEST] * 4)
    # The server would answer, with a valid verdict, after 60 s: "batch deadline" means the call ended at 0.5 s.
    assert all(v.failed and v.reasons[0] == "batch deadline" for v in verdicts)


def test_a_vote_cut_by_the_batch_deadline_says_so(server):
    """The batch stops waiting at its deadline, but on a loaded machine a vote whose request timed out at that same
    deadline could hand back first, saying "timeout" (CI saw it): a request cut short by the batch's deadline is a
    batch-deadline failure, whichever returns first."""
    server.behave = lambda body, headers, n: (200, completion("FIRST_ERROR_STEP: 1"), 60.0)
    judge = judge_for(server, timeout=60.0, max_retries=5)
    verdict, _, reason = judge._vote(REQUEST, time.monotonic() + 0.3, [0])
    assert verdict is FAIL and reason == "batch deadline"


def test_openai_judge_down_fails_fast():
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = OpenAICompatibleJudge(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff=0.01, timeout=30.0)
    verdicts = judge.judge([REQUEST, REQUEST])
    # Refused at once: a connection error, not the 30 s timeout.
    assert all(v.failed and v.reasons[0].startswith("connection error") for v in verdicts)


def vllm_like(context: int):
    """A server that, as vLLM does, refuses a request whose max_tokens does not fit in the context beside the
    prompt (counted here as one token per character), with vLLM's error body."""

    def behave(body, headers, n):
        prompt = sum(len(m["content"]) for m in body["messages"])
        wanted = body.get("max_tokens", context - prompt)
        if prompt + wanted > context:
            message = (
                f"This model's maximum context length is {context} tokens. However, you requested {wanted} output "
                f"tokens and your prompt contains at least {prompt} input tokens, for a total of at least "
                f"{prompt + wanted} tokens. Please reduce the length of the input prompt or the number of requested "
                "output tokens. (parameter=max_tokens, value=16384)"
            )
            return 400, {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}, 0
        return 200, completion("FIRST_ERROR_STEP: 2"), 0

    return behave


def test_openai_judge_shows_the_servers_error_text(server):
    server.behave = vllm_like(2048)  # no models list (404): max_tokens 16384 is sent as configured
    [verdict] = judge_for(server, max_retries=3).judge([REQUEST])
    assert verdict.failed and len(server.requests) == 1  # a 400 is not retried
    assert verdict.reasons[0].startswith("HTTP 400: This model's maximum context length is 2048 tokens. However,")
    assert len(verdict.reasons[0]) <= len("HTTP 400: ") + 300 and "\n" not in verdict.reasons[0]  # one line, capped


def test_openai_judge_bounds_max_tokens_by_the_served_context(server, caplog):
    """The default max_tokens (16384) against a small judge model (context 2048): every request failed with
    HTTP 400; the judge reads max_model_len from /v1/models and leaves max_tokens to the server instead."""
    server.behave = vllm_like(2048)
    server.models = [{"id": "judge-model", "object": "model", "max_model_len": 2048}]
    judge = judge_for(server)
    with caplog.at_level(logging.WARNING, logger="grpo_family.judges.step_judges"):
        verdicts = judge.judge([REQUEST] * 3)
        verdicts += judge.judge([REQUEST])
    assert [v.first_error for v in verdicts] == [2] * 4
    assert judge.served_context == 2048 and server.model_list_reads == 1  # read once
    assert all("max_tokens" not in r["body"] for r in server.requests)
    assert "max_tokens 16384 does not fit in the context of 'judge-model', 2048 tokens" in caplog.text
    server.requests.clear()
    [verdict] = judge_for(server, max_tokens=256).judge([REQUEST])  # a budget that fits is sent
    assert verdict.first_error == 2 and server.requests[0]["body"]["max_tokens"] == 256


def test_openai_judge_warns_about_a_model_the_server_does_not_serve(server, caplog):
    server.models = [{"id": "other-model", "max_model_len": 4096}]
    with caplog.at_level(logging.WARNING, logger="grpo_family.judges.step_judges"):
        judge_for(server).judge([REQUEST])
    assert "serves other-model, not 'judge-model'" in caplog.text


def test_openai_judge_structured_verdicts(server):
    """structured=True asks for the verdict JSON, its step range that of the request; the reply parses."""
    server.behave = lambda body, headers, n: (200, completion('{"first_error_step": 2}'), 0)
    [verdict] = judge_for(server, structured=True).judge([REQUEST])
    assert verdict.first_error == 2 and not verdict.failed
    response_format = server.requests[0]["body"]["response_format"]
    assert response_format["type"] == "json_schema" and response_format["json_schema"]["strict"] is True
    schema = response_format["json_schema"]["schema"]
    assert schema == verdict_schema(3) and schema["required"] == ["first_error_step"]
    steps = schema["properties"]["first_error_step"]["anyOf"]
    assert steps == [{"type": "integer", "minimum": 1, "maximum": 3}, {"type": "null"}]  # K = 3 steps
    assert parse_verdict('{"first_error_step": null}', 3) is None
    server.requests.clear()
    judge_for(server).judge([REQUEST])
    assert "response_format" not in server.requests[0]["body"]  # off by default


def test_openai_judge_empty_response_is_not_sent(server):
    empty = JudgeRequest("p", "r", "a", ())
    verdicts = judge_for(server).judge([empty, REQUEST])
    assert verdicts[0].first_error is None and verdicts[0].votes == [] and verdicts[1].first_error == 2
    assert len(server.requests) == 1


def test_openai_judge_validates_arguments():
    with pytest.raises(ValueError, match="base_url"):
        OpenAICompatibleJudge("", "m")
    with pytest.raises(ValueError, match="model"):
        OpenAICompatibleJudge("http://127.0.0.1:1/v1", "")
    with pytest.raises(ValueError):
        OpenAICompatibleJudge("http://127.0.0.1:1/v1", "m", num_votes=0)
    judge = OpenAICompatibleJudge("http://127.0.0.1:1/v1/chat/completions/", "m", timeout=10, max_retries=2, backoff=1)
    assert judge.url == "http://127.0.0.1:1/v1/chat/completions"
    assert judge.batch_timeout == pytest.approx(3 * 10 + 1 + 2 + 1)


# ---------------------------------------------------------------------------------------------------- transformers
def test_transformers_judge_tiny_model_garbage_is_a_failure(tiny_model_dir):
    judge = TransformersJudge(tiny_model_dir, max_new_tokens=12)
    verdicts = judge.judge([REQUEST, JudgeRequest("p", None, None, ()), REQUEST])
    assert verdicts[1].first_error is None and verdicts[1].votes == []  # empty response: nothing to judge
    for v in (verdicts[0], verdicts[2]):
        assert isinstance(v, JudgeVerdict) and v.failed and len(v.raw) == 1 and isinstance(v.raw[0], str)
    assert verdicts[0].raw == verdicts[2].raw  # greedy


def test_transformers_judge_sampled_votes_from_objects(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    judge = TransformersJudge(model, tokenizer, num_votes=3, max_new_tokens=8, batch_size=2)
    assert judge.temperature == 0.6
    verdicts = judge.judge([REQUEST] * 3)
    assert all(len(v.votes) == 3 and len(v.raw) == 3 and v.num_calls == 3 for v in verdicts)
    assert all(all(is_fail(x) or 1 <= x <= 3 or x is None for x in v.votes) for v in verdicts)


class ScriptedLM:
    """Stands in for a causal LM: 'generates' a fixed text after the prompt (tests the parse path)."""

    def __init__(self, tokenizer, text: str, fail: bool = False):
        import torch

        self.device = torch.device("cpu")
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        self.fail = fail

    def eval(self):
        return self

    def generate(self, input_ids, num_return_sequences=1, **kwargs):
        import torch

        if self.fail:
            raise RuntimeError("CUDA out of memory (simulated)")
        tail = torch.tensor(self.ids).expand(input_ids.size(0), -1)
        return torch.cat([input_ids, tail], dim=1).repeat_interleave(num_return_sequences, dim=0)


def test_transformers_judge_parses_a_real_verdict_and_survives_generate_errors(tiny_tokenizer):
    judge = TransformersJudge(ScriptedLM(tiny_tokenizer, "Step 1: OK\nFIRST_ERROR_STEP: 2"), tiny_tokenizer)
    assert [v.first_error for v in judge.judge([REQUEST, REQUEST])] == [2, 2]
    # M greedy votes are one generation counted M times: one model call.
    greedy = TransformersJudge(
        ScriptedLM(tiny_tokenizer, "FIRST_ERROR_STEP: 2"), tiny_tokenizer, num_votes=3, temperature=0.0
    )
    [verdict] = greedy.judge([REQUEST])
    assert verdict.votes == [2, 2, 2] and verdict.num_calls == 1
    broken = TransformersJudge(ScriptedLM(tiny_tokenizer, "", fail=True), tiny_tokenizer, num_votes=2)
    [verdict] = broken.judge([REQUEST])
    assert verdict.failed and len(verdict.votes) == 2 and all(is_fail(v) for v in verdict.votes)
    assert "generate" in verdict.reasons[0] and verdict.num_calls == 2  # two sampled votes were asked for
    short = TransformersJudge(ScriptedLM(tiny_tokenizer, "FIRST_ERROR_STEP: 1"), tiny_tokenizer, max_input_tokens=50)
    [verdict] = short.judge([REQUEST])
    assert verdict.failed and "tokens" in verdict.reasons[0]


# ---------------------------------------------------------------------------------------------------- programmatic
@pytest.mark.parametrize(
    "response, expected",
    [
        ("3*4=12\n2+12=14\nAnswer: 14", None),  # all right (a correct response)
        ("3*4=12\n2+12=14", None),  # truncated, every step right
        ("3*4=12\n2+12=15\nAnswer: 15", 2),
        ("3*4=11\n2+11=13\nAnswer: 13", 1),
        ("2+3=5\n5*4=20\nAnswer: 20", 1),  # precedence
        ("3*4=12\n2+12=14\nAnswer: 15", 3),
        ("3*4=12\n\n2+12=14\nAnswer: 16", 2),  # paragraphs: step 2 holds lines 2-3, line 3 is wrong
        ("3*4=12.  2+12=15.", 2),  # one line, split into sentences
    ],
)
def test_programmatic_judge_on_the_arithmetic_task(response, expected):
    steps = tuple(split_steps(response))
    [verdict] = ProgrammaticJudge().judge([JudgeRequest("Compute 2+3*4.", None, "14", steps)])
    assert verdict.first_error == expected and verdict.votes == [expected]


def test_programmatic_judge_refuses_other_tasks_and_takes_a_custom_check():
    gsm8k = JudgeRequest("Natalia sold clips to 48 friends. How many?", "48/2 = 24", "72", ("48+24 = 72",))
    judge = ProgrammaticJudge()
    assert judge.supports(REQUEST) and not judge.supports(gsm8k)
    [verdict] = judge.judge([gsm8k])
    assert verdict.failed and "not a problem" in verdict.reasons[0]
    # A custom checker: the first line containing "bad" is wrong.
    custom = ProgrammaticJudge(
        lambda problem, text: next((i for i, line in enumerate(text.splitlines(), 1) if "bad" in line), None)
    )
    verdicts = custom.judge([JudgeRequest("p", None, "a", ("ok", "ok\nbad", "bad")), gsm8k])
    assert [v.first_error for v in verdicts] == [2, None]
    crashing = ProgrammaticJudge(lambda problem, text: 1 / 0)
    assert crashing.judge([gsm8k])[0].failed


def test_programmatic_judge_against_the_problem_or_the_reference_order():
    # Against the problem any valid order of operations is right; against the reference only the reference's.
    reference = "2*3=6\n4*5=20\n6+20=26\nAnswer: 26"
    other_order = ("4*5=20", "2*3=6", "6+20=26", "Answer: 26")
    request = JudgeRequest("Compute 2*3+4*5.", reference, "26", other_order)
    assert ProgrammaticJudge().judge([request])[0].first_error is None
    assert ProgrammaticJudge(source="reference").judge([request])[0].first_error == 1
    same_order = JudgeRequest("Compute 2*3+4*5.", reference, "26", ("2*3=6", "4*5=20", "6+20=27"))
    assert ProgrammaticJudge(source="reference").judge([same_order])[0].first_error == 3


# ---------------------------------------------------------------------------------------------------- heuristic
ARITHMETIC_REFERENCE = "3*4=12\n2+12=14\nAnswer: 14"


def heuristic(steps, reference=ARITHMETIC_REFERENCE, gold="14"):
    [verdict] = HeuristicReferenceJudge().judge([JudgeRequest("Compute 2+3*4.", reference, gold, tuple(steps))])
    return verdict


@pytest.mark.parametrize(
    "response, expected",
    [
        ("3*4=12\n2+12=14\nAnswer: 15", 3),  # every result is the reference's: the final answer's step
        ("3*4=12\n2+12=16\nAnswer: 16", 2),  # 16 is not a number of the reference
        ("3*4=11\n2+11=13\nAnswer: 13", 1),
        ("2+3=5\n5*4=20\nAnswer: 20", 1),  # precedence: 5 is not in the reference
        ("3*4=12\n2+12=14", None),  # truncated, nothing off the reference, no final answer
        ("3*4=12\n\n2+12=14\nAnswer: 16", 2),  # paragraphs: step 2 holds the answer line
        ("3*4=12\n2+12=14\nso the result is \\boxed{15}", 3),  # a boxed result not in the reference
    ],
)
def test_heuristic_judge_on_the_arithmetic_task(response, expected):
    verdict = heuristic(split_steps(response))
    assert verdict.first_error == expected and verdict.votes == [expected] and verdict.num_calls == 1
    assert parse_verdict(verdict.raw[0], len(split_steps(response))) == expected  # its raw text says the same


def test_heuristic_judge_number_formats():
    # Numbers compare as exact fractions: 12 = 12.0, -3 (a glued minus), 1/2 = 0.5 = \frac{1}{2}, 1,000 = 1000.
    reference = "x = 12, y = -3 and z = 0.5; in all 1,000 items."
    same = ("a = 12.0", "b = -3", "c = 1/2", "d = \\frac{1}{2}.", "e = 1000 so f = 12.00 and g=$0.50$")
    assert heuristic(same, reference, "12").first_error is None  # no result off the reference, no final answer
    assert heuristic(("a = 12.0", "b = 3"), reference, "12").first_error == 2  # 3 is not -3
    assert heuristic(("a = 12", "b = 5 - 3 = 2"), reference, "12").first_error == 2  # 5 is an operand, 2 a result
    assert heuristic(("a = 12", "b = 0.333"), "z = 1/3", "12").first_error == 2  # 0.333 is not 1/3
    assert heuristic(("a = 12", "b = 1/3"), "z = 1/3", "12").first_error is None
    assert heuristic(("a = 12", "so \\boxed{-3}"), reference, "12").first_error == 2  # wrong final answer: flagged
    # Operands, inequalities, terms and exponents are not stated results.
    assert heuristic(("a = 7 + 5", "b <= 9", "c = 3x", "d = 2^5", "e == 4"), reference, "12").first_error is None
    # Units and prose after the number: still a result.
    assert heuristic(("She has 7 apples = 7 apples",), reference, "12").first_error == 1


def test_heuristic_reference_numbers_and_stated_results():
    from fractions import Fraction

    assert reference_numbers("5-8=-3") == {5, 8, -3}  # "-" glued to a digit subtracts; after "=" it is a sign
    assert reference_numbers("\\frac{1}{2} and 6/3, 12.0, 1,000, (-2)") == {1, 2, Fraction(1, 2), 6, 3, 12, 1000, -2}
    assert reference_numbers(None) == set() and reference_numbers("no numbers") == set()
    assert stated_results("x = 12 + 3") == [] and stated_results("y = 2^5") == [] and stated_results("a <= 3") == []
    assert stated_results("3*4=12, so \\boxed{12.0}") == [(12, "12"), (12, "12.0")]
    assert stated_results("x = 1/0 and \\boxed{x+1}") == []
    assert stated_results("x \u2212 1 = \u22123") == [(-3, "\u22123")]


def test_heuristic_judge_think_blocks_and_final_answers():
    reference, gold = "n = 4, so 2n = 8.", "8"
    # The whole completion is judged, <think> block included: the wrong step inside it is found.
    steps = split_steps("<think>\nn = 4\n\n2n = 9\n</think>\n\nAnswer: 9")
    assert heuristic(steps, reference, gold).first_error == 2
    # Cut off inside <think>: a boxed number there is no final answer -> no wrong step.
    steps = split_steps("<think>\nn = 4\n\nmaybe \\boxed{8}")
    assert heuristic(steps, reference, gold).first_error is None
    # After </think>, a (wrong) final answer is flagged at its step.
    steps = split_steps("<think>\nn = 4\n</think>\n\nThe final answer is 9.\n\nDone.")
    assert heuristic(steps, reference, gold).first_error == 2


def test_has_final_answer_and_its_step():
    assert has_final_answer("so \\boxed{12}") and has_final_answer("**Final Answer:** 14")
    assert has_final_answer("<answer>7</answer>") and has_final_answer("#### 72")
    assert has_final_answer("Then the final answer is -3.") and has_final_answer("<think>a</think>Answer: 5")
    assert not has_final_answer("3*4=12\n2+12=14") and not has_final_answer("so \\boxed{12")  # cut off in the box
    assert not has_final_answer("<think>Answer: 5") and not has_final_answer("<think>\\boxed{5}</think>")
    assert not has_final_answer("The answer is not obvious.") and not has_final_answer("")
    assert final_answer_step(["a = 1", "Answer: 2", "thanks"]) == 2
    assert final_answer_step(["a = 1", "<answer>", "2</answer>"]) == 3  # spans steps: the last one
    assert final_answer_step(["a = 1"]) is None and final_answer_step([]) is None


def test_heuristic_judge_edge_cases():
    judge = HeuristicReferenceJudge()
    assert isinstance(judge, StepJudge)
    empty, nothing, gold_only = judge.judge(
        [
            JudgeRequest("p", "x = 1", "1", ()),
            JudgeRequest("p", None, None, ("x = 1",)),
            JudgeRequest("p", None, "7", ("x = 7", "y = 8")),
        ]
    )
    assert empty.first_error is None and empty.votes == [] and empty.num_calls == 0
    assert nothing.failed and "reference" in nothing.reasons[0]
    assert gold_only.first_error == 2  # the gold answer alone is the reference


@pytest.mark.parametrize(
    "text",
    [
        "=" * 100_000,
        "= 1" * 30_000 + "+",
        "\\boxed{" * 15_000,
        "1" * 100_000 + "/",
        "answer" + ":" * 100_000,
        "<think>" * 15_000 + "= 5",
        "-" * 50_000 + "1/1/1" * 10_000,
    ],
    ids=["equals", "operands", "boxes", "digits", "colons", "think", "signs"],
)
def test_heuristic_judge_on_hostile_text_returns_a_verdict(text):
    verdict = HeuristicReferenceJudge().judge([JudgeRequest("p", text, text, (text, text))])[0]
    assert verdict.failed or verdict.first_error in (None, 1, 2)
