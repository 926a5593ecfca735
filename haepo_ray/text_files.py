"""The text files a user gives (sweep specs, TL;DR data, evaluation forms' files, Ray auth
tokens), read with an error that names the file and what is wrong with it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_text"]


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
