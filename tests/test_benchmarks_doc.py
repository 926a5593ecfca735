"""BENCHMARKS.md opens with the table of current figures, and every row of it says how to get
the figure again: a backticked command and the commit it was measured at (7 to 40 hex digits).
A figure without them cannot be checked, so it does not belong on the first screen."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
HEADING = "## Current figures"
COLUMNS = ["what", "value", "command", "commit", "machine", "date"]
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
COMMAND = re.compile(r"`[^`]+`")


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def figure_table(text: str) -> list[dict[str, str]]:
    """The rows of the first table under HEADING, by column name; an error if there is none."""
    lines = text.splitlines()
    if HEADING not in lines:
        raise ValueError(f"no {HEADING!r} section")
    rest = lines[lines.index(HEADING) + 1:]
    table = []
    for line in rest:
        if line.startswith("|"):
            table.append(line)
        elif table or line.startswith("#"):
            break
    if len(table) < 3:
        raise ValueError(f"no table under {HEADING!r}")
    header = [c.lower() for c in cells(table[0])]
    if header != COLUMNS:
        raise ValueError(f"the table's columns are {header}, not {COLUMNS}")
    return [dict(zip(header, cells(line))) for line in table[2:]]


def problems(text: str) -> list[str]:
    """What is wrong with the first-screen table: each row without a command or a commit."""
    try:
        rows = figure_table(text)
    except ValueError as error:
        return [str(error)]
    found = []
    for row in rows:
        name = row.get("what", "?")
        if not COMMAND.search(row.get("command", "")):
            found.append(f"{name}: no command")
        if not COMMIT.search(row.get("commit", "")):
            found.append(f"{name}: no commit")
    return found


def test_the_checker_sees_a_row_without_command_or_commit_and_a_missing_table():
    good = "| x | 1 s | `make test` | fca0c51 | 2-core VM | 2026-11-26 |"
    head = f"# Benchmarks\n\n{HEADING}\n\n| what | value | command | commit | machine | date |\n|---|---|---|---|---|---|\n"
    assert problems(head + good + "\n") == []
    assert problems(head + good + "\n| y | 2 s | make test | fca0c51 | 2-core VM | 2026-11-26 |\n") == ["y: no command"]
    assert problems(head + "| z | 3 s | `make test` | the latest | 2-core VM | 2026-11-26 |\n") == ["z: no commit"]
    assert problems("# Benchmarks\n\nFigures below.\n") == [f"no {HEADING!r} section"]
    assert problems(f"# Benchmarks\n\n{HEADING}\n\nSoon.\n\n## Next\n") == [f"no table under {HEADING!r}"]


def test_every_current_figure_has_a_command_and_a_commit():
    text = DOC.read_text()
    assert len(figure_table(text)) >= 10
    assert problems(text) == []


def test_the_current_figures_are_the_first_screen():
    """The table is the page's first section, before any topic."""
    headings = [line for line in DOC.read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == HEADING
