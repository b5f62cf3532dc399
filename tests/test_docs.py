"""The method documents in docs/methods/ stay in step with the code that cites them.

* every ``docs/methods/<name>.md §N`` (or ``docs/<page>.md §N``) citation in grpo_family/ (and tests/, benchmarks/)
  names a document that exists and a section number that is a heading of it;
* no comment or docstring in grpo_family/ points at the implementation specs outside the repository;
* every field a method's config class defines appears in the config table of its document.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from grpo_family import METHODS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "methods"
CITATION = re.compile(r"docs/((?:methods/)?\w+)\.md(?:``|`)?\s*§\s*(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)[. ]", re.M)
# "spec:" as prose ("spec: §3"), not a parameter annotated with a class ("spec: SlotSpec,") nor a class name
OUTSIDE = re.compile(r"spec §|spec Secs?\.|specs/|spec's|\bspec:(?!\s*(?-i:[A-Z])\w*\s*[,)=])", re.I)
CONFIGS = {name: (config.__module__, config.__name__) for name, (config, _) in METHODS.items()}


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def _headings(name: str) -> set[str]:
    """The numbered headings of ``docs/<name>.md`` (``name``: ``methods/sgpo``, ``answer_extraction``)."""
    return set(HEADING.findall((ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")))


def _resolves(section: str, headings: set[str]) -> bool:
    """``§A.B`` needs heading ``A.B`` when section A has numbered subsections, else heading ``A`` (``§11.9`` is then
    item 9 of section 11's list)."""
    top = section.split(".")[0]
    if top not in headings:
        return False
    if "." not in section:
        return True
    sub = ".".join(section.split(".")[:2])
    has_subsections = any(h.startswith(top + ".") for h in headings)
    return sub in headings if has_subsections else True


def test_every_method_has_a_document():
    for name in CONFIGS:
        assert (DOCS / f"{name}.md").is_file(), f"docs/methods/{name}.md is missing"


def test_citations_point_at_existing_sections():
    found, broken = 0, []
    for path in _sources("grpo_family", "tests", "benchmarks"):
        text = path.read_text(encoding="utf-8")
        for match in CITATION.finditer(text):
            found += 1
            name, section = match.groups()
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            if not (ROOT / "docs" / f"{name}.md").is_file():
                broken.append(f"{where}: docs/{name}.md does not exist")
            elif not _resolves(section, _headings(name)):
                broken.append(f"{where}: docs/{name}.md has no heading §{section}")
    assert found > 100, f"only {found} citations found: the pattern no longer matches how the code cites the docs"
    assert not broken, "\n".join(broken)


def test_no_reference_points_outside_the_repository():
    hits = []
    for path in _sources("grpo_family"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line) or "/work/shared" in line:
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "cite docs/methods/<method>.md §N instead:\n" + "\n".join(hits)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_table_lists_every_field(name):
    module, cls_name = CONFIGS[name]
    cls = getattr(importlib.import_module(module), cls_name)
    # the config's own fields and those of bases it adds below GRPOFamilyConfig (SGPO's judge flags)
    from grpo_family import GRPOFamilyConfig

    layers = [k for k in cls.__mro__ if issubclass(k, GRPOFamilyConfig) and k is not GRPOFamilyConfig] or [cls]
    own = [n for k in layers for n, kind in vars(k).get("__annotations__", {}).items()
           if not str(kind).startswith("ClassVar")]  # fmt: skip
    assert own, f"{cls_name} defines no fields"
    assert all(f in {f.name for f in dataclasses.fields(cls)} for f in own)
    text = (DOCS / f"{name}.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)` \|", text, re.M))
    missing = [f for f in own if f not in rows]
    assert not missing, f"docs/methods/{name}.md's config table lacks {missing} (fields of {cls_name})"


BARE = re.compile(r"§\s*(\d+(?:\.\d+)*)")


def test_bare_section_references_point_at_the_module_document():
    """A bare ``§N`` in grpo_family/ refers to the document the module's docstring names (its first
    ``docs/methods/<name>.md``): that document must have the section, and a module with bare references must name
    one."""
    found, broken = 0, []
    for path in _sources("grpo_family"):
        text = path.read_text(encoding="utf-8")
        citations = [m.span() for m in CITATION.finditer(text)]
        document = re.search(r"docs/(methods/\w+)\.md", text)
        for match in BARE.finditer(text):
            if any(start <= match.start() < end for start, end in citations):
                continue  # a full citation, checked above
            found += 1
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            if document is None:
                broken.append(f"{where}: §{match.group(1)} but the module names no docs/methods/<name>.md")
            elif not _resolves(match.group(1), _headings(document.group(1))):
                broken.append(f"{where}: docs/{document.group(1)}.md has no heading §{match.group(1)}")
    assert found > 10, f"only {found} bare references found: the pattern no longer matches"
    assert not broken, "\n".join(broken)


def test_generated_tables_are_current():
    """The tables of methods, stages and learning results in README.md and docs/ are written from the code and the
    committed results by docs/generate.py (never by hand): a new method, stage or benchmark run changes them."""
    import subprocess
    import sys

    readme, architecture = (ROOT / "README.md").read_text(), (ROOT / "docs" / "architecture.md").read_text()
    assert "<!-- generated: methods -->" in readme and "<!-- generated: learning -->" in readme
    assert "<!-- generated: stages -->" in architecture and "<!-- generated: method-stages -->" in architecture
    for method in METHODS:  # a row per method
        assert f"| `{method}` |" in readme and f"| `{method}` |" in architecture
    result = subprocess.run(
        [sys.executable, "docs/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
