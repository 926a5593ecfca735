"""The SFT start as a method of its own: what RL added is each method against it.

Every trial of a language-model sweep begins RL from the SFT start of its seed
(:mod:`haepo_ray.llm.sft_start`) and, with ``eval_start``, logs that start's held-out evaluation
(``eval_start/<mode>/<metric>`` in its first update's row; its greedy completions as update 0 of
``generations.jsonl``). :func:`start_groups` makes of these one group per experiment and model
and data set, algorithm :data:`SFT_START`, with **one trial per seed**: the trials of a seed share
one start and one evaluation of it (a shared start is evaluated once, by the trial that made it,
and the others take that evaluation), so they hold copies of one measurement, and counting each
copy would count a seed several times and narrow its intervals. A seed's copy is that of its
first trial (by algorithm, configuration and run id).

A start's trial has the held-out metrics under the usual ``eval/<mode>/<metric>`` keys, the
same value at update 0 and at its source trial's last update (it is not trained: a level line in
the figures, its final value and AUC that value), its source's ``train_time_s`` span, and the
per-prompt scores of the update-0 evaluation (the win rates against it, the bootstrap over
prompts; each prompt's AUC its value).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from haepo_ray import names
from haepo_ray.report.aggregate import SFT_START, Group
from haepo_ray.report.generations import auc_key
from haepo_ray.report.kinds import LLM
from haepo_ray.report.runs import Trial

__all__ = ["SFT_START", "START_KEYS", "start_groups"]

# the start's key -> the key of the same metric at an evaluation after RL updates
START_KEYS = dict(zip(names.llm_eval_keys(names.LLM_EVAL_START), names.llm_eval_keys(), strict=True))


def _start_trial(source: Trial) -> Trial | None:
    """The SFT start of ``source``'s seed as a trial, from ``source``'s ``eval_start`` values;
    None where it has none."""
    curves = source.curves
    values = {START_KEYS[k]: float(curves[k].dropna().iloc[0]) for k in START_KEYS
              if k in curves and curves[k].notna().any()}
    if not values:
        return None
    last = float(curves.index.max())
    frame = pd.DataFrame({k: [v, v] for k, v in values.items()}, index=pd.Index([0.0, last], name=names.LLM_UPDATE))
    if names.LLM_TRAIN_TIME in curves and curves[names.LLM_TRAIN_TIME].notna().any():
        seconds = curves[names.LLM_TRAIN_TIME].dropna()
        frame[names.LLM_TRAIN_TIME] = [float(seconds.iloc[0]), float(seconds.iloc[-1])]
    scores = {prompt: {**row, **{auc_key(k): v for k, v in row.items() if auc_key(k) in row}}
              for prompt, row in source.start_scores.items()}  # a level line's area: its value
    return dataclasses.replace(source, run_id=f"{source.run_id}:{names.LLM_EVAL_START}", algorithm=SFT_START,
                               config={}, curves=frame, scores=scores, start_scores={})


def start_groups(groups: list[Group]) -> list[Group]:
    """One :data:`SFT_START` group per experiment and language-model section whose trials
    evaluated their start: one trial per seed (module docstring)."""
    chosen: dict[tuple[str, str], dict[str, Trial]] = {}
    for g in sorted((g for g in groups if g.kind is LLM and g.algorithm != SFT_START),
                    key=lambda g: (g.experiment, g.algorithm, g.config_label)):
        for trial in sorted(g.trials, key=lambda t: t.run_id):
            seeds = chosen.setdefault((g.experiment, g.section), {})
            if str(trial.seed) not in seeds and (start := _start_trial(trial)) is not None:
                seeds[str(trial.seed)] = start
    return [Group(experiment, SFT_START, "default", [seeds[s] for s in sorted(seeds, key=_seed_order)])
            for (experiment, _), seeds in sorted(chosen.items()) if seeds]


def _seed_order(seed: str) -> tuple[float, str]:
    try:
        return float(seed), seed
    except ValueError:
        return np.inf, seed
