"""Text helpers shared by the reward functions and the collator: completion text, ``\\boxed{}``, ``<answer>``.

Standard library only, so the scoring worker process (:mod:`grpo_family.rewards.timeout`) stays light.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["answer_region", "completion_message", "completion_text", "last_boxed", "last_tag_content"]

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
