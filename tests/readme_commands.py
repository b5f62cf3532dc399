"""The commands of README.md and of the docs pages the README hands its long sections to (DOC_PAGES), read from
their fenced code blocks: what `.ci/run` installs and runs, and what `tests/test_readme.py` executes. Standard library
only (CI calls it before anything is installed). The install, lint and test commands are the README's own; the
vLLM-on-CPU install commands are those of the section of that name, on whichever page holds it.

    python tests/readme_commands.py install   # the README's install commands, one per line
    python tests/readme_commands.py test      # the README's test command
    python tests/readme_commands.py lint      # the README's lint commands
    python tests/readme_commands.py vllm-install   # the install commands of "vLLM on a CPU machine" (.ci/vllm)
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Pages whose commands are tested like the README's (the README's long sections live there).
DOC_PAGES = [ROOT / "docs" / "training.md"]
PAGES = [README, *DOC_PAGES]
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
VLLM_CPU_SECTION = "vLLM on a CPU machine"  # its own environment: installed and run by the vllm lane


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language tag, text (indentation removed), first line number, section and page."""

    lang: str
    text: str
    line: int
    section: str
    page: str = "README.md"


@dataclass(frozen=True)
class Command:
    """One shell command of a bash block: continuation lines joined, trailing comment kept apart."""

    text: str
    comment: str
    block: Block


def blocks(path: Path | None = None) -> list[Block]:
    """The blocks of ``path``, or of every page (README first) when None."""
    if path is None:
        return [block for page in PAGES if page.exists() for block in blocks(page)]
    page = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    out: list[Block] = []
    section, lang, indent, start, lines = "", None, "", 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = _FENCE.match(line)
        if lang is None:
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            elif fence:
                indent, lang, start, lines = fence.group(1), fence.group(2), number + 1, []
        elif fence and fence.group(1) == indent:
            out.append(Block(lang, "\n".join(lines) + "\n", start, section, page))
            lang = None
        else:
            lines.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
    return out


def _split_comment(line: str) -> tuple[str, str]:
    """`cmd  # why` -> ("cmd", "why"); a `#` inside quotes stays."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def commands(path: Path | None = None) -> list[Command]:
    """Every shell command of every `bash` block of ``path`` (None: every page), in page order."""
    out: list[Command] = []
    for block in blocks(path):
        if block.lang not in ("bash", "sh", "shell"):
            continue
        pending, comment = "", ""
        for raw in block.text.splitlines():
            text, why = _split_comment(raw)
            comment = comment or why
            if text.endswith("\\"):
                pending += text[:-1].rstrip() + " "
                continue
            text = (pending + text.strip()).strip()
            pending = ""
            if text:
                out.append(Command(re.sub(r"\s+", " ", text), comment, block))
            comment = ""
    return out


def install_commands(path: Path = README) -> list[str]:
    """The README's install commands (the vLLM-on-CPU ones aside): what CI installs before the tests."""
    return [c.text for c in commands(path) if c.text.startswith("pip install") and c.block.section != VLLM_CPU_SECTION]


def vllm_install_commands(path: Path | None = None) -> list[str]:
    """The pip commands (install and uninstall) of the vLLM-on-CPU environment, from the page that holds them."""
    return [c.text for c in commands(path) if c.text.startswith("pip ") and c.block.section == VLLM_CPU_SECTION]


def readme_test_command(path: Path = README) -> str:
    (command,) = [c.text for c in commands(path) if c.block.section == "Tests" and "pytest" in c.text]
    return command


def lint_commands(path: Path = README) -> list[str]:
    return [c.text for c in commands(path) if c.text.startswith("ruff ")]


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "install":
        print("\n".join(install_commands()))
    elif what == "test":
        print(readme_test_command())
    elif what == "lint":
        print("\n".join(lint_commands()))
    elif what == "vllm-install":
        print("\n".join(vllm_install_commands()))
    else:
        sys.exit(__doc__)
