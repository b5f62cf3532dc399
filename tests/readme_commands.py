"""The commands of README.md, read from its fenced code blocks: what `.ci/run` installs and runs, and what
`tests/test_readme.py` executes. Standard library only (CI calls it before anything is installed).

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

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
VLLM_CPU_SECTION = "vLLM on a CPU machine"  # its own environment: installed and run by the vllm lane


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language tag, text (indentation removed), first line number and section."""

    lang: str
    text: str
    line: int
    section: str


@dataclass(frozen=True)
class Command:
    """One shell command of a bash block: continuation lines joined, trailing comment kept apart."""

    text: str
    comment: str
    block: Block


def blocks(path: Path = README) -> list[Block]:
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
            out.append(Block(lang, "\n".join(lines) + "\n", start, section))
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


def commands(path: Path = README) -> list[Command]:
    """Every shell command of every `bash` block, in README order."""
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
    return [c.text for c in commands(path) if c.text.startswith("pip install") and c.block.section != VLLM_CPU_SECTION]


def vllm_install_commands(path: Path = README) -> list[str]:
    """The pip commands (install and uninstall) of the vLLM-on-CPU environment."""
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
