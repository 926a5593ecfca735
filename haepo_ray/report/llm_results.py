"""Language-model results with their uncertainty: per method, mean and 95% confidence interval
over seeds and held-out prompts (:mod:`~haepo_ray.report.stats`), and pairwise win rates on
the held-out prompts.

A *method* is a group of :mod:`~haepo_ray.report.aggregate`: an algorithm with one
configuration (HAEPO with ``length_normalize=True`` is a method of its own), its trials the
seeds. :func:`methods_table` gives each method's columns of :attr:`Kind.intervals
<haepo_ray.report.kinds.Kind.intervals>` (:data:`~haepo_ray.report.kinds.LLM`): the held-out
reward, ROUGE-L and semantic similarity at the last evaluation and their AUC, the KL to the
reference, HAEPO's effective number of trajectories. :func:`win_rates` compares two methods of
one model and data set on each seed both ran: the share of held-out prompts on which the first
one's greedy completion at its last evaluation scores higher than the other's
(:data:`~haepo_ray.report.generations.JUDGES`), ties half; then the mean over those seeds.

The intervals count both sources of chance, seeds and prompts
(:func:`~haepo_ray.report.stats.bootstrap_ci`): a method's per-prompt values of each seed
(:mod:`~haepo_ray.report.generations`: a win or loss per prompt, a metric's value per prompt
at the last evaluation or its area over the evaluations) are resampled by seed and, within the
drawn seeds, by prompt, one draw of prompts for all of them (the same prompts in every seed);
HAEPO's n_eff, a training metric with no prompts of its own, by seed and by the last
:data:`~haepo_ray.report.kinds.TAIL_STEPS` updates within each. Each interval is cut to its
quantity's range (:data:`PER_PROMPT`; win rates [0, 1], n_eff [1, group size]). Where a
trial has no per-prompt value of a metric (no generations, or written before that key), that
column of its method falls back to the Student-t over seed means
(:func:`~haepo_ray.report.stats.mean_ci`), marked ``(seed t)``.

Tables hold :class:`~haepo_ray.report.stats.Interval` cells (:mod:`~haepo_ray.report.interval_cells`
writes them for the CSVs and the pages).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from haepo_ray import names
from haepo_ray.report.aggregate import Group
from haepo_ray.report.generations import JUDGES, auc_key
from haepo_ray.report.kinds import (
    AUC, EXACT_KL, GREEDY_REWARD, GREEDY_ROUGE_2, GREEDY_ROUGE_L, GREEDY_SEMANTIC_SIMILARITY, LAST, LLM, TAIL,
    TAIL_STEPS)
from haepo_ray.report.runs import method_name
from haepo_ray.report.interval_cells import CI, texts
from haepo_ray.report.stats import Interval, bootstrap_ci, mean_ci, wins

UNBOUNDED = (-math.inf, math.inf)
# The held-out metrics (MLflow keys) with a value per prompt in generations.jsonl: their record
# key there and their range.
PER_PROMPT = {GREEDY_REWARD: ("reward", UNBOUNDED), GREEDY_ROUGE_L: (names.LLM_ROUGE_L, (0.0, 1.0)),
              GREEDY_ROUGE_2: (names.LLM_ROUGE_2, (0.0, 1.0)),
              GREEDY_SEMANTIC_SIMILARITY: (names.LLM_SEMANTIC_SIMILARITY, (-1.0, 1.0)),
              EXACT_KL: (names.LLM_EXACT_KL, (0.0, math.inf))}
METHODS_TITLE = (
    f"Language models, held-out results per method: mean [{CI}] over seeds and held-out prompts (a bootstrap "
    "resampling the seeds and, within them, the prompts; n_eff the seeds and their last updates; cut to each "
    "quantity's range; one seed has no interval; marked (seed t): Student-t over seed means, where a trial has "
    "no per-prompt values). final: the last evaluation; AUC: the area under the evaluation "
    "curve by the trapezoid rule over the evaluated updates, divided by the span from the first to the last "
    "of them (the curve's mean height; empty with one evaluation). Reward, ROUGE-L, ROUGE-2 and semantic similarity "
    "of the greedy completions; KL: the exact KL to the reference (summed over the vocabulary at each position) "
    "of the policy's own samples (temperature 1, EOS allowed), per prompt the mean over its samples; n_eff: "
    "HAEPO's effective number of trajectories per prompt group, 1 / sum w^2, of its training updates, the "
    f"mean of a trial's last {TAIL_STEPS}")


def method_label(g: Group) -> str:
    """``HAEPO`` or, for a configuration, ``HAEPO (length_normalize=True)``
    (:func:`~haepo_ray.report.runs.method_name`)."""
    return method_name(g.algorithm, g.config_label)


def methods_table(groups: list[Group]) -> pd.DataFrame:
    """One row per language-model group: what ran, seeds, and an :class:`Interval` per column
    of :attr:`LLM.intervals <haepo_ray.report.kinds.Kind.intervals>` (:func:`interval`); empty
    without such groups."""
    rows = [{"experiment": g.experiment, **g.trials[0].subject, "method": method_label(g), "seeds": len(g.trials),
             **{column: interval(g, metric, how) for column, metric, how in LLM.intervals}}
            for g in groups if g.kind is LLM]
    return pd.DataFrame(rows)


def interval(g: Group, metric: str, how: str) -> Interval:
    """The mean over ``g``'s seeds of ``metric`` reduced by ``how`` and its interval: the bootstrap
    over seeds and prompts of the per-prompt values (:data:`PER_PROMPT`, last evaluation or
    AUC), over seeds and last updates of n_eff (TAIL), else the Student-t over seeds."""
    if metric in PER_PROMPT and how in (LAST, AUC):
        key, bounds = PER_PROMPT[metric]
        key = key if how == LAST else auc_key(key)
        valued = g.per_trial(metric, how)
        if all(any(key in s for s in t.scores.values()) for t, v in zip(g.trials, valued) if not np.isnan(v)):
            prompts = sorted({p for t in g.trials for p in t.scores})
            rows = [[t.scores.get(p, {}).get(key, math.nan) for p in prompts] for t in g.trials]
            return bootstrap_ci(rows, bounds=bounds)
    if metric == names.LLM_EFFECTIVE_NUM_TRAJECTORIES and how == TAIL:
        tails = [_tail(t.curves, metric) for t in g.trials]
        width = max(map(len, tails), default=0)
        rows = [np.pad(tail, (0, width - len(tail)), constant_values=np.nan) for tail in tails]
        return bootstrap_ci(rows, shared_units=False, bounds=(1.0, _group_size(g)))
    return mean_ci(g.per_trial(metric, how))


def _tail(curves: pd.DataFrame, metric: str) -> np.ndarray:
    """A trial's last :data:`TAIL_STEPS` values of ``metric`` (fewer where it has fewer)."""
    values = curves[metric].dropna().to_numpy(float) if metric in curves else np.empty(0)
    return values[-TAIL_STEPS:]


def _group_size(g: Group) -> float:
    """The completions per prompt of the group's trials (param ``group_size``); inf where unknown."""
    sizes = {t.params.get("group_size") for t in g.trials}
    try:
        return float(sizes.pop()) if len(sizes) == 1 else math.inf
    except (TypeError, ValueError):
        return math.inf


def pairwise(ours: Group, theirs: Group, judge: str) -> Interval:
    """``ours``'s win rate against ``theirs`` by the record key ``judge``, over the seeds both
    have scores for and the prompts both scored in all of them (:func:`~haepo_ray.report.stats.wins`):
    the mean over seeds of a seed's win rate, and the bootstrap interval over seeds and prompts,
    cut to [0, 1]."""
    other = {str(t.seed): t.scores for t in theirs.trials if t.scores}
    pairs = [(trial.scores, other[str(trial.seed)]) for trial in ours.trials
             if trial.scores and str(trial.seed) in other]
    prompts = sorted({p for a, b in pairs for p in a.keys() & b.keys()})
    rows = [wins([a.get(p, {}).get(judge, math.nan) for p in prompts], [b.get(p, {}).get(judge, math.nan)
                                                                       for p in prompts]) for a, b in pairs]
    return bootstrap_ci(rows, bounds=(0.0, 1.0))


def llm_sections(groups: list[Group]) -> dict[str, list[Group]]:
    """The language-model groups by section (model and data set), in section order."""
    out: dict[str, list[Group]] = {}
    for g in groups:
        if g.kind is LLM:
            out.setdefault(g.section, []).append(g)
    return dict(sorted(out.items()))


def section_labels(members: list[Group]) -> dict[int, str]:
    """``id(group)`` -> its method's name in a section's tables (:func:`method_label`), prefixed
    by its experiment where the section holds several."""
    several = len({g.experiment for g in members}) > 1
    return {id(g): f"{g.experiment}: {method_label(g)}" if several else method_label(g) for g in members}


def win_rates(groups: list[Group]) -> pd.DataFrame:
    """Per model and data set, judge and ordered pair of its language-model methods with a
    seed in common: the first's win rate against the second (:func:`pairwise`), in column
    ``win rate``. Methods are named by :func:`method_label`, prefixed by their experiment
    where a model and data set have several."""
    rows = []
    for members in llm_sections(groups).values():
        label = section_labels(members)
        for judge, key in JUDGES.items():
            for ours in members:
                for theirs in (g for g in members if g is not ours):
                    rate = pairwise(ours, theirs, key)
                    if rate.n:
                        rows.append({**ours.trials[0].subject, "judge": judge, "method": label[id(ours)],
                                     "opponent": label[id(theirs)], "win rate": rate})
    return pd.DataFrame(rows)


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
                 f"and training seed, at their last evaluations (ties half); mean [{CI}] over seeds and "
                 "prompts (a bootstrap resampling the seeds and, within them, the prompts)")
        out.append((title, matrix.reset_index().rename_axis(columns=None)))
    return out
