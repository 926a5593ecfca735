"""Metric histories of many runs, read in batches rather than one request per run and metric.

:func:`read_histories` picks the store's batched reader by its tracking URI:

- a SQL store (``sqlite:///``, ``postgresql://``, ``mysql://``, ``mssql://``): its ``metrics``
  table, :data:`SQL_RUNS` runs per query, through the client's own SQLAlchemy store;
- an ``mlflow server`` (``http(s)://``): its bulk endpoint (:data:`BULK_ENDPOINT`), one metric
  of up to :data:`HTTP_RUNS` runs per request; a response holds at most
  :data:`HTTP_VALUES` values of all its runs together and says nothing when it was cut off,
  so a full one is taken as cut off and its last run asked again;
- any other store (a file store, Databricks): ``get_metric_history`` per run and metric.

Each orders a run's values as ``MlflowClient.get_metric_history`` does (timestamp, step,
value), so that a step logged twice keeps its last value in every reader.
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
# mlflow.server.handlers.get_metric_history_bulk_handler: at most 100 run ids per request and
# 25,000 values per response (its max_results caps the values of all the runs, not of each).
BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
HTTP_RUNS = 100
HTTP_VALUES = 25_000


def read_histories(client, wanted: Mapping[str, Sequence[str]]) -> Histories:
    """The histories of ``wanted`` (run id -> metric keys) from ``client``'s store; a run or key
    without values may be missing."""
    from mlflow.store.db.db_types import DATABASE_ENGINES

    scheme = urlparse(client.tracking_uri).scheme
    if scheme.split("+", 1)[0] in DATABASE_ENGINES:
        return sql_histories(client, wanted)
    if scheme in ("http", "https"):
        return http_histories(client, wanted)
    return per_run_histories(client, wanted)


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
    from mlflow.store.tracking.dbmodels.models import SqlMetric

    store, out = mlflow_internals.store(client), defaultdict(dict)
    run_ids = list(wanted)
    for start in range(0, len(run_ids), SQL_RUNS):
        chunk = run_ids[start:start + SQL_RUNS]
        keys = sorted({key for run_id in chunk for key in wanted[run_id]})
        if not keys:
            continue
        with store.ManagedSessionMaker() as session:
            rows = (session.query(SqlMetric.run_uuid, SqlMetric.key, SqlMetric.step, SqlMetric.value,
                                  SqlMetric.is_nan)
                    .filter(SqlMetric.run_uuid.in_(chunk), SqlMetric.key.in_(keys))
                    .order_by(SqlMetric.run_uuid, SqlMetric.key, SqlMetric.timestamp, SqlMetric.step,
                              SqlMetric.value)
                    .all())
        for run_id, key, step, value, is_nan in rows:
            out[run_id].setdefault(key, {})[step] = math.nan if is_nan else value
    return dict(out)


def http_histories(client, wanted: Mapping[str, Sequence[str]]) -> Histories:
    """Per metric key, one bulk request per :data:`HTTP_RUNS` runs that logged it; a run whose
    values of one key alone fill a response is read with ``get_metric_history``."""
    creds, out = mlflow_internals.store(client).get_host_creds(), defaultdict(dict)
    runs_of: dict[str, list[str]] = defaultdict(list)
    for run_id, keys in wanted.items():
        for key in keys:
            runs_of[key].append(run_id)
    for key, pending in runs_of.items():
        while pending:
            chunk = pending[:HTTP_RUNS]
            rows = _bulk(creds, chunk, key)
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


def _bulk(creds, run_ids: list[str], key: str) -> list[dict]:
    """The values of ``key`` of ``run_ids`` (ordered by run, timestamp, step, value), as the
    bulk endpoint gives them: at most :data:`HTTP_VALUES` of them, the first ones."""
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    response = http_request(creds, BULK_ENDPOINT, "GET",
                            params={"run_id": run_ids, "metric_key": key, "max_results": HTTP_VALUES})
    return verify_rest_response(response, BULK_ENDPOINT).json().get("metrics", [])
