"""Text helpers shared by the reward functions and the collator: completion text, ``\\boxed{}``, ``<answer>``.

Standard library only, so the scoring worker process (:mod:`grpo_family.rewards.timeout`) stays light.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANSWER_ANCHOR",
    "FinalAnswer",
    "answer_region",
    "completion_message",
    "completion_text",
    "final_answer",
    "final_region",
    "last_boxed",
    "last_tag_content",
    "solution_gold",
]

# ``\boxed`` and ``\fbox`` both box a final answer; ``\boxed 5`` (no braces) is valid LaTeX too.
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*")


def completion_text(completion: Any) -> str:
    """The text of one TRL completion.

    TRL passes a completion either as a string (standard format) or as a list of messages (conversational format,
    ``[{"role": "assistant", "content": "..."}]``, possibly with tool turns). For a message list this is the content
    of the last assistant message (the last message when none has a role), where a final answer lives. Content given
    as a list of parts (``[{"type": "text", "text": ...}]``) is joined.
    """
    if isinstance(completion, str):
        return completion
    message = completion_message(completion)
    return "" if message is None else _content_text(message.get("content"))


def completion_message(completion: Any) -> dict | None:
    """The message :func:`completion_text` reads from a conversational completion (a message dict, or the last
    assistant message of a list, else its last message); ``None`` for a string, ``None`` or an empty list."""
    if isinstance(completion, dict):
        return completion
    if completion is None or isinstance(completion, str):
        return None
    messages = [m for m in completion if isinstance(m, dict)]
    assistant = [m for m in messages if m.get("role") == "assistant"]
    return (assistant or messages or [None])[-1]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, with nested braces kept.

    Returns None when there is no box, when the last box is unbalanced (a completion cut off inside its answer
    has no answer; an earlier box is not taken instead, because it is usually an intermediate result) or empty.
    ``\\boxed 5`` (no braces) yields ``"5"``.
    """
    if not text:
        return None
    starts = list(_BOX_START.finditer(text))
    if not starts:
        return None
    i = starts[-1].end()
    if i >= len(text):
        return None
    if text[i] != "{":
        # Brace-less form: the argument runs to the next whitespace or maths delimiter.
        m = re.match(r"[^\s$]+", text[i:])
        return m.group(0) if m else None
    depth = 0
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in "{}":
            continue  # \{ and \} are literal braces (sets), not grouping
        if ch == "{" and (j == 0 or text[j - 1] != "\\"):
            depth += 1
        elif ch == "}" and (j == 0 or text[j - 1] != "\\"):
            depth -= 1
            if depth == 0:
                content = text[i + 1 : j].strip()
                return content or None
    return None


def last_tag_content(text: str, tag: str = "answer") -> str | None:
    """Stripped content of the last complete ``<tag>...</tag>`` block, or None (no complete block, or empty)."""
    if not text:
        return None
    # The blocks ``re.findall(r"<tag>(.*?)</tag>")`` would find, found in linear time: the regex rescans the rest of
    # the text from every unclosed ``<tag>`` (a completion of 10^5 "<answer>" took hours).
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    content, pos = None, 0
    while (start := text.find(open_tag, pos)) != -1:
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:  # no later block can be closed either
            break
        content, pos = text[start + len(open_tag) : end], end + len(close_tag)
    if content is None:
        return None
    return content.strip() or None


def answer_region(text: str) -> tuple[str, bool]:
    """Where a final answer is looked for: ``(region, explicit)``.

    The last complete ``<answer>...</answer>`` block when there is one (``explicit=True``: the whole region is
    the answer), else the whole text after any ``</think>`` (``explicit=False``: the answer must be located in it).
    """
    tagged = last_tag_content(text, "answer")
    if tagged is not None:
        return tagged, True
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text, False


# ------------------------------------------------------------------------------------------ the final answer
#
# One extraction policy for every answer-reading reward (math, choice, QA, the bundled arithmetic task); it is
# written down in docs/answer_extraction.md, and each rule below says why it exists.

# "The final answer is", "answer is", "Answer:", "answer =". No two unbounded whitespace runs side by side (linear
# on long whitespace).
ANSWER_ANCHOR = re.compile(r"(?i:\banswer)(?:\s*(?i:is|:|=))+")
# A sentence ends at . ! ? followed by whitespace or the end ("18." ends, "18.5" does not), or at a line break.
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
# Words that offer a second candidate or withhold commitment, inside the answer span.
_HEDGE_WORD = re.compile(r"(?i)\b(or|either|maybe|perhaps|possibly|and/or)\b")
# Text after the final answer that takes it back. "Wait"/"actually" after a final answer is how models retract it.
_RETRACTION = re.compile(
    r"(?i)\b(?:just\s+kidding|scratch\s+that|correction|i\s+mean|wait|actually|on\s+second\s+thought|"
    r"i\s+was\s+wrong|that'?s\s+(?:wrong|incorrect|not\s+right)|that\s+is\s+(?:wrong|incorrect)|"
    r"made\s+(?:a|an)\s+(?:mistake|error)|not\s+sure|rather|instead)\b"
)
# Text that, alone between two boxes or two <answer> blocks, makes them two candidates ("\boxed{18} or \boxed{21}").
_CONNECTOR_ONLY = re.compile(r"(?i)[\s$.,;:/&()]*(?:(?:and/or|or|and|either|maybe|perhaps|possibly)[\s$.,;:/&()]*)*")
_LEADING_CONNECTOR = re.compile(r"(?i)[\s$.,;:)]*(?:or|and/or|maybe|perhaps|possibly|alternatively)\b")
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")


@dataclass(frozen=True)
class FinalAnswer:
    """The final answer of a completion under the extraction policy (see :func:`final_answer`).

    ``text`` is the answer span (None when the completion commits to no answer); ``source`` says where it came
    from: ``"box"``, ``"tag"`` (a whole ``<answer>`` block), ``"anchor"`` ("the answer is ..."), ``"whole"`` (the
    whole final region, no box, tag or anchor: each reward decides whether a bare region is an answer) or
    ``"none"``. ``hedge`` names a structural hedge (two boxed candidates, a retraction after the answer) and
    ``hedge_words`` the hedge words inside the span ("or", "maybe", ...); :meth:`is_hedged` combines them.
    """

    text: str | None
    source: str
    hedge: str = ""
    hedge_words: frozenset[str] = frozenset()

    def is_hedged(self, allowed_words: Iterable[str] = ()) -> bool:
        """True when the answer is a hedge. ``allowed_words`` are words the gold itself contains (a QA gold
        "Trick or Treat" makes "or" no hedge)."""
        allowed = {w.lower() for w in allowed_words}
        return bool(self.hedge) or bool(self.hedge_words - allowed)


NO_ANSWER = FinalAnswer(None, "none")


def final_region(text: str) -> str | None:
    """Where the final answer may be: the text after the last ``</think>`` (the whole text when there is no think
    block). None when reasoning is left open (a ``<think>`` with no ``</think>`` after it): a completion cut off
    while thinking has given no final answer, and drafts inside the reasoning never count."""
    if not text:
        return ""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return None if "<think>" in text else text


def _span_words(span: str) -> frozenset[str]:
    return frozenset(m.group(1).lower() for m in _HEDGE_WORD.finditer(_TEXT_MACRO.sub(r" \1 ", span)))


def _trailing_hedge(trailing: str) -> str:
    if _LEADING_CONNECTOR.match(trailing):
        return "a second candidate after the answer"
    if _RETRACTION.search(trailing):
        return "a retraction after the answer"
    return ""


def _boxes(text: str) -> list[tuple[int, int, int, int]]:
    """``(start, end, content_start, content_end)`` of every ``\\boxed``/``\\fbox`` in ``text``; ``content_end``
    is -1 for an unbalanced (cut-off) box. Linear: braces are matched once for the whole text, so 10^5 unclosed
    boxes do not each scan to the end."""
    starts = list(_BOX_START.finditer(text))
    if not starts:
        return []
    closing: dict[int, int] = {}
    stack: list[int] = []
    j = 0
    while j < len(text):
        ch = text[j]
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in "{}":
            j += 2  # \{ and \} are literal braces (sets), not grouping
            continue
        if ch == "{":
            stack.append(j)
        elif ch == "}" and stack:
            closing[stack.pop()] = j
        j += 1
    out = []
    for m in starts:
        i = m.end()
        if i >= len(text):
            out.append((m.start(), i, i, -1))
        elif text[i] != "{":  # brace-less form: the argument runs to the next whitespace or maths delimiter
            arg = re.match(r"[^\s$]*", text[i:]).end()
            out.append((m.start(), i + arg, i, i + arg if arg else -1))
        elif i in closing:
            out.append((m.start(), closing[i] + 1, i + 1, closing[i]))
        else:
            out.append((m.start(), len(text), i + 1, -1))
    return out


def _box_content(text: str, box: tuple[int, int, int, int]) -> str | None:
    if box[3] < 0:
        return None
    return text[box[2] : box[3]].strip() or None


def _tag_blocks(text: str, tag: str = "answer") -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every complete ``<tag>...</tag>`` block (linear scan, as last_tag_content)."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    out, pos = [], 0
    while (start := text.find(open_tag, pos)) != -1:
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:
            break
        out.append((start, end + len(close_tag), text[start + len(open_tag) : end]))
        pos = end + len(close_tag)
    return out


def _anchored_span(region: str, anchors: re.Pattern) -> tuple[str, str] | None:
    """``(span, trailing)`` after the last anchor: the span runs from the anchor to the end of its sentence or
    line (leading spaces, colons and markdown bold skipped)."""
    last = None
    for last in anchors.finditer(region):  # noqa: B007 - the last match is wanted
        pass
    if last is None:
        return None
    start = last.end()
    while start < len(region) and region[start] in " \t\r\n:*":
        start += 1
    end_match = _SENTENCE_END.search(region, start)
    end = end_match.start() if end_match else len(region)
    return region[start:end].strip().strip("*").strip(), region[end:]


def _in_region(region: str, anchors: re.Pattern, outer_trailing: str = "") -> FinalAnswer:
    """The final answer inside one region (the final region, or the content of the last ``<answer>`` block)."""
    boxes = _boxes(region)
    if boxes:
        end = boxes[-1][1]
        content = _box_content(region, boxes[-1])
        if content is None:
            return NO_ANSWER  # cut off inside its box: an earlier box is an intermediate result, not the answer
        hedge = _trailing_hedge(region[end:] + outer_trailing)
        # Boxes joined only by "and" / "," are one answer with several parts (\boxed{2} and \boxed{3}: the
        # collator reads such a gold the same way); joined by "or" they are two candidates.
        parts = [content]
        k = len(boxes) - 1
        while k > 0 and boxes[k - 1][1] <= boxes[k][0]:
            previous = _box_content(region, boxes[k - 1])
            between = region[boxes[k - 1][1] : boxes[k][0]]
            if previous is None or not _CONNECTOR_ONLY.fullmatch(between):
                break
            if _HEDGE_WORD.search(between):
                hedge = "two boxed candidates"
            parts.insert(0, previous)
            k -= 1
        content = ", ".join(parts)
        return FinalAnswer(content, "box", hedge, _span_words(content))
    anchored = _anchored_span(region, anchors)
    if anchored is not None:
        span, trailing = anchored
        if not span:
            return NO_ANSWER
        return FinalAnswer(span, "anchor", _trailing_hedge(trailing + outer_trailing), _span_words(span))
    span = region.strip()
    if not span:
        return NO_ANSWER
    return FinalAnswer(span, "whole", _trailing_hedge(outer_trailing), _span_words(span))


def final_answer(text: str, anchors: re.Pattern = ANSWER_ANCHOR) -> FinalAnswer:
    """The final answer a completion commits to, under the one extraction policy of every answer reward.

    1. Only the text after the last ``</think>`` counts; reasoning left open (``<think>`` without ``</think>``)
       means no answer.
    2. In it, the last complete ``<answer>...</answer>`` block, if any, is the answer region; inside that region
       (or the whole final region when there is no block) the last ``\\boxed{}``/``\\fbox{}`` is the answer; an
       unbalanced last box (cut off) is no answer. Without a box, the span after the last anchor ("the answer
       is", "Answer:") up to the end of its sentence or line; without an anchor, the whole region
       (``source="whole"``).
    3. A hedge is a wrong answer, never its first candidate: two candidates joined by "or" / "and" / "," (boxes,
       ``<answer>`` blocks), hedge words in the span ("or", "either", "maybe", ...), or a retraction after the
       answer ("just kidding", "wait", "actually", ...). An earlier answer corrected by a later one is no hedge:
       the last one counts.
    """
    region = final_region(text or "")
    if region is None:
        return NO_ANSWER
    blocks = _tag_blocks(region)
    if not blocks:
        return _in_region(region, anchors)
    start, end, content = blocks[-1]
    found = _in_region(content, anchors, outer_trailing=region[end:])
    if found.source == "whole":
        found = FinalAnswer(found.text, "tag", found.hedge, found.hedge_words)
    between = region[blocks[-2][1] : start] if len(blocks) > 1 else ""
    if _CONNECTOR_ONLY.fullmatch(between) and _HEDGE_WORD.search(between) and found.text is not None:
        found = FinalAnswer(found.text, found.source, "two <answer> candidates", found.hedge_words)
    return found


def solution_gold(solution: str) -> tuple[str | None, str]:
    """The gold answer a reference solution boxes, and what is wrong when it cannot be trusted: ``(gold, "")`` or
    ``(None, reason)``.

    The last box is the gold; boxes joined only by "and" / "," (``\\boxed{2} and \\boxed{3}``) are one answer
    with several parts and become ``"2, 3"`` (a set or tuple for math-verify), not their last part. Refused (None,
    to be reported, never silently guessed): no complete box, boxes joined by "or", several boxes apart in the
    text (an early box may be an intermediate result), or an anchored answer ("the answer is ...") after the last
    box (the box was not the final answer).
    """
    if not isinstance(solution, str) or not solution.strip():
        return None, "no solution text"
    boxes = _boxes(solution)
    if not boxes or _box_content(solution, boxes[-1]) is None:
        return None, "no complete \\boxed{} in the solution"
    parts = [_box_content(solution, boxes[-1])]
    k = len(boxes) - 1
    while k > 0 and _box_content(solution, boxes[k - 1]) is not None:
        if boxes[k - 1][1] > boxes[k][0]:
            return None, "a box inside another box"
        between = solution[boxes[k - 1][1] : boxes[k][0]]
        if not _CONNECTOR_ONLY.fullmatch(between):
            return None, f"{len(boxes)} boxes apart in the solution (which one is the answer?)"
        if _HEDGE_WORD.search(between):
            return None, "boxes joined by 'or'"
        parts.insert(0, _box_content(solution, boxes[k - 1]))
        k -= 1
    if k > 0:
        return None, "an unbalanced box before the last one"
    if ANSWER_ANCHOR.search(solution, boxes[-1][1]):
        return None, "an unboxed final answer after the last box"
    return ", ".join(parts), ""
