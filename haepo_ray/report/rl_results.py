"""RL results with their uncertainty: per configuration of a sweep, the mean over its seeds and
its Student-t confidence interval (:func:`~haepo_ray.report.stats.mean_ci`) of each column of
:attr:`RL.intervals <haepo_ray.report.kinds.Kind.intervals>`: the return at the end and its
area under the curve, the evaluation return, regret and success where the trials have them.
The results table's mean and std describe the seeds; these intervals say how far the mean of
so few seeds may be from the configuration's."""

from __future__ import annotations

import pandas as pd

from haepo_ray.report.aggregate import Group
from haepo_ray.report.interval_cells import CI
from haepo_ray.report.kinds import RL
from haepo_ray.report.runs import method_name
from haepo_ray.report.stats import mean_ci

RL_TITLE = (
    f"RL, per configuration: mean [{CI}] over seeds (Student-t: mean +- t s / sqrt(n) over the seeds' values; "
    "one seed has no interval). final: a trial's last value; AUC: the area under its curve by the trapezoid rule "
    "over its training iterations, divided by their span (the curve's mean height). Return: RLlib's mean episode "
    "return of an iteration; evaluation return: that of its evaluation runs, where the config evaluates")


def rl_table(groups: list[Group]) -> pd.DataFrame:
    """One row per RL group: experiment, environment, method (algorithm and configuration),
    seeds, and an :class:`~haepo_ray.report.stats.Interval` per column of ``RL.intervals``
    that some group has values of; empty without RL groups."""
    rows = [{"experiment": g.experiment, "env": g.env_label, "method": method_name(g.algorithm, g.config_label),
             "seeds": len(g.trials),
             **{column: mean_ci(g.per_trial(metric, how)) for column, metric, how in RL.intervals}}
            for g in groups if g.kind is RL]
    table = pd.DataFrame(rows)
    empty = [column for column, _, _ in RL.intervals if column in table and not any(v.n for v in table[column])]
    return table.drop(columns=empty)
