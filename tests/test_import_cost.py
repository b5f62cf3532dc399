"""What importing parts of the package pulls in: the rewards (and the scoring workers that import them) must not
pay for TRL or transformers, while the trainers stay one import away from the top-level package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# `python -c` puts the working directory first on sys.path: this checkout, not an installed copy.
REPO = Path(__file__).resolve().parents[1]
HEAVY = ("trl", "transformers", "accelerate", "datasets", "peft", "torch")


def imported_after(statement: str) -> set[str]:
    """The HEAVY top-level modules a fresh interpreter holds after running ``statement``."""
    check = f"import sys\n{statement}\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=300, check=True, cwd=REPO
    )
    return set(eval(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "statement",
    [
        "import grpo_family.rewards",
        "import grpo_family",
        "from grpo_family.rewards import get_reward_funcs, math_accuracy_reward, code_tests_reward",
        "import grpo_family.judges, grpo_family.rewards.timeout, grpo_family.rewards.code",
    ],
)
def test_the_rewards_import_neither_trl_nor_transformers(statement):
    heavy = imported_after(statement)
    assert not heavy, f"`{statement}` imports {sorted(heavy)}: load them lazily where they are needed"


def test_the_issue_one_liner_holds():
    statement = (
        "import grpo_family.rewards, sys; assert 'trl' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", statement], check=True, timeout=300, cwd=REPO)


def test_the_trainers_are_one_attribute_away():
    """The top-level names load the trainers on first use (PEP 562), as eager imports did."""
    heavy = imported_after(
        "from grpo_family import MSGRPOTrainer, METHODS, GRPOConfig, get_method\n"
        "import grpo_family\n"
        "assert METHODS['ms_grpo'][1] is MSGRPOTrainer and get_method('ms_grpo') is METHODS['ms_grpo']\n"
        "assert grpo_family.METHODS is METHODS and set(grpo_family.__all__) <= set(dir(grpo_family))"
    )
    assert {"trl", "transformers", "torch"} <= heavy


def test_an_unknown_attribute_is_an_attribute_error():
    import grpo_family

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        grpo_family.not_a_name  # noqa: B018 - the access is the test
