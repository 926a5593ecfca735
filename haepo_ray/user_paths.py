"""The paths a user gives: text files (sweep specs, TL;DR data, evaluation forms' files, Ray
auth tokens) read with an error that names the file and what is wrong with it, and output
folders checked before anything is written there."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["read_text", "unwritable_file", "unwritable_folder"]


def read_text(path: str | Path, what: str, newline: str | None = None) -> str:
    """The UTF-8 text of ``path`` (``newline`` as :func:`open` takes it);
    ``ValueError("cannot read {what} {path}: why")`` when it cannot be read or is not UTF-8
    (``why`` then names the first bad byte and its offset)."""
    try:
        with open(path, encoding="utf-8", newline=newline) as file:
            return file.read()
    except OSError as err:
        why = err.strerror or str(err)
    except UnicodeDecodeError as err:
        why = f"not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})"
    raise ValueError(f"cannot read {what} {path}: {why}")


def unwritable_folder(path: str | Path) -> str | None:
    """None when ``path`` is a folder, or can be made one, that this process can write in;
    else why not: the nearest of it and its parents that exists is a file, or not writable."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def unwritable_file(path: str | Path, kind: str = "file") -> str | None:
    """None when the file ``path`` (a ``kind``, for the message) can be written, its folder made
    if need be; else why not: it is a folder, or :func:`unwritable_folder` of its folder."""
    path = Path(path)
    return f"{path} is a folder, not a {kind}" if path.is_dir() else unwritable_folder(path.parent)
