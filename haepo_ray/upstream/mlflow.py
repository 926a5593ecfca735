"""Every private name of MLflow that haepo-ray uses, each in one place with its reason.

MLflow 3.17's ``MlflowClient`` has no public accessor for its tracking store, which the report
reads in bulk (:mod:`haepo_ray.report.histories`), and its public ``set_terminated`` first
fetches the whole run to print a "View run" link: a request per trial that a sweep of
thousands of trials pays for nothing. An MLflow upgrade is checked against :data:`INTERNALS`.
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


INTERNALS = (
    Internal("mlflow.tracking.client:MlflowClient", "_tracking_client", "read: the tracking store", kind="instance"),
    Internal("mlflow.tracking._tracking_service.client:TrackingServiceClient", "store", "read: the tracking store"),
)
