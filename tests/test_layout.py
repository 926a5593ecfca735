"""The README's Layout lists every module of the package under its folder, and no module that
is gone: a newcomer finds where a thing lives from the README and the folder names alone.

The Layout is the first code block after the README's ``## Layout`` heading, a tree: a line
whose first word ends in ``/`` opens a folder, which holds the lines indented deeper below it;
a module is listed when its file name appears in its folder's lines (``__init__.py`` need not).
The first word of a line that names a ``.py`` file must be a module there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "haepo_ray"
MODULE = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\.py\b")


def layout_block(readme: str) -> list[str]:
    """The lines of the first code block after ``## Layout``."""
    after = readme.split("\n## Layout\n", 1)[1]
    return after.split("```", 2)[1].splitlines()[1:]


def folder_lines(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Each line with the folders it is in (``["haepo_ray", "haepo_ray/sweep"]``), innermost last."""
    placed = []
    stack: list[tuple[int, str]] = []  # (indent, path) of the open folders
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        first = line.split()[0]
        if first.endswith("/"):
            stack.append((indent, "/".join([*(p for _, p in stack[-1:]), first.rstrip("/")])))
        placed.append((line, [p for _, p in stack]))
    return placed


def problems(readme: str, root: Path = ROOT) -> list[str]:
    """Modules of the package missing from the Layout, and listed modules that do not exist."""
    placed = folder_lines(layout_block(readme))
    found = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if path.name == "__init__.py":
            continue
        folder = path.parent.relative_to(root).as_posix()
        text = " ".join(line for line, folders in placed if folder in folders)
        if path.name not in MODULE.findall(text):
            found.append(f"{path.relative_to(root)}: not in the README's Layout under {folder}/")
    for line, folders in placed:
        first = line.split()[0].rstrip(",")
        if folders and folders[-1].startswith(PACKAGE) and MODULE.fullmatch(first) and \
                not (root / folders[-1] / first).is_file():
            found.append(f"{folders[-1]}/{first}: in the README's Layout but not in the package")
    return found


def test_the_layout_lists_every_module_and_only_those():
    assert problems((ROOT / "README.md").read_text()) == []


def test_the_checker_finds_a_missing_and_a_stale_module(tmp_path):
    (tmp_path / PACKAGE / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py", "sub/c.py"):
        (tmp_path / PACKAGE / name).write_text("")
    readme = "\n".join(["# x", "", "## Layout", "", "```", "haepo_ray/   the package",
                        "  a.py       one", "  sub/       b.py, gone.py", "c.py", "```", ""])
    assert problems(readme, tmp_path) == [
        "haepo_ray/sub/c.py: not in the README's Layout under haepo_ray/sub/"]
    readme = readme.replace("  sub/       b.py, gone.py", "  sub/       b.py, c.py\n    gone.py  old")
    assert problems(readme, tmp_path) == ["haepo_ray/sub/gone.py: in the README's Layout but not in the package"]
