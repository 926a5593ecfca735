"""Plain-text tables for the terminal: aligned columns, numbers to 4 significant digits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cell(value: Any) -> str:
    """A table cell: floats to 4 significant digits, anything else as ``str``."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, rule: bool = True) -> str:
    """``headers`` and ``rows`` as left-aligned columns, with a rule under the header."""
    cells = [[cell(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join([line, *(["  ".join("-" * w for w in widths)] if rule else []), *body])
