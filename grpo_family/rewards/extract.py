"""Text helpers shared by the reward functions and the collator: completion text, ``\\boxed{}``, ``<answer>``,
reference-solution golds.

Standard library only, so the scoring worker process (:mod:`grpo_family.rewards.timeout`) stays light.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "completion_message",
    "completion_text",
    "last_boxed",
    "last_tag_content",
    "solution_gold",
]

# ``\boxed`` and ``\fbox`` both box a final answer; ``\boxed 5`` (no braces) is valid LaTeX too.
_BOX_START = re.compile(r"\\(?:boxed|fbox|framebox)(?![A-Za-z])\s*")


def completion_text(completion: Any) -> str:
    """The text of one TRL completion, read the same way by every answer reward.

    TRL passes a completion either as a string (standard format) or as a list of messages (conversational format,
    ``[{"role": "assistant", "content": "..."}]``, possibly with tool turns). For a message list this is the content
    of the **last assistant message** only (messages without a role count as assistant messages; user, tool and
    system messages never do): an earlier turn is not the answer, however final it looks. Content given as a list
    of parts is read from its text parts only (``{"type": "text", "text": ...}`` or plain strings), joined as they
    are: a reasoning, image or tool part is not text the answer is in. ``""`` for None or no assistant message.
    """
    if isinstance(completion, str):
        return completion
    message = completion_message(completion)
    return "" if message is None else _content_text(message.get("content"))


def completion_message(completion: Any) -> dict | None:
    """The message :func:`completion_text` reads from a conversational completion: a message dict, or the last
    assistant (or role-less) message of a list; ``None`` for a string, ``None``, or a list with no such message."""
    if isinstance(completion, dict):
        return completion
    if completion is None or isinstance(completion, str):
        return None
    answers = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") in ("assistant", None)]
    return answers[-1] if answers else None


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
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
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


# What stands between two boxes without being text: maths delimiters and spacing; ``\\text{ and }`` is its words.
_GAP_MARKUP = re.compile(
    r"\$\$|(?<!\\)\$|\\[()\[\]]|\\[,;:! ]|\\q?quad(?![A-Za-z])|~|\\(?:text|textrm|mathrm|mbox)\s*\{([^{}]*)\}"
)


def list_gap(between: str) -> str:
    """The text between two boxes as a reader sees it: maths delimiters and spacing commands dropped, the words in
    ``\\text{}`` unwrapped (``\\) \\quad \\text{and} \\quad \\(`` -> ``and``)."""
    return _GAP_MARKUP.sub(lambda m: f" {m.group(1)} " if m.group(1) else " ", between)


# Text that, alone between two boxes of a reference solution, makes them one answer with several parts
# ("\boxed{2} and \boxed{3}") or, with "or", an ambiguous gold (solution_gold). Reference solutions are data, not a
# policy's output: completions are read under the answer contract (contract.py).
_CONNECTOR_ONLY = re.compile(r"(?i)[\s$.,;:/&()]*(?:(?:and/or|or|and|either|maybe|perhaps|possibly)[\s$.,;:/&()]*)*")
_OR_WORD = re.compile(r"(?i)\b(or|either|maybe|perhaps|possibly|and/or)\b")
# An unboxed final answer after the last box of a reference solution ("so the answer is 9").
_SOLUTION_ANCHOR = re.compile(r"(?i:\banswer)(?:\s*(?i:is|:|=))+")


_BRACE = re.compile(r"\\[{}]|[{}]")
_BARE_ARGUMENT = re.compile(r"[^\s$]*")


def _boxes(text: str) -> list[tuple[int, int, int, int]]:
    """``(start, end, content_start, content_end)`` of every ``\\boxed``/``\\fbox`` in ``text``; ``content_end``
    is -1 for an unbalanced (cut-off) box. Linear: braces are matched once for the whole text, so 10^5 unclosed
    boxes do not each scan to the end."""
    starts = list(_BOX_START.finditer(text))
    if not starts:
        return []
    closing: dict[int, int] = {}
    stack: list[int] = []
    for brace in _BRACE.finditer(text):  # \{ and \} are literal braces (sets), not grouping
        token = brace.group(0)
        if token == "{":
            stack.append(brace.start())
        elif token == "}" and stack:
            closing[stack.pop()] = brace.start()
    out = []
    for m in starts:
        i = m.end()
        if i >= len(text):
            out.append((m.start(), i, i, -1))
        elif text[i] != "{":  # brace-less form: the argument runs to the next whitespace or maths delimiter
            arg = _BARE_ARGUMENT.match(text, i).end() - i
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
        between = list_gap(solution[boxes[k - 1][1] : boxes[k][0]])
        if not _CONNECTOR_ONLY.fullmatch(between):
            return None, f"{len(boxes)} boxes apart in the solution (which one is the answer?)"
        if _OR_WORD.search(between):
            return None, "boxes joined by 'or'"
        parts.insert(0, _box_content(solution, boxes[k - 1]))
        k -= 1
    if k > 0:
        return None, "an unbalanced box before the last one"
    if _SOLUTION_ANCHOR.search(solution, boxes[-1][1]):
        return None, "an unboxed final answer after the last box"
    return ", ".join(parts), ""
