"""Writes a sweep (or one ``haepo train`` run) to MLflow on a background thread, so that
logging never blocks Tune or training, nor raises into it.

The driver queues typed messages (:class:`StartRun`, :class:`Metrics`, :class:`Tags`,
:class:`EndRun`, :class:`Summary`, :class:`EndParent`; :class:`Barrier` and :class:`Stop` to
wait for and end the thread); a message's ``what`` names it in the not-logged record. The
thread gathers metrics for ``flush_interval_s`` and writes them in batches, through retried
calls (:mod:`haepo_ray.tracking.retry`).

A trial restored from a checkpoint (retry, resume) reports again steps it already reported,
and a resumed sweep re-reads the results its killed driver had not written: what the run
holds is not logged again (:mod:`haepo_ray.tracking.logged`; the first values stay, the tag
``haepo.replayed_steps`` counts the steps reported again, over all sessions).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from haepo_ray import names
from haepo_ray.tracking.logged import LoggedSteps, highest_steps
from haepo_ray.tracking.queries import find_trial_run
from haepo_ray.tracking.retry import MLflowCalls, short_error
from haepo_ray.tracking.schema import MAX_METRICS_PER_BATCH, MAX_TAG_VALUE, sanitize_key, tag_values

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class StartRun:
    """Create (or, resumed, reopen) a trial's child run and log its params."""

    what: ClassVar[str] = "child run"
    trial_id: str
    name: str
    tags: Mapping[str, str]
    params: Mapping[str, str]


@dataclass(frozen=True)
class Metrics:
    """One result's metrics of a trial, at its step (the sweep's step key)."""

    what: ClassVar[str] = "metrics"
    trial_id: str
    step: int
    timestamp_ms: int
    values: Mapping[str, float]


@dataclass(frozen=True)
class Tags:
    what: ClassVar[str] = "tags"
    trial_id: str
    tags: Mapping[str, str]


@dataclass(frozen=True)
class EndRun:
    """A trial ended: its failure count and error, its final checkpoint (None: none to
    upload), its status."""

    what: ClassVar[str] = "status"
    trial_id: str
    status: str  # FINISHED | FAILED | KILLED
    checkpoint: Any
    error: str | None
    num_failures: int
    root_files: tuple[str, ...] = ()  # files of the checkpoint also logged at the run's root


@dataclass(frozen=True)
class Summary:
    """The parent's best trial and ``summary.json`` (see ``schema.summarize_trials``)."""

    what: ClassVar[str] = "tags"
    summary: Mapping[str, Any]


@dataclass(frozen=True)
class EndParent:
    what: ClassVar[str] = "status"
    status: str


@dataclass(frozen=True)
class Barrier:
    """Set ``done`` once everything queued before it is written."""

    what: ClassVar[str] = "metrics"
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Stop:
    """Write what is pending, then end the thread."""

    what: ClassVar[str] = "metrics"


Message = StartRun | Metrics | Tags | EndRun | Summary | EndParent | Barrier | Stop


# --------------------------------------------------------------------------- the writer


class MLflowWriter:
    """The logging thread of one sweep, below its parent run; without a parent, of one
    ``haepo train`` run (:class:`haepo_ray.tracking.run.MLflowRun`).

    Args:
        calls: the sweep's MLflow client (connected), with retries and the not-logged record.
        flush_interval_s: how long the thread gathers metrics before writing them.
    """

    def __init__(self, calls: MLflowCalls, *, flush_interval_s: float = 0.5):
        self.calls = calls
        self.flush_interval_s = flush_interval_s
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.run_ids: dict[str, str] = {}  # trial_id -> child run id, created or reopened here
        self.earlier_runs: dict[str, str] = {}  # trial_id -> child run id of an earlier session
        self.replayed_steps: Counter[str] = Counter()
        self._logged = LoggedSteps()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Message] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self, experiment_id: str, parent_run_id: str | None,
              earlier_runs: Mapping[str, str] | None = None) -> None:
        """Starts the thread for the sweep's parent run (None: runs without a parent);
        ``earlier_runs`` are the child runs an earlier session of the sweep made (trial id ->
        run id)."""
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id
        self.earlier_runs = dict(earlier_runs or {})
        self._thread = threading.Thread(target=self._run, name="haepo-mlflow", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def client(self):
        return self.calls.client

    def put(self, message: Message) -> None:
        self._queue.put(message)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything queued so far is written (or given up). True when done."""
        if not self._thread or not self._thread.is_alive():
            return True
        barrier = Barrier()
        self._queue.put(barrier)
        return barrier.done.wait(timeout)

    def stop(self) -> None:
        """Writes what is pending, waiting at most the policy's ``close_timeout_s``; what is
        left then is recorded as not logged, without trying it."""
        if self._thread is None:
            return
        self._queue.put(Stop())
        self._thread.join(self.calls.policy.close_timeout_s)
        if self._thread.is_alive():
            self.calls.abandon()
            self._thread.join(10.0)

    def run_id_of(self, trial_id: str) -> str | None:
        """A trial's child run: created or reopened in this session, or made by an earlier one."""
        with self._lock:
            return self.run_ids.get(trial_id) or self.earlier_runs.get(trial_id)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            items = [first]
            if isinstance(first, Metrics) and self.flush_interval_s > 0:
                time.sleep(self.flush_interval_s)
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._process(items)
            except Exception as err:  # never let the thread die silently
                logger.warning("MLflow logging thread: unexpected error %s", short_error(err))
            if any(isinstance(m, Stop) for m in items):
                return

    def _process(self, items: list[Message]) -> None:
        pending: dict[str, list[Metrics]] = defaultdict(list)
        for msg in items:
            try:
                match msg:
                    case Metrics():
                        self._add_metrics(pending, msg)
                    case StartRun():
                        self._flush_metrics({msg.trial_id: pending.pop(msg.trial_id, [])})
                        self._start_run(msg)
                    case Tags():
                        self._flush_metrics({msg.trial_id: pending.pop(msg.trial_id, [])})
                        self._log_tags(msg.trial_id, msg.tags)
                    case EndRun():
                        self._flush_metrics({msg.trial_id: pending.pop(msg.trial_id, [])})
                        self._end_run(msg)
                    case Summary():
                        self._flush_metrics(pending)
                        self._log_summary(msg.summary)
                    case EndParent():
                        self._flush_metrics(pending)
                        self._end_parent(msg.status)
                    case Barrier() | Stop():
                        self._flush_metrics(pending)
            except Exception as err:  # a bug here must not stop the logging of the rest
                self.calls.record(msg.what, getattr(msg, "trial_id", None),
                                  "internal error of the MLflow callback", short_error(err))
            finally:
                if isinstance(msg, Barrier):
                    msg.done.set()
        try:
            self._flush_metrics(pending)
        except Exception as err:
            self.calls.record("metrics", None, "internal error of the MLflow callback", short_error(err))

    def _start_run(self, msg: StartRun) -> None:
        trial_id = msg.trial_id
        run_id = self.run_id_of(trial_id)
        earlier = run_id is not None

        def create() -> str:
            parent = {names.PARENT_RUN: self.parent_run_id} if self.parent_run_id else {}
            tags = tag_values({**parent, **msg.tags})
            return self.client.create_run(self.experiment_id, tags=tags, run_name=msg.name).info.run_id

        def find_or_create() -> str:  # a retry must not create a second run
            return find_trial_run(self.client, self.experiment_id, self.parent_run_id, trial_id) or create()

        if run_id is None:
            ok, run_id = self.calls.call("child run", trial_id, f"child run of trial {msg.name}", create,
                                         retry_fn=find_or_create)
            if not ok:
                return
        else:
            self.calls.call("status", trial_id, f"status RUNNING of trial {msg.name}",
                            lambda: self.client.update_run(run_id, status="RUNNING"))
        with self._lock:
            self.run_ids[trial_id] = run_id
        logged: Mapping[str, str] = {}
        if earlier:
            # A resumed run: keep what it holds. (A restored trial's config went through JSON,
            # so some values print differently; MLflow refuses to change a param.)
            ok, run = self.calls.call("params", trial_id, "params already logged (resume)",
                                      lambda: self.client.get_run(run_id))
            if ok:
                logged = run.data.params
                self.replayed_steps[trial_id] = int(run.data.tags.get(names.REPLAYED_STEPS, 0))
            if ok and trial_id not in self._logged:
                ok, steps = self.calls.call("metrics", trial_id, "steps already logged (resume)",
                                            lambda: highest_steps(self.client, run_id, run.data.metrics))
                if ok:
                    self._logged.learn(trial_id, steps)
        self.calls.log_params(run_id, trial_id, {k: v for k, v in msg.params.items() if k not in logged})

    def _add_metrics(self, pending: dict[str, list[Metrics]], msg: Metrics) -> None:
        if msg.trial_id not in self.run_ids:
            self.calls.record("metrics", msg.trial_id,
                              f"step {msg.step}: {len(msg.values)} values (no child run)",
                              "the child run could not be created")
            return
        values, replayed = self._logged.admit(msg.trial_id, msg.step, msg.values)
        self.replayed_steps[msg.trial_id] += replayed
        if values:
            pending[msg.trial_id].append(Metrics(msg.trial_id, msg.step, msg.timestamp_ms, values))

    def _flush_metrics(self, pending: dict[str, list[Metrics]]) -> None:
        from mlflow.entities import Metric

        for trial_id in list(pending):
            rows = pending.pop(trial_id)
            if not rows:
                continue
            run_id = self.run_ids[trial_id]
            metrics = [Metric(k, v, m.timestamp_ms, m.step) for m in rows for k, v in m.values.items()]
            for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
                chunk = metrics[i:i + MAX_METRICS_PER_BATCH]
                steps = sorted({m.step for m in chunk})
                self.calls.call("metrics", trial_id, f"steps {steps[0]}-{steps[-1]}: {len(chunk)} values",
                                lambda c=chunk: self.client.log_batch(run_id, metrics=c))
            if self.replayed_steps.get(trial_id):
                self._log_tags(trial_id, {names.REPLAYED_STEPS: str(self.replayed_steps[trial_id])})

    def _log_tags(self, trial_id: str, tags: Mapping[str, str]) -> None:
        run_id = self.run_ids.get(trial_id)
        if run_id is None:
            self.calls.record("tags", trial_id, f"tags {sorted(tags)} (no child run)",
                              "the child run could not be created")
            return
        from mlflow.entities import RunTag

        batch = [RunTag(k, v) for k, v in tag_values(tags).items()]
        self.calls.call("tags", trial_id, f"tags {sorted(tags)}",
                        lambda: self.client.log_batch(run_id, tags=batch))

    def _end_run(self, msg: EndRun) -> None:
        run_id = self.run_ids.get(msg.trial_id)
        if run_id is None:
            self.calls.record("status", msg.trial_id, f"status {msg.status} (no child run)",
                              "the child run could not be created")
            return
        tags = {names.NUM_FAILURES: str(msg.num_failures)}
        if msg.error:
            tags[names.ERROR] = msg.error[-MAX_TAG_VALUE:]
        self._log_tags(msg.trial_id, tags)
        if msg.checkpoint is not None:
            self._log_checkpoint(msg.trial_id, run_id, msg.checkpoint, msg.root_files)
        self.calls.call("status", msg.trial_id, f"status {msg.status}",
                        lambda: self.client.set_terminated(run_id, status=msg.status))

    def _log_checkpoint(self, trial_id: str, run_id: str, checkpoint, root_files: tuple[str, ...]) -> None:
        path = getattr(checkpoint, "path", None)

        def log(local: str) -> None:
            self.client.log_artifacts(run_id, local, artifact_path="checkpoint")
            for name in root_files:
                if os.path.isfile(os.path.join(local, name)):
                    self.client.log_artifact(run_id, os.path.join(local, name))

        def upload() -> None:
            import pyarrow.fs

            fs = getattr(checkpoint, "filesystem", None)
            if fs is None or isinstance(fs, pyarrow.fs.LocalFileSystem):
                log(path)
            else:
                with checkpoint.as_directory() as local:
                    log(local)
            self.client.set_tag(run_id, names.CHECKPOINT, str(path))

        self.calls.call("artifact", trial_id, f"final checkpoint {path}", upload)

    def _end_parent(self, status: str) -> None:
        self.calls.call("status", None, f"parent status {status}",
                        lambda: self.client.set_terminated(self.parent_run_id, status=status))

    def _log_summary(self, summary: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        best, metric = summary.get("best"), summary.get("metric")
        tags = [RunTag(names.NUM_TRIALS, str(summary.get("num_trials", 0)))]
        metrics = []
        if best:
            tags.append(RunTag(names.BEST_TRIAL_ID, best["trial_id"]))
            run_id = self.run_id_of(best["trial_id"])
            if run_id:
                tags.append(RunTag(names.BEST_RUN_ID, run_id))
            if best.get("value") is not None and metric:
                metrics.append(Metric(sanitize_key(f"best/{metric}"), float(best["value"]),
                                      int(time.time() * 1000), 0))
        text = json.dumps(dict(summary, run_ids={**self.earlier_runs, **self.run_ids},
                               parent_run_id=self.parent_run_id), indent=2, default=str)
        self.calls.call("tags", None, "best trial of the sweep",
                        lambda: self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags))
        self.calls.call("artifact", None, "summary.json",
                        lambda: self.client.log_text(self.parent_run_id, text, "summary.json"))
