"""Seeds -> mean and std: curves on common grids of updates and of wall-clock seconds, and
the results table.

Each trial's curve is interpolated linearly onto the group's grid (as the paper's figures,
"interpolated to a common grid"); a trial that stopped early (e.g. on reaching its target
return) holds its last value to the end of the grid. Updates are training iterations.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from haepo_ray.report.runs import ITERATION, RETURN, SECONDS, Trial

GRID_POINTS = 200


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

    def metrics(self) -> list[str]:
        """Metrics every trial of the group has."""
        common = set.intersection(*(set(t.curves.columns) for t in self.trials))
        return sorted(common)

    def curve(self, metric: str, x: str = ITERATION, points: int = GRID_POINTS) -> pd.DataFrame:
        """``metric`` against ``x`` (``training_iteration`` or ``time_total_s``) on a common
        grid from 0 to the longest trial's end: columns ``mean``, ``std`` (population, over
        seeds) and ``n``."""
        xs, ys = [], []
        for trial in self.trials:
            frame = trial.curves.reset_index()
            if x not in frame or metric not in frame:
                continue
            frame = frame[[x, metric]].dropna()
            if frame.empty:
                continue
            xs.append(frame[x].to_numpy(float))
            ys.append(frame[metric].to_numpy(float))
        if not xs:
            return pd.DataFrame(columns=["mean", "std", "n"])
        end = max(float(v.max()) for v in xs)
        grid = np.linspace(0.0, end, points) if x != ITERATION else np.arange(1, int(end) + 1, dtype=float)
        stacked = np.vstack([np.interp(grid, v, y) for v, y in zip(xs, ys)])
        return pd.DataFrame(
            {"mean": stacked.mean(axis=0), "std": stacked.std(axis=0), "n": len(xs)},
            index=pd.Index(grid, name=x),
        )

    def final(self, metric: str) -> np.ndarray:
        """Each trial's last reported value of ``metric`` (NaN where it has none)."""
        out = []
        for trial in self.trials:
            series = trial.curves[metric].dropna() if metric in trial.curves else pd.Series(dtype=float)
            out.append(float(series.iloc[-1]) if len(series) else np.nan)
        return np.asarray(out)

    def seconds_per_100_updates(self) -> np.ndarray:
        """Each trial's wall-clock seconds per 100 training iterations."""
        out = []
        for trial in self.trials:
            if SECONDS not in trial.curves or trial.curves[SECONDS].dropna().empty:
                out.append(np.nan)
                continue
            seconds = trial.curves[SECONDS].dropna()
            out.append(100.0 * float(seconds.iloc[-1]) / float(seconds.index[-1]))
        return np.asarray(out)


def group_trials(trials: list[Trial]) -> list[Group]:
    """Trials grouped by (experiment, algorithm, configuration), in a stable order."""
    groups: dict[tuple, list[Trial]] = defaultdict(list)
    for trial in trials:
        groups[trial.group].append(trial)
    return [Group(exp, algo, label, members) for (exp, algo, label), members in sorted(groups.items())]


TABLE_METRICS = {
    RETURN: "return",
    "env_runners/regret_per_step_mean": "regret/step",
    "env_runners/success_rate": "success",
    "policy_entropy": "entropy",
}


def results_table(groups: list[Group]) -> pd.DataFrame:
    """One row per group: seeds, iterations, final value of each metric (mean and std over
    seeds) and wall-clock seconds per 100 updates."""
    rows = []
    for g in groups:
        row = {
            "experiment": g.experiment,
            "algorithm": g.algorithm,
            "config": g.config_label,
            "seeds": len(g.trials),
            "updates": int(np.nanmean([t.curves.index.max() for t in g.trials])),
        }
        for metric, name in TABLE_METRICS.items():
            values = g.final(metric)
            if np.isnan(values).all():
                continue
            row[f"{name} mean"] = float(np.nanmean(values))
            row[f"{name} std"] = float(np.nanstd(values))
        row["s / 100 updates"] = float(np.nanmean(g.seconds_per_100_updates()))
        rows.append(row)
    return pd.DataFrame(rows)


def curve_groups(groups: list[Group], max_configs: int = 4, metric: str = RETURN,
                 mode: str = "max") -> list[Group]:
    """The groups a comparison figure draws: every configuration of a sweep (experiment and
    algorithm) with at most ``max_configs`` of them (e.g. zscore vs sum), else the sweep's
    best configuration by mean final ``metric`` (its grid is in the heatmaps)."""
    sweeps: dict[tuple[str, str], list[Group]] = defaultdict(list)
    for g in groups:
        sweeps[(g.experiment, g.algorithm)].append(g)
    sign = 1.0 if mode == "max" else -1.0

    def score(g: Group) -> float:
        values = g.final(metric)
        return -np.inf if np.isnan(values).all() else sign * float(np.nanmean(values))

    shown: list[Group] = []
    for key in sorted(sweeps):
        members = sweeps[key]
        shown += members if len(members) <= max_configs else [max(members, key=score)]
    return shown
