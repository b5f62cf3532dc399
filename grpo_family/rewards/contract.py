"""The answer contract: where a completion's one answer is, decided from structure (``docs/answer_extraction.md``).

An RL policy finds every way a reward says "correct" when the answer is not committed to: a retraction after the
answer in words no list holds, a second answer joined by "alternatively", the right value in an HTML comment and a
wrong one visible. So no word decides here. In training mode a completion keeps the contract when its **final
region** (the text after the last ``</think>``; an unclosed ``<think>`` breaks it):

1. holds no markup that hides, strikes or overlays text (HTML comments, ``\\phantom``, strike-through, a box in a
   box, zero-width and other invisible characters, ...; :func:`hiding_markup`);
2. holds **exactly one answer slot** of the reward's kind: a box (``\\boxed{}``, ``\\fbox{}``), an ``<answer>`` tag,
   an anchor line (``Answer: ...``, ``The final answer is ...``; :class:`SlotSpec`), or, when there is none of
   these, a final region of one line (the bare slot);
3. has after the slot only whitespace, closing punctuation and end-of-turn markup.

:func:`read_answer` returns the slot's text (:class:`Reading`) or the rule the completion broke; each reward then
reads one value of its kind from the slot (:mod:`grpo_family.rewards.values`). In evaluation mode (``mode="eval"``)
the last of several slots is the answer and text after it is ignored; everything else holds. For the value rewards
(:data:`VALUE_SLOTS`, :data:`MATH_SLOTS`) the committed modes also take the last sentence that holds a value as the
unmarked answer, and an anchor followed by a sentence of its own as that sentence's one number.

Standard library only (the scoring worker subprocesses import this module).
"""

from __future__ import annotations

import bisect
import html
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .extract import _boxes, completion_text, list_gap
from .values import maths_spans, restated_result, sentence_number

__all__ = [
    "ANSWER_SLOTS",
    "AnswerReward",
    "CHOICE_SLOTS",
    "END_OF_TURN",
    "MATH_SLOTS",
    "MODES",
    "Reading",
    "SlotSpec",
    "VALUE_SLOTS",
    "check_mode",
    "final_region",
    "hiding_markup",
    "is_blank",
    "read_answer",
]

MODES = ("train", "eval", "strict")


def check_mode(mode: object, reward: str = "reward") -> str:
    """``mode`` when it is ``"train"``, ``"eval"`` or ``"strict"``; a ValueError naming the problem otherwise (a
    dataset column called ``mode`` reaches a reward as a list: rename it)."""
    if mode not in MODES:
        raise ValueError(
            f"{reward}: mode must be 'train', 'eval' or 'strict', got {mode!r}"
            + (" (a dataset column named 'mode'? rename it)" if isinstance(mode, list) else "")
        )
    return mode  # type: ignore[return-value]


class AnswerReward:
    """What every answer reward shares: its TRL name (``__name__``), its default ``mode`` (``"train"``: the
    committed answer; ``"eval"``: the same with the benchmark's numeric tolerance; ``"strict"``: exactly one slot and
    nothing after it), running ``counts`` and the ``<name>/contract_violations`` metric.

    A subclass defines ``_gold`` (the gold as the reward reads it, None when it cannot: the row scores None) and
    ``_score`` (``(reward, broke_the_contract)`` for one completion text); the TRL call is then this class's. The
    golds come from the ``answer`` column unless ``gold_key`` names another.
    """

    gold_key = "answer"  # the dataset column (TRL keyword) that holds the golds
    gold_column = "the gold answers in an 'answer' dataset column"
    gold_metric = ""  # the metric of the share of unreadable golds, e.g. "qa/unparseable_gold"

    def __init__(self, mode: str, name: str):
        self.mode = check_mode(mode, name)
        self.__name__ = name
        self.counts: Counter[str] = Counter()

    def _call_mode(self, mode: str | None) -> str:
        return self.mode if mode is None else check_mode(mode, self.__name__)

    def _check_golds(self, completions: Sequence, golds: Sequence | None, what: str) -> None:
        if golds is None:
            raise ValueError(f"{self.__name__} needs {what}")
        if len(golds) != len(completions):
            raise ValueError(f"{self.__name__}: {len(completions)} completions but {len(golds)} gold answers")

    def _gold(self, gold: Any) -> Any:
        raise NotImplementedError

    def _score(self, text: str, gold: Any, mode: str) -> tuple[float, bool]:
        raise NotImplementedError

    def __call__(
        self,
        completions: list,
        answer: list | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        mode: str | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        mode = self._call_mode(mode)
        golds = answer if self.gold_key == "answer" else kwargs.get(self.gold_key)
        self._check_golds(completions, golds, self.gold_column)
        rewards: list[float | None] = []
        batch: Counter[str] = Counter()
        for completion, raw_gold in zip(completions, golds):
            gold = self._gold(raw_gold)
            if gold is None:
                batch["unparseable_gold"] += 1
                rewards.append(None)
                continue
            reward, broken = self._score(completion_text(completion), gold, mode)
            batch["contract_violations"] += broken
            rewards.append(reward)
        metrics = {self.gold_metric: "unparseable_gold"} if self.gold_metric else {}
        self._report(batch, len(completions), log_metric, metrics)
        return rewards

    def _report(
        self, batch: Counter, n: int, log_metric: Callable[[str, float], None] | None, metrics: dict[str, str]
    ) -> None:
        """Add the call's ``batch`` counts to the totals and log, as shares of the ``n`` completions, the contract
        violations and each ``{metric name: count key}`` of ``metrics``."""
        batch["total"] = n
        self.counts.update(batch)
        if log_metric is not None and n:
            log_metric(f"{self.__name__}/contract_violations", batch["contract_violations"] / n)
            for metric, key in metrics.items():
                log_metric(metric, batch[key] / n)


@dataclass(frozen=True)
class SlotSpec:
    """Which anchor lines are answer slots for a reward: the nouns of ``the (final|correct) <noun> is``/``<noun>:``
    and whether GSM8K's ``#### 42`` counts. Boxes, ``<answer>`` tags and the bare slot count for every reward.
    ``values``: the reward's answers are numbers or maths (math, arithmetic, a reasoning-gym task with a numeric
    gold), so in committed mode an unmarked answer is the last sentence that holds one (:func:`_last_valued`), and
    a committed sentence of words states its one number (:func:`~grpo_family.rewards.values.sentence_number`)."""

    nouns: tuple[str, ...] = ("answer",)
    hashes: bool = False
    values: bool = False

    def __post_init__(self):
        noun = "|".join(self.nouns)
        one = (
            r"(?:(?:so|thus|therefore|hence|finally)[ \t]*,?[ \t]+)?(?:the[ \t]+)?"
            rf"(?:(?:final|correct|right|best)[ \t]+)?(?:{noun})[ \t]*[*_]{{0,2}}[ \t]*"
            # "Answer $ 9 $": the noun then, after a space, a maths span (its one value, as after a colon)
            r"(?:is\b[ \t]*:?|:|=|[-\u2013\u2014](?=[ \t])|(?<=[ \t])(?=\$|\\[(\[]))(?:[ \t]*[*_]{1,2})?"
        )
        object.__setattr__(self, "_anchor", re.compile(rf"(?i)(?:{one}[ \t]*)+"))
        object.__setattr__(self, "_noun", re.compile(rf"(?i){noun}" + ("|####" if self.hashes else "")))
        object.__setattr__(
            self,
            "_heading",
            re.compile(rf"(?i)(?:the[ \t]+)?(?:(?:final|correct)[ \t]+)?(?:{noun})[ \t]*:?[ \t]*[*_]*[ \t]*$"),
        )


ANSWER_SLOTS = SlotSpec()
VALUE_SLOTS = SlotSpec(values=True)
MATH_SLOTS = SlotSpec(hashes=True, values=True)
CHOICE_SLOTS = SlotSpec(nouns=("answer", "option", "choice"))


@dataclass(frozen=True)
class Reading:
    """What :func:`read_answer` found: ``value`` (the text of the one answer slot, stripped; None when the contract
    is broken), ``kind`` (``"box"``, ``"tag"``, ``"anchor"``, ``"bare"``, ``"none"``) and ``violation`` (the rule
    broken, ``""`` when the contract holds)."""

    value: str | None
    kind: str
    violation: str = ""


def _broken(why: str) -> Reading:
    return Reading(None, "none", why)


# ------------------------------------------------------------------------------------------- final region


def final_region(text: str) -> tuple[str, str]:
    """``(region, violation)``: the text after the last ``</think>`` (the whole text without one), or ``("",
    why)`` when a ``<think>`` is left open or opens again in it."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        return "", "reasoning left open: a <think> with no </think> after it"
    return text, ""


# ------------------------------------------------------------------------------------------- hiding markup

# Characters that show nothing (or overlay the previous one): format characters (Cf: zero-width space, joiners,
# soft hyphen, bidirectional controls, tag characters, invisible operators), private use (Co), surrogates, control
# characters other than tab/newline/CR, combining overlays (U+0334-U+0338, U+20D2, U+20E5, U+20EB), the combining
# grapheme joiner, variation selectors, and blank glyphs (Hangul fillers, Braille blank).
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u034f\u0334-\u0338\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891"
    "\u08e2\u115f\u1160\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\u20d2\u20e5\u20eb\u2800\u3164\ufe00-\ufe0f"
    "\ufeff\uffa0\ufff9-\ufffb\ue000-\uf8ff\ud800-\udfff\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f\U000e0100-\U000e01ef\U000f0000-\U0010ffff]"
)
_HIDING_LATEX = re.compile(
    r"\\(?:[hv]?phantom|iffalse|comment|color|textcolor|colorbox|fcolorbox|sout|st|xout|cancel|bcancel|xcancel|"
    r"cancelto|not|rlap|llap|clap|mathrlap|mathllap|mathclap|def|gdef|edef|xdef|let|newcommand|renewcommand|"
    r"providecommand|DeclareMathOperator)(?![A-Za-z])|\\begin\s*\{\s*comment\s*\}|\\hspace\*?\s*\{\s*-|"
    r"\\m?kern\s*-|\\mspace\s*\{\s*-|(?<!\d,)\\!"
)
# HTML elements whose content a browser does not show as text, by class (the HTML Standard's rendering section):
# the elements it hides (head metadata, datalist, dialog without open, noembed, noframes, rp, template, ...),
# scripting (script, noscript), embedded content whose children are fallback (iframe, object, embed, video, audio,
# canvas, picture, svg, math), form controls that hold their text in a control (textarea, select, option,
# optgroup), disclosure (details, summary) and edits (s, strike, del). Any element with an attribute hides or
# restyles as it likes, so an attribute breaks the contract too.
_HIDDEN_ELEMENTS = (
    "area base basefont datalist dialog head link meta noembed noframes param rp title template style script "
    "noscript iframe object embed video audio canvas picture source track svg math frame frameset applet "
    "textarea select option optgroup details summary s strike del"
).split()
_HIDING_HTML = re.compile(
    r"(?i)<!--|<\s*/?\s*(?:"
    + "|".join(sorted(_HIDDEN_ELEMENTS, key=len, reverse=True))
    + r")(?![\w-])(?:\s[^<>]*)?/?>|"
    r"<[a-z][\w-]*(?:\s+[\w:-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s<>\"']+))+\s*/?>|"
    r"<[a-z][\w-]*\s[^<>]*\b(?:hidden|aria-hidden|open)\b[^<>]*>"
)
# Markdown that shows no text: strike-through, link-reference definitions, and a link's or image's destination and
# title (``[18](x "21")``, ``![21](x)``): only the link text of a link is shown.
_HIDING_MARKDOWN = re.compile(
    r"(?m)~~|^[ \t]{0,3}\[[^\]\n]+\]:[ \t]*\S|!?\[[^\]\n]*\]\([^)\n]*[\s\"'\\{<][^)\n]*\)|!\["
)


def hiding_markup(region: str) -> str:
    """Why ``region`` holds markup that hides, strikes or overlays text, or ``""`` (docs/answer_extraction.md §3;
    boxes inside boxes are checked with the slots)."""
    for pattern, what in (
        (_HIDING_HTML, "HTML that hides or strikes text"),
        (_HIDING_MARKDOWN, "Markdown that hides or strikes text"),
        (_HIDING_LATEX, "LaTeX that hides, overlays, strikes or redefines"),
    ):
        if (m := pattern.search(region)) is not None:
            return f"{what}: {m.group(0)[:30]!r}"
    decoded = html.unescape(region) if "&" in region else region
    if (m := _INVISIBLE.search(decoded)) is not None:
        return f"an invisible character U+{ord(m.group(0)):04X}"
    return ""


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing a reader could take for an answer: empty or whitespace once invisible
    characters are removed, or holding hiding markup (``\\boxed{\\phantom{42}}``, a zero-width space): the contract's
    own test of emptiness, shared by the format rewards."""
    decoded = html.unescape(text) if "&" in text else text
    return not _INVISIBLE.sub("", decoded).strip() or bool(hiding_markup(text))


# ---------------------------------------------------------------------------------------------------- slots

END_OF_TURN = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "</s>",
    "<eos>",
    "<end_of_turn>",
    "<|end|>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)
_END_OF_TURN = re.compile("|".join(re.escape(t) for t in END_OF_TURN))
# What may follow the slot: whitespace, closing punctuation, closing environments and tags (end-of-turn markup is
# blanked before the slots are read).
_CLOSING = re.compile(r"(?:\s|[.!)\]}$*_`'\"\u201d\u2019\u00bb]|\\[)\]]|\\end\s*\{[^{}]*\}|</[A-Za-z][\w-]*\s*>)*")
_TAG = re.compile(r"(?i)<\s*(/?)\s*answer\b[^<>]*>")
# Where an anchor may start inside a line: the line's start after Markdown decoration, or a sentence's start.
_LINE_START = re.compile(r"[ \t]*(?:[#>*_\-][ \t]*)*")
_SENTENCE_START = re.compile(r"[.!?][ \t]+[*_]{0,2}")
_COMMA = re.compile(r",[ \t]+")
# The close of a display block ends what came before it: an anchor may start after it (committed mode), as after a
# sentence's end (``\end{align*} Final Answer: ...`` in a paragraph written on one line).
_DISPLAY_END = re.compile(r"(?:\\end\s*\{[^{}]*\}|\\\])[ \t]+")
_LEAD_IN = re.compile(r"(?i)(?:so|thus|therefore|hence|finally)\b")
_HASHES = re.compile(r"[ \t]*####[ \t]*(?=[-+\u2212$\\\d.(])")
_UNESCAPED_PERCENT = re.compile(r"(?<!\\)%[^\n]*\S")


@dataclass(frozen=True)
class _Slot:
    kind: str
    start: int
    end: int
    value_start: int
    value_end: int


def _tags(region: str) -> tuple[list[tuple[int, int, int, int]], str]:
    """``(start, end, content_start, content_end)`` of every ``<answer>`` block, or the violation (an ``<answer>``
    never closed, a stray ``</answer>``, a block opened inside another). Linear."""
    blocks, open_at = [], None
    for m in _TAG.finditer(region):
        if m.group(1):  # </answer>
            if open_at is None:
                return [], "a </answer> with no <answer> before it"
            blocks.append((open_at.start(), m.end(), open_at.end(), m.start()))
            open_at = None
        elif open_at is not None:
            return [], "an <answer> opened inside another (the first never closed)"
        else:
            open_at = m
    if open_at is not None:
        return [], "an <answer> never closed"
    return blocks, ""


def _line_bounds(text: str, pos: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return start, len(text) if end < 0 else end


# A display block, or inline maths, opened on a line and closed on a later one (``Answer $`` / ``9`` / ``$``): the
# heading's value runs to its close.
_DISPLAY_OPEN = re.compile(r"[ \t]*(?:[*_]{1,2}[ \t]*)?(\\\[|\$\$|\\\(|\$|\\begin\s*\{([^{}]*)\})")
_DISPLAY_CLOSE = {"\\[": "\\]", "$$": "$$", "\\(": "\\)", "$": "$"}
# A sentence's end inside an anchor's value (committed mode): ".", "!" or "?" then whitespace, not after a single
# letter or a capitalised abbreviation ("C. Pneumonia", "St. Louis" stay whole).
_SENTENCE_END = re.compile(r"(?<!\b[A-Za-z])(?<!\b[A-Z][a-z])(?<!\b[A-Z][a-z][a-z])(?<![A-Za-z]\.[A-Za-z])[.!?](?=\s)")


def _display_close(text: str, opened: re.Match) -> int:
    """End of the line that closes the display block ``opened`` (``\\]``, ``$$``, ``\\end{env}``), or -1."""
    delimiter, env = opened.group(1), opened.group(2)
    if env is not None:
        close = re.compile(r"\\end\s*\{" + re.escape(env.strip()) + r"\}")
    else:
        close = re.compile(re.escape(_DISPLAY_CLOSE[delimiter]))
    m = close.search(text, opened.end())
    if m is None:
        return -1
    return _line_bounds(text, m.start())[1]


def _anchor_value(text: str, value_start: int, *, strict: bool = True) -> tuple[int, int]:
    """The value's extent after an anchor: the rest of its line, or the next non-empty line when the rest is
    blank (``**Answer:**`` with the value below). Committed mode (``strict=False``): a display block opened there
    (``\\[``, ``$$``, ``\\begin{align*}``) runs to its close, across lines, and a value on the anchor's line ends
    with its sentence (``The final answer is $x$. I hope it is correct.``)."""
    _, line_end = _line_bounds(text, value_start)
    if text[value_start:line_end].strip(" \t*_"):
        start, end = value_start, line_end
    else:
        start = end = -1
        pos = line_end
        while pos < len(text):
            following = text.find("\n", pos + 1)
            following = len(text) if following < 0 else following
            if text[pos + 1 : following].strip():
                start, end = pos + 1, following
                break
            pos = following
        if start < 0:
            return value_start, line_end
    if strict:
        return start, end
    opened = _DISPLAY_OPEN.match(text, start, end)
    if opened is not None and (close := _display_close(text, opened)) > end:
        return start, close
    inline = opened is None or opened.group(1) in ("$", "\\(")  # "$\\frac34$. I hope it is correct."
    if inline and (cut := _sentence_end(text, start, end)) >= 0:
        return start, cut
    return start, end


def _sentence_end(text: str, start: int, end: int) -> int:
    """Where the sentence that starts at ``start`` ends before ``end`` (a ``.``/``!``/``?`` then whitespace, outside
    ``$...$`` and ``\\(...\\)``: ``$18. 21$`` is one maths span), or -1."""
    for m in _SENTENCE_END.finditer(text, start, end):
        before = text[start : m.start()]
        if before.count("$") % 2 == 0 and before.count("\\(") <= before.count("\\)"):
            return m.start()
    return -1


class _Spans:
    """Sorted, non-overlapping ``(start, end)`` spans; ``covers(pos)`` in O(log n)."""

    def __init__(self, spans: list[tuple[int, int]]):
        self.spans = sorted(spans)
        self.starts = [s for s, _ in self.spans]

    def covers(self, pos: int) -> bool:
        i = bisect.bisect_right(self.starts, pos) - 1
        return i >= 0 and pos < self.spans[i][1]


def _anchors(text: str, spec: SlotSpec, taken: _Spans, *, strict: bool = True) -> list[_Slot]:
    """Anchor slots of ``text`` outside the ``taken`` spans (boxes, tags), in order. Committed mode
    (``strict=False``): an anchor may follow any comma (``In conclusion, the answer is 42.``)."""
    found: list[_Slot] = []
    # Only a line holding one of the nouns (or "####") can hold an anchor: the others are skipped unread.
    for pos in sorted({text.rfind("\n", 0, m.start()) + 1 for m in spec._noun.finditer(text)}):  # type: ignore[attr-defined]
        line_end = text.find("\n", pos)
        line_end = len(text) if line_end < 0 else line_end
        line = text[pos:line_end]
        if spec.hashes and not taken.covers(pos) and (h := _HASHES.match(line)) is not None:
            if not found or pos >= found[-1].end:
                # its value ends like any anchor's ("#### 0. Answer: 0" holds a second anchor after "0.")
                value_start, value_end = _anchor_value(text, pos + h.end(), strict=strict)
                found.append(_Slot("anchor", pos, value_end, value_start, value_end))
        body = pos + _LINE_START.match(line).end()
        candidates = [body]
        candidates += [pos + m.end() for m in _SENTENCE_START.finditer(line)]
        candidates += [
            pos + m.end() for m in _COMMA.finditer(line) if not strict or _LEAD_IN.match(text, pos + m.end())
        ]
        if not strict:
            candidates += [pos + m.end() for m in _DISPLAY_END.finditer(line)]
        for start in sorted(candidates):
            if taken.covers(start) or (found and start < found[-1].value_start):
                continue
            m = spec._anchor.match(text, start, line_end)  # type: ignore[attr-defined]
            if m is not None:
                value_start, value_end = _anchor_value(text, m.end(), strict=strict)
            elif start == body and spec._heading.match(text, start, line_end):  # type: ignore[attr-defined]
                # a line that only names the answer ("### Final Answer"): the value is the next non-empty line
                value_start, value_end = _anchor_value(text, line_end, strict=strict)
            else:
                continue
            found.append(_Slot("anchor", start, value_end, value_start, value_end))
    return found


def _slots(region: str, spec: SlotSpec, *, allow_tags: bool, strict: bool = True) -> tuple[list[_Slot], str]:
    """Every answer slot of ``region``, in order, or the structural violation."""
    tags, why = _tags(region)
    if why:
        return [], why
    if tags and not allow_tags:
        return [], "an <answer> inside an <answer>"
    boxes = _boxes(region)
    reach = -1  # the furthest content end of the boxes so far (they come in order of their start)
    for start, _end, content_start, content_end in boxes:
        if content_end < 0:
            return [], "a box never closed (cut off)"
        if start < reach:
            return [], "a box inside a box"
        reach = max(reach, content_end)
        if _UNESCAPED_PERCENT.search(region, content_start, content_end):
            return [], "a LaTeX comment (%) inside a box"
    slots = [_Slot("tag", s, e, cs, ce) for s, e, cs, ce in tags]
    in_tag = [(s, e) for s, e, _, _ in tags]
    slots += [_Slot("box", s, e, cs, ce) for s, e, cs, ce in boxes if not any(a <= s < b for a, b in in_tag)]
    held = _Spans([(s.start, s.end) for s in slots])
    for anchor in _anchors(region, spec, held, strict=strict):
        # An anchor whose value holds a box or a tag is that box or tag: one slot.
        i = bisect.bisect_left(held.starts, anchor.value_start)
        if i == len(held.starts) or held.starts[i] >= anchor.value_end:
            slots.append(anchor)
    return sorted(slots, key=lambda s: s.start), ""


# Values joined into a list before a slot on its line ("40 or \\boxed{42}", "Answer: 40, \\boxed{42}"): a value (a
# digit, a closing bracket or dollar, a capital letter alone) then a separator, then only wrappers before the slot.
_JOINED_BEFORE = re.compile(
    r"(?:\d|[})\]$]|(?<![A-Za-z])[A-Z])[ \t]*(?:[,;/|]|\bor\b|\band\b|\\lor\b|\\vee\b|\\text\s*\{\s*(?:or|and)\s*\})"
    r"[ \t]*(?:\$\$|\$|\\\(|\\\[|[*_]{1,2})*[ \t]*$"
)
_SEPARATOR_FIRST = re.compile(r"[ \t$*_)\]]*(?:[,;/|]|or\b|and\b)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")


def _joined(region: str, slots: list[_Slot]) -> str:
    """Why the last slot is one of a list of values on its line (a value and a separator just before it, the value
    maybe another slot: ``40 or \\boxed{42}``, ``\\boxed{40}, \\boxed{42}``, ``Answer: 40 / \\boxed{42}``), or
    ``""``."""
    slot = slots[-1]
    line_start, _ = _line_bounds(region, slot.start)
    before = region[line_start : slot.start]
    if len(slots) > 1 and slots[-2].end > line_start:  # "\\boxed{18}, or, if inclusive, \\boxed{21}"
        between = region[slots[-2].end : slot.start]
        if _SEPARATOR_FIRST.match(between) and not re.search(r"[.!?][ \t]", between):
            return f"two answer slots joined by a separator in one sentence: {between.strip()[:30]!r}"
    if _JOINED_BEFORE.search(before):
        return f"a value joined to the slot before it: {before.strip()[-30:]!r}"
    return ""


def _last_line(region: str) -> tuple[int, int]:
    end = len(region.rstrip())
    start = region.rfind("\n", 0, end) + 1
    return start, end


_CAPITALISED_AFTER = re.compile(r"[ \t]+([A-Z][a-z])")
_CAPITALISED_AFTER_NUMBER = re.compile(r"(?<=\d)" + _CAPITALISED_AFTER.pattern)


def _sentences(region: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the sentences of ``region`` in order: it is cut at line ends and sentence ends
    (:data:`_SENTENCE_END`, the punctuation left out), never inside a maths span (``$18. 21$``, a display block over
    several lines)."""
    spans = maths_spans(region)
    inside = _Spans(spans)
    cuts = [(m.start(), m.end()) for m in re.finditer(r"\n", region) if not inside.covers(m.start())]
    cuts += [(m.start(), m.end()) for m in _SENTENCE_END.finditer(region) if not inside.covers(m.start())]
    # A maths span closed, or a number, and a capitalised word after it: a new sentence with its full stop left out,
    # as when a solution's lines were joined ("$y = 8.8 - 2.8 = 6$ So, the ordered pair ... is $(7, 6)$.", "P(A) =
    # 2/3 Therefore, the probability ... is 2/3.").
    cuts += [(end, m.start(1)) for _, end in spans if (m := _CAPITALISED_AFTER.match(region, end))]
    cuts += [
        (m.start(), m.start(1)) for m in _CAPITALISED_AFTER_NUMBER.finditer(region) if not inside.covers(m.start())
    ]
    out, start = [], 0
    for end, after in sorted(cuts):
        if end >= start:
            out.append((start, end))
            start = after
    out.append((start, len(region)))
    return out


def _valued_sentences(region: str) -> list[str]:
    """The sentences of ``region`` that hold a value (a digit or a maths span), stripped, in order."""
    sentences = [region[start:end].strip() for start, end in _sentences(region)]
    return [s for s in sentences if re.search(r"\d", s) or maths_spans(s)]


def _restating(before: str, value: str) -> str | None:
    """The result of a true computation stated in ``before`` that ``value`` only restates (``7 * 2 = 14`` then
    ``The answer is exactly 14.``), else None (:func:`~grpo_family.rewards.values.restated_result`)."""
    for sentence in _valued_sentences(before):
        if (result := restated_result(value, sentence)) is not None:
            return result
    return None


def _last_valued(region: str) -> str:
    """The last sentence of ``region`` that holds a value (a digit or a maths span), stripped; ``""`` when none does.
    A value reward's unmarked answer: the sentences after it hold no value (``I hope it is correct.``) and, like
    any text after the committed answer, are not read. A sentence that only restates an earlier sentence's true
    computation (:func:`~grpo_family.rewards.values.restated_result`: ``7 + 1 = 8.`` then ``This is the result
    of 7 + 1, which is 8.``) holds no value of its own: the computation stays the answer."""
    valued = _valued_sentences(region)
    for i in reversed(range(len(valued))):
        if not any(restated_result(valued[i], earlier) is not None for earlier in valued[:i]):
            return valued[i]
    return ""


def _unmarked(region: str, in_tag: bool, strict: bool, valued: str = "") -> Reading:
    """The slot of a final region with no box, tag or anchor: in strict mode the region when it is one line; in
    committed mode the last bold span of its last non-empty line, else that line up to its sentence's end. For a
    value reward, ``valued`` is the region's last sentence that holds a value (:func:`_last_valued`), read in place
    of that line (its last bold span if it has one)."""
    value = region.strip()
    if not value:
        return _broken("an empty <answer>" if in_tag else "no answer slot")
    if in_tag:
        return Reading(value, "tag")
    if strict:
        if "\n" in value:
            return _broken("no answer slot (no box, <answer> tag or anchor line, and more than one line)")
        return Reading(value, "bare")
    line = valued or region[slice(*_last_line(region))]
    bold = list(_BOLD.finditer(line))
    if bold:
        m = bold[-1]
        return Reading((m.group(1) or m.group(2)).strip(), "bold")
    cut = _sentence_end(line, 0, len(line))
    value = (line[:cut] if cut >= 0 else line).strip()
    return Reading(value, "bare") if value else _broken("no answer slot")


def _read(region: str, spec: SlotSpec, mode: str, *, in_tag: bool) -> Reading:
    strict = mode == "strict"
    slots, why = _slots(region, spec, allow_tags=not in_tag, strict=strict)
    if why:
        return _broken(why)
    if not slots:
        valued = _last_valued(region) if spec.values and not strict and not in_tag else ""
        if valued and valued != region.strip() and _slots(valued, spec, allow_tags=True, strict=False)[0]:
            # The committed sentence read as a text of its own: a marker only a line's start makes a slot ("We
            # check. #### 0", "Done. - Answer: 5") is one there, as it is when the sentence is written alone.
            return _read(valued, spec, mode, in_tag=False)
        reading = _unmarked(region, in_tag, strict, valued)
        if valued and reading.value and (number := sentence_number(reading.value)) is not None:
            return Reading(number, reading.kind)  # "Therefore, the probability ... is 2/3." commits to 2/3
        return reading
    if strict:
        if len(slots) > 1:
            kinds = ", ".join(s.kind for s in slots)
            return _broken(f"{len(slots)} answer slots ({kinds})")
        if _CLOSING.fullmatch(region, slots[-1].end) is None:
            after = region[slots[-1].end :].strip()
            return _broken(f"text after the answer slot: {after[:40]!r}")
    elif why := _joined(region, slots):
        return _broken(why)
    slot = slots[-1]
    content = region[slot.value_start : slot.value_end]
    if slot.kind == "tag":
        inner = _read(content, spec, mode, in_tag=True)
        return Reading(inner.value, "tag", inner.violation)
    value = content.strip()
    if slot.kind == "anchor":  # Markdown emphasis and a sentence's full stop around the value
        while value != (stripped := value.strip(" \t*_").rstrip(".!")):
            value = stripped
        if spec.values and not strict:  # "Final Answer: The largest $n$ is 34." commits to 34
            value = sentence_number(value) or _restating(region[: slot.start], value) or value
    if not value:
        return _broken("an empty answer slot")
    return Reading(value, slot.kind)


def read_answer(text: str | None, spec: SlotSpec = ANSWER_SLOTS, mode: str = "train") -> Reading:
    """The one answer slot of a completion's text under the answer contract, or the rule it breaks.

    ``spec`` says which anchor lines are slots (:data:`ANSWER_SLOTS`, :data:`MATH_SLOTS` with ``#### 42``,
    :data:`CHOICE_SLOTS` with "the correct option is"). ``mode="eval"`` takes the last of several slots and ignores
    text after it. The value is the slot's raw text; each reward reads its value from it.
    """
    region, why = final_region(text or "")
    if why:
        return _broken(why)
    # End-of-turn markup is no text (and </s> is no strike-through): blanked, so offsets and lines stay.
    region = _END_OF_TURN.sub(lambda m: " " * len(m.group(0)), region)
    why = hiding_markup(region)
    if why:
        return _broken(why)
    return _read(region, spec, mode, in_tag=False)


# Between two boxes of one list (after :func:`list_gap`): commas, semicolons or one "and"; "or" offers alternatives
# and joins no list. In committed mode a label of words may stand before and after the separator ("\\boxed{(3, 3)}
# \\text{ for part (a) and } \\boxed{(1, 1)}"): it holds no digit, so no value, and no "or".
_BOX_LIST_SEPARATOR = r"(?:[,;][ \t]*(?:and\b[ \t]*)?|and\b[ \t]*)"
_LIST_GAP = re.compile(rf"(?i)[ \t]*{_BOX_LIST_SEPARATOR}")
_LABEL_WORDS = r"(?:(?!or\b|and\b)(?:[A-Za-z]++|\([A-Za-z]{1,4}\))[ \t]*+)*+"
_LABELLED_LIST_GAP = re.compile(rf"(?i)[ \t]*{_LABEL_WORDS}{_BOX_LIST_SEPARATOR}{_LABEL_WORDS}")


def read_box_list(text: str | None, spec: SlotSpec = MATH_SLOTS, mode: str = "train") -> list[str] | None:
    """The contents of the boxes that end a completion as one list on one line (``\\boxed{1}, \\boxed{2} and
    \\boxed{3}``), for a gold with that many values; None when the answer is no such list.

    The list is one answer: the last slot is its last box, every gap between its boxes is a list separator
    (:data:`_LIST_GAP`), no value is joined to its first box, and the completion keeps every other rule of
    :func:`read_answer` (in strict mode the list is the only slot and nothing follows it). A reward compares the
    whole list with a gold of as many values, so that listing more values than the gold has never pays."""
    region, why = final_region(text or "")
    if why:
        return None
    region = _END_OF_TURN.sub(lambda m: " " * len(m.group(0)), region)
    if hiding_markup(region):
        return None
    strict = mode == "strict"
    slots, why = _slots(region, spec, allow_tags=True, strict=strict)
    if why or not slots or slots[-1].kind != "box":
        return None
    run = [slots[-1]]
    for before in reversed(slots[:-1]):
        gap = list_gap(region[before.end : run[0].start])
        if before.kind != "box" or "\n" in gap or not (_LIST_GAP if strict else _LABELLED_LIST_GAP).fullmatch(gap):
            break
        run.insert(0, before)
    if len(run) < 2:
        return None
    line_start, _ = _line_bounds(region, run[0].start)
    if _JOINED_BEFORE.search(region[line_start : run[0].start]):
        return None
    if strict and (len(run) != len(slots) or _CLOSING.fullmatch(region, run[-1].end) is None):
        return None
    values = [region[s.value_start : s.value_end].strip() for s in run]
    return values if all(values) else None
