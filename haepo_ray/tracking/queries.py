"""Finding a sweep's runs in MLflow: by the tags of :mod:`haepo_ray.tracking.schema`; and
the experiment they go to (:func:`get_or_create_experiment`).

The callback uses these to find the runs of an earlier session again (resume, a retried
create); tests and the report use them to read a sweep back.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from haepo_ray import names
from haepo_ray.tracking.schema import SWEEP_ROLE
from haepo_ray.tracking.uri import sqlite_file
from haepo_ray.uris import is_http_url


PROBE_TIMEOUT_S = 10.0  # how long a reader waits for an mlflow server's first answer


def open_store(tracking_uri: str):
    """An ``MlflowClient`` of the store at ``tracking_uri``; ``LookupError`` where that is a
    SQLite file that does not exist (MLflow would create an empty one), or an ``mlflow server``
    that does not answer (MLflow would retry for about 4 minutes, then raise)."""
    from mlflow.tracking import MlflowClient

    from haepo_ray.upstream import mlflow as mlflow_internals

    db = sqlite_file(tracking_uri)
    if db is not None and not db.is_file():
        raise LookupError(f"no MLflow store at {tracking_uri} (run a sweep first, or give --tracking-uri)")
    client = MlflowClient(tracking_uri=tracking_uri)
    if is_http_url(tracking_uri):
        why = mlflow_internals.server_answers(client, PROBE_TIMEOUT_S)
        if why is not None:
            raise LookupError(f"MLflow at {tracking_uri} does not answer ({why}): start the server, or give "
                              "the --tracking-uri of one that runs")
    return client


def experiment_named(client, name: str):
    """The client's MLflow experiment ``name``; ``LookupError`` naming the experiments there
    are when it has none."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        raise LookupError(f"no MLflow experiment {name!r} at {client.tracking_uri}; there are: {known}")
    return exp


def search_all_runs(client, experiment_id: str, filter_string: str) -> list:
    """Every run of the experiment that matches ``filter_string``, over all result pages."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string,
                                  max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def run_artifacts(client, run_ids: Iterable[str], name: str) -> Iterator[tuple[str, Path]]:
    """(run id, local copy) of the file ``name`` at the artifact root of each of ``run_ids``
    that has one, downloaded in turn to a temporary folder that lasts while the caller reads."""
    with tempfile.TemporaryDirectory() as tmp, _no_progress_bars():
        for run_id in run_ids:
            if name in {a.path for a in client.list_artifacts(run_id)}:
                yield run_id, Path(client.download_artifacts(run_id, name, tmp))


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """MLflow draws a "Downloading artifacts" bar per file (one per trial run); the form's
    command and ``haepo report`` print what they wrote instead."""
    saved = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = saved


def child_runs(client, experiment_id: str, parent_run_id: str) -> list:
    """The child runs (trials) of a parent run."""
    return search_all_runs(client, experiment_id, f"tags.`{names.PARENT_RUN}` = '{_q(parent_run_id)}'")


def find_trial_run(client, experiment_id: str, parent_run_id: str | None, trial_id: str) -> str | None:
    """The run id of a trial's child run under ``parent_run_id`` (None: a run of the trial id
    with or without a parent), if there is one."""
    query = f"tags.`{names.TRIAL_ID}` = '{_q(trial_id)}'"
    if parent_run_id is not None:
        query = f"tags.`{names.PARENT_RUN}` = '{_q(parent_run_id)}' and {query}"
    runs = search_all_runs(client, experiment_id, query)
    return runs[0].info.run_id if runs else None


def get_or_create_experiment(client, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``: restored when deleted, created (with
    ``artifact_location``) when missing."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except Exception:  # made meanwhile by another driver
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_sweep_parent(client, experiment_id: str, sweep_dir: str) -> str | None:
    """The run id of the (first) parent run of the sweep whose Ray results are ``sweep_dir``."""
    runs = search_all_runs(client, experiment_id,
                           f"tags.`{names.ROLE}` = '{SWEEP_ROLE}' and "
                           f"tags.`{names.SWEEP_DIR}` = '{_q(sweep_dir)}'")
    if not runs:
        return None
    runs.sort(key=lambda r: r.info.start_time or 0)
    return runs[0].info.run_id


def find_sweep_runs(tracking_uri: str, experiment_name: str, parent_run_id: str | None = None):
    """``(parent, children)`` of a sweep in MLflow: the parent run (the newest sweep of the
    experiment unless ``parent_run_id`` is given) and its child runs, as MLflow Run objects."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = experiment_named(client, experiment_name)
    if parent_run_id is None:
        parents = client.search_runs([exp.experiment_id], f"tags.`{names.ROLE}` = '{SWEEP_ROLE}'",
                                     order_by=["attributes.start_time DESC"], max_results=1)
        if not parents:
            raise LookupError(f"no sweep in MLflow experiment {experiment_name!r}")
        parent = parents[0]
    else:
        parent = client.get_run(parent_run_id)
    return parent, child_runs(client, exp.experiment_id, parent.info.run_id)


def _q(text: str) -> str:
    """``text`` quoted for a filter string."""
    return text.replace("\\", "\\\\").replace("'", "\\'")
