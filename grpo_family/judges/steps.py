"""Split a completion into numbered reasoning steps for a step-wise judge (docs/methods/sgpo.md §2.2).

The paper gives no segmentation rule, so the library segments the text itself and shows the judge numbered
steps; the step count ``K`` therefore never depends on the judge. Every judge (LLM, scripted, heuristic)
uses these two functions, so ``K`` and the numbering are the same whichever judge runs:

* :func:`split_steps` -- paragraphs (blank lines), falling back to single lines, then to sentence ends
  outside maths; optionally merged into at most ``max_steps`` contiguous blocks; ``[]`` for an empty text.
* :func:`number_steps` -- the ``[1] ...`` / ``[2] ...`` rendering of the judge prompt (docs/methods/sgpo.md §3.3).

The whole decoded completion is split, ``<think>`` block included (docs/methods/sgpo.md §2.2, item 1): a truncated
chain of thought is exactly the case SGPO rewards.
"""

from __future__ import annotations

import re

__all__ = ["SPLITTERS", "merge_steps", "number_steps", "split_steps"]

SPLITTERS = ("paragraph", "line", "sentence")

_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Maths delimiters: $$, $, \[ \], \( \); an escaped dollar (\$) is text, not a delimiter.
_MATH_DELIM = re.compile(r"\\\$|\$\$|\$|\\\[|\\\]|\\\(|\\\)")
_CLOSES = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}
# What joins merged steps, so that a block reads like the original text.
_JOINER = {"paragraph": "\n\n", "line": "\n", "sentence": " "}


def _pieces(parts: list[str]) -> list[str]:
    return [p.strip() for p in parts if p.strip()]


def _math_spans(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` character spans of inline/display maths; an unclosed opener runs to the end."""
    spans, opener, start = [], None, 0
    for m in _MATH_DELIM.finditer(text):
        tok = m.group()
        if tok == "\\$":
            continue
        if opener is None:
            if tok in _CLOSES:
                opener, start = tok, m.start()
        elif tok == _CLOSES[opener]:
            spans.append((start, m.end()))
            opener = None
    if opener is not None:
        spans.append((start, len(text)))
    return spans


def _split_sentences(text: str) -> list[str]:
    """Split after ``.``, ``!`` or ``?`` followed by whitespace, never inside maths (``1.5``, ``$x. y$``)."""
    spans = _math_spans(text)
    pieces, last = [], 0
    for m in _SENTENCE_END.finditer(text):
        if any(a <= m.start() < b for a, b in spans):
            continue
        pieces.append(text[last : m.start()])
        last = m.end()
    pieces.append(text[last:])
    return _pieces(pieces)


def _split_lines(text: str) -> list[str]:
    return _pieces(text.split("\n"))


def merge_steps(steps: list[str], max_steps: int, *, joiner: str = "\n\n") -> list[str]:
    """Merge adjacent steps into ``max_steps`` contiguous blocks of nearly equal step counts (docs/methods/sgpo.md §2.2.4).

    Block sizes differ by at most one, larger blocks first (``numpy.array_split``'s rule). Fewer steps than
    ``max_steps`` are returned unchanged.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
    if len(steps) <= max_steps:
        return list(steps)
    size, extra = divmod(len(steps), max_steps)
    blocks, i = [], 0
    for b in range(max_steps):
        n = size + (b < extra)
        blocks.append(joiner.join(steps[i : i + n]))
        i += n
    return blocks


def split_steps(text: str, *, splitter: str = "paragraph", max_steps: int | None = None) -> list[str]:
    """Split ``text`` into stripped, non-empty reasoning steps (docs/methods/sgpo.md §2.2).

    Args:
        text: the full decoded completion (``<think>`` block included).
        splitter: where the fallback chain starts. ``"paragraph"`` (default) splits on blank lines
            (``\\n\\s*\\n``); if that gives one step and the text has several non-empty lines, it splits on
            single newlines (``"line"``); if that still gives one step, on sentence ends ``(?<=[.!?])\\s+``
            outside ``$...$``, ``$$...$$``, ``\\(...\\)`` and ``\\[...\\]`` (``"sentence"``). One step is then
            final (``K = 1``).
        max_steps: if set and there are more steps, adjacent steps are merged into ``max_steps`` nearly equal
            contiguous blocks (keeps judge prompts bounded for long responses).

    Returns:
        the steps, ``[]`` for an empty or whitespace-only text (``K = 0``: no judge call, RTS = 0).
    """
    if splitter not in SPLITTERS:
        raise ValueError(f"splitter must be one of {SPLITTERS}, got {splitter!r}.")
    if not text.strip():
        return []
    chain = SPLITTERS[SPLITTERS.index(splitter) :]
    steps, used = [text.strip()], chain[-1]
    for level in chain:
        if level == "paragraph":
            steps = _pieces(_PARAGRAPH.split(text))
        elif level == "line":
            steps = _split_lines(text)
        else:
            steps = _split_sentences(text.strip())
        used = level
        if len(steps) > 1:
            break
    if max_steps is not None:
        steps = merge_steps(steps, max_steps, joiner=_JOINER[used])
    return steps


def number_steps(steps: list[str]) -> str:
    """Render steps as the judge prompt shows them: ``"[1] step one\\n[2] step two"`` (docs/methods/sgpo.md §3.3).

    Numbering is 1-based, matching the judge's ``FIRST_ERROR_STEP: <j>`` answer. ``[]`` renders as ``""``.
    """
    return "\n".join(f"[{j}] {step}" for j, step in enumerate(steps, start=1))
