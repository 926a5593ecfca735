"""The statistics of the RL and language-model results (:mod:`~haepo_ray.report.rl_results`,
:mod:`~haepo_ray.report.llm_results`), each a pure function of plain numbers: the mean and its
Student-t confidence interval over seeds, the mean over seeds and prompts and its bootstrap
interval over both, the area under a curve, and win rates of paired scores.

The t quantile is SciPy's (``scipy.stats.t``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
T, BOOTSTRAP = "t", "bootstrap"  # how an Interval was made
REPLICATES = 2000  # bootstrap_ci's resamples
BOOTSTRAP_SEED = 0  # its generator's seed: a report is the same every time it is built


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values and its confidence interval [``low``, ``high``]; the bounds are
    NaN when ``n`` < 2 (one seed has no interval), the mean too when ``n`` is 0."""

    mean: float
    low: float
    high: float
    n: int
    how: str = T  # T (mean_ci) or BOOTSTRAP (bootstrap_ci)


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


def bootstrap_ci(values: Sequence[Sequence[float]], *, shared_units: bool = True,
                 bounds: tuple[float, float] = (-math.inf, math.inf), confidence: float = CONFIDENCE,
                 replicates: int = REPLICATES, seed: int = BOOTSTRAP_SEED) -> Interval:
    """The mean over seeds of each seed's mean over its units (``values[s][u]``: seed ``s``'s
    value of unit ``u``, NaN where it has none) and its percentile bootstrap interval, cut to
    ``bounds`` (the quantity's range).

    Each of ``replicates`` resamples draws the seeds with replacement, then the units with
    replacement within them: one draw of units shared by every drawn seed where
    ``shared_units`` (column ``u`` is the same unit, a held-out prompt, in every seed: a hard
    prompt is hard in every seed, which independent draws per seed would average away), one
    per seed otherwise (a seed's units are its own, its training updates). ``n`` counts the
    seeds with a value; under two there is no interval (NaN bounds), as :func:`mean_ci`. The
    generator's ``seed`` is fixed: the same values give the same interval."""
    lengths = {len(row) for row in values}
    if len(lengths) > 1:
        raise ValueError(f"bootstrap_ci needs one row of unit values per seed, all as long; got rows of "
                         f"{sorted(lengths)} values")
    x = np.asarray(values, dtype=float).reshape(len(values), lengths.pop() if lengths else 0)
    x = x[np.isfinite(x).any(axis=1)]
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, BOOTSTRAP)
    mean = float(np.mean(_row_means(x)))
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1, BOOTSTRAP)
    units = x.shape[1]
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, n, (replicates, n))
    drawn = rng.integers(0, units, (replicates, 1 if shared_units else n, units))
    rows = x[seeds[:, :, None], drawn]  # [replicates, n, units]
    stats = _row_means(_row_means(rows))
    stats = stats[np.isfinite(stats)]  # a resample of units none of its seeds has
    if not len(stats):
        return Interval(mean, math.nan, math.nan, n, BOOTSTRAP)
    low, high = np.quantile(stats, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(mean, float(np.clip(low, *bounds)), float(np.clip(high, *bounds)), n, BOOTSTRAP)


def _row_means(x: np.ndarray) -> np.ndarray:
    """The mean of each last-axis row over its finite values; NaN for a row without one."""
    kept = np.isfinite(x)
    count = kept.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.where(kept, x, 0.0).sum(axis=-1) / count, np.nan)


def auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """The area under the piecewise-linear curve through (``steps``, ``values``), ascending
    steps (the trapezoid rule), divided by the span last - first step: the curve's mean
    height, in the values' units. NaN with fewer than two steps (one point has no area)."""
    s, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if len(s) < 2:
        return math.nan
    return float(np.sum((v[1:] + v[:-1]) / 2 * np.diff(s)) / (s[-1] - s[0]))


def wins(ours: Sequence[float], theirs: Sequence[float]) -> np.ndarray:
    """Per pair (``ours[i]``, ``theirs[i]``): 1 where ours is higher, 0.5 for a tie, 0 where
    lower, NaN where either is NaN."""
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    return np.where(np.isnan(a) | np.isnan(b), np.nan, (a > b) + 0.5 * (a == b))


def win_rate(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The fraction of pairs (``ours[i]``, ``theirs[i]``) where ours is higher, a tie counting
    half (:func:`wins`); pairs with a NaN are left out. NaN when no pair is left."""
    w = wins(ours, theirs)
    w = w[~np.isnan(w)]
    return float(w.mean()) if len(w) else math.nan
