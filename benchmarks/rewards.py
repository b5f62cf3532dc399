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

    python benchmarks/rewards.py
"""

from __future__ import annotations

import platform
import sys
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_family.rewards import (  # noqa: E402
    MathAccuracyReward,
    choice_accuracy_reward,
    completion_text,
    qa_exact_match_reward,
)
from grpo_family.tasks.arithmetic import arithmetic_reward  # noqa: E402
from tests.reward_cases import ALL_CASES, Case  # noqa: E402
from tests.reward_cases_contract import ALL_CONTRACT_CASES  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "rewards.md"
OURS = {
    "math_accuracy": MathAccuracyReward(backend="none"),
    "choice_accuracy": choice_accuracy_reward,
    "qa_exact_match": qa_exact_match_reward,
    "arithmetic": arithmetic_reward,
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
    from trl.rewards import accuracy_reward

    gold = _string_gold(case)
    if gold is None:
        return "n/a"  # TRL parses a string gold only (a NaN or None gold raises)
    if wrap and gold.strip() and "$" not in gold:
        gold = f"${gold}$"
    try:
        return accuracy_reward([[{"role": "assistant", "content": completion_text(case.completion)}]], [gold])[0]
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"error: {type(error).__name__}"


def run_math_verify(case: Case) -> float | None | str:
    from math_verify import parse, verify

    gold = _string_gold(case)
    if gold is None:
        return "n/a"
    try:
        gold_parsed = parse(gold, parsing_timeout=None)
        if not gold_parsed:
            return None
        return float(
            verify(gold_parsed, parse(completion_text(case.completion), parsing_timeout=None), timeout_seconds=None)
        )
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


def _fmt(value) -> str:
    return "None" if value is None else value if isinstance(value, str) else f"{value:g}"


def main() -> None:
    start = time.perf_counter()
    sets = {
        "issue 29 contract cases (`tests/reward_cases_contract.py`)": [(c, score(c)) for c in ALL_CONTRACT_CASES],
        "issue 21 cases (`tests/reward_cases.py`)": [(c, score(c)) for c in ALL_CASES],
    }
    seconds = time.perf_counter() - start
    lines = [
        "# Answer rewards against hand grades: grpo_family, TRL's `accuracy_reward`, math-verify",
        "",
        f"Written by `python benchmarks/rewards.py` on {platform.machine()}, Python {platform.python_version()}, "
        f"TRL {version('trl')}, math-verify {version('math-verify')}; "
        f"{sum(len(r) for r in sets.values())} hand-graded cases ({seconds:.1f} s in all, every grader).",
        "",
        "A case's grade is a careful human's verdict on the final answer (1 right and committed to; 0 wrong, "
        "withdrawn, hedged, hidden or absent; None: the gold cannot be read). FP: 1.0 where the grade is not 1. "
        "FN: not 1.0 where the grade is 1; for grpo_family's training mode, the FN on completions that break the "
        "documented answer contract (`docs/answer_extraction.md`) are counted in brackets. TRL's reward and "
        "math-verify run on the shared set: the math and arithmetic cases (`n/a` elsewhere).",
        "",
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
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:30]))


if __name__ == "__main__":
    main()
