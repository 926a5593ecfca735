"""The trial runs of an experiment as plain records: id, status, tags, params and the keys of
the metrics each logged, without MLflow's run entities where the store allows it.

:func:`trial_runs` picks the reader by the tracking URI (:func:`~haepo_ray.report.histories.store_kind`):

- a SQL store: its ``runs``, ``tags``, ``params`` and ``latest_metrics`` tables as plain rows
  (:func:`~haepo_ray.upstream.mlflow.sql_trial_runs`);
- an ``mlflow server`` (with the server's ``--static-prefix`` where it has one): its REST
  ``runs/search``, :data:`PAGE` runs per request, its JSON read as it is
  (:func:`~haepo_ray.upstream.mlflow.search_runs_page`);
- any other store: ``MlflowClient.search_runs``.

Each gives the runs ``search_runs`` gives, in its order (latest start first, then by id), the
first two with each metric's latest step and value too:
10,000 runs of a sweep are read in seconds, where ``search_runs`` took a minute
(:mod:`haepo_ray.upstream.mlflow` says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from haepo_ray.report.histories import store_kind
from haepo_ray.tracking import search_all_runs
from haepo_ray.upstream import mlflow as mlflow_internals

# Runs per search request to an mlflow server (its largest page is 50,000).
PAGE = 1000


@dataclass
class RunRecord:
    """What the report reads of a run."""

    run_id: str
    status: str  # FINISHED, FAILED, KILLED, RUNNING, SCHEDULED
    tags: dict[str, str]
    params: dict[str, str]
    metrics: list[str]  # the keys of the metrics it logged
    # key -> (step, value) of its latest value (MLflow's: the highest step's, of them the latest
    # logged, of those the largest), where the reader gets it (not from MlflowClient.search_runs)
    latest: dict[str, tuple[int, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, run) -> RunRecord:
        """The record of an MLflow ``Run`` entity (without latest steps: the entity has none public)."""
        return cls(run.info.run_id, run.info.status, dict(run.data.tags), dict(run.data.params),
                   list(run.data.metrics))


def trial_runs(client, experiment_id: str, tag: str, value: str) -> list[RunRecord]:
    """The active runs of ``experiment_id`` whose tag ``tag`` is ``value``."""
    kind = store_kind(client.tracking_uri)
    if kind == "sql":
        return _sql_runs(client, experiment_id, tag, value)
    filter_string = f"tags.`{tag}` = '{value}'"
    if kind == "http":
        return _http_runs(client, experiment_id, filter_string)
    return [RunRecord.of(run) for run in search_all_runs(client, experiment_id, filter_string)]


def _sql_runs(client, experiment_id: str, tag: str, value: str) -> list[RunRecord]:
    runs, tags, params, metrics = mlflow_internals.sql_trial_runs(client, experiment_id, tag, value)
    records = {run_id: RunRecord(run_id, status, {}, {}, []) for run_id, status in runs}
    for rows, field in ((tags, "tags"), (params, "params")):
        for run_id, key, text in rows:
            getattr(records[run_id], field)[key] = text
    for run_id, key, step, number, is_nan in metrics:
        records[run_id].metrics.append(key)
        records[run_id].latest[key] = (step, math.nan if is_nan else number)
    return list(records.values())


def _http_runs(client, experiment_id: str, filter_string: str) -> list[RunRecord]:
    records, token = [], None
    while True:
        page = mlflow_internals.search_runs_page(client, experiment_id, filter_string, PAGE, token)
        records += [_record(run) for run in page.get("runs", [])]
        token = page.get("next_page_token")
        if not token:
            return records


def _record(run: dict) -> RunRecord:
    """The record of a run in the REST API's JSON (which leaves out empty strings and zeros,
    writes an int64 as a string and NaN as ``"NaN"``)."""
    data = run.get("data", {})
    metrics = data.get("metrics", [])
    return RunRecord(run["info"]["run_id"], run["info"]["status"],
                     {t["key"]: t.get("value", "") for t in data.get("tags", [])},
                     {p["key"]: p.get("value", "") for p in data.get("params", [])},
                     [m["key"] for m in metrics],
                     {m["key"]: (int(m.get("step", 0)), float(m.get("value", 0.0))) for m in metrics})
