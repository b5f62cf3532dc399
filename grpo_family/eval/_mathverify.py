"""math-verify's own verdict on one completion, as the library gives it with its default extraction: the column we
put beside the project's reward. Imports math-verify only: it runs in the light scoring workers of
:mod:`grpo_family.rewards.timeout` (a killable subprocess per item deadline)."""

from __future__ import annotations

from math_verify import parse, verify

import grpo_family.rewards.math  # noqa: F401  (silences math-verify's "timeout is disabled" notices, as the reward does)


def math_verify_verdict(text: str, gold: str) -> bool | None:
    """``verify(parse(gold), parse(text))`` with math-verify's defaults; the gold is wrapped in ``$...$`` when it has
    no math delimiters (math-verify's advice for bare LaTeX golds). None when the gold does not parse."""
    if not any(d in gold for d in ("$", "\\(", "\\[", "\\boxed")):
        gold = f"${gold}$"
    parsed_gold = parse(gold, parsing_timeout=None)
    if not parsed_gold:
        return None
    return bool(verify(parsed_gold, parse(text, parsing_timeout=None), timeout_seconds=None))
