"""Which installed files the code sandbox exposes for the packages a reward lists (``Sandbox(packages=...)``).

Each listed name is an installed *distribution* (``numpy``, ``PyYAML``) or the *import package* of one (``yaml``).
What is exposed for it is exactly what that distribution installed directly in its site-packages directory, as its
``RECORD`` says: the first path component of each of its files there (``numpy/``, ``numpy.libs/``,
``numpy-2.x.dist-info/``), and nothing else of that directory. A file it installed elsewhere (``../../bin/f2py``)
is skipped, and so is a top-level ``__pycache__``, which holds other single-module distributions' bytecode too.

Standard library only, with no relative import: :class:`~grpo_family.rewards.code.Sandbox` calls
:func:`package_paths` here when the sandbox runs this interpreter, and runs this file as a script
(``python -I <this file> NAME...``, which prints the answer as JSON) when it runs another one, so that the answer is
that interpreter's. ``-I`` keeps this file's directory (with its ``code.py`` and ``math.py``) off ``sys.path``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import sys

# PEP 508 names: letters, digits, ``.``, ``_`` and ``-``, starting and ending with a letter or digit. Nothing else
# (no path separator, no ``..``, no space) ever reaches a path or a mount.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def not_installed(name: str, python: str) -> ValueError:
    """The error for a listed name that ``python`` does not have, with the fix."""
    where = " (it is in the standard library, which is always there)" if name in sys.stdlib_module_names else ""
    return ValueError(
        f"packages: {name!r} is not an installed distribution or import package of {python}{where}: install it, "
        "or remove it from packages"
    )


def distribution_of(name: str) -> metadata.Distribution | None:
    """The installed distribution ``name`` names: the distribution of that name, else the one distribution that
    installed the import package ``name``; None when there is none. Several owners (a namespace package such as
    ``google``) are ambiguous: ValueError."""
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        pass
    owners = sorted(set(metadata.packages_distributions().get(name, ())))
    if len(owners) > 1:
        raise ValueError(
            f"packages: the import package {name!r} belongs to several distributions ({', '.join(owners)}); list "
            "the ones the program needs by their distribution names"
        )
    return metadata.distribution(owners[0]) if owners else None


def top_level_paths(dist: metadata.Distribution) -> list[str]:
    """The absolute paths of what ``dist`` installed directly in its site-packages directory (see the module
    docstring), sorted; only those that exist."""
    site = os.path.realpath(dist.locate_file(""))
    found = set()
    for file in dist.files or ():
        path = os.path.normpath(os.path.join(site, str(file)))
        if not path.startswith(site + os.sep):
            continue  # installed outside site-packages (scripts, data files)
        first = path[len(site) + 1 :].split(os.sep, 1)[0]
        if first != "__pycache__":
            found.add(os.path.join(site, first))
    return sorted(p for p in found if os.path.lexists(p))


def package_paths(names: list[str], python: str = sys.executable) -> list[str]:
    """The paths to expose for ``names`` (see the module docstring), in this interpreter. Raises ValueError for a
    malformed name, a name not installed here, a distribution without a file list, or two paths of one name from
    different directories (they would meet in the sandbox's one packages directory)."""
    chosen: dict[str, str] = {}
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"packages: {name!r} is not a package name (letters, digits, '.', '_', '-')")
        dist = distribution_of(name)
        if dist is None:
            raise not_installed(name, python)
        paths = top_level_paths(dist)
        if not paths:
            raise ValueError(
                f"packages: {name!r} lists no file in its site-packages directory (no RECORD); reinstall it with "
                "pip, or remove it from packages"
            )
        for path in paths:
            if chosen.setdefault(os.path.basename(path), path) != path:
                raise ValueError(f"packages: {path} and {chosen[os.path.basename(path)]} would share one name")
    return sorted(chosen.values())


def main(names: list[str]) -> None:
    """Print ``{"paths": [...]}``, or ``{"error": "..."}`` for a ValueError, as one JSON line."""
    try:
        answer = {"paths": package_paths(names)}
    except ValueError as e:
        answer = {"error": str(e)}
    print(json.dumps(answer))


if __name__ == "__main__":
    main(sys.argv[1:])
