"""Metric histories of many runs, read in batches rather than one request per run and metric.

:func:`read_histories` picks the store's batched reader by its tracking URI (:func:`store_kind`):

- a SQL store (``sqlite:///``, ``postgresql://``, ``mysql://``, ``mssql://``): its ``metrics``
  table, :data:`SQL_RUNS` runs per query, through the client's own SQLAlchemy store;
- an ``mlflow server`` (``http(s)://``, with the server's ``--static-prefix`` where it has one):
  its bulk endpoint (:data:`~haepo_ray.upstream.mlflow.BULK_ENDPOINT`), one metric of up to
  :data:`HTTP_RUNS` runs per request; a response holds at most
  :data:`HTTP_VALUES` values of all its runs together and says nothing when it was cut off,
  so a full one is taken as cut off and its last run asked again;
- any other store (a file store, Databricks): ``get_metric_history`` per run and metric.

Each orders a run's values as ``MlflowClient.get_metric_history`` does (timestamp, step,
value), so that a step logged twice keeps its last value in every reader. MLflow has no public
batched reader: the first two read as MLflow's stores and UI do, through
:mod:`haepo_ray.upstream.mlflow`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlparse

from haepo_ray.upstream import mlflow as mlflow_internals

History = dict[int, float]  # step -> value
Histories = dict[str, dict[str, History]]  # run id -> metric key -> its history

SQL_RUNS = 500
# The bulk endpoint's caps (haepo_ray.upstream.mlflow.BULK_ENDPOINT): run ids per request, values
# per response.
HTTP_RUNS = 100
HTTP_VALUES = 25_000


def store_kind(tracking_uri: str) -> str:
    """``"sql"`` (a SQL store), ``"http"`` (an ``mlflow server``) or ``"client"`` (any other)."""
    if mlflow_internals.is_sql_store(tracking_uri):
        return "sql"
    return "http" if urlparse(tracking_uri).scheme in ("http", "https") else "client"


def read_histories(client, wanted: Mapping[str, Sequence[str]]) -> Histories:
    """The histories of ``wanted`` (run id -> metric keys) from ``client``'s store; a run or key
    without values may be missing."""
    readers = {"sql": sql_histories, "http": http_histories, "client": per_run_histories}
    return readers[store_kind(client.tracking_uri)](client, wanted)


def history(steps: Iterable[tuple[int, float]]) -> History:
    """Step -> value of ``(step, value)`` pairs in the store's order: a step logged twice
    keeps its last value."""
    return dict(steps)


def per_run_histories(client, wanted: Mapping[str, Sequence[str]]) -> Histories:
    """One ``get_metric_history`` request per run and metric."""
    return {run_id: {key: history((m.step, m.value) for m in client.get_metric_history(run_id, key))
                     for key in keys} for run_id, keys in wanted.items()}


def sql_histories(client, wanted: Mapping[str, Sequence[str]]) -> Histories:
    """One query of the ``metrics`` table per :data:`SQL_RUNS` runs."""
    out = defaultdict(dict)
    run_ids = list(wanted)
    for start in range(0, len(run_ids), SQL_RUNS):
        chunk = run_ids[start:start + SQL_RUNS]
        keys = sorted({key for run_id in chunk for key in wanted[run_id]})
        if not keys:
            continue
        rows = mlflow_internals.sql_metric_rows(client, chunk, keys)
        for run_id, key, step, value, is_nan in rows:
            out[run_id].setdefault(key, {})[step] = math.nan if is_nan else value
    return dict(out)


def http_histories(client, wanted: Mapping[str, Sequence[str]]) -> Histories:
    """Per metric key, one bulk request per :data:`HTTP_RUNS` runs that logged it; a run whose
    values of one key alone fill a response is read with ``get_metric_history``."""
    out = defaultdict(dict)
    runs_of: dict[str, list[str]] = defaultdict(list)
    for run_id, keys in wanted.items():
        for key in keys:
            runs_of[key].append(run_id)
    for key, pending in runs_of.items():
        while pending:
            chunk = pending[:HTTP_RUNS]
            rows = mlflow_internals.bulk_history(client, chunk, key, HTTP_VALUES)
            complete = _complete(chunk, rows)
            for row in rows:
                if row["run_id"] in complete:
                    out[row["run_id"]].setdefault(key, {})[row["step"]] = float(row["value"])
            if not complete:  # one run's values of the key fill a response alone
                run_id = rows[-1]["run_id"]
                out[run_id].update(per_run_histories(client, {run_id: [key]})[run_id])
                complete = {run_id}
            pending = [run_id for run_id in chunk if run_id not in complete] + pending[HTTP_RUNS:]
    return dict(out)


def _complete(chunk: list[str], rows: list[dict]) -> set[str]:
    """The runs of ``chunk`` whose every value a bulk response holds: all of them unless the
    response is full; else those before its last run (it orders its values by run)."""
    if len(rows) < HTTP_VALUES:
        return set(chunk)
    return {row["run_id"] for row in rows} - {rows[-1]["run_id"]}
