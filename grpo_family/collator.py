"""The one data-collator module: rows of common datasets -> TRL's conversational prompt format.

:func:`prepare_dataset` turns a ``datasets.Dataset`` into rows ::

    {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
     "answer": gold,                 # what the reward functions in grpo_family.rewards compare against
     "solution": reference}          # only when the data has a reference solution (SGPO's judge uses it)

(the ``code`` preset puts the tests in ``test_cases`` instead of ``answer``) and drops every other column. TRL applies the model's chat template itself, and batching is TRL's too, so nothing
else is needed here. Presets (``preset=`` name, or ``"auto"`` to detect from the columns):

============  ==========================================  ======================================================
preset        columns (first present wins)                gold
============  ==========================================  ======================================================
``gsm8k``     ``question``, ``answer``                    the number after ``####`` in ``answer`` (commas
                                                          dropped); the worked answer, without ``<<...>>``
                                                          calculator notes, becomes ``solution``
``math``      ``problem`` (or ``question``),              ``answer`` when present, else the boxed answer of
              ``answer``/``final_answer``, ``solution``   ``solution`` (boxes joined by "and"/"," become one
                                                          tuple gold ``"2, 3"``; an ambiguous solution is no
                                                          gold, reported). MATH, MATH-500, DeepScaleR
                                                          (problem/answer/solution), Open-RS / open-s1,
                                                          NuminaMath-style data
``dapo``      ``prompt`` (text or messages), ``solution``  ``solution`` (open-r1/DAPO-Math-17k-Processed) or
              or ``reward_model``                         ``reward_model["ground_truth"]`` (the original DAPO
                                                          data); DAPO's own "Answer:" instruction around the
                                                          problem is removed so the system prompt governs
``choice``    ``question``, ``options``/``choices``,      a letter: ``answer_idx`` (MedQA), ``answerKey``
              gold column                                 (RiddleSense, ARC, CommonsenseQA), ``answer`` (a
                                                          letter, a 0-based index as in MMLU, or an option's
                                                          text), ``label`` (0-based index). Options may be a
                                                          list, a ``{"A": text}`` dict, a
                                                          ``{"label": [...], "text": [...]}`` dict or a list of
                                                          ``{"key", "value"}``; they are rendered
                                                          ``"A. ...\\nB. ..."`` after the question, re-lettered
                                                          A, B, ... in their order
``qa``        ``question``, ``answer``/``answers``        the answer as is: a string or a list of aliases (a
                                                          SQuAD ``{"text": [...]}`` dict becomes its list).
                                                          HotpotQA, NQ, SQuAD, and any question/answer data
``code``      ``question``/``problem``/``prompt``/        no ``answer``: the tests go to a ``test_cases``
              ``text``, ``test_cases``/``tests``/         column, as is, for the ``code_tests`` reward (a list
              ``input_output``/``test_list``/``test``     of ``{"input", "output"}``, APPS
                                                          ``{"inputs", "outputs"}``, assert strings as in MBPP /
                                                          HumanEval; see :mod:`grpo_family.rewards.code`)
``prompt``    ``prompt``, ``answer``                      passed through unchanged (the bundled tasks); a system
                                                          message is added only when ``system_prompt`` is given
``reasoning_  ``question``, ``answer``,                   ``answer`` as is; the entry column is kept for the
gym``         ``reasoning_gym_entry``                     ``reasoning_gym`` reward (the task's own verifier).
                                                          Rows of ``--dataset_name reasoning_gym/<task>``
                                                          (:mod:`grpo_family.tasks.reasoning_gym`)
============  ==========================================  ======================================================

Auto-detection, in order: a ``reasoning_gym_entry`` column -> ``reasoning_gym``; a test column (``test_cases``,
``tests``, ``input_output``, ``test_list``) -> ``code``; ``prompt`` + ``answer`` -> ``prompt``; an
``options``/``choices`` column -> ``choice``; ``prompt`` + ``solution``/``reward_model`` -> ``dapo``; ``problem``
-> ``math``; ``question`` + ``answer`` whose first rows contain ``####`` -> ``gsm8k``; ``question`` +
``answer``/``answers`` -> ``qa``. Column overrides
(``question_column=`` ...) take part in the detection; with only overrides to go on, ``qa`` (gold as is) is used.

A needed column that is missing raises :class:`DatasetFormatError` before any row is processed; its message names
the column, lists the columns found and says how to map them. Rows whose gold cannot be found (e.g. a MATH
solution without ``\\boxed{}``, boxes apart in the text, an unboxed final answer after the box) keep
``answer=None`` (the rewards return None, "cannot score", for them) and are counted in a warning with examples and
reasons. :func:`grpo_family.rewards.check_golds` goes further and checks, before training, that each reward can read
each gold.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable
from typing import Any

from .errors import DatasetFormatError
from .rewards.extract import solution_gold

__all__ = [
    "BOXED_SYSTEM_PROMPT",
    "CHOICE_SYSTEM_PROMPT",
    "CODE_SYSTEM_PROMPT",
    "DatasetFormatError",
    "MATH_SYSTEM_PROMPT",
    "PRESETS",
    "REASONING_GYM_SYSTEM_PROMPT",
    "REASONING_SYSTEM_PROMPT",
    "SYSTEM_PROMPTS",
    "detect_preset",
    "filter_rows",
    "format_options",
    "gsm8k_gold",
    "prepare_dataset",
]

logger = logging.getLogger(__name__)

REASONING_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant answers it. The "
    "Assistant first thinks about the reasoning process and then gives the answer. The reasoning process and the "
    "answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think><answer> answer here </answer>."
)
MATH_SYSTEM_PROMPT = (
    REASONING_SYSTEM_PROMPT + " Inside the <answer> tags, put the final result within \\boxed{}. Reply in English."
)
BOXED_SYSTEM_PROMPT = (
    "Think through the problem step by step inside <think> </think> tags, then write the solution and put your "
    "final answer within \\boxed{}."
)
CHOICE_SYSTEM_PROMPT = (
    REASONING_SYSTEM_PROMPT + " The question is multiple choice: inside the <answer> tags write only the letter of "
    "the correct option."
)
CODE_SYSTEM_PROMPT = (
    "Solve the programming problem in Python. Think it through first, then give the complete program in one "
    "```python code block at the end; it reads standard input and writes standard output unless the problem asks "
    "for a function."
)
# reasoning-gym tasks: their questions say what to compute, not how to mark the answer, which the verifier and the
# answer rewards read from an <answer> block.
REASONING_GYM_SYSTEM_PROMPT = (
    "Solve the problem. You may reason briefly first, then give only the final answer inside <answer> </answer> "
    "tags, for example <answer>42</answer>."
)

# ``system_prompt=`` also accepts these names. "none" (or "") means no system message.
SYSTEM_PROMPTS: dict[str, str] = {
    "reasoning": REASONING_SYSTEM_PROMPT,
    "math": MATH_SYSTEM_PROMPT,
    "boxed": BOXED_SYSTEM_PROMPT,
    "choice": CHOICE_SYSTEM_PROMPT,
    "code": CODE_SYSTEM_PROMPT,
    "reasoning_gym": REASONING_GYM_SYSTEM_PROMPT,
    "none": "",
}

PRESETS = ("gsm8k", "math", "dapo", "choice", "qa", "code", "prompt", "reasoning_gym")
# The column that carries a reasoning-gym entry (grpo_family.tasks.reasoning_gym.ENTRY_COLUMN).
_RG_ENTRY = "reasoning_gym_entry"
_ALIASES = {
    "math500": "math",
    "math-500": "math",
    "deepscaler": "math",
    "open-rs": "math",
    "open_rs": "math",
    "open-s1": "math",
    "dapo-math": "dapo",
    "mcq": "choice",
    "multiple_choice": "choice",
    "medqa": "choice",
    "riddlesense": "choice",
    "mmlu": "choice",
    "arc": "choice",
    "hotpotqa": "qa",
    "nq": "qa",
    "squad": "qa",
    "apps": "code",
    "taco": "code",
    "mbpp": "code",
    "humaneval": "code",
    "bundled": "prompt",
    "passthrough": "prompt",
}
_DEFAULT_SYSTEM = {
    "gsm8k": MATH_SYSTEM_PROMPT,
    "math": MATH_SYSTEM_PROMPT,
    "dapo": MATH_SYSTEM_PROMPT,
    "choice": CHOICE_SYSTEM_PROMPT,
    "qa": REASONING_SYSTEM_PROMPT,
    "code": CODE_SYSTEM_PROMPT,
    "prompt": "",
    "reasoning_gym": REASONING_GYM_SYSTEM_PROMPT,
}

# Candidate columns per role, first present wins.
_QUESTION = {
    "gsm8k": ("question",),
    "math": ("problem", "question"),
    "dapo": ("prompt",),
    "choice": ("question", "problem", "stem"),
    "qa": ("question", "query", "problem"),
    "code": ("question", "problem", "prompt", "text", "description"),
    "prompt": ("prompt",),
    "reasoning_gym": ("question",),
}
_GOLD = {
    "gsm8k": ("answer",),
    "math": ("answer", "final_answer", "gold"),
    "dapo": ("solution", "reward_model", "answer", "ground_truth"),
    "choice": ("answer_idx", "answerKey", "answer_key", "answer", "label"),
    "qa": ("answer", "answers", "gold"),
    "code": ("test_cases", "tests", "input_output", "test_list", "test"),
    "prompt": ("answer",),
    "reasoning_gym": ("answer",),
}
_OPTIONS = ("options", "choices")

_DAPO_PREFIX = re.compile(
    r"^\s*Solve the following math problem step by step\. The last line of your response should be of the form "
    r"Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*",
)
_DAPO_SUFFIX = re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$")
_GSM8K_CALC = re.compile(r"<<[^<>]*>>")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def gsm8k_gold(answer: str) -> str | None:
    """The final answer of a GSM8K ``answer`` field: the text after the last ``####``, commas dropped."""
    if not isinstance(answer, str):
        return None
    tail = answer.rsplit("####", 1)[-1].strip().replace(",", "")
    return tail or None


def format_options(options: Any) -> list[tuple[str, str]]:
    """``[(letter, text), ...]`` from a list, ``{"A": text}``, ``{"label": [...], "text": [...]}`` or a list of
    ``{"key", "value"}`` dicts. Letters are A, B, ... in the options' order (original labels are dropped)."""
    if isinstance(options, dict):
        if "text" in options and isinstance(options["text"], list):
            texts = list(options["text"])
        else:
            texts = [options[k] for k in sorted(options) if options[k] is not None]
    elif isinstance(options, list):
        texts = [o.get("value", o.get("text")) if isinstance(o, dict) else o for o in options]
    else:
        raise DatasetFormatError(f"cannot read multiple-choice options of type {type(options).__name__}: {options!r}")
    return [(_LETTERS[i], str(t)) for i, t in enumerate(texts)]


def _option_labels(options: Any) -> list[str]:
    """The dataset's own labels of the options, in order (to map a labelled gold onto A, B, ...)."""
    if isinstance(options, dict):
        if "label" in options and isinstance(options["label"], list):
            return [str(x) for x in options["label"]]
        if "text" in options and isinstance(options["text"], list):
            return []
        return [str(k) for k in sorted(options) if options[k] is not None]
    if isinstance(options, list):
        return [str(o["key"]) if isinstance(o, dict) and "key" in o else "" for o in options]
    return []


def _choice_gold(gold: Any, options: Any) -> str | None:
    """The gold option as a letter A, B, ... (None when it cannot be matched to an option)."""
    rendered = format_options(options)
    n = len(rendered)
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return _LETTERS[gold] if 0 <= gold < n else None
    gold = str(gold).strip()
    labels = _option_labels(options)
    for i, label in enumerate(labels):  # the dataset's own label ("C", or "3" in some ARC rows)
        if label and gold.upper() == label.upper():
            return _LETTERS[i] if i < n else None
    if len(gold) == 1 and gold.upper() in _LETTERS[:n]:
        return gold.upper()
    if gold.isdigit():
        idx = int(gold)
        return _LETTERS[idx] if 0 <= idx < n else None
    for letter, text in rendered:  # gold given as the option's text (MedQA's "answer")
        if text.strip() == gold:
            return letter
    return None


def _columns(dataset) -> list[str]:
    cols = getattr(dataset, "column_names", None)
    if cols is None:
        raise DatasetFormatError(
            "the dataset does not expose its column names (an IterableDataset without features?); "
            "load it as a datasets.Dataset or cast its features first"
        )
    return list(cols)


def _peek(dataset, n: int = 20) -> list[dict]:
    return list(itertools.islice(iter(dataset), n))


def _how_to_map(preset: str) -> str:
    return (
        f"Map your columns with prepare_dataset(..., preset={preset!r}, question_column=..., answer_column=..., "
        "solution_column=...) or, on the command line, --question_column / --answer_column / --solution_column "
        f"(and --dataset_preset to pick a preset: {', '.join(PRESETS)})."
    )


def detect_preset(dataset, *, question_column=None, answer_column=None, options_column=None) -> str:
    """The preset ``"auto"`` picks for ``dataset`` (see the module docstring); DatasetFormatError if none fits."""
    cols = set(_columns(dataset))
    if _RG_ENTRY in cols:
        return "reasoning_gym"
    if cols & set(_GOLD["code"][:-1]):  # "test" alone is too generic to detect on
        return "code"
    has_gold = "answer" in cols or answer_column is not None
    if "prompt" in cols and has_gold and question_column is None:
        return "prompt"
    if options_column is not None or cols & set(_OPTIONS):
        return "choice"
    if "prompt" in cols and ({"solution", "reward_model"} & cols) and question_column is None:
        return "dapo"
    if "problem" in cols or (question_column == "problem"):
        return "math"
    if "question" in cols or question_column is not None:
        gold_col = answer_column or ("answer" if "answer" in cols else "answers" if "answers" in cols else None)
        if gold_col == "answer" and answer_column is None:
            rows = _peek(dataset)
            golds = [r.get("answer") for r in rows]
            if golds and all(isinstance(g, str) and "####" in g for g in golds):
                return "gsm8k"
        if gold_col is not None:
            return "qa"
    raise DatasetFormatError(
        f"Could not tell which dataset preset fits the columns {sorted(cols)}. Known presets: "
        f"{', '.join(PRESETS)} (see grpo_family.collator). " + _how_to_map("math")
    )


def _pick(preset: str, role: str, candidates: tuple[str, ...], override: str | None, cols: list[str]) -> str | None:
    if override is not None:
        if override not in cols:
            raise DatasetFormatError(
                f"The {role} column {override!r} given for preset {preset!r} is not in the dataset; "
                f"columns found: {cols}. " + _how_to_map(preset)
            )
        return override
    return next((c for c in candidates if c in cols), None)


def _missing(preset: str, role: str, candidates: tuple[str, ...], cols: list[str], flag: str) -> DatasetFormatError:
    wanted = " or ".join(repr(c) for c in candidates)
    return DatasetFormatError(
        f"Preset {preset!r} needs a {role} column ({wanted}), but the dataset has none. Columns found: {cols}. "
        f"Say which column holds the {role} with prepare_dataset(..., {flag}=<column>) (--{flag} on the command "
        f"line), or choose another preset with preset= (--dataset_preset): {', '.join(PRESETS)}."
    )


def _system_text(system_prompt: str | None, preset: str) -> str:
    if system_prompt is None:
        return _DEFAULT_SYSTEM[preset]
    return SYSTEM_PROMPTS.get(system_prompt, system_prompt)


def _messages(system: str, user: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": user}]


def _with_instruction(prompt: Any, instruction: str) -> Any:
    """``prompt`` (text or messages) with ``instruction`` on a new line after its last user message."""
    if isinstance(prompt, str):
        return f"{prompt}\n{instruction}"
    messages = [dict(m) for m in prompt]
    last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    messages[last]["content"] = f"{messages[last]['content']}\n{instruction}"
    return messages


def _user_text(prompt: Any) -> str:
    """The question of a DAPO-style prompt given as text or as a message list (its last user message)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return str(users[-1].get("content") or "")
    raise DatasetFormatError(f"cannot read a question from a prompt of type {type(prompt).__name__}")


def _qa_gold(gold: Any) -> Any:
    if isinstance(gold, dict):  # SQuAD {"text": [...], "answer_start": [...]}, TriviaQA {"value", "aliases"}
        if isinstance(gold.get("text"), list):
            return [str(g) for g in gold["text"]]
        if isinstance(gold.get("aliases"), list):
            value = [str(gold["value"])] if gold.get("value") else []
            return value + [str(a) for a in gold["aliases"]]
    if isinstance(gold, tuple):
        return list(gold)
    return gold


def _plan(dataset, preset, question_column, answer_column, solution_column, options_column, system_prompt):
    """Resolve columns and return the per-row function; raises DatasetFormatError before touching rows."""
    cols = _columns(dataset)
    q = _pick(preset, "question", _QUESTION[preset], question_column, cols)
    if q is None:
        raise _missing(preset, "question", _QUESTION[preset], cols, "question_column")
    gold_candidates = _GOLD[preset]
    a = _pick(preset, "answer", gold_candidates, answer_column, cols)
    # The reference solution: auto-picked for math and qa; any preset carries one named by solution_column.
    s = _pick(preset, "solution", ("solution",) if preset in ("math", "qa") else (), solution_column, cols)
    if a is None and not (preset == "math" and s is not None):
        if preset == "math":
            raise _missing(preset, "gold answer", gold_candidates + ("solution",), cols, "answer_column")
        raise _missing(
            preset, "test cases" if preset == "code" else "gold answer", gold_candidates, cols, "answer_column"
        )
    system = _system_text(system_prompt, preset)

    if preset == "gsm8k":

        def row_fn(row):
            ans = row[a]
            out = {"prompt": _messages(system, row[q]), "answer": gsm8k_gold(ans)}
            if s is not None:
                out["solution"] = row[s]
            elif isinstance(ans, str) and "####" in ans:
                out["solution"] = _GSM8K_CALC.sub("", ans).strip()
            return out

        return row_fn

    if preset == "math":

        def row_fn(row):
            sol = row[s] if s is not None else None
            gold = row[a] if a is not None else None
            if gold is None or (isinstance(gold, str) and not gold.strip()):
                gold, _ = solution_gold(sol) if isinstance(sol, str) else (None, "")
            out = {"prompt": _messages(system, row[q]), "answer": None if gold is None else str(gold)}
            if s is not None:
                out["solution"] = sol
            return out

        return row_fn

    if preset == "dapo":

        def row_fn(row):
            text = _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", _user_text(row[q])))
            gold = row[a]
            if isinstance(gold, dict):
                gold = gold.get("ground_truth")
            out = {"prompt": _messages(system, text.strip()), "answer": None if gold is None else str(gold)}
            if s is not None:
                out["solution"] = row[s]
            return out

        return row_fn

    if preset == "choice":
        o = _pick(preset, "options", _OPTIONS, options_column, cols)
        if o is None:
            raise _missing(preset, "options", _OPTIONS, cols, "options_column")

        def row_fn(row):
            rendered = format_options(row[o])
            body = "\n".join(f"{letter}. {text}" for letter, text in rendered)
            out = {"prompt": _messages(system, f"{row[q]}\n\n{body}"), "answer": _choice_gold(row[a], row[o])}
            if s is not None:
                out["solution"] = row[s]
            return out

        return row_fn

    if preset == "code":

        def row_fn(row):  # the tests stay as they are: the code_tests reward parses every supported form
            out = {"prompt": _messages(system, _user_text(row[q])), "test_cases": row[a]}
            if s is not None:
                out["solution"] = row[s]
            return out

        return row_fn

    if preset == "reasoning_gym":
        if _RG_ENTRY not in cols:
            raise DatasetFormatError(
                f"Preset 'reasoning_gym' needs the {_RG_ENTRY!r} column that --dataset_name reasoning_gym/<task> "
                f"writes; columns found: {cols}. Load the data with grpo_family.tasks.reasoning_gym_splits."
            )

        def row_fn(row):
            out = {"prompt": _messages(system, row[q]), "answer": row[a], _RG_ENTRY: row[_RG_ENTRY]}
            if s is not None:
                out["solution"] = row[s]
            return out

        return row_fn

    if preset == "qa":

        def row_fn(row):
            out = {"prompt": _messages(system, row[q]), "answer": _qa_gold(row[a])}
            if s is not None:
                out["solution"] = row[s]
            return out

        return row_fn

    # "prompt": already in TRL format.
    return None


def _row_predicate(column: str, rule: Any) -> Callable[[Any], bool]:
    """One column's rule: a list of allowed values, a ``{"min": a, "max": b}`` range (either bound optional,
    inclusive; numbers given as text are read as numbers), or a single allowed value."""
    if isinstance(rule, dict):
        unknown = set(rule) - {"min", "max"}
        if unknown or not rule:
            raise ValueError(f"dataset_filters[{column!r}]: a range is {{'min': ..., 'max': ...}}, got {rule!r}")
        low, high = rule.get("min"), rule.get("max")

        def in_range(value: Any) -> bool:
            try:
                number = float(value)
            except (TypeError, ValueError):
                return False
            return (low is None or number >= low) and (high is None or number <= high)

        return in_range
    allowed = list(rule) if isinstance(rule, list | tuple | set) else [rule]
    allowed_text = {str(v) for v in allowed}
    return lambda value: value in allowed or str(value) in allowed_text


def filter_rows(dataset, filters: dict[str, Any] | str | None, *, name: str = "dataset"):
    """Keep the rows of ``dataset`` that pass every column rule of ``filters`` (``dataset_filters`` in a recipe).

    ``filters`` maps a column to a list of allowed values (``{"level": ["Level 3", "Level 4", "Level 5"]}``), a
    single allowed value (``{"source": "aime"}``) or an inclusive numeric range (``{"Year": {"min": 1997, "max":
    2023}}``); a JSON string of the same (command line) is accepted. The rules are ANDed. Logs how many rows were
    kept; a column that does not exist, or a filter that keeps no row, raises :class:`DatasetFormatError` naming the
    dataset's columns. ``None`` or ``{}`` returns ``dataset`` unchanged. A stream is filtered lazily (no count)."""
    if not filters:
        return dataset
    if isinstance(filters, str):
        import json

        filters = json.loads(filters)
    if not isinstance(filters, dict):
        raise ValueError(f"dataset_filters must map column -> rule, got {filters!r}")
    cols = _columns(dataset)
    missing = [c for c in filters if c not in cols]
    if missing:
        raise DatasetFormatError(
            f"dataset_filters names column(s) {missing} that {name} does not have; its columns: {cols}."
        )
    checks = [(column, _row_predicate(column, rule)) for column, rule in filters.items()]

    def keep(row: dict) -> bool:
        return all(check(row[column]) for column, check in checks)

    before = getattr(dataset, "num_rows", None)
    kept = dataset.filter(keep) if before is None else dataset.filter(keep, desc="grpo_family: dataset_filters")
    if before is None:
        logger.warning("dataset_filters %s on %s (a stream): rows are filtered as they arrive.", filters, name)
        return kept
    logger.warning("dataset_filters %s kept %d of %d rows of %s.", filters, kept.num_rows, before, name)
    if kept.num_rows == 0:
        examples = {c: dataset[0][c] for c in filters} if before else {}
        raise DatasetFormatError(
            f"dataset_filters {filters} kept 0 of {before} rows of {name}. Its columns: {cols}; the filtered "
            f"columns of the first row: {examples}."
        )
    return kept


def _resolve_preset(preset: str) -> str:
    name = preset.lower()
    name = _ALIASES.get(name, name)
    if name not in PRESETS:
        raise ValueError(
            f"Unknown dataset preset {preset!r}. Valid presets: auto, {', '.join(PRESETS)} "
            f"(aliases: {', '.join(sorted(_ALIASES))})."
        )
    return name


def prepare_dataset(
    dataset,
    *,
    preset: str = "auto",
    system_prompt: str | None = None,
    question_column: str | None = None,
    answer_column: str | None = None,
    solution_column: str | None = None,
    options_column: str | None = None,
    user_instruction: str | None = None,
):
    """Turn ``dataset`` into TRL conversational prompts plus ``answer`` (and ``solution``) columns.

    Args:
        dataset: a ``datasets.Dataset`` (a ``DatasetDict`` is prepared split by split).
        preset: ``"auto"`` (detect from the columns) or one of :data:`PRESETS` / their aliases (``"math500"``,
            ``"deepscaler"``, ``"medqa"``, ``"riddlesense"``, ``"hotpotqa"``, ``"bundled"``, ...).
        system_prompt: None for the preset's default (math presets: :data:`MATH_SYSTEM_PROMPT`, choice:
            :data:`CHOICE_SYSTEM_PROMPT`, qa: :data:`REASONING_SYSTEM_PROMPT`, prompt: none); a key of
            :data:`SYSTEM_PROMPTS` (``"reasoning"``, ``"math"``, ``"boxed"``, ``"choice"``, ``"none"``); ``""`` for
            no system message; any other string is used verbatim.
        question_column, answer_column, solution_column, options_column: override the preset's column choice.
        user_instruction: text appended to the user turn after the question, on a new line (e.g. GPG's
            "Please reason step by step, and put your final answer within \\boxed{}." after the question, with the
            system message "You are a helpful assistant."); None adds nothing.

    Returns the mapped dataset with columns ``prompt``, ``answer`` (``test_cases`` for the ``code`` preset) and,
    where present, ``solution`` (the ``prompt`` preset keeps the dataset's columns). Raises :class:`DatasetFormatError` when a needed column is
    missing, naming it and listing the columns found.
    """
    if _is_dataset_dict(dataset):
        return type(dataset)(
            {
                split: prepare_dataset(
                    ds,
                    preset=preset,
                    system_prompt=system_prompt,
                    question_column=question_column,
                    answer_column=answer_column,
                    solution_column=solution_column,
                    options_column=options_column,
                    user_instruction=user_instruction,
                )
                for split, ds in dataset.items()
            }
        )
    name = (
        detect_preset(
            dataset, question_column=question_column, answer_column=answer_column, options_column=options_column
        )
        if preset == "auto"
        else _resolve_preset(preset)
    )
    if name == "prompt":
        mapped = _pass_through(dataset, system_prompt, question_column, answer_column, solution_column)
        if user_instruction:
            mapped = _map(
                mapped,
                lambda row: {"prompt": _with_instruction(row["prompt"], user_instruction)},
                remove=[],
                desc="grpo_family: adding the user instruction",
            )
        return mapped
    row_fn = _plan(dataset, name, question_column, answer_column, solution_column, options_column, system_prompt)
    if user_instruction:
        planned = row_fn

        def row_fn(row):
            out = planned(row)
            return {**out, "prompt": _with_instruction(out["prompt"], user_instruction)}

    mapped = _map(dataset, row_fn, remove=_columns(dataset), desc=f"grpo_family: preparing {name} prompts")
    order = [c for c in ("prompt", "answer", "test_cases", "solution", _RG_ENTRY) if c in (mapped.column_names or ())]
    if order and list(mapped.column_names) != order:
        mapped = mapped.select_columns(order)
    _warn_missing_gold(mapped, name)
    return mapped


def _is_dataset_dict(dataset) -> bool:
    try:
        from datasets import DatasetDict, IterableDatasetDict
    except ImportError:  # pragma: no cover - datasets is a dependency
        return False
    return isinstance(dataset, DatasetDict | IterableDatasetDict)


def _map(dataset, fn: Callable, *, remove: list[str], desc: str):
    kwargs: dict[str, Any] = {"remove_columns": remove}
    if hasattr(dataset, "_fingerprint"):  # a map-style Dataset (IterableDataset.map takes no desc)
        kwargs["desc"] = desc
    return dataset.map(fn, **kwargs)


def _pass_through(dataset, system_prompt, question_column, answer_column, solution_column):
    cols = _columns(dataset)
    gold = _pick("prompt", "answer", ("answer",), answer_column, cols)
    if gold is None:
        raise _missing("prompt", "gold answer", ("answer",), cols, "answer_column")
    if "prompt" not in cols:
        raise _missing("prompt", "prompt", ("prompt",), cols, "question_column")
    renames = {}
    if gold != "answer":
        renames[gold] = "answer"
    if solution_column is not None and solution_column != "solution":
        _pick("prompt", "solution", (), solution_column, cols)
        renames[solution_column] = "solution"
    if renames:
        dataset = dataset.rename_columns(renames)
    if system_prompt is None:
        return dataset
    system = _system_text(system_prompt, "prompt")

    def add_system(row):
        prompt = row["prompt"]
        if isinstance(prompt, str):
            return {"prompt": _messages(system, prompt)}
        messages = [m for m in prompt if m.get("role") != "system"]
        return {"prompt": ([{"role": "system", "content": system}] if system else []) + messages}

    return _map(dataset, add_system, remove=[], desc="grpo_family: adding the system prompt")


def _warn_missing_gold(mapped, preset: str) -> None:
    if not hasattr(mapped, "_fingerprint"):
        return  # an IterableDataset: counting would consume it
    column = "test_cases" if preset == "code" else "answer"
    golds = mapped[column]
    missing_rows = [i for i, g in enumerate(golds) if g is None or (isinstance(g, list | str) and len(g) == 0)]
    missing = len(missing_rows)
    if missing and preset == "math" and "solution" in (mapped.column_names or ()):
        solutions = mapped.select(missing_rows[:5])["solution"]
        examples = "; ".join(f"row {i}: {solution_gold(sol)[1]}" for i, sol in zip(missing_rows, solutions))
        logger.warning("Rows whose solution gives no trustworthy gold (first 5): %s", examples)
    if missing:
        logger.warning(
            "%d of %d rows (preset %r) have no %s; the rewards return None (cannot score) for them. "
            "Drop them with dataset.filter(lambda r: r[%r] is not None) if you prefer.",
            missing,
            len(golds),
            preset,
            "test cases" if preset == "code" else "gold answer",
            column,
        )
