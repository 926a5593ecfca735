"""This checkout's commit and a git revision's code beside it, for benchmarks that measure a
change in one run (the revision's code in a detached worktree, removed after the run)."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    """A git command in this checkout; its output."""
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def this_commit() -> str:
    """HEAD, and whether ``haepo_ray`` has uncommitted changes."""
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "haepo_ray") else ""
    return git("rev-parse", "HEAD") + dirty


@contextlib.contextmanager
def revision(rev: str) -> Iterator[tuple[Path, str]]:
    """A detached worktree of ``rev`` and its commit, removed on exit."""
    commit = git("rev-parse", f"{rev}^{{commit}}")
    folder = Path(tempfile.mkdtemp(prefix="haepo-base-"))
    git("worktree", "add", "--detach", str(folder), commit)
    try:
        yield folder, commit
    finally:
        git("worktree", "remove", "--force", str(folder))
