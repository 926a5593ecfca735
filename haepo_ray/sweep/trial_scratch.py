"""A trial's temporary folder on its node, which a killed process does not leave behind.

A language-model trial writes its run's files, and each checkpoint before Ray copies it to the
trial's storage, in a folder of the node's temporary directory. A process that is killed never
reaches its ``finally`` and never removes it (a killed driver's trials, a worker that Ray's
memory monitor kills; a trial that Tune stops, or whose training raises, does end its ``with``
blocks), and a mid-run checkpoint holds the model, its reference and AdamW's two moments
(SmolLM2-135M in float32: 4 x 0.54 GB): a few kills fill a GPU node's ``/tmp``. So each folder is held by an exclusive ``flock`` on a lock file beside it, which the
kernel lets go when its process ends, however it ends; every :func:`scratch_folder` removes, when
it starts and when it ends, the folders of its prefix whose locks nobody holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_SUFFIX = ".lock"

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[Path]:
    """A new folder ``<temporary directory>/<prefix>XXXXXXXX``, removed on exit; the folders
    that dead processes left under the same prefix are removed on entry and on exit."""
    root = Path(tempfile.gettempdir())
    _remove_orphans_said(prefix, root)
    # The lock is taken under a name that no scan reads, then renamed beside the folder: a scan
    # never finds the lock of a living folder free.
    fd, lock = tempfile.mkstemp(prefix=f".{prefix}", dir=root)
    folder = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        os.rename(lock, f"{folder}{LOCK_SUFFIX}")
        lock = f"{folder}{LOCK_SUFFIX}"
        yield folder
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)
        _remove_orphans_said(prefix, root)


def _remove_orphans_said(prefix: str, root: Path) -> None:
    if removed := remove_orphans(prefix, root):
        logger.info("removed %d folder(s) that killed processes left in %s: %s", len(removed), root,
                    ", ".join(folder.name for folder in removed))


def remove_orphans(prefix: str, root: Path) -> list[Path]:
    """Removes each folder ``root/<prefix>*`` whose lock file beside it no process holds, and
    that lock file; returns the folders removed. A folder without a lock file is left alone."""
    removed = []
    for lock in root.glob(f"{glob.escape(prefix)}*{LOCK_SUFFIX}"):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:  # removed since the glob, or another user's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process is alive
            os.close(fd)
            continue
        try:
            folder = lock.with_name(lock.name[:-len(LOCK_SUFFIX)])
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            removed.append(folder)
        finally:
            os.close(fd)
    return removed

