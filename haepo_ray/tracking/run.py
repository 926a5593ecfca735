"""One MLflow run without a parent: what ``haepo train`` logs, in the form of a sweep trial's
run (:mod:`haepo_ray.tracking.callback`), written by the same thread
(:mod:`haepo_ray.tracking.writer`) with the same retries (:mod:`haepo_ray.tracking.retry`).

What it writes: tag ``haepo.role=train``, the given tags (algorithm, env, seed, provenance)
and those of each result (:func:`~haepo_ray.tracking.schema.result_tags`); the given params
flattened with ``/``; every result's metrics chosen by ``metrics`` with ``step`` =
``training_iteration``; at the end the status (FINISHED, FAILED or KILLED), the error, and the
final checkpoint as artifacts under ``checkpoint/`` (tag ``haepo.checkpoint``).

Logging never raises into training: MLflow that cannot be reached at start means no tracking
(a warning says so); what fails later is recorded and summarized in a warning at the end.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from haepo_ray import names
from haepo_ray.tracking.queries import get_or_create_experiment
from haepo_ray.tracking.retry import MLflowCalls, NotLogged, RetryPolicy
from haepo_ray.tracking.schema import DEFAULT_METRICS, TRAIN_ROLE, params_of, result_tags, select_metrics
from haepo_ray.tracking.uri import artifact_location_for
from haepo_ray.tracking.messages import EndRun, Metrics, StartRun, Tags
from haepo_ray.tracking.writer import MLflowWriter

logger = logging.getLogger(__name__)


class MLflowRun:
    """One MLflow run of ``haepo train``; see the module doc.

    Args:
        tracking_uri: where to log (see :func:`haepo_ray.tracking.resolve_tracking_uri`).
        experiment_name: the MLflow experiment (created when missing).
        run_name: the run's name.
        metrics: glob patterns of result keys to log (None or empty: :data:`DEFAULT_METRICS`).
        retry: how hard each MLflow call is tried (default: :meth:`RetryPolicy.from_env`).
    """

    def __init__(self, tracking_uri: str, experiment_name: str, run_name: str, *,
                 metrics: tuple[str, ...] | None = None, retry: RetryPolicy | None = None):
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.metrics = tuple(metrics or DEFAULT_METRICS)
        self.run_id: str | None = None
        self._calls = MLflowCalls(tracking_uri, retry if retry is not None else RetryPolicy.from_env())
        self._writer = MLflowWriter(self._calls)
        self._key = uuid.uuid4().hex  # the run's haepo.trial_id: how a retried create finds it
        self._result_tags: dict[str, str] | None = None

    @property
    def not_logged(self) -> list[NotLogged]:
        """What could not be written to MLflow, so far."""
        return self._calls.not_logged

    def start(self, tags: Mapping[str, str], params: Mapping[str, Any]) -> str | None:
        """Connects, finds or creates the experiment, creates the run with ``tags`` and
        ``params`` (a nested config, flattened). Returns the run id, or None when MLflow cannot
        be reached (then nothing is logged)."""
        calls = self._calls
        calls.connect()
        ok, experiment_id = calls.call(
            "experiment", None, f"experiment {self.experiment_name!r}",
            lambda: get_or_create_experiment(calls.client, self.experiment_name,
                                             artifact_location_for(self.tracking_uri)))
        if ok:
            self._writer.start(experiment_id, None)
            run_tags = {names.ROLE: TRAIN_ROLE, names.TRIAL_ID: self._key, names.TRIAL_NAME: self.run_name, **tags}
            self._writer.put(StartRun(self._key, self.run_name, run_tags, params_of(params)))
            self._writer.flush()
            self.run_id = self._writer.run_id_of(self._key)
        if self.run_id is None:
            logger.warning("MLflow at %s cannot be reached: this run trains without tracking "
                           "(nothing will be logged to MLflow)", self.tracking_uri)
            self._writer.stop(timeout=0)
            calls.write_not_logged()
        return self.run_id

    def log_result(self, result: Mapping[str, Any]) -> None:
        """Queues a training result's metrics at its ``training_iteration``, and its tags when
        they changed."""
        if self.run_id is None:
            return
        step = int(result.get(names.TRAINING_ITERATION, 0) or 0)
        self._writer.put(Metrics(self._key, step, int(time.time() * 1000), select_metrics(result, self.metrics)))
        tags = result_tags(result)
        if tags != self._result_tags:
            self._result_tags = tags
            self._writer.put(Tags(self._key, tags))

    def end(self, status: str, checkpoint: Any = None, error: str | None = None) -> None:
        """Writes what is pending, the error, the checkpoint (a ``ray.train.Checkpoint``; None:
        none) and the status (FINISHED, FAILED or KILLED), giving up after the retry policy's
        ``close_timeout_s`` without a write; warns about anything not logged."""
        if self.run_id is None:
            return
        self._writer.put(EndRun(self._key, status, checkpoint, error, 0))
        self._writer.stop()
        self._calls.write_not_logged()
