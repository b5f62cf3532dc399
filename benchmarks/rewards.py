"""Hand-graded answer cases: grpo_family's rewards beside TRL's ``accuracy_reward`` and math-verify; writes
results/rewards.md.

The cases are ``tests/reward_cases.py`` (issue 21) and ``tests/reward_cases_contract.py`` (issue 29; graded and
committed before the answer contract's code ran on them). Every case goes through the grpo_family reward it names,
in training mode (the default) and in evaluation mode. On the shared set — the math and arithmetic cases, whose
golds are numbers or LaTeX — two other graders run too:

* TRL's ``trl.rewards.accuracy_reward`` (the completion as one assistant message; TRL parses the gold with LaTeX
  extraction only, so it runs twice: the gold as given, and wrapped in ``$...$``);
* math-verify alone: ``verify(parse(gold), parse(completion))`` with its default configuration.

A case's hand grade is what a careful human gives the final answer (1, 0, or None for an unreadable gold). A false
positive is a 1.0 where the grade is not 1; a false negative is a score other than 1.0 where the grade is 1 (None,
an error or "n/a" included). For our training mode the false negatives are split: those on completions that break
the documented answer contract (``Case.breaks``; docs/answer_extraction.md) and the others.

The third set is ``benchmarks/data/rewards_corpus.jsonl`` (issue 40): real completion endings with their
provenance (grader and trainer test fixtures of public repositories, and SmolLM2-135M-Instruct's own completions on
the project's tasks), each graded by hand against its gold before any reward ran on it. Each goes through the
grpo_family reward its record names (``reward``), in both modes, and math-verify and TRL's ``accuracy_reward`` run
on every record whose gold is a value (all families but choice and QA). The same command writes
``results/rewards_false_negatives.md``: every correct ending grpo_family scores below 1, with its layout.

    python benchmarks/rewards.py
"""

from __future__ import annotations

import json
import platform
import re
import sys
from collections import Counter
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from grpo_family.rewards import (  # noqa: E402
    MathAccuracyReward,
    choice_accuracy_reward,
    completion_text,
    get_reward_funcs,
    qa_exact_match_reward,
)
from grpo_family.tasks.arithmetic import arithmetic_reward  # noqa: E402
from tests.reward_cases import ALL_CASES, Case  # noqa: E402
from tests.reward_cases_contract import ALL_CONTRACT_CASES  # noqa: E402

OUT = harness.RESULTS / "rewards.md"
FALSE_NEGATIVES = harness.RESULTS / "rewards_false_negatives.md"
CORPUS = ROOT / "benchmarks" / "data" / "rewards_corpus.jsonl"
OURS = {
    "math_accuracy": MathAccuracyReward(backend="none"),
    "choice_accuracy": choice_accuracy_reward,
    "qa_exact_match": qa_exact_match_reward,
    "arithmetic": arithmetic_reward,
    "reasoning_gym": get_reward_funcs(["reasoning_gym"])[0],
}
SHARED = ("math_accuracy", "arithmetic")
GRADERS = ("ours", "ours_eval", "trl_given", "trl_wrapped", "math_verify")
LABELS = {
    "ours": "grpo_family, training mode",
    "ours_eval": "grpo_family, eval mode",
    "trl_given": "TRL `accuracy_reward`, gold as given",
    "trl_wrapped": "TRL `accuracy_reward`, gold in `$...$`",
    "math_verify": "math-verify alone",
}


def _string_gold(case: Case) -> str | None:
    return case.gold if isinstance(case.gold, str) else str(case.gold) if isinstance(case.gold, int) else None


def run_trl(case: Case, wrap: bool) -> float | None | str:
    return trl_score(completion_text(case.completion), _string_gold(case), wrap)


def trl_score(completion: str, gold: str | None, wrap: bool) -> float | None | str:
    """TRL's ``accuracy_reward`` on one completion (one assistant message); ``wrap`` puts the gold in ``$...$``."""
    from trl.rewards import accuracy_reward

    if gold is None:
        return "n/a"  # TRL parses a string gold only (a NaN or None gold raises)
    if wrap and gold.strip() and "$" not in gold:
        gold = f"${gold}$"
    try:
        return accuracy_reward([[{"role": "assistant", "content": completion}]], [gold])[0]
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"error: {type(error).__name__}"


def run_math_verify(case: Case) -> float | None | str:
    return math_verify_score(completion_text(case.completion), _string_gold(case))


def math_verify_score(completion: str, gold: str | None) -> float | None | str:
    """math-verify alone, default configuration: ``verify(parse(gold), parse(completion))``."""
    from math_verify import parse, verify

    if gold is None:
        return "n/a"
    try:
        gold_parsed = parse(gold, parsing_timeout=None)
        if not gold_parsed:
            return None
        return float(verify(gold_parsed, parse(completion, parsing_timeout=None), timeout_seconds=None))
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"error: {type(error).__name__}"


def score(case: Case) -> dict[str, object]:
    reward = OURS[case.reward]
    row: dict[str, object] = {
        "ours": reward([case.completion], answer=[case.gold])[0],
        "ours_eval": reward([case.completion], answer=[case.gold], mode="eval")[0],
    }
    shared = case.reward in SHARED
    row["trl_given"] = run_trl(case, wrap=False) if shared else "n/a"
    row["trl_wrapped"] = run_trl(case, wrap=True) if shared else "n/a"
    row["math_verify"] = run_math_verify(case) if shared else "n/a"
    return row


def tally(rows: list[tuple[Case, dict]], grader: str) -> Counter:
    out: Counter = Counter()
    for case, row in rows:
        got = row[grader]
        if got == "n/a":
            continue
        out["n"] += 1
        out["agree"] += got == case.grade and not isinstance(got, str)
        if got == 1.0 and case.grade != 1:
            out["fp"] += 1
        if case.grade == 1 and got != 1.0:
            out["fn"] += 1
            out["fn_contract"] += bool(case.breaks)
    return out


def _cell(t: Counter, grader: str) -> str:
    if not t["n"]:
        return "n/a"
    fn = f"{t['fn']}" if grader != "ours" else f"{t['fn']} ({t['fn_contract']} break the contract)"
    return f"{t['agree']}/{t['n']} agree, **{t['fp']} FP**, {fn} FN"


def _short(value, width: int = 80) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'")
    return text if len(text) <= width else text[: width - 3] + "..."


# ------------------------------------------------------------------------------ real completion endings (issue 40)
CORPUS_FAMILIES = ("math", "choice", "qa", "arithmetic", "reasoning_gym")
# Families whose golds are values: math-verify and TRL's accuracy_reward run on these (a letter or a free-text
# answer is no input of theirs).
VALUE_FAMILIES = ("math", "arithmetic", "reasoning_gym")
CORPUS_FIELDS = ("id", "source", "kind", "family", "reward", "completion", "gold", "grade", "note")
GRADES = {"correct": 1, "incorrect": 0}


def load_corpus(path: Path = CORPUS) -> list[dict]:
    """The corpus's records (one JSON object a line)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _ours(record: dict, mode: str) -> float | None | str:
    reward = OURS[record["reward"]]
    gold = record["reasoning_gym_entry"] if record["reward"] == "reasoning_gym" else record["gold"]
    try:
        return reward([record["completion"]], **{getattr(reward, "gold_key", "answer"): [gold]}, mode=mode)[0]
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"error: {type(error).__name__}"


def score_record(record: dict) -> dict[str, object]:
    """Every grader's score of one corpus record (``"n/a"`` where a grader does not apply)."""
    row: dict[str, object] = {"ours": _ours(record, "train"), "ours_eval": _ours(record, "eval")}
    shared = record["family"] in VALUE_FAMILIES
    gold = str(record["gold"])
    row["trl_given"] = trl_score(record["completion"], gold, wrap=False) if shared else "n/a"
    row["trl_wrapped"] = trl_score(record["completion"], gold, wrap=True) if shared else "n/a"
    row["math_verify"] = math_verify_score(record["completion"], gold) if shared else "n/a"
    return row


def tally_corpus(rows: list[tuple[dict, dict]], grader: str) -> Counter:
    """``n``, ``agree``, ``fp`` (1.0 on an incorrect ending) and ``fn`` (not 1.0 on a correct one) of a grader."""
    out: Counter = Counter()
    for record, row in rows:
        got, grade = row[grader], GRADES[record["grade"]]
        if got == "n/a":
            continue
        out["n"] += 1
        out["agree"] += got == grade and not isinstance(got, str)
        out["fp"] += got == 1.0 and grade != 1
        out["fn"] += grade == 1 and got != 1.0
    return out


def _corpus_cell(t: Counter) -> str:
    return f"{t['agree']}/{t['n']} agree, **{t['fp']} FP**, **{t['fn']} FN**" if t["n"] else "n/a"


def contract_rule(record: dict) -> str:
    """The answer-contract rule a record's ending breaks in training mode (``""`` when it keeps it), as
    :func:`grpo_family.rewards.contract.read_answer` reports it for the record's reward; ``"n/a"`` when the
    contract module does not offer it."""
    try:
        from grpo_family.rewards import contract
        from grpo_family.rewards.values import count_numbers

        # each reward's own slots; reasoning-gym reads a gold of one number as a value reward does
        values = getattr(contract, "VALUE_SLOTS", contract.ANSWER_SLOTS)
        gold = str(record["gold"])
        numeric = record["reward"] == "reasoning_gym" and count_numbers(gold) == 1 and "=" not in gold
        spec = {
            "math_accuracy": contract.MATH_SLOTS,
            "choice_accuracy": contract.CHOICE_SLOTS,
            "arithmetic": values,
        }.get(record["reward"], values if numeric else contract.ANSWER_SLOTS)
        reading = contract.read_answer(record["completion"], spec)
        return reading.violation or f"keeps it ({reading.kind} slot: {_short(reading.value, 40)})"
    except Exception as error:  # noqa: BLE001 - the rules may change under this benchmark
        return f"n/a ({type(error).__name__})"


def rule_class(rule: str) -> str:
    """A contract rule without the quoted text it names, so endings that break the same rule count together."""
    if rule.startswith("keeps it ("):
        kind = rule.removeprefix("keeps it (").split(" slot", 1)[0]
        return f"keeps the contract ({kind} slot); the value read from it does not score"
    return re.sub(r"\s*[:(]\s*'.*$", "", rule).strip() or rule


def corpus_report(rows: list[tuple[dict, dict]], seconds: float) -> tuple[list[str], list[str]]:
    """The corpus's section of rewards.md and the false-negative list (rewards_false_negatives.md)."""
    kinds = Counter(r["kind"] for r, _ in rows)
    grades = Counter(r["grade"] for r, _ in rows)
    lines = [
        f"## Real completion endings (`{CORPUS.relative_to(ROOT)}`, issue 40)",
        "",
        f"{len(rows)} endings ({', '.join(f'{n} {k}' for k, n in kinds.most_common())}; {grades['correct']} "
        f"correct, {grades['incorrect']} incorrect by hand grade), each graded before any reward ran on it; every "
        f"grader in {seconds:.1f} s. Each record names its source (repository, path, commit, licence, or the model, "
        "task and seed) and the grpo_family reward whose dataset format it fits. math-verify and TRL run on the "
        f"families whose golds are values ({', '.join(VALUE_FAMILIES)}). Most math endings are Math-Verify's and "
        "lighteval's own test fixtures, cases those graders are built to pass, so math-verify's agreement there is "
        "a ceiling rather than an independent measure; the model outputs are the part no grader was tuned on.",
        "",
        "| family | endings | " + " | ".join(LABELS[g] for g in GRADERS) + " |",
        "|---|---|" + "---|" * len(GRADERS),
    ]
    groups = {f: [r for r in rows if r[0]["family"] == f] for f in CORPUS_FAMILIES}
    groups["value golds (" + " + ".join(VALUE_FAMILIES) + ")"] = [r for r in rows if r[0]["family"] in VALUE_FAMILIES]
    for kind in sorted(kinds):
        groups[f"all {kind}s"] = [r for r in rows if r[0]["kind"] == kind]
    groups["all"] = rows
    for family, group in groups.items():
        if group:
            cells = [_corpus_cell(tally_corpus(group, g)) for g in GRADERS]
            lines.append(f"| {family} | {len(group)} | " + " | ".join(cells) + " |")
    value_rows = [r for r in rows if r[0]["family"] in VALUE_FAMILIES]
    fn = {g: tally_corpus(value_rows, g)["fn"] for g in GRADERS}
    verdicts = [
        f"{LABELS[g]}: {fn[g]} ({'no more than' if fn[g] <= fn['math_verify'] else '**more than**'} math-verify's)"
        for g in ("ours", "ours_eval")
    ]
    lines += [
        "",
        f"False negatives on the correct endings with value golds: math-verify alone {fn['math_verify']}; "
        + "; ".join(verdicts)
        + ".",
        "",
        "Per family, grpo_family's false negatives against math-verify's (training / eval / math-verify): "
        + ", ".join(
            f"{f} {tally_corpus(groups[f], 'ours')['fn']} / {tally_corpus(groups[f], 'ours_eval')['fn']} / "
            f"{tally_corpus(groups[f], 'math_verify')['fn']}"
            for f in VALUE_FAMILIES
            if groups[f]
        )
        + ".",
        "",
        "| source | licence | endings |",
        "|---|---|---|",
    ]
    sources = Counter(
        (r["source"].get("repo") or r["source"].get("model"), r["source"].get("licence", "")) for r, _ in rows
    )
    for (name, licence), n in sorted(sources.items(), key=lambda item: -item[1]):
        lines.append(f"| {name} | {licence} | {n} |")
    lines += ["", "False positives of grpo_family:", ""]
    for grader in ("ours", "ours_eval"):
        fps = [r for r, row in rows if row[grader] == 1.0 and r["grade"] != "correct"]
        lines.append(f"- {LABELS[grader]}: {len(fps)}" + "".join(f"; `{r['id']}`" for r in fps))
    lines.append("")

    fn_lines = [
        "# grpo_family's false negatives on the real completion endings",
        "",
        f"Written by `python benchmarks/rewards.py` with rewards.md: each correct ending of `{CORPUS.relative_to(ROOT)}` "
        "that grpo_family scores below 1, with the ending's last characters, the gold, the contract rule the ending "
        "breaks in training mode (`read_answer` with the reward's slots), and math-verify's score where it runs.",
        "",
    ]
    for grader in ("ours", "ours_eval"):
        misses = [(r, row) for r, row in rows if r["grade"] == "correct" and row[grader] != 1.0]
        rules = Counter((r["family"], rule_class(contract_rule(r))) for r, _ in misses)
        fn_lines += [f"## {LABELS[grader]}: {len(misses)}", ""]
        if grader == "ours" and misses:
            fn_lines += ["By family and the rule the ending breaks (the layouts to act on):", ""]
            fn_lines += [
                f"- {family}: {n} x {rule}"
                + "".join(
                    f" `{r['id']}`" for r, _ in misses if (r["family"], rule_class(contract_rule(r))) == (family, rule)
                )
                for (family, rule), n in sorted(rules.items(), key=lambda item: (item[0][0], -item[1]))
            ]
            fn_lines.append("")
        fn_lines += [
            "| record | family | reward | score | rule broken (training mode) | ending | gold | math-verify |"
        ]
        fn_lines.append("|---|---|---|---|---|---|---|---|")
        for record, row in misses:
            fn_lines.append(
                f"| `{record['id']}` | {record['family']} | {record['reward']} | {_fmt(row[grader])} | "
                f"{_short(contract_rule(record), 50)} | `{_short(record['completion'][-140:], 140)}` | "
                f"`{_short(record['gold'], 30)}` | {_fmt(row['math_verify'])} |"
            )
        fn_lines.append("")
    return lines, fn_lines


def _fmt(value) -> str:
    return "None" if value is None else value if isinstance(value, str) else f"{value:g}"


def main() -> None:
    with harness.Timer() as cases:
        sets = {
            "issue 29 contract cases (`tests/reward_cases_contract.py`)": [(c, score(c)) for c in ALL_CONTRACT_CASES],
            "issue 21 cases (`tests/reward_cases.py`)": [(c, score(c)) for c in ALL_CASES],
        }
    with harness.Timer() as corpus:
        corpus_rows = [(record, score_record(record)) for record in load_corpus()]
    corpus_lines, fn_lines = corpus_report(corpus_rows, corpus.wall)
    lines = [
        "# Answer rewards against hand grades: grpo_family, TRL's `accuracy_reward`, math-verify",
        "",
        f"Written by `python benchmarks/rewards.py` on {platform.machine()}, Python {platform.python_version()}, "
        f"TRL {version('trl')}, math-verify {version('math-verify')}; "
        f"{sum(len(r) for r in sets.values())} hand-graded cases written for issues 21 and 29 ({cases.wall:.1f} s in "
        f"all, every grader) and {len(corpus_rows)} real completion endings (below).",
        "",
        "A case's grade is a careful human's verdict on the final answer (1 right and committed to; 0 wrong, "
        "withdrawn, hedged, hidden or absent; None: the gold cannot be read). FP: 1.0 where the grade is not 1. "
        "FN: not 1.0 where the grade is 1; for grpo_family's training mode, the FN on completions that break the "
        "documented answer contract (`docs/answer_extraction.md`) are counted in brackets. TRL's reward and "
        "math-verify run on the shared set: the math and arithmetic cases (`n/a` elsewhere).",
        "",
        *corpus_lines,
    ]
    for title, rows in sets.items():
        lines += [f"## {title}", "", "| family | cases | " + " | ".join(LABELS[g] for g in GRADERS) + " |"]
        lines.append("|---|---|" + "---|" * len(GRADERS))
        families = sorted({c.reward for c, _ in rows}, key=list(OURS).index)
        for family in [*families, "shared set (math + arithmetic)", "all"]:
            if family == "all":
                group = rows
            elif family.startswith("shared"):
                group = [r for r in rows if r[0].reward in SHARED]
            else:
                group = [r for r in rows if r[0].reward == family]
            cells = [_cell(tally(group, g), g) for g in GRADERS]
            lines.append(f"| {family} | {len(group)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## False positives, case by case", ""]
    for title, rows in sets.items():
        for grader in GRADERS:
            fps = [(c, r) for c, r in rows if r[grader] == 1.0 and c.grade != 1]
            lines.append(f"**{LABELS[grader]}, {title.split(' (')[0]}: {len(fps)}**" + ("" if fps else " (none)"))
            lines.append("")
            for case, _ in fps:
                lines.append(f"- `{case.id}` ({case.cls}): `{_short(case.completion)}`, gold `{_short(case.gold)}`")
            if fps:
                lines.append("")
    lines += [
        "## Our training mode's false negatives, case by case",
        "",
        "Each breaks the documented contract (the rule in the last column); a completion that keeps it and is "
        "right scores 1.",
        "",
        "| case | completion | gold | contract rule broken |",
        "|---|---|---|---|",
    ]
    for rows in sets.values():
        for case, row in rows:
            if case.grade == 1 and row["ours"] != 1.0:
                lines.append(
                    f"| `{case.id}` | `{_short(case.completion, 60)}` | `{_short(case.gold, 20)}` | {case.breaks or '**none**'} |"
                )
    lines += ["", "## Every verdict on the shared set", ""]
    lines.append("| case | grade | breaks | " + " | ".join(LABELS[g] for g in GRADERS) + " |")
    lines.append("|---|---|---|" + "---|" * len(GRADERS))
    for rows in sets.values():
        for case, row in rows:
            if case.reward in SHARED:
                cells = " | ".join(_fmt(row[g]) for g in GRADERS)
                lines.append(f"| `{case.id}` | {_fmt(case.grade)} | {case.breaks} | {cells} |")
    harness.write_report(OUT, "\n".join(lines) + "\n", echo=False)
    harness.write_report(FALSE_NEGATIVES, "\n".join(fn_lines) + "\n", echo=False)
    print("\n".join(lines[:30]))


if __name__ == "__main__":
    main()
