"""A sweep metric that no trial reports, said as soon as a trial ends without it; so is a glob of
``tracking.metrics`` that no result has matched.

Tune's schedulers and searchers, and the summary's best trial, rank trials by the spec's
``metric``. A result without it does not stop a sweep: the RL trainable carries a missing
metric forward, NaN until its first value (RLlib reports episode metrics only once an episode
has ended). So a misspelt metric ran a whole sweep unranked and without a word: ASHA stopped
nothing, and every value in the summary was "-". :class:`MetricWatch` warns when the first
trial ends without having reported the metric and no other trial has, naming the result keys
closest to it (:func:`missing_metric`); the summary says it again. A mistyped glob of
``tracking.metrics`` (``env_runner/*``) logged nothing to MLflow without a word: when a trial
ends, each glob that no result so far has a value for is said once, with the keys closest to it.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ray.tune import Callback

from haepo_ray.tracking import metric_value, select_metrics
from haepo_ray.tracking.schema import flatten

__all__ = ["MetricWatch", "missing_metric", "unlogged_glob"]

logger = logging.getLogger(__name__)


def missing_metric(metric: str, step_key: str, results: Iterable[Mapping[str, Any] | None]) -> str | None:
    """What to say when none of ``results`` (trials' last results) holds a value of
    ``metric``; None when one does, or when no trial reported a step (``step_key``): a trial
    that failed at start, or has not reported yet, has no keys to go by."""
    reported = [flat for flat in (flatten(r) for r in results if r) if metric_value(flat, step_key) is not None]
    if not reported or any(metric_value(flat, metric) is not None for flat in reported):
        return None
    return (f"no trial has reported the sweep's metric {metric!r} ({_closest(metric, reported)}): schedulers, "
            "searchers and the best trial rank trials by it; fix `metric` in the spec")


def unlogged_glob(glob: str, result: Mapping[str, Any]) -> str:
    """What to say of a ``tracking.metrics`` glob that no result has matched, ``result`` (a
    trial's last) giving the keys closest to it."""
    return (f"no result so far has a value that tracking.metrics {glob!r} selects "
            f"({_closest(glob, [flatten(result)])}): MLflow logs nothing for it; fix tracking.metrics in the spec")


def _closest(name: str, flat_results: Iterable[Mapping[str, Any]]) -> str:
    """``did you mean`` the result keys closest to ``name``, or how many there are."""
    keys = sorted({key for flat in flat_results for key, value in flat.items()
                   if not key.startswith("config/") and key != name and isinstance(value, (int, float))})
    closest = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(closest)}?" if closest else f"none of the {len(keys)} result keys is close"


class MetricWatch(Callback):
    """Warns (once) when a trial ends and no result so far has reported ``metric``
    (``step_key``: what counts a trial's steps, :attr:`~haepo_ray.sweep.plan_base.Plan.step_key`),
    and once for each of the ``globs`` MLflow logs (``tracking.metrics``) that none has matched."""

    def __init__(self, metric: str, step_key: str, globs: Iterable[str] = ()) -> None:
        self.metric, self.step_key, self.globs = metric, step_key, tuple(globs)
        self.reported = False
        self.warning: str | None = None
        self.unmatched = list(self.globs)  # no result has had a value they select

    def __reduce__(self):
        # Tune pickles its callbacks into tuner.pkl: a new watch, never this run's state.
        return type(self), (self.metric, self.step_key, self.globs)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.reported = self.reported or metric_value(result, self.metric) is not None
        self.unmatched = [glob for glob in self.unmatched if not select_metrics(result, [glob])]

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        if self.unmatched and metric_value(trial.last_result, self.step_key) is not None:
            for glob in self.unmatched:
                logger.warning("%s (trial %s ended)", unlogged_glob(glob, trial.last_result), trial.trial_id)
            self.unmatched = []
        if self.reported or self.warning is not None:
            return
        self.warning = missing_metric(self.metric, self.step_key, [trial.last_result])
        if self.warning:
            logger.warning("%s (trial %s ended without it)", self.warning, trial.trial_id)
