"""The report's ``index.html``: its tables and interactive charts, working with no network.

The page loads plotly.js from ``plotly.min.js``, written beside it from the plotly package
(:func:`write_plotly`), rather than inlining it: one 4.8 MB copy serves every chart, the page
stays small enough to read and diff, and ``--out`` stays one folder to zip and mail. Each
chart's figure (:mod:`~haepo_ray.report.charts`) is a JSON block in the page; where
plotly.js did not load (the page copied alone), the page says so and shows the figures' PNGs.
The script of ``page.js``, inlined, sorts any table by a header click, filters the results
tables by text, and highlights the curves of the results rows ticked (rows and traces share
:func:`~haepo_ray.report.charts.group_key`).
"""

from __future__ import annotations

import html
import json
import math
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from plotly.offline import get_plotlyjs

from haepo_ray.report.aggregate import by_kind
from haepo_ray.report.charts import group_key
from haepo_ray.report.kinds import LLM
from haepo_ray.tables import cell

if TYPE_CHECKING:
    from haepo_ray.report import Report

PLOTLY_JS = "plotly.min.js"
SCRIPT = Path(__file__).with_name("page.js")
HOW_TO = ("Click a column header to sort; type in the box above a results table to keep the rows holding "
          "those words; tick rows to highlight their curves in the charts. In a chart, hover for values, "
          "click a legend entry to hide or show a configuration, drag to zoom, double-click to reset.")


def caption(part: pd.DataFrame) -> str:
    """The caption of a kind's table (of :func:`by_kind`; language-model rows name a model)."""
    return LLM.caption if "model" in part else ""


def write_plotly(out: Path) -> Path:
    """plotly.js, of the installed plotly package, written to ``out`` beside the page."""
    path = out / PLOTLY_JS
    path.write_text(get_plotlyjs(), encoding="utf-8")
    return path


def _td(value) -> str:
    """A cell: numbers to 4 significant digits with their full value in ``data-v`` (what the
    sort compares), NaN and None empty, anything else as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "<td></td>"
    if isinstance(value, Real) and not isinstance(value, bool):
        return f'<td data-v="{float(value)!r}">{cell(float(value)) if isinstance(value, float) else value}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def table_html(frame: pd.DataFrame, table_id: str, classes: str, keys: list[str] | None = None) -> str:
    """``frame`` as a sortable table; with ``keys`` (a row's :func:`group_key`, by the frame's
    index) each row has a box that highlights its configuration's curves."""
    pick = '<th class="pick" title="highlight in the charts"></th>' if keys else ""
    head = pick + "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for index, row in zip(frame.index, frame.itertuples(index=False)):
        attrs, box = "", ""
        if keys:
            attrs = f' data-group="{html.escape(keys[index])}"'
            box = '<td><input type="checkbox" aria-label="highlight in the charts"></td>'
        rows.append(f"<tr{attrs}>{box}{''.join(_td(v) for v in row)}</tr>")
    return (f'<table id="{table_id}" class="{classes} sortable">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
            + "\n".join(rows) + "\n</tbody></table>")


def _charts_json(report: Report) -> str:
    """The JSON block of every figure's chart by stem, safe inside a ``<script>`` element."""
    body = ",".join(f"{json.dumps(f.stem)}:{f.chart.to_json()}" for f in report.figures)
    return "{" + body.replace("</", "<\\/") + "}"


def render_html(report: Report, tracking_uri: str) -> str:
    """index.html: the results tables, the other tables, then every figure as a chart."""
    keys = [group_key(g) for g in report.groups]  # the results table's rows are the groups, in order
    parts = []
    for i, part in enumerate(by_kind(report.table)):
        parts.append((f'<p class="caption">{html.escape(caption(part))}</p>\n' if caption(part) else "")
                     + f'<input class="filter" type="search" placeholder="filter rows" data-table="results-{i}"'
                     f' aria-label="filter the rows">\n' + table_html(part, f"results-{i}", "results", keys))
    for i, (title, extra) in enumerate(report.extras):
        parts.append(f"<h2>{html.escape(title)}</h2>\n" + table_html(extra, f"extra-{i}", "extra"))
    warnings = "".join(f'<p class="warning">WARNING: {html.escape(w)}</p>\n' for w in report.warnings)
    sections = []
    for section in dict.fromkeys(f.section for f in report.figures):
        charts = [f'<figure><div class="plot" data-stem="{html.escape(f.stem)}"></div>'
                  f'<figcaption>{html.escape(f.title)} (<a href="{html.escape(f.stem)}.png">PNG</a>, '
                  f'<a href="{html.escape(f.stem)}.svg">SVG</a>)</figcaption></figure>'
                  for f in report.figures if f.section == section]
        sections.append(f"<h2>{html.escape(section)}</h2>\n" + "\n".join(charts))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>haepo-ray report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table.results, table.extra {{ border-collapse: collapse; font-size: 0.85em; }}
table.results th, table.results td, table.extra th, table.extra td {{
  padding: 0.2em 0.6em; border-bottom: 1px solid #ddd; text-align: left; }}
table.sortable th:not(.pick) {{ cursor: pointer; user-select: none; }}
th[aria-sort=ascending]::after {{ content: " \\25B2"; }}
th[aria-sort=descending]::after {{ content: " \\25BC"; }}
tr[data-group] {{ cursor: pointer; }}
tr.chosen {{ background: #fff3c4; }}
input.filter {{ margin: 0.5em 0; width: 24em; }}
p.warning {{ color: #a40000; font-weight: bold; }}
figure {{ display: inline-block; margin: 0.5em; vertical-align: top; }}
div.plot {{ width: 640px; }}
div.plot img {{ max-width: 640px; }}
figcaption {{ font-size: 0.8em; }}
</style>
<script src="{PLOTLY_JS}" charset="utf-8"></script>
</head>
<body>
<h1>haepo-ray report</h1>
<p>{len(report.groups)} configurations, {sum(len(g.trials) for g in report.groups)} trials from
<code>{html.escape(tracking_uri)}</code>. Mean and std over seeds (the RL configurations' and the
language-model methods' tables and win rates: mean and 95% confidence interval); updates are training
iterations (RL updates for language models); per environment (or model and data set), the
curves show every configuration of a sweep of up to four, and the best one, by final evaluation
return where each configuration evaluated, else final return (held-out reward), of a larger grid
(its heatmaps show the rest, by the same value). Language models: the held-out
evaluation's values (eval/*, never the training samples' metrics), peak memory over updates and
phases, seconds per RL update.</p>
<p class="howto">{HOW_TO}</p>
<p id="no-plotly" class="warning" hidden>{PLOTLY_JS} did not load (it belongs beside this page):
the figures are the static PNGs.</p>
{warnings}{chr(10).join(parts)}
{chr(10).join(sections)}
<script type="application/json" id="haepo-charts">{_charts_json(report)}</script>
<script>
{SCRIPT.read_text(encoding="utf-8")}</script>
</body></html>
"""
