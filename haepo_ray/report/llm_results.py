"""Language-model results with their uncertainty: per method, mean and 95% confidence interval
over seeds (:mod:`~haepo_ray.report.stats`), and pairwise win rates on the held-out prompts.

A *method* is a group of :mod:`~haepo_ray.report.aggregate`: an algorithm with one
configuration (HAEPO with ``length_normalize=True`` is a method of its own), its trials the
seeds. :func:`methods_table` gives each method's columns of :attr:`Kind.intervals
<haepo_ray.report.kinds.Kind.intervals>` (:data:`~haepo_ray.report.kinds.LLM`): the held-out
reward, ROUGE-L and semantic similarity at the last evaluation and their AUC, the KL to the
reference, HAEPO's effective number of trajectories. :func:`win_rates` compares two methods of
one model and data set on each seed both ran: the share of held-out prompts on which the first
one's greedy completion at its last evaluation scores higher than the other's
(:data:`~haepo_ray.report.generations.JUDGES`), ties half; then mean and CI over those seeds.

Tables hold :class:`~haepo_ray.report.stats.Interval` cells: :func:`numbers` spreads them into
columns for the CSVs, :func:`texts` writes them as ``mean [low, high]`` for the pages.
"""

from __future__ import annotations

import pandas as pd

from haepo_ray.report.aggregate import Group
from haepo_ray.report.generations import JUDGES
from haepo_ray.report.kinds import LLM, TAIL_STEPS
from haepo_ray.report.stats import CONFIDENCE, Interval, mean_ci, win_rate

CI = f"{CONFIDENCE:.0%} CI"
METHODS_TITLE = (
    f"Language models, held-out results per method: mean [{CI}] over seeds (Student-t, n - 1 degrees of "
    "freedom; one seed has no interval). final: the last evaluation; AUC: the area under the evaluation "
    "curve by the trapezoid rule over the evaluated updates, divided by the span from the first to the last "
    "of them (the curve's mean height; empty with one evaluation). Reward, ROUGE-L and semantic similarity "
    "of the greedy completions; KL to the reference of those sampled at the training temperature; n_eff: "
    "HAEPO's effective number of trajectories per prompt group, 1 / sum w^2, of its training updates, the "
    f"mean of a trial's last {TAIL_STEPS}")


def method_label(g: Group) -> str:
    """``HAEPO`` or, for a configuration, ``HAEPO (length_normalize=True)``."""
    return g.algorithm if g.config_label == "default" else f"{g.algorithm} ({g.config_label})"


def methods_table(groups: list[Group]) -> pd.DataFrame:
    """One row per language-model group: what ran, seeds, and an :class:`Interval` per column
    of :attr:`LLM.intervals <haepo_ray.report.kinds.Kind.intervals>`; empty without such groups."""
    rows = [{"experiment": g.experiment, **g.trials[0].subject, "method": method_label(g), "seeds": len(g.trials),
             **{column: mean_ci(g.per_trial(metric, how)) for column, metric, how in LLM.intervals}}
            for g in groups if g.kind is LLM]
    return pd.DataFrame(rows)


def pairwise(ours: Group, theirs: Group, judge: str) -> Interval:
    """``ours``'s win rate against ``theirs`` by the record key ``judge``: per seed both have
    scores for, over the prompts both scored (:func:`~haepo_ray.report.stats.win_rate`); mean
    and CI over the seeds."""
    other = {str(t.seed): t.scores for t in theirs.trials if t.scores}
    rates = []
    for trial in ours.trials:
        against = other.get(str(trial.seed))
        if trial.scores and against:
            prompts = sorted(trial.scores.keys() & against.keys())
            rates.append(win_rate([trial.scores[p][judge] for p in prompts], [against[p][judge] for p in prompts]))
    return mean_ci(rates)


def win_rates(groups: list[Group]) -> pd.DataFrame:
    """Per model and data set, judge and ordered pair of its language-model methods with a
    seed in common: the first's win rate against the second (:func:`pairwise`), in column
    ``win rate``. Methods are named by :func:`method_label`, prefixed by their experiment
    where a model and data set have several."""
    rows = []
    for section in sorted({g.section for g in groups if g.kind is LLM}):
        members = [g for g in groups if g.kind is LLM and g.section == section]
        several = len({g.experiment for g in members}) > 1
        label = {id(g): f"{g.experiment}: {method_label(g)}" if several else method_label(g) for g in members}
        for judge, key in JUDGES.items():
            for ours in members:
                for theirs in (g for g in members if g is not ours):
                    rate = pairwise(ours, theirs, key)
                    if rate.n:
                        rows.append({**ours.trials[0].subject, "judge": judge, "method": label[id(ours)],
                                     "opponent": label[id(theirs)], "win rate": rate})
    return pd.DataFrame(rows)


def interval_text(value: Interval) -> str:
    """``0.5 [0.25, 0.75]`` (4 significant digits), ``0.5 (n=1, no interval)``, or empty
    without a value."""
    if value.n == 0:
        return ""
    if value.n == 1:
        return f"{value.mean:.4g} (n=1, no interval)"
    return f"{value.mean:.4g} [{value.low:.4g}, {value.high:.4g}]"


def _interval_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table if len(table) and isinstance(table[c].iloc[0], Interval)]


def numbers(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each :class:`Interval` column ``c`` as columns ``c mean``, ``c CI low``,
    ``c CI high`` and ``c n`` (the seeds with a value)."""
    out = table.copy()
    for column in _interval_columns(table):
        at = out.columns.get_loc(column)
        values = out.pop(column)
        for i, (part, field) in enumerate((("mean", "mean"), ("CI low", "low"), ("CI high", "high"), ("n", "n"))):
            out.insert(at + i, f"{column} {part}", [getattr(v, field) for v in values])
    return out


def texts(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each :class:`Interval` written by :func:`interval_text`."""
    return table.assign(**{c: table[c].map(interval_text) for c in _interval_columns(table)})


def win_rate_matrices(rates: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, matrix) per model and data set and judge of :func:`win_rates`: a row per method,
    its win rate against each opponent's column as text."""
    out = []
    if rates.empty:
        return out
    subject = [c for c in rates if c in LLM.subject]
    for key, part in rates.groupby([*subject, "judge"], sort=False):
        *what, judge = key
        matrix = texts(part).pivot(index="method", columns="opponent", values="win rate").fillna("")
        title = (f"Win rate on held-out prompts, {' on '.join(what)}, judged by the {judge} against the gold "
                 "summary: the row method's greedy completion against the column method's on the same prompt "
                 f"and training seed, at their last evaluations (ties half); mean [{CI}] over seeds, the "
                 "Student-t interval not cut to [0, 1]")
        out.append((title, matrix.reset_index().rename_axis(columns=None)))
    return out
