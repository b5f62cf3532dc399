"""Reading the one value an answer slot holds: text macros, number words, scale words, units, exact numbers.

The answer contract (``docs/answer_extraction.md`` §6, :mod:`grpo_family.rewards.contract`) says a slot holds one
value of the reward's kind. These helpers turn a slot's text into that value or say why it is not one; the math,
multiple-choice, QA and arithmetic rewards build on them. The word lists here are lists of *numerals, units and
maths names that are read as values*; any other word in a numeric slot breaks the contract. No list of retraction
or hedge words decides anything.

Standard library only (the scoring worker subprocesses import this module).
"""

from __future__ import annotations

import ast
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "MATH_NAMES",
    "SCALES",
    "UNITS",
    "GoldShape",
    "count_numbers",
    "currency_signs_dropped",
    "integer_value",
    "list_separators",
    "normalise_gold",
    "number_from_words",
    "read_math_value",
    "read_number",
    "sentence_number",
    "sentence_result",
    "strip_wrappers",
    "unwrap_text_macros",
]

# A value may be this long; beyond it the slot holds no readable number (Python refuses int() of > 4300 digits).
MAX_NUMBER_CHARS = 1000

# ----------------------------------------------------------------------------------------------- text macros

# Every macro whose argument is shown as text: its content is read like any other text (a relation or a word in
# \textrm{} is seen), never dropped as math-verify drops \text{...}.
TEXT_MACRO = re.compile(
    r"\\(?:text(?:rm|bf|it|sf|tt|normal|up|sl|sc|md)?|emph|mbox|hbox|math(?:rm|bf|it|sf|tt|normal)|"
    r"operatorname\*?|boldsymbol|bm|pmb)(?![A-Za-z])\s*\{"
)


def _closing_brace(text: str, open_at: int) -> int:
    """Index of the ``}`` matching the ``{`` at ``open_at`` (``\\{`` and ``\\}`` are literal), or -1."""
    depth, i = 0, open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def unwrap_text_macros(text: str) -> str:
    """``text`` with every text macro replaced by its content between spaces (``18\\text{ or }21`` ->
    ``18  or  21``); an unclosed macro keeps the rest of the text as its content."""
    while (m := TEXT_MACRO.search(text)) is not None:
        close = _closing_brace(text, m.end() - 1)
        if close < 0:
            text = text[: m.start()] + " " + text[m.end() :]
        else:
            text = text[: m.start()] + " " + text[m.end() : close] + " " + text[close + 1 :]
    return text


_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"), ("__", "__"), ("`", "`"))


# A maths delimiter: ``$$``, an unescaped ``$`` (``\\$`` is a dollar sign), ``\\(``, ``\\)``, ``\\[``, ``\\]``.
_MATHS_DELIMITER = re.compile(r"\$\$|(?<!\\)\$|\\[()\[\]]")
_MATHS_OPENER = re.compile(r"\$\$|(?<!\\)\$|\\[(\[]")
_MATHS_CLOSER = {
    "$$": re.compile(r"\$\$"),
    "$": re.compile(r"(?<!\\)\$"),
    "\\(": re.compile(r"\\\)"),
    "\\[": re.compile(r"\\\]"),
}


def maths_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every maths span of ``text`` (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``),
    delimiters included, in order. A ``$`` span closes at the next ``$``, even the first of a ``$$`` (``$9$$8$`` is
    two spans); an unclosed span runs to the end; a stray closing delimiter is no span."""
    spans, pos = [], 0
    while (opened := _MATHS_OPENER.search(text, pos)) is not None:
        closed = _MATHS_CLOSER[opened.group(0)].search(text, opened.end())
        if closed is None:
            spans.append((opened.start(), len(text)))
            break
        spans.append((opened.start(), closed.end()))
        pos = closed.end()
    return spans


def spans_side_by_side(text: str) -> bool:
    """Whether two maths spans of ``text`` stand with only whitespace between them (``$9$ $8$``,
    ``\\(9\\)\\(8\\)``): two values in one slot, which math-verify would read as the last."""
    spans = maths_spans(text)
    return any(not text[a:b].strip() for (_, a), (b, _) in zip(spans, spans[1:]))


def strip_wrappers(value: str) -> str:
    """The value without the delimiters around all of it: ``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``,
    Markdown bold and code, ``\\displaystyle``, and a sentence's full stop at its end."""
    value = value.strip()
    changed = True
    while changed and value:
        changed = False
        for left, right in _WRAPPERS:
            if len(value) >= len(left) + len(right) and value.startswith(left) and value.endswith(right):
                inner = value[len(left) : len(value) - len(right)]
                if left in inner or right in inner:  # "$a$ and $b$", "\\(9\\) \\(8\\)": not one wrapped value
                    continue
                value, changed = inner.strip(), True
        for prefix in ("\\displaystyle", "\\textstyle"):
            if value.startswith(prefix):
                value, changed = value[len(prefix) :].strip(), True
        if value.endswith("."):  # a sentence's full stop ("!" may be a factorial)
            value, changed = value[:-1].rstrip(), True
    return value


# ------------------------------------------------------------------------------------------------- numbers

_SMALL = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen".split()
    )
}
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i > 1}
SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_SIGN_WORDS = {"minus": -1, "negative": -1}
NUMBER_WORDS = frozenset(_SMALL) | frozenset(_TENS) | frozenset(SCALES) | frozenset(_SIGN_WORDS) | {"and"}


def number_from_words(text: str) -> int | None:
    """The integer that English number words write (``eighteen``, ``twenty-one``, ``one hundred and five``,
    ``minus three``, ``eighteen thousand``), or None when ``text`` is anything else."""
    words = re.findall(r"[a-z]+|\S", text.lower().replace("-", " "))
    if not words:
        return None
    sign = 1
    if words[0] in _SIGN_WORDS:
        sign, words = _SIGN_WORDS[words[0]], words[1:]
    total = current = 0
    seen_number = False
    previous = ""
    for word in words:
        if word in _SMALL:
            if previous in _SMALL or previous in _TENS and _SMALL[word] >= 10 or previous in _TENS and word == "zero":
                return None  # "eighteen five", "twenty twelve": not one number
            current += _SMALL[word]
        elif word in _TENS:
            if previous in _SMALL or previous in _TENS:
                return None
            current += _TENS[word]
        elif word == "hundred":
            if current == 0 or current >= 100:
                return None
            current *= 100
        elif word in SCALES:
            if current == 0:
                return None
            total += current * SCALES[word]
            current = 0
        elif word == "and" and seen_number and previous == "hundred" or word == "and" and previous in SCALES:
            continue
        else:
            return None
        seen_number = True
        previous = word
    return sign * (total + current) if seen_number else None


_NUMERAL = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[-+−]?\.\d+")
_SCALED = re.compile(r"(?P<num>[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*(?P<scale>" + "|".join(SCALES) + r")\b")


def numeral_value(numeral: str) -> Fraction:
    """The exact value of a numeral matched by the numeral pattern (``1,234.50`` -> 2469/2)."""
    return Fraction(Decimal(numeral.replace(",", "").replace("−", "-")))


def apply_scales(text: str) -> str:
    """Numerals followed by a scale word written out (``18 thousand`` -> ``18000``, ``1.5 million`` -> ``1500000``):
    a scale word is never dropped."""

    def scaled(m: re.Match) -> str:
        value = numeral_value(m.group("num")) * SCALES[m.group("scale").lower()]
        return str(value.numerator) if value.denominator == 1 else str(Decimal(value.numerator) / value.denominator)

    return _SCALED.sub(scaled, text)


def read_number(value: str, *, prose: bool = True) -> tuple[Fraction | None, str]:
    """``(number, "")`` for a slot that holds exactly one number — a numeral (sign, thousands separators, decimals,
    ``\\$``), number words, or either followed by a scale word — else ``(None, why)``. ``prose`` (training and
    evaluation modes; off in strict mode): a sentence of words around one true computation states its result
    (:func:`sentence_result`)."""
    if len(value) > MAX_NUMBER_CHARS:
        return None, f"a value longer than {MAX_NUMBER_CHARS} characters"
    text = strip_wrappers(unwrap_text_macros(value)).replace("\\$", "")
    if spans_side_by_side(text):
        return None, "two maths spans side by side"
    text = " ".join(_MATHS_DELIMITER.sub(" ", text).split())  # "$0$$0$" is two numbers, not "00"
    text = equation_result(text) or (prose and sentence_result(text)) or text  # "2 + 8 = 10" states 10
    words = number_from_words(text)
    if words is not None:
        return Fraction(words), ""
    m = re.fullmatch(r"(?P<num>[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?)(?:\s*(?P<scale>[A-Za-z]+))?", text)
    if m is None:
        return None, f"not one number: {value.strip()[:40]!r}"
    try:
        number = numeral_value(m.group("num").rstrip("."))
    except (InvalidOperation, ValueError):
        return None, f"not one number: {value.strip()[:40]!r}"
    scale = m.group("scale")
    if scale is None:
        return number, ""
    if scale.lower() in SCALES:
        return number * SCALES[scale.lower()], ""
    if scale.lower() in UNITS or _is_noun(scale):  # a unit or the noun the number counts: "18 apples"
        return number, ""
    return None, f"a word after the number: {scale!r}"


_INTEGER = re.compile(r"-?\d+")


def integer_value(digits: str) -> int | None:
    """``int(digits)`` for an integer string (optional minus sign, surrounding whitespace), or None: not a string,
    not an integer, or longer than ``MAX_NUMBER_CHARS`` (Python refuses > 4300 digits: a ValueError that would make
    a reward or the step checker raise on a model's runaway number). The bundled task's golds and answers."""
    if not isinstance(digits, str) or not _INTEGER.fullmatch(digits.strip()):
        return None
    return int(digits) if len(digits.strip()) <= MAX_NUMBER_CHARS else None


# "2 + 8 = 10", "7 x 6 = 42", "3 \\times 6 = 18": a computation and its result, on one line.
_EQUATION = re.compile(r"(?P<lhs>[\d\s.,+\-−*/×x·÷()]+?)\s*=\s*(?P<rhs>[-−]?\d+(?:\.\d+)?)")
_OPERATOR_WORDS = {"\\times": "*", "\\cdot": "*", "\\div": "/", "×": "*", "·": "*", "÷": "/", "−": "-"}
_OPERATIONS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__}


def _exact(node: ast.AST) -> Fraction:
    """The exact value of an arithmetic expression tree of numbers, ``+ - * /`` and signs (anything else raises)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _exact(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _exact(node.left) / _exact(node.right)  # ZeroDivisionError: no result
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATIONS:
        return _OPERATIONS[type(node.op)](_exact(node.left), _exact(node.right))
    raise ValueError("not arithmetic")


def equation_result(text: str) -> str | None:
    """The result of a true arithmetic equation that ``text`` is, or None: ``2 + 8 = 10`` -> ``10``,
    ``7 x 6 = 42`` -> ``42``; ``2 + 8 = 11`` (false), ``9 = 10``, ``10 = 2 + 8`` and chains are not one.

    A computation written with its result states one value, the result: its operands are no candidates, and a
    false equation states none (so a policy cannot hide a second number in it). Exact rational arithmetic over
    ``+ - * /`` (``x``, ``\\times``, ``\\cdot``, ``÷`` written as such); no powers, at most 80 characters."""
    text = text.strip().rstrip(".").strip()
    if len(text) > 80 or text.count("=") != 1:
        return None
    for word, symbol in _OPERATOR_WORDS.items():
        text = text.replace(word, symbol)
    m = _EQUATION.fullmatch(text)
    if m is None:
        return None
    lhs = re.sub(r"(?<=[\d)\s])x(?=[\s\d(])", "*", m.group("lhs"))  # "7 x 6": x between numbers is a times
    if not re.search(r"\d\s*[-+*/]\s*[-+(]*\s*\.?\d", lhs) or _GROUPING_COMMA.sub("", lhs).count(",") > 0:
        return None  # no operation ("9 = 10"), or a list ("2, 8 = 10")
    try:
        tree = ast.parse(_GROUPING_COMMA.sub("", lhs).strip(), mode="eval")
        value = _exact(tree.body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None
    rhs = m.group("rhs").replace("−", "-")
    return rhs if value == Fraction(rhs) else None


# A computation inside a sentence of words: numbers and operators around one "=", then its result
# ("Therefore, 7 - 2 = 5.", "Here is the solution: 3 * 6 = 18"); operators already written as symbols.
_COMPUTATION = re.compile(r"(?<![\w.])[-−]?[\d(][\d\s.,+\-−*/×x·÷()]*=\s*[-−]?\d+(?:\.\d+)?(?![\w.]*\d)")
# What a sentence may hold around its one value: words and punctuation, nothing that could be a second value.
_WORDS_ONLY = re.compile(r"[A-Za-z\s,.;:!'\u2019-]*")


def sentence_result(text: str) -> str | None:
    """The result of the one true computation that a sentence of words states (``Therefore, 7 - 2 = 5.`` -> ``5``,
    ``Here is the solution: 3 * 6 = 18`` -> ``18``), or None.

    A true computation states its result (:func:`equation_result`); written inside a sentence it still states only
    that: the words around it are not read, as the words around one maths span are not
    (docs/answer_extraction.md §6). None when the words hold anything that could be a second value (a digit, a
    maths span, a number word, a second "="), or when the computation is false."""
    if len(text) > MAX_NUMBER_CHARS:
        return None
    for word, symbol in _OPERATOR_WORDS.items():
        text = text.replace(word, symbol)
    found = _sole_value(list(_COMPUTATION.finditer(text)), text)
    return None if found is None else equation_result(found.group(0))


def _sole_value(found: list[re.Match], text: str) -> re.Match | None:
    """The one match of ``found`` when ``text`` holds nothing else that could be a value: exactly one match, and
    around it words and punctuation only, with no number word."""
    if len(found) != 1:
        return None
    rest = text[: found[0].start()] + " " + text[found[0].end() :]
    if not _WORDS_ONLY.fullmatch(rest) or _NUMBER_WORD_RUN.search(rest):
        return None
    return found[0]


# A number as a restating sentence writes it: a sign only when it touches the digits ("-1", not "5 - 6").
_SIGNED_NUMBER = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?(?![\w.]*\d)")
_EXPRESSION_TOKEN = re.compile(r"\d+(?:\.\d+)?|[-+*/()]")


def restated_result(sentence: str, computation: str) -> str | None:
    """The result of the true computation that the sentence ``computation`` states (:func:`sentence_result`) when
    ``sentence`` only restates it, else None. It restates it when, with every copy of the computation's expression
    taken out, each number left is the result: ``8 + 8 = 16.`` then ``This is the result of 8 + 8, which is 16.``
    or ``This is 0.`` after ``0 - 0 = 0.``; so does a sentence that names, beside the result, the computation's
    operands in their order (``The answer is indeed 11, which is the addition of 2 and 9.`` after ``2 + 9 = 11``).
    Such a sentence names no value the computation did not commit to, so it is no later answer. None when
    ``sentence`` holds a maths span, a number word or any other number (an operand alone: ``3 is the answer to the
    question of 3 + 3.`` after ``3 + 5 = 8.``; ``This is 1 less than -2.`` after ``5 - 6 = -1.``), when it holds
    neither (an empty anchor value), or when ``computation`` is no true computation."""
    result = sentence_result(computation)
    if result is None or len(sentence) > MAX_NUMBER_CHARS or maths_spans(sentence):
        return None
    if _NUMBER_WORD_RUN.search(sentence):
        return None
    for word, symbol in _OPERATOR_WORDS.items():
        computation, sentence = computation.replace(word, symbol), sentence.replace(word, symbol)
    lhs = _COMPUTATION.search(computation).group(0).split("=")[0]
    expression = r"\s*".join(re.escape(token) for token in _EXPRESSION_TOKEN.findall(lhs))
    rest, copies = re.subn(rf"(?<![\w.]){expression}(?![\w.]*\d)", " ", sentence)
    numbers = [Fraction(n) for n in _SIGNED_NUMBER.findall(rest)]
    others = [n for n in numbers if n != Fraction(result)]
    if not (copies or numbers):
        return None  # restating nothing ("The answer is" cut off) is no restatement
    # The operands named in words, in order, beside the result: "11, which is the addition of 2 and 9"
    operands = [Fraction(n) for n in _SIGNED_NUMBER.findall(lhs)]
    if others and (others != operands or len(others) == len(numbers)):
        return None
    return result


# ------------------------------------------------------------------------------------------ lists of values

_LIST_SEPARATOR = re.compile(r"[,;/|]|\b(?:or|and)\b", re.IGNORECASE)
_GROUPING_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # "3,037": a thousands separator, no list
_ANY_NUMBER = re.compile(r"(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def list_separators(text: str) -> int:
    """How many list separators (``,`` ``;`` ``/`` ``|``, "or", "and") ``text`` holds. A slot holding more than
    its gold is a list of answers, not one (``Paris or London``; ``Trick or Treat`` is one for that gold)."""
    return len(_LIST_SEPARATOR.findall(_GROUPING_COMMA.sub("", text)))


def count_numbers(text: str) -> int:
    """How many numbers ``text`` writes (``1,234`` is one, ``30,37`` two). A slot holding more numbers than its
    gold holds more than one value of the gold's kind (``31 or 40``; a verifier reading the first number, or a
    prefix, would compare both)."""
    return len(_ANY_NUMBER.findall(text))


# --------------------------------------------------------------------------------------------- maths words

# Names that are maths, not words, when written without a backslash.
MATH_NAMES = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp max min gcd lcm mod det pi sqrt "
    "infty inf".split()
)

# Units dropped after a number when the gold is a pure number (docs/answer_extraction.md §6). Compared in lower
# case; single letters (m, g, s, h, l) only as the last token of the value.
UNITS = frozenset(
    (
        # length, area, volume
        "mm cm dm m km in inch inches ft foot feet yd yard yards mi mile miles meter meters metre metres "
        "centimeter centimeters centimetre centimetres millimeter millimeters kilometer kilometers kilometre "
        "kilometres ml l liter liters litre litres gallon gallons gal quart quarts pint pints cup cups "
        "unit units sq square cubic cc "
        # mass
        "mg g kg gram grams kilogram kilograms lb lbs pound pounds oz ounce ounces ton tons tonne tonnes "
        # time
        "s sec secs second seconds min mins minute minutes h hr hrs hour hours day days week weeks month months "
        "year years "
        # money, angle, percent, speed, temperature
        "dollar dollars cent cents usd euro euros eur pound pence penny pennies yen "
        "degree degrees deg rad radian radians percent mph kph kmh km/h m/s celsius fahrenheit"
    ).split()
)


# ---------------------------------------------------------------------------------------------- math values

# Relations at the top level of a value. "=" names a value (x = 5); inequalities in one variable are sets; the rest
# (approximations, "not equal", arrows) never state one exact value. "!=" is "not equal" (as "\\neq").
_RELATION_COMMANDS = (
    r"<=|>=|:=|!=|\\(?:leqslant|geqslant|leq|geq|le|ge|lt|gt|neq|ne|approx|simeq|sim|cong|equiv|propto|to|"
    r"rightarrow|Rightarrow|longrightarrow|implies|iff|mapsto|[A-Za-z]*(?:eq|sim|approx|arrow|Arrow)|prec|succ|"
    r"asymp|models|vdash|dashv|parallel|perp|ll|gg)(?![A-Za-z])"
)
# Characters that are values or operators on values although Unicode files them as maths symbols (Sm); every other
# Sm character is a relation (=, <, ≤, ≅, ≃, ≒, ≡, ≈, ∼, ∝, ⇒, ...), decided by category, not by a list of relations.
_SM_OPERATORS = frozenset("+\u2212\u00b1\u2213\u00d7\u00f7\u00b7\u22c5\u2217\u2218\u221a\u221b\u221c\u221e\u2211\u220f\u2210"
                          "\u222b\u222c\u222d\u222e\u2202\u2207\u00ac\u222a\u2229\u2216\u2044\u2215|~^/\u2032\u2033")  # fmt: skip
_SM_RELATIONS = "".join(
    re.escape(chr(c)) for c in range(0x110000) if unicodedata.category(chr(c)) == "Sm" and chr(c) not in _SM_OPERATORS
)
# Relations at the top level of a value. "=" names a value (x = 5); inequalities in one variable are sets; the rest
# (approximations, "not equal", congruences, arrows) never state one exact value.
_RELATION = re.compile(_RELATION_COMMANDS + f"|[{_SM_RELATIONS}]")
_EQUALS = {"=", ":="}
_LESS = {"<", "<=", "\\le", "\\leq", "\\leqslant", "\\lt", "≤", "⩽"}
_GREATER = {">", ">=", "\\ge", "\\geq", "\\geqslant", "\\gt", "≥", "⩾"}
_NOT_EQUAL = {"!=", "\\neq", "\\ne", "≠"}


def _relation_class(symbol: str) -> str:
    """``"="``, ``"<"``, ``">"``, ``"≠"`` or the symbol itself (any other relation is its own class)."""
    classes = ((_EQUALS, "="), (_LESS, "<"), (_GREATER, ">"), (_NOT_EQUAL, "≠"))
    return next((name for members, name in classes if symbol in members), symbol)


# Separators of several values at the top level: "2, 3", "2; 3", "2 \lor 3".
# Between the values of a list: punctuation, logic symbols, and the words "and" / "or" of a solution set
# ("$x = 2$ or $x = 3$", "6 \\text{ and } 8"; inside brackets they are no separators).
_WORD_SEPARATOR = re.compile(
    r"(?i)(?:[,;]\s*)?(?:\b(?:and|or)\b|\\(?:text|textrm|mathrm|mbox)\s*\{\s*(?:and|or)\s*\})"  # ", and": one
)
_SEPARATOR = re.compile(_WORD_SEPARATOR.pattern + r"|[,;]|\\(?:lor|vee|land|wedge)(?![A-Za-z])")
# What names a value: x, y_1, a_{n}, \theta, f(x), g(x, y), x'.
_NAME = re.compile(
    r"(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{[^{}]*\}|_[A-Za-z0-9])?'*(?:\s*\(\s*[A-Za-z](?:\s*,\s*[A-Za-z])*\s*\))?"
)
# A maths span that only names something: Latin letters with subscripts and primes, maybe applied to a list of
# such names (``$n$``, ``$ABCDEFGH$``, ``$f(x)$``, ``$y_1$``), or a tuple of names (``$(x, y)$``); no digit, no
# operator, no command. It states no value.
_NAME_ATOM = r"[A-Za-z](?:_\{?[A-Za-z]\}?)?'*"
_NAME_TUPLE = rf"\(\s*{_NAME_ATOM}(?:\s*,\s*{_NAME_ATOM})*\s*\)"
_NAME_SPAN = re.compile(rf"\s*(?:{_NAME_ATOM}(?:\s*{_NAME_ATOM})*(?:\s*{_NAME_TUPLE})?|{_NAME_TUPLE})\s*")
_WORD_OR_COMMAND = re.compile(r"\\[A-Za-z]+|[A-Za-z]+")
_NUMBER_WORD_RUN = re.compile(
    r"(?i)\b(?:(?:minus|negative)\s+)?(?:" + "|".join(sorted(NUMBER_WORDS - {"and"}, key=len, reverse=True)) + r")"
    r"(?:(?:[\s-]+|\s+and\s+)(?:" + "|".join(sorted(NUMBER_WORDS - {"and"}, key=len, reverse=True)) + r"))*\b"
)
_UNIT_WORD_TAIL = re.compile(r"(?<![A-Za-z\\])([A-Za-z]+(?:/[A-Za-z]+)?)\.?\s*$")
_PERCENT_TAIL = re.compile(r"\s*\\?%\s*$")
_UNIT_EXPONENT_TAIL = re.compile(r"\^\s*\{?\s*[23]\s*\}?\s*$")
_UNIT_JOIN_TAIL = re.compile(r"(?:/|\\cdot|\bper)\s*$")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\s*\{[^{}]*\}")
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad(?![A-Za-z])|~")


def _top_level(text: str, pattern: re.Pattern) -> list[re.Match]:
    """The matches of ``pattern`` in ``text`` outside every bracket (``()``, ``[]``, ``{}``, ``\\{\\}``; an
    interval's ``(1, 3]`` counts as brackets)."""
    found, depth, i = [], 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and (m := pattern.match(text, i)) is not None:
            found.append(m)
            i = m.end()
            continue
        i += 1
    return found


def split_top_level(text: str, separator: re.Pattern = _SEPARATOR) -> list[str]:
    """``text`` split at the separators outside every bracket (``"2, 3"`` -> two parts, ``"(2, 3)"`` -> one)."""
    cuts = [(m.start(), m.end()) for m in _top_level(text, separator)]
    starts = [0] + [end for _, end in cuts]
    ends = [start for start, _ in cuts] + [len(text)]
    return [text[a:b] for a, b in zip(starts, ends)]


def _relations(text: str) -> list[re.Match]:
    """The relation symbols of ``text`` outside brackets."""
    return _top_level(text, _RELATION)


def _is_name(side: str) -> bool:
    return _NAME.fullmatch(side.strip()) is not None


def _names_a_tuple(side: str) -> bool:
    """``(x, y)``: a tuple of names, which names the tuple on the other side of ``=`` as ``x`` names a number."""
    return re.fullmatch(_NAME_TUPLE, side.strip()) is not None


def _outer_brackets(text: str) -> tuple[str, str]:
    """The bracket pair around all of ``text`` (``("(", ")")`` for ``(2, 3)``), or ``("", "")``."""
    text = text.strip()
    for left, right in (("\\{", "\\}"), ("\\left(", "\\right)"), ("\\left[", "\\right]")):
        if text.startswith(left) and text.endswith(right):
            return left, right
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]":
        # the first bracket must close at the end ("(1)(2)" is not wrapped)
        depth = 0
        for i, ch in enumerate(text):
            depth += ch in "([{"
            depth -= ch in ")]}"
            if depth == 0 and i < len(text) - 1:
                return "", ""
        return text[0], text[-1]
    return "", ""


class GoldShape:
    """What a math gold looks like, for reading an answer against it: how many top-level values it has (``2, 3``:
    2) and its brackets, whether it is a relation (``x > 2``), whether it is a pure number (units may then follow
    an answer), and its letters and words (an answer may use them)."""

    def __init__(self, gold: str):
        text = strip_wrappers(gold.replace("\\$", ""))
        plain = unwrap_text_macros(text)
        left, right = _outer_brackets(text)
        self.parts = len(split_top_level(text[len(left) : len(text) - len(right)] if left else text))
        self.brackets = (left, right) if self.parts > 1 else ("", "")
        self.relations = tuple(_relation_class(m.group(0)) for m in _relations(plain))
        self.relation = bool(self.relations)
        # each value's own relations ("k = 45, n = 2": "=" in each), which a listed answer's values match
        self.part_relations = frozenset(
            tuple(_relation_class(m.group(0)) for m in _relations(part)) for part in split_top_level(plain)
        )
        no_commands = re.sub(r"\\[A-Za-z]+", " ", TEXT_MACRO.sub(" ", text))
        self.letters = frozenset(re.findall(r"[A-Za-z]", no_commands))
        self.words = frozenset(w.lower() for w in re.findall(r"[A-Za-z]{2,}", plain) if not _is_command(plain, w))
        self.numeric = not self.letters and not self.words
        self.subscripts = bool(re.search(r"\d\s*_", text))


def _is_command(text: str, word: str) -> bool:
    return f"\\{word}" in text and word not in re.findall(r"(?<!\\)\b[A-Za-z]+\b", text)


def _number_words_to_digits(text: str) -> str:
    def digits(m: re.Match) -> str:
        value = number_from_words(m.group(0))
        return m.group(0) if value is None else str(value)

    return _NUMBER_WORD_RUN.sub(digits, text)


def _is_noun(word: str) -> bool:
    """A word that may be the noun a number counts (``18 apples``, ``12 students``): two or more letters, no maths
    name and no number word."""
    lower = word.lower()
    return len(word) > 1 and word.isalpha() and lower not in MATH_NAMES and lower not in NUMBER_WORDS


def _drop_units(text: str) -> str:
    """``text`` without a trailing run of units after a number (``18 cm^2``, ``5 km/h``, ``3 square units``,
    ``18 apples``, ``12.5\\%``); an exponent goes only with its unit (``x^2`` keeps its square). Listed units
    (:data:`UNITS`) may be chained; one other word, right after the number, is the noun it counts (``18 apples``;
    ``18 is not the answer`` keeps its words)."""
    noun_allowed = True
    while True:
        rest = _UNIT_EXPONENT_TAIL.sub("", text).rstrip()
        percent = _PERCENT_TAIL.search(rest)
        if percent is not None and re.search(r"\d", rest[: percent.start()]):
            text = rest[: percent.start()].rstrip()
            continue
        m = _UNIT_WORD_TAIL.search(rest)
        if m is None:
            return text
        words = m.group(1).split("/")
        if not all(w.lower() in UNITS for w in words):
            head = rest[: m.start()].rstrip()
            if not (noun_allowed and len(words) == 1 and _is_noun(words[0]) and re.search(r"\d$", head)):
                return text
            noun_allowed = False
        head = rest[: m.start()]
        if len(m.group(1)) == 1 and not head[-1:].isspace():
            return text  # "2m" is a product; "2 m" and "2\text{ m}" are metres
        if not re.search(r"\d", head):
            return text
        text = _UNIT_JOIN_TAIL.sub("", head.rstrip()).rstrip()


_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")


def currency_signs_dropped(text: str) -> str:
    """``text`` without its currency signs: ``\\$``, a lone ``$`` before a number or right after one (``2,74 $``;
    paired ``$`` delimit maths), and ``€`` ``£`` ``¥`` before or after a number."""
    text = text.replace("\\$", " ")
    if text.count("$") % 2 == 1:
        text = re.sub(r"\$(?=\s*\d)|(?<=\d)\s*\$(?!\s*\d)", "", text, count=1)
    return re.sub(r"(?<=\d)\s*[€£¥]|[€£¥]\s*(?=\d)", "", text)


def _money_and_separators(text: str) -> str:
    text = strip_wrappers(currency_signs_dropped(text))
    text = re.sub(r"(\d)\{,\}(\d{3})", r"\1\2", text)
    text = re.sub(r"(\d),\\!(\d{3})(?!\d)", r"\1\2", text)  # MATH's "10,\!000"
    text = _SI_GROUPED.sub(lambda m: re.sub(r"\D", "", m.group(0)), text)
    text = _BRACKETED_ARRAY.sub(_array_matrix, text)
    text = _MATRIX.sub(r"\\\1{pmatrix}", text)
    return _REPEATING.sub(_repeating_fraction, text)


# A number written in SI groups of three digits ("1 234", "1\,234 567", thin spaces): one number.
_SI_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?:(?: |\\,|~|\u2009|\u202f)\d{3})+(?![\d.,])")
# A matrix in any bracket style (pmatrix, bmatrix, Bmatrix, matrix, smallmatrix) is the same matrix; vmatrix is a
# determinant and stays.
_MATRIX = re.compile(r"\\(begin|end)\s*\{(?:[bBp]?matrix|smallmatrix)\}")
# An array between stretched brackets (``\left[\begin{array}{cc}1 & 2\end{array}\right]``) is the matrix of that
# bracket style: the column specification (``{cc}``) is layout, not text.
_BRACKETED_ARRAY = re.compile(
    r"\\left\s*([(\[])\s*\\begin\s*\{array\}\s*\{[^{}]*\}(.*?)\\end\s*\{array\}\s*\\right\s*([)\]])", re.S
)


def _array_matrix(m: re.Match) -> str:
    if "([".index(m.group(1)) != ")]".index(m.group(3)):  # "\\left( ... \\right]": no one bracket style
        return m.group(0)
    environment = "pmatrix" if m.group(1) == "(" else "bmatrix"
    return f"\\begin{{{environment}}}{m.group(2)}\\end{{{environment}}}"


# A repeating decimal: 0.\overline{3}, 1.2\overline{45}, 0.\dot{3}.
_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\(?:overline|dot)\s*\{?\s*(\d+)\s*\}?")


def _repeating_fraction(m: re.Match) -> str:
    whole, fixed, period = m.group(1) or "0", m.group(2), m.group(3)
    value = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _group_end(text: str) -> int:
    """The index of the brace that closes the group ``text`` opens with ``{`` (escaped braces are no grouping); -1
    when it never closes."""
    depth, i = 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
        i += 1
    return -1


def commas_in_one_number(text: str) -> str:
    """``text`` that is one number written with a comma, as a reader reads it: thousands separators go (``1,234``,
    ``12,345.5``); a comma that cannot group thousands is a decimal comma (``1,22``, ``0,111``, ``1000,99``: 1.22,
    0.111, 1000.99). Any other text is returned unchanged."""
    if re.fullmatch(r"[-+−]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?", text):
        return text.replace(",", "")
    if re.fullmatch(r"[-+−]?\d+,\d+", text):
        return text.replace(",", ".")
    return text


def normalise_gold(gold: str) -> str:
    """A math gold as the answers are read: delimiters, ``\\$`` and text macros unwrapped, degrees and a trailing
    unit after a number dropped (``5\\text{ cm}^2`` -> ``5``)."""
    text = strip_wrappers(gold)
    if maths_spans(text) and not spans_side_by_side(text):  # "$1$ and $2$ and $3$"
        text = _MATHS_DELIMITER.sub(" ", text)
    # spacing is no text: "a=4,\\,-8" is the list "a=4, -8" (the comma of "\\," is no separator)
    text = _SPACING.sub(" ", unwrap_text_macros(_money_and_separators(text)))
    if text.startswith("{") and _group_end(text) == len(text) - 1:  # a LaTeX group shows its content: "{1,2,3}"
        text = text[1:-1].strip()
    if _top_level(text, _WORD_SEPARATOR):  # "6 and 8", "1 and 2 and 3": the list math-verify reads as "6, 8"
        text = ", ".join(part.strip() for part in split_top_level(text, _WORD_SEPARATOR))
    text = re.sub(r"(?i)\bper\s*cent\b|\bpercent\b", "%", text)
    text = _number_words_to_digits(apply_scales(text))
    text = _DEGREES.sub(" ", text)
    text = " ".join(_drop_units(text.strip()).split())
    return commas_in_one_number(named_tuples(text))


def _names_only(span: str) -> bool:
    """Whether a maths span (delimiters included) only names something (``$n$``, ``$f(x)$``, ``$(x, y)$``)."""
    return _NAME_SPAN.fullmatch(_MATHS_DELIMITER.sub(" ", span)) is not None


def _span_in_prose(text: str, spans: list[tuple[int, int]]) -> str:
    """The content of the one maths span of a sentence whose other text is words alone (``Therefore $x \\geq 5$ is
    the solution.``, ``The identity matrix is $I$.``): the value the sentence states, as math-verify reads it; ``""``
    when there are more spans or the words hold a number (a digit, a number word), which would be a second value.
    Beside a span that holds a value, spans that only name something (``So the pair $(x, y)$ is $(7, 6)$.``,
    :func:`_names_only`) are words: they hold no candidate."""
    values = [span for span in spans if not _names_only(text[span[0] : span[1]])]
    chosen = values if len(spans) > 1 else spans
    if len(chosen) != 1:
        return ""
    ((start, end),) = chosen
    cuts = [0] + [i for span in spans for i in span] + [len(text)]
    prose = " ".join(text[a:b] for a, b in zip(cuts[::2], cuts[1::2]))  # the text outside every span
    if not prose.strip() or re.search(r"[^A-Za-z\s,.;:!'\u2019-]", prose) or _NUMBER_WORD_RUN.search(prose):
        return ""
    return _MATHS_DELIMITER.sub(" ", text[start:end]).strip()


# A number in a sentence of words: sign, digits, decimal or grouping marks, a fraction bar, a percent sign.
_PLAIN_NUMBER = re.compile(r"(?<![\w.,/-])[-−]?\d+(?:[.,/]\d+)*(?:\\?%)?(?!\w)")


def sentence_number(sentence: str) -> str | None:
    """The one number of a sentence of words (``Therefore, the probability that Alice wins the game is 2/3``,
    ``So, you are left with only 7 in your answer``, ``The volume of $ABCDEFGH$ is 120``), or None.

    A value reward's committed sentence (docs/answer_extraction.md §4: an anchor's value, or the last sentence that
    holds a value) states its one number, whatever its words say: the words are not read, as those around one
    maths span or one box are not (``The answer is not 18`` states 18, as ``The answer is not $18$`` and ``The
    answer isn't $\\boxed{18}$`` do; strict mode refuses all three). So the sentence earns what the number alone
    earns, and no more. None when it holds a second number, a number word, a maths span with a value in it (spans
    that only name something, :func:`_names_only`, may stand in it), or anything but words, punctuation and a
    currency sign besides."""
    if len(sentence) > MAX_NUMBER_CHARS:
        return None
    sentence = currency_signs_dropped(sentence)
    spans = maths_spans(sentence)
    if any(not _names_only(sentence[a:b]) for a, b in spans):
        return None
    cuts = [0] + [i for span in spans for i in span] + [len(sentence)]
    words = " ".join(sentence[a:b] for a, b in zip(cuts[::2], cuts[1::2]))
    number = _sole_value(list(_PLAIN_NUMBER.finditer(words)), words)
    return None if number is None else number.group(0)


# Words and a colon before a value label it (``Here is a zero matrix: $...$``, ``Here is the solution: 3 * 6 =
# 18``): a label holds no digit and no maths, and its words are not read (a number word in it is no value).
_LABEL = re.compile(r"[A-Za-z][A-Za-z \t,'\u2019-]*:[ \t]+(?=\S)")


def drop_label(text: str) -> str:
    """``text`` without a label of words and a colon before its value (see :data:`_LABEL`)."""
    m = _LABEL.match(text)
    return text[m.end() :] if m else text


# One named value of a list: ``p=5``, ``x_1 = -3``.
_NAMED_PART = re.compile(r"\s*([A-Za-z](?:_\{?\w+\}?)?)\s*=\s*([^=]+?)\s*")


def named_tuples(text: str) -> str:
    """``text`` with solutions written as groups of named values read as the tuples they are, in golds and answers
    alike (``p=5,q=2;p=7,q=2`` and ``p = 5, q = 2 and p = 7, q = 2`` -> ``(5, 2), (7, 2)``); any other text
    unchanged. The groups are found by their names, not by their separators: a list of named values whose names
    repeat, in the same order, every k > 1 values (distinct names within a group) holds one solution per group. The
    names say which part of a tuple each value is, nothing more: the tuples are compared as a gold of tuples is."""
    parts = [_NAMED_PART.fullmatch(part) for part in split_top_level(text)]
    if len(parts) < 4 or not all(parts):
        return text
    names = [m.group(1) for m in parts]
    size = names.index(names[0], 1) if names[0] in names[1:] else 0
    if size < 2 or len(names) % size or len(set(names[:size])) != size:
        return text
    if any(name != names[i % size] for i, name in enumerate(names)):
        return text
    groups = [parts[i : i + size] for i in range(0, len(parts), size)]
    return ", ".join("(" + ", ".join(m.group(2) for m in group) + ")" for group in groups)


def _distinct(parts: list[str]) -> list[str]:
    """``parts`` with repeats of a value (spacing aside) dropped: a value listed twice is one value, not two
    candidates (``(3, 17, 3, 7), ..., (3,17,3,7)``)."""
    seen: dict[str, str] = {}
    for part in parts:
        seen.setdefault(re.sub(r"\s+", "", part), part)
    return list(seen.values())


def read_math_value(slot: str, gold: GoldShape, *, prose: bool = True) -> tuple[str | None, str, bool]:
    """``(latex, violation, as_set)``: the one value (or the gold's number of values) a math slot holds, as LaTeX
    for math-verify, or why the slot breaks the contract (docs/answer_extraction.md §6). ``as_set``: the value is an
    inequality in one variable, compared with an interval gold as a set. ``prose`` (training and evaluation modes;
    off in strict mode): a sentence of words around one maths span states the span's value, around one true
    computation its result, and words and a colon before the value label it."""
    text = strip_wrappers(drop_label(slot.strip()) if prose else slot)
    # Maths spans left inside the value: two side by side are two values ("$9$ $8$", "\\(9\\)\\(8\\)", which
    # math-verify would read as the last); otherwise their delimiters go ("$x$ = $9$", "\\(9\\) apples").
    if spans_side_by_side(text):
        return None, "two maths spans side by side", False
    if spans := maths_spans(text):
        text = (prose and _span_in_prose(text, spans)) or _MATHS_DELIMITER.sub(" ", text)
    text = unwrap_text_macros(_money_and_separators(text))
    text = re.sub(r"(?i)\bper\s*cent\b|\bpercent\b", r"\\%", text)
    text = apply_scales(text)
    text = _number_words_to_digits(text)
    text = apply_scales(text)
    if gold.numeric:
        text = _drop_units(_DEGREES.sub(" ", text).strip())
    text = " ".join(_SPACING.sub(" ", text).split())
    if prose and gold.numeric and (result := sentence_result(text)) is not None:
        text = result  # "Therefore, 7 - 2 = 5." states 5
    if not text:
        return None, "an empty slot", False
    if "?" in text:
        return None, "a question mark in the value", False
    if text.count("(") + text.count("[") != text.count(")") + text.count("]"):
        return None, "unbalanced brackets (a list left open: '0 (0, 1')", False
    if re.search(r"\d\s*_", text) and not gold.subscripts:
        return None, "a subscript on a number (a base, an index: not the number)", False
    for token in _WORD_OR_COMMAND.findall(_ENVIRONMENT.sub(" ", text)):
        if token.startswith("\\") or len(token) == 1:
            continue
        word = token.lower()
        if word in MATH_NAMES or word in gold.words or set(token) <= gold.letters:
            continue
        if gold.parts > 1 and _WORD_SEPARATOR.fullmatch(token):  # "6 and 8" for a gold of two values
            continue
        return None, f"a word in the value: {token!r}", False
    if gold.parts == 1:
        text = commas_in_one_number(text)
    parts = split_top_level(named_tuples(text))
    if len(parts) > gold.parts:
        parts = _distinct(parts)
    if len(parts) > 1 and len(parts) != gold.parts:
        return None, f"{len(parts)} values where the gold has {gold.parts}", False
    values, as_set = [], False
    for part in parts:
        part = part.strip()
        if not part:
            return None, "an empty value between separators", False
        # "18 21", and "18. 21" (a sentence's full stop between them: math-verify would read the text as it is)
        if re.search(r"\d\.?\s+[-+−]?\.?\d", part):
            return None, "two numbers side by side", False
        relations = _relations(part)
        if relations and gold.relation:
            kinds = tuple(_relation_class(m.group(0)) for m in relations)
            mirrored = tuple({"<": ">", ">": "<"}.get(k, k) for k in reversed(kinds))  # "5 \\geq x" is "x \\leq 5"
            allowed = gold.part_relations if len(parts) > 1 else {gold.relations}
            if not {kinds, mirrored} & allowed:
                return None, f"relations {' '.join(m.group(0) for m in relations)} where the gold states one", False
        elif relations:
            kinds = [m.group(0) for m in relations]
            sides = [part[: relations[0].start()]]
            sides += [part[a.end() : b.start()] for a, b in zip(relations, relations[1:])]
            sides.append(part[relations[-1].end() :])
            if len(kinds) == 1 and kinds[0] in _EQUALS:
                if _is_name(sides[0]) or _names_a_tuple(sides[0]):  # "x = 5", "(x, y) = (5, 8)"
                    part = sides[1].strip()
                elif _is_name(sides[1]):
                    part = sides[0].strip()
                elif gold.numeric and (result := equation_result(part)) is not None:
                    part = result  # "2 + 8 = 10": a true computation states its result
                else:
                    return None, "a relation between two values", False
                if not part:
                    return None, "a relation without a value", False
            elif all(k in _LESS for k in kinds) or all(k in _GREATER for k in kinds):
                named = [i for i, side in enumerate(sides) if _is_name(side)]
                if len(kinds) > 2 or len(named) != 1 or (len(kinds) == 2 and named != [1]):
                    return None, "an inequality that is not in one variable", False
                as_set = True
            else:
                return None, f"a relation that states no exact value: {' '.join(kinds)}", False
        values.append(part)
    latex = ", ".join(values)
    if len(values) > 1 and gold.brackets != ("", ""):
        latex = gold.brackets[0] + latex + gold.brackets[1]
    return latex, "", as_set
