"""The package's floors (``grpo_family.layers.FLOORS``): every unit of ``grpo_family/`` (a subpackage or a loose
module) imports only from lower floors, at module level or inside a function alike (an import moved into a function
to dodge a circle is still a circle); no module imports a private name of another unit; no modules import each other,
directly or through others. ``docs/architecture.md`` §1's layer table is generated from the same rule
(``docs/generate.py``, block ``floors``).

Read from the source with ``ast``: nothing is imported, so the test is fast and sees imports that run only in some
code paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_family.layers import (
    FLOORS,
    PACKAGE_DIR,
    ROOT,
    import_violations,
    module_circles,
    private_imports,
    units,
)


def test_every_import_points_down_a_floor():
    violations = [message for _, _, message in import_violations(PACKAGE_DIR, FLOORS)]
    assert not violations, "imports up a floor (they make import circles):\n" + "\n".join(violations)


def test_no_module_imports_a_private_name_of_another_unit():
    found = private_imports(PACKAGE_DIR)
    assert not found, "make the name public in its unit (or move it down a floor):\n" + "\n".join(found)


def test_no_import_circle_between_modules():
    """Inside a unit too: modules that import each other (``run_folder`` <-> ``resume`` was one)."""
    assert module_circles(PACKAGE_DIR) == []


def test_the_layer_rule_sees_every_package_unit():
    """A new subpackage or loose module must be given a floor (else its imports are unchecked)."""
    found = units(PACKAGE_DIR)
    assert found == set(FLOORS), (
        f"units without a floor: {sorted(found - set(FLOORS))}; stale: {sorted(set(FLOORS) - found)}"
    )


def test_the_architecture_page_holds_the_generated_layer_table():
    """docs/generate.py writes the table from FLOORS (tests/test_docs.py fails when it is stale); here: it is there."""
    page = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "<!-- generated: floors -->" in page and "<!-- end generated: floors -->" in page


# ------------------------------------------------------------------------------------------------ the rule can fail
SYNTHETIC_FLOORS = {"low": 0, "mid": 1, "side": 1, "high": 2, ROOT: 3}


def _package(tmp_path: Path) -> Path:
    package = tmp_path / "pkg"
    for unit in ("low", "high"):
        (package / unit).mkdir(parents=True)
        (package / unit / "__init__.py").write_text("")
    (package / "__init__.py").write_text("CONSTANT = 1\n")
    (package / "high" / "sibling.py").write_text("y = 1\n")
    (package / "mid.py").write_text("from .low import thing\n")
    (package / "side.py").write_text("x = 1\n")
    return package


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
    package = _package(tmp_path)
    path = package / file
    path.write_text(source)
    messages = [message for _, _, message in import_violations(package, SYNTHETIC_FLOORS)]
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expected in messages[0], messages


@pytest.mark.parametrize(
    "file, source, expected",
    [
        ("mid.py", "from .low import _hidden\n", "pkg/mid.py:1 imports pkg.low._hidden"),
        ("mid.py", "def f():\n    from pkg.low._impl import x\n", "pkg/mid.py:2 imports pkg.low._impl.x"),
        ("high/__init__.py", "from .sibling import _y\n", None),  # inside one unit
        ("mid.py", "from .low import __version__\n", None),  # a dunder is not private
    ],
    ids=["private-name", "private-module", "same-unit", "dunder"],
)
def test_a_private_import_of_another_unit_is_reported(tmp_path, file, source, expected):
    package = _package(tmp_path)
    (package / file).write_text(source)
    found = private_imports(package)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0], found


def test_a_circle_inside_a_unit_is_reported(tmp_path):
    """Two modules of one unit importing each other, one of them inside a function (the floors cannot see it)."""
    package = _package(tmp_path)
    (package / "high" / "a.py").write_text("from .b import x\n")
    (package / "high" / "b.py").write_text("x = 1\n\ndef f():\n    from pkg.high.a import x\n")
    (package / "high" / "c.py").write_text("from . import a\n")  # reaches the circle without being in it
    assert module_circles(package) == [["pkg.high.a", "pkg.high.b"]]
    (package / "high" / "b.py").write_text("x = 1\n")
    assert module_circles(package) == []
