"""Every private name of MLflow that haepo-ray uses, each in one place with its reason.

MLflow 3.17's ``MlflowClient`` has no public accessor for its tracking store, and its public
``set_terminated`` first fetches the whole run to print a "View run" link: a request per trial
that a sweep of thousands of trials pays for nothing.

MLflow has no public way to read the metric histories of many runs at once, which the report
needs (:mod:`haepo_ray.report.histories`: a request per run and metric took minutes at a few
thousand trials), so it reads them as MLflow's own stores and UI do:

- a SQL store: the ``metrics`` table (``SqlMetric``, MLflow's table model) through the store's
  sessions (``SqlAlchemyStore.ManagedSessionMaker``) (:func:`sql_metric_rows`); which tracking
  URIs are SQL stores: ``mlflow.store.db.db_types.DATABASE_ENGINES`` (:func:`is_sql_store`);
- an ``mlflow server``: the bulk endpoint its UI reads (``get_metric_history_bulk_handler``,
  :data:`BULK_ENDPOINT`), with the client's credentials (``RestStore.get_host_creds``) and
  MLflow's request helpers (``mlflow.utils.rest_utils``) (:func:`bulk_history`). A server run
  with ``--static-prefix /p`` serves it, as its REST API, under ``/p``: the tracking URI then
  ends with ``/p``, and the endpoint is asked under the URI's path.

The report's runs (:mod:`haepo_ray.report.records`) are read without ``search_runs``' entities:
on SQLite they took 58% of a report of 10,000 runs (profiled: an ORM object per tag, param and
latest metric, 930,000 of them); over HTTP the client spent 13 CPU-seconds turning the JSON
into messages and entities, 1.3 s reading it as JSON:

- a SQL store: the ``runs``, ``tags``, ``params`` and ``latest_metrics`` tables (``SqlRun``,
  ``SqlTag``, ``SqlParam``, ``SqlLatestMetric``) as plain rows (:func:`sql_trial_runs`);
- an ``mlflow server``: its public REST ``runs/search`` (:data:`SEARCH_ENDPOINT`) asked with
  MLflow's request helpers, its JSON kept as it is (:func:`search_runs_page`).

A reader of an ``mlflow server`` that is down would wait out MLflow's retries (about 4 minutes)
before its error: :func:`server_answers` asks once first, with the same helpers and no retries.

MLflow says which tracking URIs it has no store for only when it opens one (a traceback from the
first client, which for ``sqlite:///`` also creates the database): :func:`unknown_store` asks its
registry of tracking stores (``_tracking_store_registry``, entry-point plugins included) which
store it would open, and opens none.

An MLflow upgrade is checked against :data:`INTERNALS`.
"""

from __future__ import annotations

import time

from haepo_ray.upstream.declared import Internal


def store(client):
    """``MlflowClient._tracking_client.store``: the client's tracking store."""
    return client._tracking_client.store


def set_terminated(client, run_id: str, status: str) -> None:
    """``MlflowClient.set_terminated`` without its "View run" line (and so without its
    ``get_run``): the store's ``update_run_info``, with the end time now."""
    from mlflow.entities import RunStatus

    store(client).update_run_info(run_id, run_status=RunStatus.from_string(status),
                                  end_time=int(time.time() * 1000), run_name=None)


# mlflow.server.handlers.get_metric_history_bulk_handler's route (the UI's), below the server's
# static prefix: at most 100 run ids per request and 25,000 values per response (its max_results
# caps the values of all the runs, not of each).
BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"


def is_sql_store(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` names a SQL store (``sqlite:///``, ``postgresql://``, ...)."""
    from urllib.parse import urlparse

    from mlflow.store.db.db_types import DATABASE_ENGINES

    return urlparse(tracking_uri).scheme.split("+", 1)[0] in DATABASE_ENGINES


def sql_metric_rows(client, run_ids: list[str], keys: list[str]) -> list[tuple]:
    """``(run id, key, step, value, is_nan)`` of every value of ``keys`` that ``run_ids`` logged
    in ``client``'s SQL store, ordered by run and key and as ``get_metric_history`` orders a
    run's values (timestamp, step, value)."""
    from mlflow.store.tracking.dbmodels.models import SqlMetric

    with store(client).ManagedSessionMaker() as session:
        return (session.query(SqlMetric.run_uuid, SqlMetric.key, SqlMetric.step, SqlMetric.value, SqlMetric.is_nan)
                .filter(SqlMetric.run_uuid.in_(run_ids), SqlMetric.key.in_(keys))
                .order_by(SqlMetric.run_uuid, SqlMetric.key, SqlMetric.timestamp, SqlMetric.step, SqlMetric.value)
                .all())


def sql_trial_runs(client, experiment_id: str, tag: str, value: str) -> tuple[list, list, list, list]:
    """The active runs of ``experiment_id`` in ``client``'s SQL store whose tag ``tag`` is
    ``value``, as ``search_runs`` finds them: ``(run id, status)`` in its order (latest start
    first, then by id), ``(run id, key, value)`` of their tags and params and ``(run id, key,
    step, value, is_nan)`` of their latest metrics."""
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlParam, SqlRun, SqlTag
    from sqlalchemy import select

    ids = (select(SqlRun.run_uuid).join(SqlTag, SqlTag.run_uuid == SqlRun.run_uuid)
           .where(SqlRun.experiment_id == int(experiment_id), SqlRun.lifecycle_stage == LifecycleStage.ACTIVE,
                  SqlTag.key == tag, SqlTag.value == value))
    with store(client).ManagedSessionMaker() as session:
        runs = (session.query(SqlRun.run_uuid, SqlRun.status).filter(SqlRun.run_uuid.in_(ids))
                .order_by(SqlRun.start_time.desc(), SqlRun.run_uuid).all())
        tags, params = ([tuple(row) for row in session.query(table.run_uuid, table.key, table.value)
                         .filter(table.run_uuid.in_(ids))] for table in (SqlTag, SqlParam))
        latest = SqlLatestMetric
        metrics = [tuple(row) for row in session.query(latest.run_uuid, latest.key, latest.step, latest.value,
                                                       latest.is_nan).filter(latest.run_uuid.in_(ids))]
        return [tuple(row) for row in runs], tags, params, metrics


# MLflow's public REST API: search runs (https://mlflow.org/docs/latest/api_reference/rest-api.html).
SEARCH_ENDPOINT = "/api/2.0/mlflow/runs/search"


def search_runs_page(client, experiment_id: str, filter_string: str, max_results: int,
                     page_token: str | None) -> dict:
    """One page of ``client``'s ``mlflow server``'s :data:`SEARCH_ENDPOINT` (under the
    tracking URI's path: a ``--static-prefix``) as its JSON: ``runs`` (each ``info`` and
    ``data``: ``tags``, ``params``, ``metrics``; empty lists left out) and ``next_page_token``."""
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    body = {"experiment_ids": [experiment_id], "filter": filter_string, "max_results": max_results,
            **({"page_token": page_token} if page_token else {})}
    response = http_request(store(client).get_host_creds(), SEARCH_ENDPOINT, "POST", json=body)
    return verify_rest_response(response, SEARCH_ENDPOINT).json()


# MLflow's public REST API: search experiments, the cheapest question a server answers.
PROBE_ENDPOINT = "/api/2.0/mlflow/experiments/search"


def server_answers(client, timeout_s: float) -> str | None:
    """None when ``client``'s ``mlflow server`` answers one request (any answer: a refusal
    of the credentials is the client's to report) within ``timeout_s``, without MLflow's
    retries (7, over about 4 minutes); else why not."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.rest_utils import http_request

    try:
        http_request(store(client).get_host_creds(), PROBE_ENDPOINT, "GET", params={"max_results": 1},
                     max_retries=0, timeout=timeout_s, raise_on_status=False)
    except MlflowException as err:
        return err.message
    return None


def bulk_history(client, run_ids: list[str], key: str, max_results: int) -> list[dict]:
    """The values of ``key`` of ``run_ids`` from ``client``'s ``mlflow server`` (its
    :data:`BULK_ENDPOINT`, under the tracking URI's path: a ``--static-prefix``), ordered by
    run, timestamp, step, value: at most ``max_results`` of them, the first ones."""
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    response = http_request(store(client).get_host_creds(), BULK_ENDPOINT, "GET",
                            params={"run_id": run_ids, "metric_key": key, "max_results": max_results})
    return verify_rest_response(response, BULK_ENDPOINT).json().get("metrics", [])


def unknown_store(tracking_uri: str) -> str | None:
    """None when MLflow has a tracking store for ``tracking_uri`` (opened or not), else why not:
    the schemes it has stores for, or its reason (a SQL URI of an unknown dialect)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    try:
        _tracking_store_registry.get_store_builder(tracking_uri)
    except UnsupportedModelRegistryStoreURIException as err:  # (misnamed: raised for tracking stores too)
        schemes = sorted(s for s in err.supported_uri_schemes if s)
        return f"MLflow has no tracking store for it; it takes a URI of {', '.join(schemes)}"
    except MlflowException as err:
        return err.message
    return None


INTERNALS = (
    Internal("mlflow.tracking.client:MlflowClient", "_tracking_client", "read: the tracking store", kind="instance"),
    Internal("mlflow.tracking._tracking_service.client:TrackingServiceClient", "store", "read: the tracking store"),
    Internal("mlflow.store.db.db_types", "DATABASE_ENGINES", "read: which URIs are SQL stores"),
    Internal("mlflow.store.tracking.dbmodels.models", "SqlMetric", "queried: the metrics table"),
    *(Internal("mlflow.store.tracking.dbmodels.models", model, f"queried: the {table} table")
      for model, table in (("SqlRun", "runs"), ("SqlTag", "tags"), ("SqlParam", "params"),
                           ("SqlLatestMetric", "latest_metrics"))),
    Internal("mlflow.store.tracking.sqlalchemy_store:SqlAlchemyStore", "ManagedSessionMaker",
             "called: a session of the store", kind="instance"),
    Internal("mlflow.store.tracking.rest_store:RestStore", "get_host_creds", "read: the server's credentials",
             kind="instance"),
    Internal("mlflow.utils.rest_utils", "http_request", "called: a request to the bulk, search and probe endpoints",
             ("host_creds", "endpoint", "method", "max_retries", "backoff_factor", "backoff_jitter", "extra_headers",
              "retry_codes", "timeout", "raise_on_status", "respect_retry_after_header", "retry_timeout_seconds",
              "kwargs")),
    Internal("mlflow.utils.rest_utils", "verify_rest_response", "called: its response checked",
             ("response", "endpoint", "expected_status")),
    Internal("mlflow.server.handlers", "get_metric_history_bulk_handler", "asked: its route (BULK_ENDPOINT)", ()),
    Internal("mlflow.tracking._tracking_service.utils", "_tracking_store_registry",
             "asked: which tracking store a URI would open (unknown_store)"),
    Internal("mlflow.tracking.registry:StoreRegistry", "get_store_builder", "called: the store of a URI, unopened",
             ("self", "store_uri")),
    Internal("mlflow.tracking.registry:UnsupportedModelRegistryStoreURIException", "supported_uri_schemes",
             "read: the schemes of the stores it has", kind="instance"),
)
