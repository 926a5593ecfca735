"""The report's figures: each written as PNG and SVG (matplotlib, no display) and kept as an
interactive chart for the page (:mod:`~haepo_ray.report.charts`), both drawn from one
computation of its numbers.

Figures compare what ran on one environment (env id and env_config), whichever sweeps ran
it: learning curves against updates and against wall-clock seconds, mean +- std over seeds,
for every configuration of a sweep of up to 4 (zscore vs sum, say) and for the best one of a
larger grid; per-step regret, success rate and policy entropy where the env or algorithm
reports them; and heatmaps over lr x batch size and beta_ent x beta_kl, one per
(experiment, algorithm) whose sweep varies both. A sweep's best configuration and its heatmaps
are by its final evaluation return where every configuration evaluated, else by its final
return (:func:`~haepo_ray.report.aggregate.headline`).

Language-model trials are drawn the same way, per model and data set, with their own metrics
(:data:`~haepo_ray.report.kinds.LLM`: the held-out evaluation's reward and ROUGE-L against
updates and training seconds, HAEPO's effective number of trajectories per group against
updates, heatmaps of the final held-out reward), plus a bar chart of peak
memory per phase of an update per configuration: the paper's memory comparison of HAEPO, GRPO
and DPO.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the SVGs (searchable)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import plotly.graph_objects as go  # noqa: E402

from haepo_ray import names  # noqa: E402
from haepo_ray.report.aggregate import Group, curve_groups, headline  # noqa: E402
from haepo_ray.report.charts import curve_chart, heatmap_chart, memory_chart  # noqa: E402
from haepo_ray.report.kinds import GREEDY_ROUGE_L, LLM, MAX, STEPS, memory_phase, memory_phases  # noqa: E402
from haepo_ray.report.runs import ENTROPY, ITERATION, REGRET, RETURN, SECONDS, SUCCESS  # noqa: E402

BATCH_KEYS = ("episodes_per_batch", "train_batch_size_per_learner", "batch_size", "batch_prompts")
HEATMAP_AXES = {"lr-batch": ("lr", BATCH_KEYS), "betas": ("beta_ent", ("beta_kl",))}
BOUNDS = {SUCCESS: (0.0, 1.0), ENTROPY: (0.0, None), REGRET: (0.0, None),  # metric -> its range
          GREEDY_ROUGE_L: (0.0, 1.0)}
X_LABELS = {ITERATION: "updates (training iterations)", SECONDS: "wall-clock seconds",
            LLM.step: "updates (RL updates)", LLM.seconds: "training seconds"}


@dataclass(frozen=True)
class Figure:
    """A written figure: its section (env label), title, the stem of its files and its
    interactive chart."""

    section: str
    title: str
    stem: str
    chart: go.Figure | None = field(default=None, compare=False, repr=False)


def slug(text: str) -> str:
    """``haepo/ChainMDP-v0 (length=5)`` -> ``haepo_ChainMDP-v0_length=5``: a file-name stem."""
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", text).strip("_")


def _save(fig, out: Path, stem: str) -> None:
    for ext in ("png", "svg"):
        fig.savefig(out / f"{stem}.{ext}", dpi=110, bbox_inches="tight")
    plt.close(fig)


def curve_figure(groups: list[Group], metric: str, x: str, ylabel: str, title: str,
                 out: Path, stem: str) -> go.Figure | None:
    """Mean +- std (within the metric's range) of ``metric`` against ``x``, one line per
    group; its chart, or None if no group has it."""
    curves = []
    for g in groups:
        if metric not in g.metrics():
            continue
        curve = g.curve(metric, x)
        if not curve.empty:
            curves.append((g, f"{g.experiment}: {g.algorithm} ({g.config_label}, {int(curve['n'].max())} seeds)",
                           curve))
    if not curves:
        return None
    bounds = BOUNDS.get(metric, (None, None))  # a band never leaves the metric's range
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for _, label, curve in curves:
        ax.plot(curve.index, curve["mean"], label=label)
        ax.fill_between(curve.index, (curve["mean"] - curve["std"]).clip(*bounds),
                        (curve["mean"] + curve["std"]).clip(*bounds), alpha=0.2)
    ax.set(xlabel=X_LABELS[x], ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, out, stem)
    return curve_chart(curves, ylabel, X_LABELS[x], title, bounds, seconds=x not in STEPS)


def heatmap_figure(groups: list[Group], row_key: str, col_keys: tuple[str, ...], title: str,
                   out: Path, stem: str, metric: str = RETURN, label: str = "return") -> go.Figure | None:
    """Final ``metric`` (mean over seeds, and over any other setting the sweep varies) over
    two settings of the groups; its chart (the hover adds the std over the cell's trials), or
    None unless both vary. ``col_keys``: the first one present."""
    col_key = next((k for k in col_keys if any(k in g.config for g in groups)), None)
    members = [g for g in groups if row_key in g.config and col_key in g.config]
    table = pd.DataFrame([(g.config[row_key], g.config[col_key], float(np.nanmean(g.final(metric))))
                          for g in members], columns=["row", "col", "value"])
    if table.empty or table["row"].nunique() < 2 or table["col"].nunique() < 2:
        return None
    grid = table.pivot_table(index="row", columns="col", values="value", aggfunc="mean")
    trials = pd.DataFrame([(g.config[row_key], g.config[col_key], v) for g in members for v in g.final(metric)],
                          columns=["row", "col", "value"])
    by_cell = trials.dropna().groupby(["row", "col"])["value"]
    spread = by_cell.std(ddof=0).unstack().reindex(index=grid.index, columns=grid.columns)
    counts = by_cell.count().unstack().reindex(index=grid.index, columns=grid.columns)
    fig, ax = plt.subplots(figsize=(1.2 * grid.shape[1] + 2.5, 0.8 * grid.shape[0] + 1.8))
    image = ax.imshow(grid.to_numpy(), cmap="viridis", aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [f"{v:.4g}" for v in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [f"{v:.4g}" for v in grid.index])
    ax.set(xlabel=col_key, ylabel=row_key, title=title)
    for (i, j), value in np.ndenumerate(grid.to_numpy()):
        ax.text(j, i, f"{value:.3g}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(image, ax=ax, label=f"final mean {label}")
    _save(fig, out, stem)
    return heatmap_chart(grid, spread, counts, row_key, col_key, label, title)


def memory_figure(groups: list[Group], title: str, out: Path, stem: str) -> go.Figure | None:
    """Peak memory per phase of an update (max over updates, mean +- std over seeds), one bar
    per group in each phase; its chart, or None if no group logged any."""
    phases = memory_phases(dict.fromkeys(c for g in groups for c in g.metrics()))
    groups = [g for g in groups if set(map(memory_phase, phases)) & set(g.metrics())]  # the SFT start: no update
    if not phases:
        return None
    labels = [p.replace("_", "/") for p in phases]
    bars = []
    for g in groups:
        peaks = [g.per_trial(memory_phase(p), MAX) for p in phases]
        bars.append((g, f"{g.experiment}: {g.algorithm} ({g.config_label}, {len(g.trials)} seeds)", labels,
                     np.array([np.nanmean(v) for v in peaks]), np.array([np.nanstd(v) for v in peaks]),
                     len(g.trials)))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    width = 0.8 / len(groups)
    for i, (_, label, _, means, stds, _) in enumerate(bars):
        ax.bar(np.arange(len(phases)) + (i - (len(groups) - 1) / 2) * width, means, width, yerr=stds, capsize=3,
               label=label)
    ax.set_xticks(range(len(phases)), labels)
    ax.set(xlabel="phase of an update", ylabel="peak memory (MB)", title=title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    _save(fig, out, stem)
    return memory_chart(bars, title)


def write_figures(groups: list[Group], out: Path) -> list[Figure]:
    """Every figure the groups support, written to ``out``; the list of what was written."""
    out.mkdir(parents=True, exist_ok=True)
    figures: list[Figure] = []
    for section in sorted({g.section for g in groups}):
        members = [g for g in groups if g.section == section]
        kind = members[0].kind
        shown = curve_groups(members)
        for name, (metric, x, ylabel) in kind.curves.items():
            stem = f"{slug(section)}-{name}"
            title = f"{section}: {ylabel} vs {X_LABELS[x].split(' (')[0]}"
            if (chart := curve_figure(shown, metric, x, ylabel, title, out, stem)) is not None:
                figures.append(Figure(section, title, stem, chart))
        stem, title = f"{slug(section)}-peak-memory", f"{section}: peak memory per phase"
        if kind is LLM and (chart := memory_figure(shown, title, out, stem)) is not None:
            figures.append(Figure(section, title, stem, chart))
        for experiment, algorithm in sorted({(g.experiment, g.algorithm) for g in shown}):
            sweep = [g for g in members if (g.experiment, g.algorithm) == (experiment, algorithm)]
            owner = "-".join([experiment, algorithm, *sweep[0].trials[0].subject.values()])
            metric, label = headline(sweep)
            for name, (row_key, col_keys) in HEATMAP_AXES.items():
                stem = slug(f"{owner}-heatmap-{name}")
                title = f"{experiment}, {algorithm}: final {label} over {row_key} x {col_keys[0]}"
                chart = heatmap_figure(sweep, row_key, col_keys, title, out, stem, metric, label)
                if chart is not None:
                    figures.append(Figure(section, title, stem, chart))
    return figures
