"""Hand-graded answer cases: grpo_family's rewards beside TRL's ``accuracy_reward``; writes results/rewards.md.

The cases are ``tests/reward_cases.py`` (graded by hand before any reward ran on them). Every case goes through the
grpo_family reward it names. TRL's ``trl.rewards.accuracy_reward`` (a math reward) runs on the cases where it
applies: math and arithmetic cases with a string completion and a string gold, twice: the gold as given, and the
gold wrapped in ``$...$`` (TRL parses golds with LaTeX extraction only, so a bare ``42`` is unparseable to it).
Agreement is exact equality with the hand grade (None, "cannot score", agrees only with None); a false positive is
a 1.0 where the hand grade is 0 or None.

    PYTHONPATH=. python benchmarks/rewards.py
"""

from __future__ import annotations

import platform
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_family.rewards import (  # noqa: E402
    MathAccuracyReward,
    choice_accuracy_reward,
    qa_exact_match_reward,
)
from grpo_family.tasks.arithmetic import arithmetic_reward  # noqa: E402
from tests.reward_cases import ALL_CASES, Case  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "rewards.md"
OURS = {
    "math_accuracy": MathAccuracyReward(backend="none"),
    "choice_accuracy": choice_accuracy_reward,
    "qa_exact_match": qa_exact_match_reward,
    "arithmetic": arithmetic_reward,
}


def trl_applies(case: Case) -> bool:
    return case.reward in ("math_accuracy", "arithmetic") and isinstance(case.completion, str | list)


def run_trl(case: Case, wrap: bool) -> float | None | str:
    from trl.rewards import accuracy_reward

    if not isinstance(case.gold, str):
        return "n/a"  # TRL parses a string gold only (a NaN or None gold raises)
    text = case.completion if isinstance(case.completion, str) else case.completion[-1]["content"]
    gold = f"${case.gold}$" if wrap and case.gold.strip() and "$" not in case.gold else case.gold
    try:
        return accuracy_reward([[{"role": "assistant", "content": text}]], [gold])[0]
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"error: {type(error).__name__}"


def main() -> None:
    rows = []
    start = time.perf_counter()
    for case in ALL_CASES:
        ours = OURS[case.reward]([case.completion], answer=[case.gold])[0]
        trl_given = run_trl(case, wrap=False) if trl_applies(case) else "n/a"
        trl_wrapped = run_trl(case, wrap=True) if trl_applies(case) else "n/a"
        rows.append((case, ours, trl_given, trl_wrapped))
    seconds = time.perf_counter() - start

    def agree(got, grade):
        return got == grade if not isinstance(got, str) else False

    lines = [
        "# Answer rewards against hand grades: grpo_family and TRL's `accuracy_reward`",
        "",
        f"Written by `benchmarks/rewards.py` on {platform.machine()}, Python {platform.python_version()}, "
        f"TRL {__import__('trl').__version__}, math-verify {__import__('importlib.metadata').metadata.version('math-verify')}; "
        f"{len(ALL_CASES)} hand-graded cases from `tests/reward_cases.py` ({seconds:.1f} s in all).",
        "Agreement is equality with the hand grade (1, 0, or None for an unreadable gold). TRL's reward is a math "
        "reward: it runs on the math and arithmetic cases with string golds, once with the gold as given and once "
        "wrapped in `$...$`; `n/a` where it does not apply.",
        "",
        "## Agreement with the hand grades",
        "",
        "| reward | cases | grpo_family | TRL, gold as given | TRL, gold in `$...$` | TRL applies to |",
        "|---|---|---|---|---|---|",
    ]
    by_reward: dict[str, list] = {}
    for row in rows:
        by_reward.setdefault(row[0].reward, []).append(row)
    totals = Counter()
    for reward, group in by_reward.items():
        n = len(group)
        ours = sum(agree(o, c.grade) for c, o, _, _ in group)
        applies = [r for r in group if r[2] != "n/a"]
        given = sum(agree(g, c.grade) for c, _, g, _ in applies)
        wrapped = sum(agree(w, c.grade) for c, _, _, w in applies)
        totals.update(n=n, ours=ours, applies=len(applies), given=given, wrapped=wrapped)
        trl_cells = (
            (f"{given} / {len(applies)}", f"{wrapped} / {len(applies)}", str(len(applies)))
            if applies
            else ("n/a",) * 3
        )
        lines.append(f"| `{reward}` | {n} | {ours} / {n} | {' | '.join(trl_cells)} |")
    lines.append(
        f"| all | {totals['n']} | {totals['ours']} / {totals['n']} | {totals['given']} / {totals['applies']} | "
        f"{totals['wrapped']} / {totals['applies']} | {totals['applies']} |"
    )
    ours_on_trl_cases = sum(agree(o, c.grade) for c, o, g, _ in rows if g != "n/a")
    lines += [
        "",
        f"On the {totals['applies']} cases TRL applies to, grpo_family agrees on {ours_on_trl_cases}.",
        "",
        "## False positives (1.0 where the hand grade is 0 or None)",
        "",
    ]
    for label, index in (("grpo_family", 1), ("TRL, gold as given", 2), ("TRL, gold in `$...$`", 3)):
        fps = [r for r in rows if r[index] == 1.0 and r[0].grade != 1]
        lines.append(f"**{label}: {len(fps)}**" + ("" if fps else " (none)"))
        lines.append("")
        for r in fps:
            lines.append(
                f"- `{r[0].id}` ({r[0].cls}): completion `{_short(r[0].completion)}`, gold `{_short(r[0].gold)}`"
            )
        if fps:
            lines.append("")
    lines += ["## Disagreements, case by case", "", "| case | class | grade | grpo_family | TRL given | TRL `$...$` |"]
    lines.append("|---|---|---|---|---|---|")
    for case, ours, given, wrapped in rows:
        if not agree(ours, case.grade) or (
            given != "n/a" and (not agree(given, case.grade) or not agree(wrapped, case.grade))
        ):
            lines.append(f"| `{case.id}` | {case.cls} | {case.grade} | {ours} | {given} | {wrapped} |")
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:20]))


def _short(value, width: int = 70) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'")
    return text if len(text) <= width else text[: width - 3] + "..."


if __name__ == "__main__":
    main()
