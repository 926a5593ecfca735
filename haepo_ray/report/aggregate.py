"""Seeds -> mean and std: curves on common grids of updates and of wall-clock seconds, and
the results table.

Each trial's curve is interpolated linearly onto the group's grid (as the paper's figures,
"interpolated to a common grid"); a finished trial that stopped early (e.g. on reaching its
target return) holds its last value to the end of the grid, an unfinished one (failed, killed,
still running; only with ``--include-unfinished``) ends where its run ended, no curve starts
before its first reported point (a held-out evaluation first made after update 50 has no
value at update 1), and each point is the mean over the trials that reach it. Updates are the
trials' steps: training iterations of RL trials, RL updates of language-model ones
(:mod:`~haepo_ray.report.kinds`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from haepo_ray.report.kinds import AUC, LAST, MAX, MEAN, RL, STEPS, TAIL, TAIL_STEPS, Kind
from haepo_ray.report.runs import ITERATION, SECONDS, Trial
from haepo_ray.report.stats import auc

GRID_POINTS = 200
SFT_START = "SFT start"  # the algorithm of the SFT start's groups (haepo_ray.report.sft_start)
# A trial's (steps, values) of a metric -> one number (kinds.LAST, ...).
REDUCE = {LAST: lambda steps, v: v[-1], MAX: lambda steps, v: np.max(v), MEAN: lambda steps, v: np.mean(v),
          AUC: auc, TAIL: lambda steps, v: np.mean(v[-TAIL_STEPS:])}


@dataclass
class Group:
    """The trials of one experiment, algorithm and configuration (its seeds)."""

    experiment: str
    algorithm: str
    config_label: str
    trials: list[Trial]

    @property
    def config(self) -> dict:
        return self.trials[0].config

    @property
    def env_label(self) -> str:
        return self.trials[0].env_label

    @property
    def kind(self) -> Kind:
        return self.trials[0].kind

    @property
    def section(self) -> str:
        return self.trials[0].section

    def metrics(self) -> list[str]:
        """Metrics every trial of the group has."""
        common = set.intersection(*(set(t.curves.columns) for t in self.trials))
        return sorted(common)

    def curve(self, metric: str, x: str = ITERATION, points: int = GRID_POINTS) -> pd.DataFrame:
        """``metric`` against ``x`` (a step, ``training_iteration`` or ``update``, or seconds,
        ``time_total_s`` or ``train_time_s``) on a common grid from 0 to the longest trial's
        end: columns ``mean``, ``std`` (population, over the seeds that reach the point) and
        ``n`` (how many do)."""
        xs, ys, ends = [], [], []
        for trial in self.trials:
            frame = trial.curves.reset_index()
            if x not in frame or metric not in frame:
                continue
            frame = frame[[x, metric]].dropna()
            if frame.empty:
                continue
            xs.append(frame[x].to_numpy(float))
            ys.append(frame[metric].to_numpy(float))
            ends.append(ys[-1][-1] if trial.finished else np.nan)
        if not xs:
            return pd.DataFrame(columns=["mean", "std", "n"])
        end = max(float(v.max()) for v in xs)
        grid = np.linspace(0.0, end, points) if x not in STEPS else np.arange(1, int(end) + 1, dtype=float)
        stacked = np.vstack([np.interp(grid, v, y, left=np.nan, right=end) for v, y, end in zip(xs, ys, ends)])
        n = (~np.isnan(stacked)).sum(axis=0)
        reached = np.where(n > 0, n, 1)
        mean = np.where(n > 0, np.nansum(stacked, axis=0) / reached, np.nan)
        std = np.sqrt(np.nansum((stacked - mean) ** 2, axis=0) / reached)
        return pd.DataFrame({"mean": mean, "std": np.where(n > 0, std, np.nan), "n": n},
                            index=pd.Index(grid, name=x))

    def final(self, metric: str) -> np.ndarray:
        """Each trial's last reported value of ``metric`` (NaN where it has none)."""
        return self.per_trial(metric, LAST)

    def per_trial(self, metric: str, how: str) -> np.ndarray:
        """Each trial's ``metric`` as one number, ``how`` one of :data:`REDUCE` (NaN where it
        has no value)."""
        out = []
        for trial in self.trials:
            steps, values = _values(trial.curves, metric)
            out.append(float(REDUCE[how](steps, values)) if len(values) else np.nan)
        return np.asarray(out)

    def seconds_per_100_updates(self) -> np.ndarray:
        """Each trial's wall-clock seconds per 100 training iterations."""
        out = []
        for trial in self.trials:
            steps, seconds = _values(trial.curves, SECONDS)
            out.append(100.0 * float(seconds[-1]) / float(steps[-1]) if len(seconds) else np.nan)
        return np.asarray(out)


def _values(curves: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``metric`` in a trial's curves where it has a value (NumPy, not
    pandas: the table reads them for every trial)."""
    if metric not in curves:
        return np.empty(0), np.empty(0)
    values = curves.to_numpy()[:, curves.columns.get_loc(metric)]  # a view of one block: no Series built
    kept = ~np.isnan(values)
    return curves.index.to_numpy()[kept], values[kept]


def group_trials(trials: list[Trial]) -> list[Group]:
    """Trials grouped by (experiment, algorithm, model, configuration), in a stable order."""
    groups: dict[tuple, list[Trial]] = defaultdict(list)
    for trial in trials:
        groups[trial.group].append(trial)
    return [Group(exp, algo, label, members) for (exp, algo, _, label), members in sorted(groups.items())]


IDENTITY = ("experiment", "algorithm", "model", "data", "config", "seeds", "unfinished",
            "updates")  # the table's first columns


def results_table(groups: list[Group]) -> pd.DataFrame:
    """One row per group: what ran (a language-model group also names its model and data
    set), seeds (and, where unfinished trials are included, how many of them did not finish),
    updates, and its kind's table metrics (mean and std over seeds); RL groups also wall-clock
    seconds per 100 updates. RL and language-model rows share one table, a column empty where
    a kind has no such metric (:func:`by_kind` splits it again)."""
    rows = []
    for g in groups:
        row = {"experiment": g.experiment, "algorithm": g.algorithm, **g.trials[0].subject,
               "config": g.config_label, "seeds": len(g.trials),
               "unfinished": sum(not t.finished for t in g.trials), "updates": _updates(g)}
        for name, metric, how in g.kind.table:
            values = g.per_trial(metric, how)
            if np.isnan(values).all():
                continue
            row[f"{name} mean"] = float(np.nanmean(values))
            row[f"{name} std"] = float(np.nanstd(values))
        if g.kind is RL:
            row["s / 100 updates"] = float(np.nanmean(g.seconds_per_100_updates()))
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table["unfinished"].any():
        table = table.drop(columns="unfinished")
    return table[[c for c in IDENTITY if c in table] + [c for c in table if c not in IDENTITY]]


def _updates(g: Group) -> int:
    """The mean over seeds of the last step reported; 0 when no trial reported one (a trial
    that failed before its first update is still listed) and for the SFT start (not trained:
    :mod:`~haepo_ray.report.sft_start`)."""
    last = [float(t.curves.index.max()) for t in g.trials if len(t.curves.index) and t.algorithm != SFT_START]
    return int(np.mean(last)) if last else 0


def by_kind(table: pd.DataFrame) -> list[pd.DataFrame]:
    """The results table as one table per kind of trial (RL rows, then language-model rows:
    those naming a model), each without the columns only the other kind fills."""
    llm = table["model"].notna() if "model" in table else pd.Series(False, index=table.index)
    parts = [table[~llm], table[llm]]
    return [part.dropna(axis=1, how="all") for part in parts if len(part)]


def headline(groups: list[Group]) -> tuple[str, str]:
    """The (metric, label) that ranks the configurations of one sweep: the first of its kind's
    :attr:`~haepo_ray.report.kinds.Kind.headlines` that every configuration has a final value of
    (an RL sweep's evaluation return where RLlib evaluated it, its training return otherwise),
    else the last."""
    headlines = groups[0].kind.headlines
    return next((h for h in headlines if all(not np.isnan(g.final(h[0])).all() for g in groups)), headlines[-1])


def curve_groups(groups: list[Group], max_configs: int = 4) -> list[Group]:
    """The groups a comparison figure draws: every configuration of a sweep (experiment and
    algorithm) with at most ``max_configs`` of them (e.g. zscore vs sum), else the sweep's
    best configuration by mean final :func:`headline` (its grid is in the heatmaps)."""
    sweeps: dict[tuple[str, str], list[Group]] = defaultdict(list)
    for g in groups:
        sweeps[(g.experiment, g.algorithm)].append(g)
    shown: list[Group] = []
    for key in sorted(sweeps):
        members = sweeps[key]
        if len(members) <= max_configs:
            shown += members
            continue
        metric, _ = headline(members)

        def score(g: Group) -> float:
            values = g.final(metric)
            return -np.inf if np.isnan(values).all() else float(np.nanmean(values))
        shown.append(max(members, key=score))
    return shown
