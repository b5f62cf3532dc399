"""The package's floors: the one rule for which part of ``grpo_family/`` may import which.

Every unit (a subpackage or a loose module of ``grpo_family/``) sits on a floor of :data:`FLOORS` and imports only
from lower floors, at module level or inside a function alike (an import moved into a function to dodge a circle is
still a circle). With every import pointing down, the imports between units have no circle; :func:`module_circles`
checks the modules inside a unit too. ``tests/test_import_layers.py`` enforces the rule on the source and
``docs/generate.py`` writes the layer table of ``docs/architecture.md`` §1 from it, so the page cannot drift.

The source is read with :mod:`ast`: nothing is imported, so the check is fast and sees imports that run only in some
code paths. Standard library only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ROOT = "__init__"  # the package itself (grpo_family/__init__.py: METHODS, the lazy exports)

# Lower floors never import higher ones; units on one floor never import each other.
FLOORS: dict[str, int] = {
    "algorithms": 0,  # the maths: torch only
    "errors": 0,  # every error a caller catches
    "integrations": 0,  # engines fixed for this package (vLLM on CPU)
    "layers": 0,  # this rule
    "launch": 1,
    "rewards": 1,
    "runtime": 1,  # the run folder, its lock, the caches built once, resume, guards
    "collator": 2,
    "tasks": 2,
    "bounds": 3,
    "models": 3,
    "preflight": 3,
    "judges": 4,
    "eval": 5,
    "trainers": 6,
    ROOT: 7,
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


def _module_name(relative: Path) -> str:
    """``grpo_family/a/b.py`` -> ``grpo_family.a.b``; a package's ``__init__.py`` -> the package."""
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(package_dir: Path) -> Iterator[tuple[Path, str, str, ast.AST, str]]:
    """``(file relative to the package's parent, module, its unit, import node, imported dotted name)`` for every
    import of the package's own modules, at any depth of every source file."""
    package = package_dir.name
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent)
        module = _module_name(relative)
        unit = unit_of(package_dir, module)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for target in imported_modules(node, package, module.split("."), is_package):
                yield relative, module, unit, node, target


def units(package_dir: Path = PACKAGE_DIR) -> set[str]:
    """The package's units: its subpackages and loose modules (the root ``__init__`` included)."""
    found = {p.stem for p in package_dir.glob("*.py")} | {p.name for p in package_dir.iterdir() if p.is_dir()}
    return {u for u in found if u != "__pycache__" and not u.startswith(".")}


def import_violations(package_dir: Path, floors: dict[str, int]) -> list[tuple[str, str, str]]:
    """Every import of a unit on the same or a higher floor than the importing unit's, at any depth of the source,
    and every file whose unit has no floor: ``(file, unit, message)``, the message naming the file, line and import."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent)
        unit = unit_of(package_dir, _module_name(relative))
        if unit not in floors:
            found.append((relative.as_posix(), unit, f"{relative}: unit {unit!r} has no floor in FLOORS"))
    for relative, _, source_unit, node, target in _imports(package_dir):
        target_unit = unit_of(package_dir, target)
        if source_unit not in floors or target_unit == source_unit:
            continue
        if target_unit not in floors:
            message = f"{relative}:{node.lineno} imports {target} (unit {target_unit!r} has no floor in FLOORS)"
            found.append((relative.as_posix(), target_unit, message))
        elif floors[target_unit] >= floors[source_unit]:
            message = (
                f"{relative}:{node.lineno} imports {target}: {source_unit!r} (floor {floors[source_unit]}) "
                f"may not import {target_unit!r} (floor {floors[target_unit]})"
            )
            found.append((relative.as_posix(), target_unit, message))
    return found


def private_imports(package_dir: Path) -> list[str]:
    """Every import of a private name (``_name``, a module or an attribute) of another unit: file, line, name."""
    found = []
    for relative, _, source_unit, node, target in _imports(package_dir):
        private = any(p.startswith("_") and not p.startswith("__") for p in target.split(".")[1:])
        if private and unit_of(package_dir, target) != source_unit:
            found.append(f"{relative}:{node.lineno} imports {target}, a private name of another unit")
    return found


def unit_imports(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Unit -> the other units of the package it imports (at any depth of its source)."""
    out: dict[str, set[str]] = {unit: set() for unit in units(package_dir)}
    for _, _, source_unit, _, target in _imports(package_dir):
        target_unit = unit_of(package_dir, target)
        if target_unit != source_unit:
            out.setdefault(source_unit, set()).add(target_unit)
    return out


def module_circles(package_dir: Path) -> list[list[str]]:
    """The groups of the package's modules that import each other, directly or through others, imports inside
    functions included (strongly connected components of more than one module, each sorted). Importing ``pkg.a.b``
    imports ``pkg.a`` (its ``__init__``) too; the root is left out (its exports load lazily)."""
    modules = {_module_name(path.relative_to(package_dir.parent)) for path in package_dir.rglob("*.py")}

    def module_of(name: str) -> str:  # `pkg.a.b.attribute` -> `pkg.a.b`
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {module: set() for module in modules}
    for _, module, _, _, target in _imports(package_dir):
        imported = module_of(target).split(".")
        for depth in range(2, len(imported) + 1):  # the module and the packages above it
            name = ".".join(imported[:depth])
            if name != module and not module.startswith(name + "."):  # a module's own packages are loaded first
                edges[module].add(name)
    # Tarjan's algorithm (the graph has a few hundred modules: recursion is shallow enough).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for nxt in edges[module]:
            if nxt not in index:
                visit(nxt)
                low[module] = min(low[module], low[nxt])
            elif nxt in stack:
                low[module] = min(low[module], index[nxt])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return sorted(circles)
