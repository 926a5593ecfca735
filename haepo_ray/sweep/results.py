"""What a finished sweep hands back: one :class:`TrialSummary` per trial, the best trial by
the one rule of :func:`haepo_ray.tracking.best` (which the MLflow parent run records too),
the printed summary and ``haepo_summary.json``."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune import Callback

from haepo_ray.sweep.metric_watch import missing_metric
from haepo_ray.sweep.plan_base import Plan
from haepo_ray.tables import format_table
from haepo_ray.tracking import best, metric_value, rank
from haepo_ray.uris import is_http_url, is_uri

logger = logging.getLogger(__name__)


INTERRUPTED = "INTERRUPTED"  # a trial that was running when the sweep was interrupted


@dataclass
class TrialSummary:
    trial_id: str
    name: str
    status: str
    iterations: int
    value: float | None
    values: dict[str, Any]
    run_id: str | None
    num_failures: int = 0
    error: str | None = None


@dataclass
class SweepResult:
    run_dir: str
    experiment: str
    tracking_uri: str | None
    parent_run_id: str | None
    metric: str
    mode: str
    experiment_id: str | None = None
    trials: list[TrialSummary] = field(default_factory=list)
    not_logged: list = field(default_factory=list)
    result_grid: Any = None
    interrupted_by: str | None = None  # the signal's name (SIGINT, SIGTERM, SIGUSR1); None: not interrupted
    missing_metric: str | None = None  # no trial reported the metric: what to say (metric_watch)

    @property
    def interrupted(self) -> bool:
        """Ctrl-C or SIGTERM: Tune saved its state, and --resume continues the sweep."""
        return self.interrupted_by is not None

    @property
    def best(self) -> TrialSummary | None:
        return best(self.trials, lambda t: t.value, self.mode)

    def ranked(self) -> list[TrialSummary]:
        """Best first (the rule MLflow's parent run records), then trials without a value."""
        return rank(self.trials, lambda t: t.value, self.mode)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "experiment": self.experiment, "tracking_uri": self.tracking_uri,
            "parent_run_id": self.parent_run_id, "metric": self.metric, "mode": self.mode,
            "interrupted": self.interrupted, "interrupted_by": self.interrupted_by,
            "missing_metric": self.missing_metric,
            "best_trial_id": self.best.trial_id if self.best else None,
            "trials": [t.__dict__ for t in self.ranked()],
        }


class TrialRecorder(Callback):
    """A Tune callback that keeps Tune's trials as the experiment ends (status, last result,
    failures, error file): what the summary needs and ``ResultGrid`` does not expose."""

    def __init__(self) -> None:
        self.trials: list = []

    def on_experiment_end(self, trials, **info) -> None:
        self.trials = list(trials)


def _error_line(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        lines = Path(path).read_text(errors="replace").strip().splitlines()
        return (lines[-1] if lines else "error")[:300]
    return "error"


def summarize(plan: Plan, trials: list, grid, callback, run_dir: str, experiment: str,
              at_interrupt: Mapping[str, str] | None = None, interrupted_by: str | None = None) -> SweepResult:
    """One :class:`TrialSummary` per Tune trial (in creation order). ``at_interrupt``: the
    trials' statuses when the sweep was interrupted by the signal ``interrupted_by``
    (:mod:`haepo_ray.sweep.interrupt`); a trial running then is ``INTERRUPTED`` (Tune marks it
    TERMINATED as it stops it)."""
    spec = plan.spec
    result = SweepResult(
        run_dir=run_dir, experiment=experiment,
        tracking_uri=callback.tracking_uri if callback else None,
        parent_run_id=callback.parent_run_id if callback else None,
        experiment_id=callback.experiment_id if callback else None,
        metric=spec.metric, mode=spec.mode, result_grid=grid,
        not_logged=list(callback.not_logged) if callback else [],
        interrupted_by=interrupted_by,
    )
    for trial in trials:
        last = trial.last_result or {}
        status = trial.status
        if at_interrupt is not None:
            status = at_interrupt.get(trial.trial_id, status)
            status = INTERRUPTED if status == "RUNNING" else status
        result.trials.append(TrialSummary(
            trial_id=trial.trial_id,
            name=str(trial),
            status=status,
            iterations=int(last.get(plan.step_key, 0) or 0),
            value=metric_value(last, spec.metric),
            values=plan.search_values(trial.config or {}),
            run_id=callback.run_id_of(trial.trial_id) if callback else None,
            num_failures=int(getattr(trial, "num_failures", 0) or 0),
            error=_error_line(trial) if trial.status == "ERROR" else None,
        ))
    if all(t.value is None for t in result.trials):  # the values are the trials' last results' metric
        result.missing_metric = missing_metric(spec.metric, plan.step_key, [trial.last_result for trial in trials])
    return result


def format_summary(result: SweepResult, top: int = 10) -> str:
    if result.interrupted:
        finished = sum(t.status == "TERMINATED" for t in result.trials)
        stopped = sum(t.status == INTERRUPTED for t in result.trials)
        lines = [f"sweep interrupted ({result.interrupted_by}): {finished} trials finished, {stopped} stopped "
                 f"while running; results in {result.run_dir}",
                 "Tune saved its state: the same command with --resume continues the sweep (a stopped trial "
                 "from its last checkpoint)"]
    else:
        lines = [f"sweep finished: {len(result.trials)} trials, results in {result.run_dir}"]
    if result.parent_run_id:
        lines.append(f"MLflow: {result.tracking_uri}  experiment {result.experiment!r}  "
                     f"parent run {result.parent_run_id}")
    elif result.tracking_uri:
        lines.append(f"MLflow at {result.tracking_uri} was not reached: nothing was logged. Once it answers, "
                     f"run this sweep again with --resume: every trial's results reach it, each step once.")
    ranked = result.ranked()[:top]
    value_names = sorted({k for t in ranked for k in t.values})
    rows = [[i + 1, t.trial_id, t.status, t.iterations, t.value if t.value is not None else "-"]
            + [t.values.get(n) for n in value_names] + [t.run_id or "-"] for i, t in enumerate(ranked)]
    lines.append(f"best trials by {result.metric} ({result.mode}, last reported value):")
    lines.append(format_table(["rank", "trial", "status", "iter", result.metric] + value_names
                              + ["mlflow run"], rows))
    for t in result.trials:
        if t.error:
            lines.append(f"trial {t.trial_id} failed: {t.error}")
    if result.missing_metric:
        lines.append(f"warning: {result.missing_metric}")
    if result.parent_run_id:
        lines.append(next_steps(result))
    return "\n".join(lines)


def next_steps(result: SweepResult) -> str:
    """How to look at the sweep: the MLflow UI with the direct link to the experiment's runs
    (MLflow 3 opens an experiment in its GenAI view, which shows "No data" for training runs;
    the link opens the runs table), and the report."""
    uri = result.tracking_uri or ""
    runs = f"/#/experiments/{result.experiment_id}/runs"
    if is_http_url(uri):
        view = f"open {uri.rstrip('/')}{runs}"
    else:
        view = f"mlflow ui --backend-store-uri {uri}, then open http://127.0.0.1:5000{runs}"
    return f"next: {view}\n      haepo report --experiment {result.experiment} --tracking-uri {uri}"


def write_summary(run_dir: str, result: SweepResult) -> None:
    """``haepo_summary.json`` in a local sweep folder."""
    if is_uri(run_dir):
        return
    try:
        (Path(run_dir) / "haepo_summary.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    except OSError as err:  # pragma: no cover
        logger.warning("cannot write the sweep summary: %s", err)
