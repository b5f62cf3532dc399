"""The package's floors: every unit of ``grpo_family/`` (a subpackage or a loose module) sits on a floor and imports
only from lower floors, at module level or inside a function alike (an import moved into a function to dodge a
circle is still a circle). With every import pointing down, the import graph between units has no circle.

Read from the source with ``ast``: nothing is imported, so the test is fast and sees imports that run only in some
code paths. ``docs/architecture.md`` §1 describes the floors.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "grpo_family"
ROOT = "__init__"  # the package itself (grpo_family/__init__.py: METHODS, the lazy exports)

# Lower floors never import higher ones; units on one floor never import each other.
FLOORS: dict[str, int] = {
    "algorithms": 0,  # the maths: torch only
    "integrations": 0,  # engines fixed for this package (vLLM on CPU)
    "pidlock": 0,
    "cache": 1,
    "rewards": 2,
    "collator": 3,
    "tasks": 3,
    "preflight": 4,
    "bounds": 5,
    "launch": 5,
    "models": 5,
    "run_folder": 5,
    "judges": 6,
    "runtime": 6,
    "eval": 7,
    "trainers": 8,
    ROOT: 9,
}

# Imports that run up a floor today, each closing a circle the issue (43, item 3) names; their files belong to work
# in progress elsewhere. (importing file, imported unit): the test fails for any other upward import, and for an
# entry here that no longer occurs, so that the list only shrinks.
KNOWN_VIOLATIONS: set[tuple[str, str]] = {
    ("grpo_family/bounds.py", ROOT),  # _methods(): METHODS for the --method choices
    ("grpo_family/rewards/__init__.py", "judges"),  # the judges re-exported from rewards
    ("grpo_family/rewards/golds.py", "tasks"),  # a private name of tasks/arithmetic.py
    ("grpo_family/run_folder.py", "runtime"),  # run_folder <-> runtime/resume.py
    ("grpo_family/tasks/tiny_model.py", "eval"),  # generate_completions uses eval's generate backend
}


def unit_of(package_dir: Path, module: str) -> str:
    """The unit of a dotted module name inside the package (``pkg.a.b`` -> ``a``; ``pkg`` or a name the root
    ``__init__`` defines -> the root)."""
    parts = module.split(".")[1:]
    if not parts:
        return ROOT
    first = parts[0]
    if (package_dir / first).is_dir() or (package_dir / f"{first}.py").is_file():
        return first
    return ROOT


def imported_modules(node: ast.AST, package: str, module_parts: list[str], is_package: bool) -> list[str]:
    """The package's dotted modules (or module attributes) an import statement names; ``[]`` for outside imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == package]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: resolved against the importing module's package
        base = module_parts if is_package else module_parts[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base)
    else:
        prefix = ""
    target = ".".join(p for p in (prefix, node.module or "") if p)
    if target.split(".")[0] != package:
        return []
    # `from pkg import x` may name a submodule x: the unit is decided by x.
    return [f"{target}.{alias.name}" for alias in node.names]


def import_violations(package_dir: Path, floors: dict[str, int]) -> list[tuple[str, str, str]]:
    """Every import of a unit on the same or a higher floor than the importing unit's, at any depth of the source:
    ``(importing file, imported unit, message)``, the message naming the file, line and import."""
    package = package_dir.name
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent)
        module_parts = list(relative.with_suffix("").parts)
        is_package = module_parts[-1] == "__init__"
        if is_package:
            module_parts = module_parts[:-1]
        source_unit = unit_of(package_dir, ".".join(module_parts))
        if source_unit not in floors:
            found.append(
                (relative.as_posix(), source_unit, f"{relative}: unit {source_unit!r} has no floor in FLOORS")
            )
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for target in imported_modules(node, package, module_parts, is_package):
                target_unit = unit_of(package_dir, target)
                if target_unit == source_unit:
                    continue
                if target_unit not in floors:
                    message = (
                        f"{relative}:{node.lineno} imports {target} (unit {target_unit!r} has no floor in FLOORS)"
                    )
                    found.append((relative.as_posix(), target_unit, message))
                elif floors[target_unit] >= floors[source_unit]:
                    message = (
                        f"{relative}:{node.lineno} imports {target}: {source_unit!r} (floor {floors[source_unit]}) "
                        f"may not import {target_unit!r} (floor {floors[target_unit]})"
                    )
                    found.append((relative.as_posix(), target_unit, message))
    return found


def test_every_import_points_down_a_floor():
    violations = import_violations(PACKAGE_DIR, FLOORS)
    new = [message for file, unit, message in violations if (file, unit) not in KNOWN_VIOLATIONS]
    assert not new, "imports up a floor (they make import circles):\n" + "\n".join(new)
    gone = KNOWN_VIOLATIONS - {(file, unit) for file, unit, _ in violations}
    assert not gone, f"fixed, remove from KNOWN_VIOLATIONS: {sorted(gone)}"


def test_the_layer_rule_sees_every_package_unit():
    """A new subpackage or loose module must be given a floor (else its imports are unchecked)."""
    units = {p.stem for p in PACKAGE_DIR.glob("*.py")} | {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir()}
    units = {u for u in units if u != "__pycache__" and not u.startswith(".")}
    assert units == set(FLOORS), (
        f"units without a floor: {sorted(units - set(FLOORS))}; stale: {sorted(set(FLOORS) - units)}"
    )


def floors_sentence(floors: dict[str, int]) -> str:
    """The floors as docs/architecture.md §1 states them: ``0 `a`, `b`; 1 `c`; ...``, the root last."""
    by_floor: dict[int, list[str]] = {}
    for unit, floor in floors.items():
        by_floor.setdefault(floor, []).append("the package itself (`METHODS`)" if unit == ROOT else f"`{unit}`")
    return "; ".join(f"{floor} {', '.join(sorted(units))}" for floor, units in sorted(by_floor.items()))


def test_the_architecture_page_states_these_floors():
    page = PACKAGE_DIR.parent / "docs" / "architecture.md"
    text = " ".join(page.read_text(encoding="utf-8").split())
    assert floors_sentence(FLOORS) in text, (
        f"docs/architecture.md §1 must state the floors as: {floors_sentence(FLOORS)}"
    )


# ------------------------------------------------------------------------------------------------ the rule can fail
SYNTHETIC_FLOORS = {"low": 0, "mid": 1, "side": 1, "high": 2, ROOT: 3}


@pytest.mark.parametrize(
    "file, source, expected",
    [
        ("high/__init__.py", "from ..low import thing\nimport pkg.mid\n", None),  # downward: allowed
        ("low/__init__.py", "from ..high import thing\n", "pkg/low/__init__.py:1 imports pkg.high.thing"),
        (
            "low/core.py",
            "import os\n\ndef f():\n    import pkg.high.deep\n",
            "pkg/low/core.py:4 imports pkg.high.deep",
        ),
        ("mid.py", "from pkg import high\n", "pkg/mid.py:1 imports pkg.high"),
        ("mid.py", "from . import CONSTANT\n", "pkg/mid.py:1 imports pkg.CONSTANT"),  # a root name: the root
        ("low/core.py", "from .. import mid\n", "'low' (floor 0) may not import 'mid' (floor 1)"),
        ("mid.py", "from .high import x\n", "pkg/mid.py:1 imports pkg.high.x"),
        ("mid.py", "import pkg.side\n", "'mid' (floor 1) may not import 'side' (floor 1)"),
        ("high/__init__.py", "from . import sibling\nfrom .sibling import y\n", None),  # inside one unit
        ("stray.py", "x = 1\n", "unit 'stray' has no floor"),
    ],
    ids=[
        "down",
        "up",
        "up-in-function",
        "up-by-name",
        "root-name",
        "relative-up",
        "relative-sibling",
        "same-floor",
        "same-unit",
        "stray",
    ],  # fmt: skip
)
def test_an_upward_import_is_reported(tmp_path, file, source, expected):
    package = tmp_path / "pkg"
    for unit in ("low", "high"):
        (package / unit).mkdir(parents=True)
        (package / unit / "__init__.py").write_text("")
    (package / "__init__.py").write_text("CONSTANT = 1\n")
    (package / "high" / "sibling.py").write_text("y = 1\n")
    (package / "mid.py").write_text("from .low import thing\n")
    (package / "side.py").write_text("x = 1\n")
    path = package / file
    path.write_text(source)
    messages = [message for _, _, message in import_violations(package, SYNTHETIC_FLOORS)]
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expected in messages[0], messages
