"""The Ray Tune callback that logs a sweep to MLflow: one parent run per sweep, one nested
child run per trial. It runs on the Tune driver, so trials need no MLflow access.

What it writes (names in :mod:`haepo_ray.names`, forms in :mod:`haepo_ray.tracking.schema`):

- parent run (tag ``haepo.role=sweep``): the spec's params, the resolved spec as an artifact
  (``spec.yaml``, and the file as written, ``spec_source.yaml``), at the end the best trial
  (tags ``haepo.best_trial_id`` / ``haepo.best_run_id``, metric ``best/<metric>``) and
  ``summary.json``;
- one child per trial (``mlflow.parentRunId`` = the parent; tag ``haepo.trial_id``): params =
  the trial's config flattened with ``/``, less ``SweepTracking.default_params`` (the plan's:
  for RL, the algorithm's defaults the spec neither sets nor searches); metrics of every result, with ``step`` = the
  sweep's step key (``training_iteration``, or ``update`` for language models): the keys
  matching ``SweepTracking.metrics``, among them wall-clock ``time_total_s`` and env steps
  ``env_runners/num_env_steps_sampled_lifetime``, each (run, metric, step) once;
  tags algorithm, env, seed, trial id/name, the trial's search values by their spec names
  (``haepo.search_values``), its Ray node (ip and host name) and the provenance its results
  carry (code version, machine, library versions: :mod:`haepo_ray.provenance`); the final
  checkpoint as artifacts under ``checkpoint/``.

Runs are found again, never duplicated: a resumed sweep finds its parent by the tag
``haepo.sweep_dir`` and every trial's child by ``haepo.trial_id``; after a driver crash, what
the old driver had not written is recovered from each trial's ``result.json``: every trial
whose folder shows that it ran (results, a checkpoint) gets its run (found, or created if the
old writer was too far behind to make it) and its rows on disk before Tune restores it, so that
nothing it wrote is lost however far behind the killed writer was; the ``result.json`` of a
trial MLflow holds as ended is not read. A trial restored from a checkpoint, or restarted from
scratch for want of one, reports again steps it had reported: the rows of the killed attempt
are kept, and those steps are dropped (counted in ``haepo.replayed_steps``), with or without an
earlier MLflow run, so each (run, metric, step) is logged once, its first value.

Logging never raises into Tune and never blocks it (:mod:`haepo_ray.tracking.writer`, with
the retries of :mod:`haepo_ray.tracking.retry`). While MLflow cannot be reached, what waits
for it is kept, past a bound in ``mlflow_backlog.pkl`` in the sweep folder, and written when
it is back; what fails for good is in :attr:`MLflowSweepCallback.not_logged` and
``mlflow_not_logged.jsonl`` in the sweep folder.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ray.tune import Callback

from haepo_ray import names
from haepo_ray.tracking.queries import child_runs, find_sweep_parent, get_or_create_experiment
from haepo_ray.tracking.schema import (
    SWEEP_ROLE,
    TRIAL_ROLE,
    is_metric_value,
    params_of,
    result_tags,
    sanitize_key,
    select_metrics,
    summarize_trials,
    tag_values,
)
from haepo_ray.tracking.retry import MLflowCalls, NotLogged, RetryPolicy
from haepo_ray.tracking.settings import SweepTracking
from haepo_ray.tracking.trial_files import checkpoint_of, results_on_disk
from haepo_ray.tracking.messages import EndParent, EndRun, Metrics, StartRun, Summary, Tags
from haepo_ray.tracking.writer import MLflowWriter
from haepo_ray.uris import is_uri

logger = logging.getLogger(__name__)

NOT_LOGGED_FILE = "mlflow_not_logged.jsonl"
BACKLOG_FILE = "mlflow_backlog.pkl"  # what waits for MLflow past the writer's memory bound


class MLflowSweepCallback(Callback):
    """One MLflow parent run per sweep, one nested child per trial; see the module doc.

    Args:
        settings: what to log and where.
        retry: how hard each MLflow call is tried (default: :meth:`RetryPolicy.from_env`).
        interrupted: at the experiment's end, the trials' statuses when the sweep was
            interrupted, None if it was not (:meth:`haepo_ray.sweep.interrupt.InterruptWatch.at_interrupt`):
            the runs of the trials it stopped, and the parent, end KILLED (a resume reopens them).
    """

    def __init__(self, settings: SweepTracking, retry: RetryPolicy | None = None,
                 interrupted: Callable[[], Mapping[str, str] | None] | None = None):
        self.settings = settings
        self.retry = retry if retry is not None else RetryPolicy.from_env()
        self._interrupted = interrupted
        not_logged_path = os.path.join(settings.sweep_dir, NOT_LOGGED_FILE) if settings.sweep_dir else None
        self._calls = MLflowCalls(settings.tracking_uri, self.retry, not_logged_path=not_logged_path)
        self._writer = MLflowWriter(self._calls, backlog_path=(
            os.path.join(settings.sweep_dir, BACKLOG_FILE) if settings.sweep_dir and not is_uri(settings.sweep_dir)
            else None))
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._earlier_runs: dict[str, str] = {}  # trial_id -> child run of an earlier session
        self._earlier_status: dict[str, str] = {}  # trial_id -> that run's MLflow status
        self._reconciled = False
        self._result_tags: dict[str, dict[str, str]] = {}  # trial_id -> node and provenance tags
        self._started_trials: set[str] = set()
        self._started = False
        self._closed = False

    def __reduce__(self):
        # Tune pickles its callbacks into tuner.pkl: the settings, never the live state.
        return type(self), (self.settings, self.retry)

    @property
    def tracking_uri(self) -> str:
        return self.settings.tracking_uri

    @property
    def not_logged(self) -> list[NotLogged]:
        """What could not be written to MLflow, so far."""
        return self._calls.not_logged

    @property
    def writer(self) -> MLflowWriter:
        """The thread that writes to MLflow (benchmarks weigh and profile it)."""
        return self._writer

    def backlog(self) -> int:
        """Messages queued for MLflow and not written yet (those waiting while it cannot be
        reached among them)."""
        return self._writer.backlog()

    def run_id_of(self, trial_id: str) -> str | None:
        """The child run of a trial: created or found in this session, or (on resume) by an
        earlier one."""
        return self._writer.run_id_of(trial_id)

    # ------------------------------------------------------------------ set-up

    def start(self) -> str | None:
        """Connects, finds or creates the experiment and the parent run; starts the logging
        thread. Returns the parent run id, or None when MLflow cannot be reached (then nothing
        is logged and the sweep goes on). Idempotent."""
        if self._started:
            return self.parent_run_id
        self._started = True
        s, calls = self.settings, self._calls
        calls.connect()
        ok, experiment_id = calls.call("experiment", None, f"experiment {s.experiment_name!r}",
                                       lambda: get_or_create_experiment(calls.client, s.experiment_name,
                                                                        s.artifact_location))
        parent = None
        if ok and s.resume and s.sweep_dir is not None:
            ok, parent = calls.call("parent run", None, f"parent run of {s.sweep_name!r} (resume)",
                                    lambda: self._reopen_parent(experiment_id))
        if ok and parent is None:
            parent = self._create_parent(experiment_id)
        if parent is None:
            logger.warning("MLflow at %s cannot be reached: this sweep runs without tracking (nothing "
                           "will be logged to MLflow); once it answers, `haepo sweep --resume` logs every "
                           "trial's results", s.tracking_uri)
            calls.write_not_logged()
            return None
        self.experiment_id, self.parent_run_id = experiment_id, parent
        self._writer.start(experiment_id, parent, self._earlier_runs)
        return parent

    def _reopen_parent(self, experiment_id: str) -> str | None:
        """The parent run of an earlier session of this sweep, set RUNNING, with its children
        remembered; None when there is none."""
        client = self._calls.client
        run_id = find_sweep_parent(client, experiment_id, self.settings.sweep_dir)
        if run_id is None:
            return None
        client.update_run(run_id, status="RUNNING")
        for run in child_runs(client, experiment_id, run_id):
            trial_id = run.data.tags.get(names.TRIAL_ID)
            if trial_id and trial_id not in self._earlier_runs:
                self._earlier_runs[trial_id] = run.info.run_id
                self._earlier_status[trial_id] = run.info.status
        logger.info("MLflow: resuming parent run %s (%d child runs)", run_id, len(self._earlier_runs))
        return run_id

    def _create_parent(self, experiment_id: str) -> str | None:
        """A new parent run with its params and spec texts; None when it cannot be created."""
        s, calls = self.settings, self._calls
        client = calls.client
        tags = {names.ROLE: SWEEP_ROLE, names.SWEEP: s.sweep_name, **s.parent_tags}
        if s.sweep_dir is not None:
            tags[names.SWEEP_DIR] = s.sweep_dir

        def create() -> str:
            return client.create_run(experiment_id, tags=tag_values(tags), run_name=s.sweep_name).info.run_id

        def find_or_create() -> str:  # a retry must not create a second parent
            found = find_sweep_parent(client, experiment_id, s.sweep_dir) if s.sweep_dir else None
            return found or create()

        ok, run_id = calls.call("parent run", None, f"parent run of {s.sweep_name!r}", create,
                                retry_fn=find_or_create)
        if not ok:
            return None
        calls.log_params(run_id, None, params_of(s.parent_params))
        for text, name in ((s.spec_yaml, "spec.yaml"), (s.spec_source, "spec_source.yaml")):
            if text:
                calls.call("artifact", None, name, lambda t=text, n=name: client.log_text(run_id, t, n))
        return run_id

    # ------------------------------------------------------------------ Tune hooks (driver)

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.start()

    def on_step_begin(self, iteration, trials, **info):
        self._reconcile_once(trials)

    def _reconcile_once(self, trials) -> None:
        """On resume, :meth:`_reconcile` once: at the first step, or at the end when Tune had
        no trial left to run (every trial ended before the crash; Tune then takes no step)."""
        if self.settings.resume and not self._reconciled and self._active():
            self._reconciled = True
            self._reconcile(trials)

    def _reconcile(self, trials) -> None:
        """After a driver crash, before Tune restores any trial: what the old driver had queued
        but not written is recovered from each trial's ``result.json``, and trials that had
        finished get their final status and checkpoint.

        Whether a trial ran is judged from its folder (results, a checkpoint), whatever its
        status and whether or not MLflow holds a run of it: the old writer may have been too far
        behind to create the run. Such a trial's run is found or created and its rows on disk
        queued now, before Tune restores it, so that the steps it reports again are dropped.
        A trial MLflow holds as finished or failed is not read (everything before its end was
        written); one that never started has no folder to read."""
        began, looked, recovered = time.perf_counter(), 0, 0
        for trial in trials:
            status = getattr(trial, "status", "")
            logged = self._earlier_status.get(trial.trial_id)
            if logged in ("FINISHED", "FAILED"):
                continue  # its end was written, so was everything queued before it
            rows = results_on_disk(trial)
            looked += 1
            recovered += bool(rows)
            ran = bool(rows) or getattr(trial, "checkpoint", None) is not None
            if not ran and trial.trial_id not in self._earlier_runs and status not in ("TERMINATED", "ERROR"):
                continue  # not started before the crash: its run is created when it starts
            self._enqueue_start(trial)
            for row in rows:
                step = int(row.get(self.settings.step_key, 0) or 0)
                ts = int(float(row.get("timestamp", time.time())) * 1000)
                self._writer.put(Metrics(trial.trial_id, step, ts, self._values_of(trial, row)))
                self._tag_result(trial, row)
            if status == "TERMINATED" and logged != "FINISHED":
                self._enqueue_end(trial, "FINISHED")
            elif status == "ERROR" and logged != "FAILED":
                self._enqueue_end(trial, "FAILED")
        logger.info("MLflow: resume looked into %d of %d trials' folders, re-read the results of %d, in %.2f s",
                    looked, len(trials), recovered, time.perf_counter() - began)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._enqueue_start(trial)

    def on_trial_restore(self, iteration, trials, trial, **info):
        self._enqueue_start(trial)

    def on_trial_recover(self, iteration, trials, trial, **info):
        if self._active():
            self._enqueue_start(trial)
            self._writer.put(Tags(trial.trial_id, {names.NUM_FAILURES: str(trial.num_failures)}))
        logger.warning("trial %s failed (failure %d); Tune retries it from its last checkpoint",
                       trial.trial_id, trial.num_failures)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self._active():
            return
        self._enqueue_start(trial)
        step = int(result.get(self.settings.step_key, 0) or 0)
        self._writer.put(Metrics(trial.trial_id, step, int(time.time() * 1000), self._values_of(trial, result)))
        self._tag_result(trial, result)

    def _values_of(self, trial, result: Mapping[str, Any]) -> dict[str, float]:
        """The metrics a result logs: those the spec selects, and its config's ``config_metrics``
        (the result's config, which Tune also writes into ``result.json``, else the trial's)."""
        values = select_metrics(result, self.settings.metrics)
        config = result.get("config") or trial.config or {}
        for key in self.settings.config_metrics:
            value = config.get(key)
            if is_metric_value(value):
                values[sanitize_key(f"config/{key}")] = float(value)
        return values

    def _tag_result(self, trial, result: Mapping[str, Any]) -> None:
        """Tags the trial's run with the node and provenance of a result, when they changed
        (a trial restored on another node)."""
        tags = result_tags(result)
        if self._result_tags.get(trial.trial_id) != tags:
            self._result_tags[trial.trial_id] = tags
            self._writer.put(Tags(trial.trial_id, tags))

    def on_trial_complete(self, iteration, trials, trial, **info):
        if self._active():
            self._enqueue_start(trial)
            self._enqueue_end(trial, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        if self._active():
            self._enqueue_start(trial)
            error = None
            path = getattr(trial, "error_file", None)
            if path and os.path.exists(path):
                try:
                    error = Path(path).read_text(errors="replace")
                except OSError:
                    error = None
            self._enqueue_end(trial, "FAILED", error)

    def on_experiment_end(self, trials, **info):
        self._reconcile_once(trials)
        at_interrupt = self._interrupted() if self._interrupted is not None else None
        if at_interrupt is not None:  # Tune marked the trials it stopped TERMINATED
            status = "KILLED"
            for trial in trials:
                if at_interrupt.get(trial.trial_id) not in ("TERMINATED", "ERROR") \
                        and trial.trial_id in self._started_trials:
                    self._writer.put(EndRun(trial.trial_id, "KILLED", None, None, trial.num_failures))
        else:
            statuses = [getattr(t, "status", "") for t in trials]
            status = "FAILED" if any(s == "ERROR" for s in statuses) else (
                "FINISHED" if all(s == "TERMINATED" for s in statuses) else "KILLED")
        self.close(status=status, trials=trials)

    # ------------------------------------------------------------------ end

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything queued so far is written (or given up). True when done."""
        return self._writer.flush(timeout)

    def close(self, status: str = "FINISHED", trials: Iterable[Any] | None = None) -> None:
        """Writes what is pending (giving up after ``retry.close_timeout_s`` without a write),
        the best trial, the parent's status; warns about anything not logged. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._writer.started:
            if trials is not None:
                self._writer.put(Summary(summarize_trials(trials, self.settings.metric, self.settings.mode)))
            self._writer.put(EndParent(status))
            self._writer.stop()
        self._calls.write_not_logged()

    def not_logged_summary(self) -> str:
        """What was not logged, counted by kind, with the first items ("" when nothing)."""
        return self._calls.not_logged_summary()

    # ------------------------------------------------------------------ queueing (driver)

    def _active(self) -> bool:
        if not self._started:
            self.start()
        return self._writer.started and not self._closed

    def _enqueue_start(self, trial) -> None:
        if not self._active() or trial.trial_id in self._started_trials:
            return
        self._started_trials.add(trial.trial_id)
        s = self.settings
        config = dict(trial.config or {})
        tags = {
            names.ROLE: TRIAL_ROLE,
            names.TRIAL_ID: trial.trial_id,
            names.TRIAL_NAME: str(trial),
            names.SWEEP: s.sweep_name,
            **s.trial_tags,
        }
        if "seed" in config:
            tags[names.SEED] = str(config["seed"])
        tags.update({tag: str(config[key]) for tag, key in s.config_tags.items() if key in config})
        if s.search_keys:
            tags[names.SEARCH_VALUES] = json.dumps(
                {name: config.get(key) for name, key in s.search_keys.items()}, default=str, sort_keys=True)
        params = {k: v for k, v in params_of(config).items() if s.default_params.get(k) != v}
        self._writer.put(StartRun(trial.trial_id, str(trial), tags, params))

    def _enqueue_end(self, trial, status: str, error: str | None = None) -> None:
        checkpoint = checkpoint_of(trial) if self.settings.log_checkpoints else None
        self._writer.put(EndRun(trial.trial_id, status, checkpoint, error, trial.num_failures,
                                self.settings.checkpoint_root_files))
