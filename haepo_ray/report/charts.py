"""The report page's interactive charts: the figures of :mod:`~haepo_ray.report.figures` as
Plotly figures, drawn from the same numbers as their PNG and SVG.

Hovering a point shows its configuration, its update (or seconds, or phase) and its value
with the spread over seeds; a configuration's traces share a legend group named by
:func:`group_key`, so one legend click hides or shows the configuration (its line and its
band) and the page's results table highlights a row's curves by that key
(:mod:`~haepo_ray.report.page`). Plotly's own defaults do the rest: drag to zoom,
double-click to reset.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from haepo_ray.report.aggregate import Group

PALETTE = qualitative.Plotly  # a configuration's color: its place among a section's curves
FONT = {"size": 11}


def group_key(g: Group) -> str:
    """What names a group in the page (legend groups, table rows): its experiment, algorithm,
    model and configuration, ``|``-joined."""
    return "|".join(g.trials[0].group)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[k:k + 2], 16) for k in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _layout(title: str, xlabel: str, ylabel: str, **extra) -> dict:
    return {"title": {"text": title, "font": {"size": 13}, "x": 0.01, "xanchor": "left"}, "font": FONT,
            "template": "none",  # plotly.js defaults
            "xaxis": {"title": {"text": xlabel}}, "yaxis": {"title": {"text": ylabel}},
            "legend": {"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0, "font": {"size": 10}},
            "margin": {"l": 60, "r": 20, "t": 50, "b": 40}, "height": 460, **extra}


def curve_chart(curves: list[tuple[Group, str, pd.DataFrame]], ylabel: str, xlabel: str, title: str,
                bounds: tuple[float | None, float | None], seconds: bool) -> go.Figure:
    """One line (the mean) and band (+- std, within ``bounds``) per (group, label, curve of
    :meth:`Group.curve`); the hover reads the label, x (an update, or seconds) and the mean
    +- std over the seeds that reach the point."""
    x_text = "%{x:.4~g} s" if seconds else "update %{x}"
    hover = (f"<b>%{{fullData.name}}</b><br>{x_text}<br>{ylabel} %{{y:.4~g}} ± %{{customdata[0]:.3~g}}"
             " (std over %{customdata[1]} seeds)<extra></extra>")
    fig = go.Figure(layout=_layout(title, xlabel, ylabel))
    for i, (g, label, curve) in enumerate(curves):
        drawn = curve[curve["mean"].notna()]
        x = drawn.index.to_numpy(float)
        lo, hi = ((drawn["mean"] + sign * drawn["std"]).clip(*bounds).to_numpy() for sign in (-1, 1))
        key = group_key(g)
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]), fill="toself",
                                 fillcolor=_rgba(color(i), 0.2), line={"width": 0}, hoverinfo="skip",
                                 showlegend=False, legendgroup=key, name=label))
        fig.add_trace(go.Scatter(x=x, y=drawn["mean"].to_numpy(), mode="lines", name=label, legendgroup=key,
                                 line={"color": color(i), "width": 2},
                                 customdata=np.column_stack([drawn["std"].to_numpy(), drawn["n"].to_numpy()]),
                                 hovertemplate=hover))
    return fig


def heatmap_chart(grid: pd.DataFrame, spread: pd.DataFrame, counts: pd.DataFrame, row_key: str, col_key: str,
                  label: str, title: str) -> go.Figure:
    """``grid`` (rows: ``row_key``'s values, columns: ``col_key``'s) as cells; the hover reads
    both settings and the value +- ``spread`` (std over the ``counts`` trials in the cell)."""
    values = grid.to_numpy(float)
    fig = go.Figure(go.Heatmap(
        z=values, x=[f"{v:.4g}" for v in grid.columns], y=[f"{v:.4g}" for v in grid.index],
        colorscale="Viridis", colorbar={"title": {"text": f"final mean {label}", "side": "right"}},
        text=[[f"{v:.3g}" for v in row] for row in values], texttemplate="%{text}",
        customdata=np.dstack([spread.to_numpy(float), counts.to_numpy(float)]),
        hovertemplate=(f"{row_key}=%{{y}}, {col_key}=%{{x}}<br>final mean {label} %{{z:.4~g}} ± "
                       "%{customdata[0]:.3~g} (std over %{customdata[1]} trials)<extra></extra>")),
        layout=_layout(title, col_key, row_key, height=max(320, 60 * len(grid) + 160)))
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def memory_chart(bars: list[tuple[Group, str, list[str], np.ndarray, np.ndarray, int]], title: str) -> go.Figure:
    """One bar per phase for each (group, label, phases, means, stds, seeds); the hover reads
    the label, the phase and the peak +- std over seeds."""
    fig = go.Figure(layout=_layout(title, "phase of an update", "peak memory (MB)", barmode="group"))
    for i, (g, label, phases, means, stds, seeds) in enumerate(bars):
        fig.add_trace(go.Bar(
            x=phases, y=means, error_y={"type": "data", "array": stds}, name=label, legendgroup=group_key(g),
            marker={"color": color(i)}, customdata=np.column_stack([stds, np.full(len(phases), seeds)]),
            hovertemplate=("<b>%{fullData.name}</b><br>phase %{x}<br>peak memory (MB) %{y:.4~g} ± "
                           "%{customdata[0]:.3~g} (std over %{customdata[1]} seeds)<extra></extra>")))
    return fig
