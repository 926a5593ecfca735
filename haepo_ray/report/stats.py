"""The statistics of the language-model results (:mod:`~haepo_ray.report.llm_results`), each a
pure function of plain numbers: the mean and its Student-t confidence interval over seeds, the
area under an evaluation curve, and a win rate of paired scores.

The t quantile is SciPy's (``scipy.stats.t``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values and its confidence interval [``low``, ``high``]; the bounds are
    NaN when ``n`` < 2 (one seed has no interval), the mean too when ``n`` is 0."""

    mean: float
    low: float
    high: float
    n: int


def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``dof`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(p, dof))


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of the finite ``values`` and its two-sided ``confidence`` interval
    mean +- t_{(1 + confidence) / 2, n - 1} * s / sqrt(n), s the sample standard deviation
    (n - 1 in its denominator)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1)
    half = t_quantile((1 + confidence) / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """The area under the piecewise-linear curve through (``steps``, ``values``), ascending
    steps (the trapezoid rule), divided by the span last - first step: the curve's mean
    height, in the values' units. NaN with fewer than two steps (one point has no area)."""
    s, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if len(s) < 2:
        return math.nan
    return float(np.sum((v[1:] + v[:-1]) / 2 * np.diff(s)) / (s[-1] - s[0]))


def win_rate(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The fraction of pairs (``ours[i]``, ``theirs[i]``) where ours is higher, a tie counting
    half; pairs with a NaN are left out. NaN when no pair is left."""
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    kept = ~(np.isnan(a) | np.isnan(b))
    if not kept.any():
        return math.nan
    a, b = a[kept], b[kept]
    return float(np.mean((a > b) + 0.5 * (a == b)))
