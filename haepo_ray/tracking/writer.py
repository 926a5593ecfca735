"""Writes a sweep (or one ``haepo train`` run) to MLflow on a background thread, so that
logging never blocks Tune or training, nor raises into it.

The driver queues typed messages (:class:`StartRun`, :class:`Metrics`, :class:`Tags`,
:class:`EndRun`, :class:`Summary`, :class:`EndParent`; :class:`Barrier` and :class:`Stop` to
wait for and end the thread); a message's ``what`` names it in the not-logged record. The
thread moves them into its backlog (:mod:`haepo_ray.tracking.backlog`: in order, in memory up
to a bound, then in a file), gathers metrics for ``flush_interval_s`` and writes them in
batches, through retried calls (:mod:`haepo_ray.tracking.retry`).

*A tracking-server outage loses nothing.* A write that fails because MLflow cannot be reached
is not recorded as lost: it goes back to the head of the backlog with everything after it,
and the thread tries the head again, after 1, 2, 4, 8, then every 10 s, until MLflow
answers; then it writes the backlog in order. What the driver queues meanwhile waits in the
backlog, in bounded memory. A write that may have reached MLflow before its answer was lost lands once when tried
again: a create looks for the run first; a metrics batch is sent again with the same rows,
which MLflow's SQL stores keep once (one row per run, key, timestamp, step and value). Only when the sweep has ended and MLflow stays away past the
policy's ``close_timeout_s`` is what waits recorded as not logged (a writer that is behind,
with MLflow answering, is waited for: the end gives up only after that long without a write).

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
from haepo_ray.upstream import mlflow as mlflow_internals
from haepo_ray.tracking.backlog import DEFAULT_MAX_IN_MEMORY, Backlog
from haepo_ray.tracking.logged import LoggedSteps, highest_steps
from haepo_ray.tracking.queries import find_trial_run
from haepo_ray.tracking.retry import MLflowCalls, Unavailable, short_error
from haepo_ray.tracking.schema import (
    MAX_METRICS_PER_BATCH,
    MAX_TAG_VALUE,
    MAX_TAGS_PER_BATCH,
    sanitize_key,
    tag_values,
)

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
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))  # of best/<metric>


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


@dataclass(frozen=True)
class Admitted:
    """Metric rows (admitted: :class:`~haepo_ray.tracking.logged.LoggedSteps`) and tags of one
    trial, not written when MLflow went away."""

    what: ClassVar[str] = "metrics"
    trial_id: str
    rows: tuple  # of mlflow.entities.Metric and RunTag


Message = StartRun | Metrics | Tags | EndRun | Summary | EndParent | Barrier | Stop
_Item = Message | Admitted

MAX_PROBE_INTERVAL_S = 10.0


# --------------------------------------------------------------------------- the writer


class MLflowWriter:
    """The logging thread of one sweep, below its parent run; without a parent, of one
    ``haepo train`` run (:class:`haepo_ray.tracking.run.MLflowRun`).

    Args:
        calls: the sweep's MLflow client (connected), with retries and the not-logged record.
        flush_interval_s: how long the thread gathers metrics before writing them.
        backlog_path: where the backlog spills past ``max_in_memory`` messages (None: an
            anonymous temporary file).
        max_in_memory: messages the backlog holds in memory.
        max_batch: messages the thread takes from the backlog at a time.
    """

    def __init__(self, calls: MLflowCalls, *, flush_interval_s: float = 0.5,
                 backlog_path: str | None = None, max_in_memory: int = DEFAULT_MAX_IN_MEMORY,
                 max_batch: int = 2000):
        self.calls = calls
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.run_ids: dict[str, str] = {}  # trial_id -> child run id, created or reopened here
        self.earlier_runs: dict[str, str] = {}  # trial_id -> child run id of an earlier session
        self.replayed_steps: Counter[str] = Counter()
        self.peak_backlog = 0  # most messages waiting at once (queue and backlog)
        self._logged = LoggedSteps()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Message] = queue.Queue()
        self._backlog = Backlog(backlog_path, max_in_memory)
        self._holding = False  # MLflow cannot be reached: the backlog waits
        self._tried: set[str] = set()  # trials whose create was tried: a repeat looks first
        self._wake = threading.Event()
        self._written_at = time.monotonic()  # when a message was last written
        self._in_hand = 0  # messages of the batch being written
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

    @property
    def holding(self) -> bool:
        """MLflow cannot be reached: what is queued waits for it."""
        return self._holding

    def backlog(self) -> int:
        """Messages queued and not written yet (the batch being written among them)."""
        return self._queue.qsize() + len(self._backlog) + self._in_hand

    @property
    def spilled(self) -> int:
        """Messages that waited in the backlog's file, so far."""
        return self._backlog.spilled_total

    def put(self, message: Message) -> None:
        self._queue.put(message)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything queued so far is written (or given up). True when done;
        False after ``timeout`` or, at once, while MLflow cannot be reached."""
        if not self._thread or not self._thread.is_alive():
            return True
        barrier = Barrier()
        self._queue.put(barrier)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not barrier.done.wait(0.05):
            if self._holding or (deadline is not None and time.monotonic() > deadline):
                return False
        return True

    def stop(self, timeout: float | None = None) -> None:
        """Writes what is pending, for as long as MLflow takes writes: it gives up after
        ``timeout`` seconds (default: the policy's ``close_timeout_s``) in which nothing was
        written, and records what is left as not logged, without trying it."""
        if self._thread is None:
            return
        self._queue.put(Stop())
        limit = self.calls.policy.close_timeout_s if timeout is None else timeout
        self._written_at = time.monotonic()
        while self._thread.is_alive() and time.monotonic() - self._written_at < limit:
            self._thread.join(min(1.0, limit))
        if self._thread.is_alive():
            self.calls.abandon()
            self._wake.set()
            self._thread.join(10.0)

    def run_id_of(self, trial_id: str) -> str | None:
        """A trial's child run: created or reopened in this session, or made by an earlier one."""
        with self._lock:
            return self.run_ids.get(trial_id) or self.earlier_runs.get(trial_id)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        probe_s = 0.0
        try:
            while True:
                self._take(block=not self._backlog and not self._holding)
                if self._holding:
                    probe_s = min(MAX_PROBE_INTERVAL_S, max(1.0, 2 * probe_s))
                    self._wait(probe_s)
                elif isinstance(self._backlog.peek(), (Metrics, Admitted)) and self.flush_interval_s > 0:
                    self._wait(self.flush_interval_s)
                if self.calls.abandoned:
                    self._give_up()
                    return
                waiting = len(self._backlog)
                items = [self._backlog.popleft() for _ in range(min(self.max_batch, waiting))]
                self._in_hand = len(items)
                try:
                    rest = self._process(items)
                except Exception as err:  # never let the thread die silently
                    logger.warning("MLflow logging thread: unexpected error %s", short_error(err))
                    rest = []
                self._in_hand = 0
                if rest:
                    self._backlog.put_back(rest)
                    self._holding = True
                    continue
                if self._holding:
                    logger.warning("MLflow at %s answers again: writing the %d messages that waited",
                                   self.calls.tracking_uri, waiting)
                self._holding, probe_s = False, 0.0
                if any(isinstance(m, Stop) for m in items):
                    return
        finally:
            self._backlog.close()

    def _take(self, block: bool, timeout: float | None = None) -> None:
        """Moves what is queued into the backlog (waiting for a first message if ``block``)."""
        try:
            if block:
                self._backlog.append(self._queue.get(timeout=timeout))
            while True:
                self._backlog.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        self.peak_backlog = max(self.peak_backlog, len(self._backlog))

    def _wait(self, seconds: float) -> None:
        """Waits ``seconds`` (less when the writer is abandoned), taking what is queued."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self.calls.abandoned:
            self._wake.wait(min(left, 0.25))
            self._take(block=False)

    def _give_up(self) -> None:
        """Records everything that waits as not logged (the sweep ended, MLflow stayed away)."""
        self._take(block=False)
        while self._backlog:
            item = self._backlog.popleft()
            if isinstance(item, Barrier):
                item.done.set()
            elif not isinstance(item, Stop):
                for what, detail in _unwritten(item):
                    self.calls.record(what, getattr(item, "trial_id", None), detail,
                                      "not written: the sweep ended before MLflow answered again")

    def _call(self, what: str, trial_id: str | None, detail: str, fn, *, retry_fn=None) -> tuple[bool, Any]:
        """A retried call whose failure for want of MLflow raises :class:`Unavailable`."""
        return self.calls.call(what, trial_id, detail, fn, retry_fn=retry_fn, hold=True)

    def _process(self, items: list[_Item]) -> list[_Item]:
        """Writes ``items`` in order; returns those not written because MLflow cannot be
        reached (the one that failed first), to be tried again."""
        pending: dict[str, list] = defaultdict(list)  # trial_id -> admitted rows (Metric)
        for i, msg in enumerate(items):
            try:
                self._handle(msg, pending)
            except Unavailable as err:
                return _held(msg, err, pending, items[i + 1:])
            except Exception as err:  # a bug here must not stop the logging of the rest
                self.calls.record(msg.what, getattr(msg, "trial_id", None),
                                  "internal error of the MLflow callback", short_error(err))
            if isinstance(msg, Barrier):
                msg.done.set()
            self._written_at = time.monotonic()
        try:
            self._flush(pending)
        except Unavailable as err:
            return _held(None, err, pending, [])
        except Exception as err:
            self.calls.record("metrics", None, "internal error of the MLflow callback", short_error(err))
        return []

    def _handle(self, msg: _Item, pending: dict[str, list]) -> None:
        match msg:
            case Metrics():
                self._add_metrics(pending, msg)
            case Admitted():
                pending[msg.trial_id].extend(msg.rows)
            case StartRun():
                self._flush({msg.trial_id: pending.pop(msg.trial_id, [])})
                self._start_run(msg)
            case Tags():
                self._add_tags(pending, msg.trial_id, msg.tags)
            case EndRun():
                self._end_run(msg, pending)
            case Summary():
                self._flush(pending)
                self._log_summary(msg.summary, msg.timestamp_ms)
            case EndParent():
                self._flush(pending)
                self._end_parent(msg.status)
            case Barrier() | Stop():
                self._flush(pending)

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
            tried = trial_id in self._tried
            self._tried.add(trial_id)
            ok, run_id = self._call("child run", trial_id, f"child run of trial {msg.name}",
                                    find_or_create if tried else create, retry_fn=find_or_create)
            if not ok:
                return
        else:
            self._call("status", trial_id, f"status RUNNING of trial {msg.name}",
                            lambda: self.client.update_run(run_id, status="RUNNING"))
        with self._lock:
            self.run_ids[trial_id] = run_id
        logged: Mapping[str, str] = {}
        if earlier:
            # A resumed run: keep what it holds. (A restored trial's config went through JSON,
            # so some values print differently; MLflow refuses to change a param.)
            ok, run = self._call("params", trial_id, "params already logged (resume)",
                                 lambda: self.client.get_run(run_id))
            if ok:
                logged = run.data.params
                self.replayed_steps[trial_id] = int(run.data.tags.get(names.REPLAYED_STEPS, 0))
            if ok and trial_id not in self._logged:
                ok, steps = self._call("metrics", trial_id, "steps already logged (resume)",
                                       lambda: highest_steps(self.client, run_id, run.data.metrics))
                if ok:
                    self._logged.learn(trial_id, steps)
        self.calls.log_params(run_id, trial_id, {k: v for k, v in msg.params.items() if k not in logged},
                              hold=True)

    def _add_metrics(self, pending: dict[str, list], msg: Metrics) -> None:
        if msg.trial_id not in self.run_ids:
            self.calls.record("metrics", msg.trial_id,
                              f"step {msg.step}: {len(msg.values)} values (no child run)",
                              "the child run could not be created")
            return
        from mlflow.entities import Metric

        values, replayed = self._logged.admit(msg.trial_id, msg.step, msg.values)
        self.replayed_steps[msg.trial_id] += replayed
        pending[msg.trial_id] += [Metric(k, v, msg.timestamp_ms, msg.step) for k, v in values.items()]

    def _add_tags(self, pending: dict[str, list], trial_id: str, tags: Mapping[str, str]) -> None:
        if trial_id not in self.run_ids:
            self.calls.record("tags", trial_id, f"tags {sorted(tags)} (no child run)",
                              "the child run could not be created")
            return
        from mlflow.entities import RunTag

        pending[trial_id] += [RunTag(k, v) for k, v in tag_values(tags).items()]

    def _flush(self, pending: dict[str, list]) -> None:
        """Writes each trial's admitted metric rows and its tags (the last value of each), both
        in the same ``log_batch`` calls; :class:`_RowsUnavailable` from the call MLflow went
        away on."""
        from mlflow.entities import Metric, RunTag

        for trial_id in list(pending):
            rows = pending.pop(trial_id)
            if self.replayed_steps.get(trial_id) and rows:
                rows.append(RunTag(names.REPLAYED_STEPS, str(self.replayed_steps[trial_id])))
            if not rows:
                continue
            run_id = self.run_ids[trial_id]
            metrics = [r for r in rows if isinstance(r, Metric)]
            tags = list({r.key: r for r in rows if isinstance(r, RunTag)}.values())
            while metrics or tags:
                t, tags = tags[:MAX_TAGS_PER_BATCH], tags[MAX_TAGS_PER_BATCH:]
                size = MAX_METRICS_PER_BATCH - len(t)
                m, metrics = metrics[:size], metrics[size:]
                detail = ", ".join(part for part in (
                    f"{_steps(row.step for row in m)}: {len(m)} values" if m else "",
                    f"tags {sorted(tag.key for tag in t)}" if t else "") if part)
                try:
                    self._call("metrics" if m else "tags", trial_id, detail,
                               lambda m=m, t=t: self.client.log_batch(run_id, metrics=m, tags=t))
                except Unavailable as err:
                    raise _RowsUnavailable(err, trial_id, m + metrics + t + tags) from err

    def _end_run(self, msg: EndRun, pending: dict[str, list]) -> None:
        run_id = self.run_ids.get(msg.trial_id)
        if run_id is None:
            self.calls.record("status", msg.trial_id, f"status {msg.status} (no child run)",
                              "the child run could not be created")
            return
        tags = {names.NUM_FAILURES: str(msg.num_failures)}
        if msg.error:
            tags[names.ERROR] = msg.error[-MAX_TAG_VALUE:]
        self._add_tags(pending, msg.trial_id, tags)
        self._flush({msg.trial_id: pending.pop(msg.trial_id)})
        if msg.checkpoint is not None:
            self._log_checkpoint(msg.trial_id, run_id, msg.checkpoint, msg.root_files)
        self._call("status", msg.trial_id, f"status {msg.status}",
                   lambda: mlflow_internals.set_terminated(self.client, run_id, msg.status))

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

        self._call("artifact", trial_id, f"final checkpoint {path}", upload)

    def _end_parent(self, status: str) -> None:
        self._call("status", None, f"parent status {status}",
                   lambda: self.client.set_terminated(self.parent_run_id, status=status))

    def _log_summary(self, summary: Mapping[str, Any], timestamp_ms: int) -> None:
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
                metrics.append(Metric(sanitize_key(f"best/{metric}"), float(best["value"]), timestamp_ms, 0))
        text = json.dumps(dict(summary, run_ids={**self.earlier_runs, **self.run_ids},
                               parent_run_id=self.parent_run_id), indent=2, default=str)
        self._call("tags", None, "best trial of the sweep",
                   lambda: self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags))
        self._call("artifact", None, "summary.json",
                   lambda: self.client.log_text(self.parent_run_id, text, "summary.json"))


class _RowsUnavailable(Unavailable):
    """MLflow went away while a trial's metric rows were written: ``rows`` from the batch that
    failed on (which may have been written)."""

    def __init__(self, error: Unavailable, trial_id: str, rows: list):
        super().__init__(str(error))
        self.trial_id, self.rows = trial_id, rows


def _held(msg: _Item | None, error: Unavailable, pending: Mapping[str, list], rest: list[_Item]) -> list[_Item]:
    """What goes back to the backlog when MLflow went away while ``msg`` was written: the rows
    of the batch that failed (or ``msg`` itself), the other admitted rows, ``msg``, ``rest``.
    A trial's rows keep their order and come before its later messages; rows of different
    trials need no order between them."""
    head: list[_Item] = []
    if isinstance(error, _RowsUnavailable):
        head.append(Admitted(error.trial_id, tuple(error.rows)))
        if isinstance(msg, Admitted):  # its rows are those
            msg = None
    head += [Admitted(t, tuple(rows)) for t, rows in pending.items() if rows]
    return head + ([msg] if msg is not None else []) + rest


def _steps(steps) -> str:
    steps = sorted(set(steps))
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def _unwritten(item: _Item) -> list[tuple[str, str]]:
    """(what, detail) of each write a backlog item holds, for the not-logged record."""
    match item:
        case Metrics():
            return [("metrics", f"{_steps([item.step])}: {len(item.values)} values")]
        case Admitted():
            steps = [row.step for row in item.rows if hasattr(row, "step")]
            tags = sorted(row.key for row in item.rows if not hasattr(row, "step"))
            return ([("metrics", f"{_steps(steps)}: {len(steps)} values")] if steps else []) + (
                [("tags", f"tags {tags}")] if tags else [])
        case StartRun():
            return [("child run", f"child run of trial {item.name}")]
        case Tags():
            return [("tags", f"tags {sorted(item.tags)}")]
        case EndRun():
            checkpoint = getattr(item.checkpoint, "path", None)
            return ([("artifact", f"final checkpoint {checkpoint}")] if checkpoint else []) + [
                ("status", f"status {item.status}")]
        case EndParent():
            return [("status", f"parent status {item.status}")]
        case _:
            return [("tags", "best trial of the sweep"), ("artifact", "summary.json")]
