"""Writes a sweep (or one ``haepo train`` run) to MLflow on a background thread, so that
logging never blocks Tune or training, nor raises into it: the transport. What each message
does to MLflow's runs is :mod:`haepo_ray.tracking.sweep_runs`.

The driver queues typed messages (:mod:`haepo_ray.tracking.messages`: ``StartRun``,
``Metrics``, ``Tags``, ``EndRun``, ``Summary``, ``EndParent``; ``Barrier`` and ``Stop`` to wait
for and end the thread); a message's ``what`` names it in the not-logged record. The thread
moves them into its backlog (:mod:`haepo_ray.tracking.backlog`: in order, in memory up to a
bound, then in a file), gathers metrics for ``flush_interval_s`` and writes them in batches,
through retried calls (:mod:`haepo_ray.tracking.retry`).

*A tracking-server outage loses nothing.* A write that fails because MLflow cannot be reached
is not recorded as lost: it goes back to the head of the backlog with everything after it,
and the thread tries the head again, after 1, 2, 4, 8, then every 10 s, until MLflow
answers; then it writes the backlog in order. What the driver queues meanwhile waits in the
backlog, in bounded memory. A write that may have reached MLflow before its answer was lost
lands once when tried again (:mod:`~haepo_ray.tracking.sweep_runs`). Only when the sweep has
ended and MLflow stays away past the
policy's ``close_timeout_s`` is what waits recorded as not logged (a writer that is behind,
with MLflow answering, is waited for: the end gives up only after that long without a write).

A trial restored from a checkpoint (retry, resume) reports again steps it already reported,
and a resumed sweep re-reads the results its killed driver had not written: what the run
holds is not logged again (:mod:`haepo_ray.tracking.logged`; the first values stay, the tag
``haepo.replayed_steps`` counts the steps reported again, over all sessions).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping

from haepo_ray import names
from haepo_ray.tracking.backlog import DEFAULT_MAX_IN_MEMORY, Backlog
from haepo_ray.tracking.logged import LoggedSteps
from haepo_ray.tracking.messages import (
    Admitted,
    Barrier,
    EndParent,
    EndRun,
    Item,
    Message,
    Metrics,
    StartRun,
    Stop,
    Summary,
    Tags,
    unwritten,
)
from haepo_ray.tracking.retry import MLflowCalls, Unavailable, short_error
from haepo_ray.tracking.schema import tag_values
from haepo_ray.tracking.sweep_runs import RowsUnavailable, SweepRuns

__all__ = ["MAX_PROBE_INTERVAL_S", "EndParent", "EndRun", "MLflowWriter", "Metrics", "StartRun", "Summary", "Tags"]

logger = logging.getLogger(__name__)

MAX_PROBE_INTERVAL_S = 10.0


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
        self.runs = SweepRuns(calls)
        self.replayed_steps: Counter[str] = Counter()  # trial_id -> steps reported again, all sessions
        self._logged = LoggedSteps()
        # C code without a lock of Python's: a Ctrl-C's KeyboardInterrupt inside queue.Queue's put
        # could leave its lock held (CPython 3.11), and every later put, the run's end among them,
        # would wait for ever
        self._queue: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._backlog = Backlog(backlog_path, max_in_memory)
        self._holding = False  # MLflow cannot be reached: the backlog waits
        self._wake = threading.Event()
        self._written_at = time.monotonic()  # when a message was last written
        self._in_hand = 0  # messages of the batch being written
        self._thread: threading.Thread | None = None

    def start(self, experiment_id: str, parent_run_id: str | None,
              earlier_runs: Mapping[str, str] | None = None) -> None:
        """Starts the thread for the sweep's parent run (None: runs without a parent);
        ``earlier_runs`` are the child runs an earlier session of the sweep made (trial id ->
        run id)."""
        self.runs.open(experiment_id, parent_run_id, earlier_runs)
        self._thread = threading.Thread(target=self.run, name="haepo-mlflow", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

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

    def run_id_of(self, trial_id: str) -> str | None:
        """A trial's child run: created or reopened in this session, or made by an earlier one."""
        return self.runs.run_id_of(trial_id)

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

    # ------------------------------------------------------------------ the thread

    def run(self) -> None:
        """The thread's loop (:meth:`start` runs it): takes what is put and writes it, until stopped."""
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
                for what, detail in unwritten(item):
                    self.calls.record(what, getattr(item, "trial_id", None), detail,
                                      "not written: the sweep ended before MLflow answered again")

    def _process(self, items: list[Item]) -> list[Item]:
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

    def _handle(self, msg: Item, pending: dict[str, list]) -> None:
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
                self.runs.log_summary(msg.summary, msg.timestamp_ms)
            case EndParent():
                self._flush(pending)
                self.runs.end_parent(msg.status)
            case Barrier() | Stop():
                self._flush(pending)

    def _start_run(self, msg: StartRun) -> None:
        """The trial's run, and, reopened, what it holds: the steps it has, its replayed count."""
        reopened = self.runs.start_run(msg, known=msg.trial_id in self._logged)
        if reopened is not None:
            self.replayed_steps[msg.trial_id] = reopened.replayed
            if reopened.steps is not None:
                self._logged.learn(msg.trial_id, reopened.steps)

    def _without_run(self, what: str, trial_id: str, detail: str) -> bool:
        """Records a write for a trial whose run could not be created; True when so."""
        if self.runs.has_run(trial_id):
            return False
        self.calls.record(what, trial_id, f"{detail} (no child run)", "the child run could not be created")
        return True

    def _add_metrics(self, pending: dict[str, list], msg: Metrics) -> None:
        """The metric values of a step the run does not hold yet (each (run, metric, step) once)."""
        if self._without_run("metrics", msg.trial_id, f"step {msg.step}: {len(msg.values)} values"):
            return
        from mlflow.entities import Metric

        values, replayed = self._logged.admit(msg.trial_id, msg.step, msg.values)
        self.replayed_steps[msg.trial_id] += replayed
        pending[msg.trial_id] += [Metric(k, v, msg.timestamp_ms, msg.step) for k, v in values.items()]

    def _add_tags(self, pending: dict[str, list], trial_id: str, tags: Mapping[str, str]) -> None:
        if self._without_run("tags", trial_id, f"tags {sorted(tags)}"):
            return
        from mlflow.entities import RunTag

        pending[trial_id] += [RunTag(k, v) for k, v in tag_values(tags).items()]

    def _flush(self, pending: dict[str, list]) -> None:
        """Writes each trial's admitted rows, with its count of replayed steps."""
        from mlflow.entities import RunTag

        for trial_id in list(pending):
            rows = pending.pop(trial_id)
            if self.replayed_steps.get(trial_id) and rows:
                rows.append(RunTag(names.REPLAYED_STEPS, str(self.replayed_steps[trial_id])))
            if rows:
                self.runs.write_rows(trial_id, rows)

    def _end_run(self, msg: EndRun, pending: dict[str, list]) -> None:
        if self._without_run("status", msg.trial_id, f"status {msg.status}"):
            return
        self._add_tags(pending, msg.trial_id, self.runs.end_tags(msg))
        self._flush({msg.trial_id: pending.pop(msg.trial_id)})
        self.runs.end_run(msg)


def _held(msg: Item | None, error: Unavailable, pending: Mapping[str, list], rest: list[Item]) -> list[Item]:
    """What goes back to the backlog when MLflow went away while ``msg`` was written: the rows
    of the batch that failed (or ``msg`` itself), the other admitted rows, ``msg``, ``rest``.
    A trial's rows keep their order and come before its later messages; rows of different
    trials need no order between them."""
    head: list[Item] = []
    if isinstance(error, RowsUnavailable):
        head.append(Admitted(error.trial_id, tuple(error.rows)))
        if isinstance(msg, Admitted):  # its rows are those
            msg = None
    head += [Admitted(t, tuple(rows)) for t, rows in pending.items() if rows]
    return head + ([msg] if msg is not None else []) + rest
