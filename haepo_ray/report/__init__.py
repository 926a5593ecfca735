"""``haepo report``: sweeps in MLflow -> aggregated curves, tables, figures and a static page.

:func:`build_report` reads every trial of the given experiments from any tracking URI
(:mod:`~haepo_ray.report.runs`), groups them by algorithm and configuration and aggregates
over seeds (:mod:`~haepo_ray.report.aggregate`), and writes to ``out``:

- ``results.csv`` and ``results.md``: one row per group (final metrics, mean and std over
  seeds; wall-clock seconds per 100 updates). The return is RLlib 2.60's
  ``env_runners/episode_return_mean``: the mean over the episodes of that iteration.
  Language-model groups (trials tagged ``haepo.model``) have the paper's metrics instead, of
  the held-out evaluation (``eval/*``) and never of the training samples
  (:data:`~haepo_ray.report.kinds.LLM`); ``results.md``, the printed tables and the page show
  each kind as its own table, under its caption, the CSV holds both;
- for RL groups, ``rl_results.csv``: per configuration, the final return, its area under the
  curve, the evaluation return, regret and success as a mean and its 95% Student-t confidence
  interval over seeds (:mod:`~haepo_ray.report.rl_results`), in every output too;
- for language-model groups, ``llm_results.csv`` and ``win_rates.csv``: per method (an
  algorithm and configuration), the held-out results' mean and 95% confidence interval over
  seeds and held-out prompts, and its win rates against the other methods on the held-out prompts
  (:mod:`~haepo_ray.report.llm_results`), in every output too; with them the SFT start as a
  method of its own (one per seed, :mod:`~haepo_ray.report.sft_start`), in every table and
  figure, and ``optimised.csv`` and ``verdicts.csv``: which method optimised each metric, and
  each pair's verdict by the metrics neither optimised (:mod:`~haepo_ray.report.optimised`);
- the figures of :mod:`~haepo_ray.report.figures`, each as PNG and SVG;
- ``index.html`` and ``plotly.min.js`` beside it: the tables (sortable, filterable, their rows
  highlighting their curves) and every figure as an interactive chart, with no network access
  needed (:mod:`~haepo_ray.report.page`);
- ``unfinished.csv`` when some trials did not finish (failed, killed, still running): they
  are listed apart in every output and left out of the aggregates unless
  ``include_unfinished`` (:mod:`~haepo_ray.report.status`);
- ``repeats.csv`` when a sweep run again repeated the seeds of an earlier one: of a
  configuration's trials with one seed only the newest is aggregated, the others are listed
  apart in every output (:func:`~haepo_ray.report.status.newest_per_seed`);
- ``provenance.csv``: per configuration, the code version, machine and Ray/RLlib/PyTorch
  versions that made its runs, in every output too, with a warning for an experiment whose
  runs mix code versions (:mod:`~haepo_ray.report.provenance`). With ``require_commit`` the
  report refuses runs made by another commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from haepo_ray.report.aggregate import Group, by_kind, group_trials, results_table
from haepo_ray.report.figures import Figure, write_figures
from haepo_ray.report.interval_cells import numbers, texts
from haepo_ray.report.llm_results import METHODS_TITLE, methods_table, win_rate_matrices, win_rates
from haepo_ray.report.optimised import OPTIMISED_TITLE, VERDICTS_TITLE, optimisation_table, verdicts
from haepo_ray.report.page import caption, render_html, write_plotly
from haepo_ray.report.provenance import (ProvenanceError, check_commit, mixed_code_versions, mixed_settings,
                                         provenance_table)
from haepo_ray.report.rl_results import RL_TITLE, rl_table
from haepo_ray.report.runs import load_trials
from haepo_ray.report.sft_start import start_groups
from haepo_ray.report.status import aggregated, newest_per_seed, repeats_table, unfinished_table
from haepo_ray.tables import cell, format_table

__all__ = ["ProvenanceError", "Report", "build_report", "report_text"]


@dataclass
class Report:
    """What :func:`build_report` wrote."""

    out: Path
    table: pd.DataFrame
    groups: list[Group]
    figures: list[Figure]
    unfinished: pd.DataFrame  # trials whose runs did not finish (:func:`unfinished_table`)
    provenance: pd.DataFrame  # per configuration (:func:`provenance_table`)
    warnings: list[str]  # mixed code versions, uncommitted changes, seeds of one configuration with mixed settings
    include_unfinished: bool = False
    repeats: pd.DataFrame = field(default_factory=pd.DataFrame)  # seeds repeated by a newer trial (:func:`repeats_table`)
    rl: pd.DataFrame = field(default_factory=pd.DataFrame)  # RL: intervals over seeds (:func:`rl_table`)
    methods: pd.DataFrame = field(default_factory=pd.DataFrame)  # language models (:func:`methods_table`)
    win_rates: pd.DataFrame = field(default_factory=pd.DataFrame)  # language models (:func:`win_rates`)
    optimised: pd.DataFrame = field(default_factory=pd.DataFrame)  # language models (:func:`optimisation_table`)
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)  # language models (:func:`verdicts`)

    @property
    def extras(self) -> list[tuple[str, pd.DataFrame]]:
        """The tables after the results, with their titles: the RL configurations' intervals and
        the language-model methods and their win rates (where there are some), the trials that
        did not finish (when some did not), the repeated seeds (when a sweep repeated some), the
        provenance."""
        how = "included in" if self.include_unfinished else "left out of"
        extras = [(RL_TITLE, texts(self.rl, mark_t=False)), (METHODS_TITLE, texts(self.methods)),
                  *win_rate_matrices(self.win_rates),
                  (OPTIMISED_TITLE, self.optimised), (VERDICTS_TITLE, self.verdicts),
                  (f"{len(self.unfinished)} trials did not finish ({how} the aggregates)", self.unfinished),
                  (f"{len(self.repeats)} trials repeat the seed of a newer trial of their configuration (left out "
                   "of the aggregates)", self.repeats)]
        return [e for e in extras if len(e[1])] + [("Provenance (code, machine, libraries)", self.provenance)]

    @property
    def listed_files(self) -> dict[str, pd.DataFrame]:
        """The CSVs of the tables that some reports have and their tables (a file is written
        where its table is not empty): the RL intervals, the trials listed apart and the
        language-model tables."""
        return {"rl_results.csv": self.rl, "unfinished.csv": self.unfinished, "repeats.csv": self.repeats,
                "llm_results.csv": self.methods, "win_rates.csv": self.win_rates, "optimised.csv": self.optimised,
                "verdicts.csv": self.verdicts}

    @property
    def index(self) -> Path:
        return self.out / "index.html"


def build_report(tracking_uri: str, experiments: Iterable[str] | None, out: str | Path, *,
                 include_unfinished: bool = False, require_commit: str | None = None) -> Report:
    """Reads the experiments' sweeps from MLflow and writes the report to ``out``; trials
    whose runs did not finish are aggregated only with ``include_unfinished``.

    Raises ``LookupError`` when an experiment is missing, no trial is found, or none
    finished and unfinished ones are not included; :class:`ProvenanceError`, before writing
    anything, when ``require_commit`` is given and some run was made by another commit.
    """
    experiments = list(experiments or [])
    trials = load_trials(tracking_uri, experiments)
    warnings = mixed_code_versions(trials) + (check_commit(trials, require_commit) if require_commit else [])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen, repeats = newest_per_seed(aggregated(trials, include_unfinished))
    groups = group_trials(chosen)
    warnings += mixed_settings(groups)
    groups += start_groups(groups)
    table = results_table(groups)
    unfinished, provenance = unfinished_table(trials), provenance_table(groups)
    table.to_csv(out / "results.csv", index=False)
    provenance.to_csv(out / "provenance.csv", index=False)
    figures = write_figures(groups, out)
    rates = win_rates(groups)
    report = Report(out, table, groups, figures, unfinished, provenance, warnings, include_unfinished,
                    repeats_table(repeats), rl_table(groups), methods_table(groups), rates, optimisation_table(groups),
                    verdicts(groups, rates))
    for name, part in report.listed_files.items():
        (out / name).unlink(missing_ok=True)  # never a previous report's
        if len(part):
            numbers(part).to_csv(out / name, index=False)
    extras = "".join(f"\n\n{title}:\n\n{_markdown(t)}" for title, t in report.extras)
    (out / "results.md").write_text(_warning_lines(report) + to_markdown(table) + extras + "\n")
    write_plotly(out)
    report.index.write_text(render_html(report, tracking_uri), encoding="utf-8")
    return report


def to_markdown(table: pd.DataFrame) -> str:
    """The table as GitHub Markdown (numbers to 4 significant digits), one table per kind of
    trial (RL and language-model rows share few columns) under its caption, a blank line apart."""
    return "\n\n".join(_captioned(part, _markdown(part)) for part in by_kind(table))


def _captioned(part: pd.DataFrame, rendered: str) -> str:
    return "\n\n".join(filter(None, [caption(part), rendered]))


def _markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _warning_lines(report: Report) -> str:
    return "".join(f"WARNING: {w}\n\n" for w in report.warnings)


def to_text(table: pd.DataFrame) -> str:
    """The table for a terminal: aligned columns, one table per kind of trial under its caption."""
    return "\n\n".join(_captioned(part, _text(part)) for part in by_kind(table))


def _text(table: pd.DataFrame) -> str:
    return format_table(list(table.columns), list(table.itertuples(index=False)), rule=False)


def report_text(report: Report) -> str:
    """What ``haepo report`` prints: its warnings, the results tables, then the trials that
    did not finish and the provenance."""
    extras = "".join(f"\n\n{title}:\n{_text(t)}" for title, t in report.extras)
    return _warning_lines(report) + to_text(report.table) + extras
