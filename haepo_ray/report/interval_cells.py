"""Tables whose cells are :class:`~haepo_ray.report.stats.Interval` s, written out: as columns
of numbers for the CSVs (:func:`numbers`) and as ``mean [low, high]`` for the pages and the
terminal (:func:`texts`)."""

from __future__ import annotations

import pandas as pd

from haepo_ray.report.stats import CONFIDENCE, T, Interval

CI = f"{CONFIDENCE:.0%} CI"


def interval_text(value: Interval, mark_t: bool = True) -> str:
    """``0.5 [0.25, 0.75]`` (4 significant digits; with ``mark_t``, ``(seed t)`` after a
    Student-t one), ``0.5 (n=1, no interval)``, or empty without a value."""
    if value.n == 0:
        return ""
    if value.n == 1:
        return f"{value.mean:.4g} (n=1, no interval)"
    marked = mark_t and value.how == T
    return f"{value.mean:.4g} [{value.low:.4g}, {value.high:.4g}]" + (" (seed t)" if marked else "")


def interval_columns(table: pd.DataFrame) -> list[str]:
    """The columns of ``table`` that hold intervals."""
    return [c for c in table if len(table) and isinstance(table[c].iloc[0], Interval)]


def numbers(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each :class:`Interval` column ``c`` as columns ``c mean``, ``c CI low``,
    ``c CI high``, ``c n`` (the seeds with a value) and ``c CI by`` (``bootstrap`` or ``t``)."""
    out = table.copy()
    parts = (("mean", "mean"), ("CI low", "low"), ("CI high", "high"), ("n", "n"), ("CI by", "how"))
    for column in interval_columns(table):
        at = out.columns.get_loc(column)
        values = out.pop(column)
        for i, (part, field) in enumerate(parts):
            out.insert(at + i, f"{column} {part}", [getattr(v, field) for v in values])
    return out


def texts(table: pd.DataFrame, mark_t: bool = True) -> pd.DataFrame:
    """``table`` with each :class:`Interval` written by :func:`interval_text` (a table whose
    intervals are all Student-t, as its title says, leaves ``mark_t`` off)."""
    return table.assign(**{c: table[c].map(lambda v: interval_text(v, mark_t)) for c in interval_columns(table)})
