"""Writes to MLflow on a background thread, so that logging never blocks Tune nor raises into it.

The driver queues typed messages (:class:`StartRun`, :class:`Metrics`, :class:`Tags`,
:class:`EndRun`, :class:`Summary`, :class:`EndParent`; :class:`Barrier` and :class:`Stop` to
wait for and end the thread). The thread gathers metrics for ``flush_interval_s`` and writes
them in batches. Each MLflow call is retried with exponential backoff (:class:`RetryPolicy`);
after two calls in a row failed for good, MLflow counts as down and each call is tried once
until one succeeds, so a dead server does not hold the sweep's end for minutes. What still
fails is recorded (:class:`NotLogged`, ``not_logged_path`` as JSON lines) and a warning says
what was not logged.

A trial restored from a checkpoint (retry, resume) reports again steps it already reported:
those are not logged again (the first values stay; the tag ``haepo.replayed_steps`` counts
them).
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from haepo_ray import names
from haepo_ray.tracking.queries import find_trial_run
from haepo_ray.tracking.schema import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_PER_BATCH,
    MAX_TAG_VALUE,
    sanitize_key,
    tag_values,
)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- policy, record


@dataclass(frozen=True)
class RetryPolicy:
    """How hard each MLflow call is tried: ``retries`` after the first attempt, the first
    backoff (doubling each retry), the HTTP timeout of one attempt, and how long the end of
    the sweep waits for pending logging."""

    retries: int = 3
    backoff_s: float = 1.0
    timeout_s: float = 30.0
    close_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        problems = [f"{name} must be {rule}, got {value!r}" for name, value, ok, rule in (
            ("retries (HAEPO_MLFLOW_RETRIES)", self.retries, self.retries >= 0, ">= 0"),
            ("backoff_s (HAEPO_MLFLOW_BACKOFF_S)", self.backoff_s, self.backoff_s >= 0, ">= 0"),
            ("timeout_s (HAEPO_MLFLOW_TIMEOUT_S)", self.timeout_s, self.timeout_s > 0, "> 0"),
            ("close_timeout_s", self.close_timeout_s, self.close_timeout_s >= 0, ">= 0"),
        ) if not ok]
        if problems:
            raise ValueError("MLflow retry policy: " + "; ".join(problems))

    @classmethod
    def from_env(cls, retries: int | None = None, backoff_s: float | None = None,
                 timeout_s: float | None = None) -> RetryPolicy:
        """The given values; for those left out ``HAEPO_MLFLOW_RETRIES`` (3),
        ``HAEPO_MLFLOW_BACKOFF_S`` (1.0), ``HAEPO_MLFLOW_TIMEOUT_S`` (30)."""
        return cls(
            retries=int(retries if retries is not None else _env_number("HAEPO_MLFLOW_RETRIES", 3)),
            backoff_s=float(backoff_s if backoff_s is not None else _env_number("HAEPO_MLFLOW_BACKOFF_S", 1.0)),
            timeout_s=float(timeout_s if timeout_s is not None else _env_number("HAEPO_MLFLOW_TIMEOUT_S", 30.0)),
        )


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        logger.warning("ignoring %s=%r (not a number)", name, raw)
        return default


@dataclass
class NotLogged:
    """Something that could not be written to MLflow."""

    what: str  # "experiment", "parent run", "child run", "params", "metrics", "tags", "artifact", "status"
    trial_id: str | None
    detail: str
    error: str


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
    """One training iteration's metrics of a trial."""

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
    status: str  # FINISHED | FAILED
    checkpoint: Any
    error: str | None
    num_failures: int


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


_ENV_SET_HERE: dict[str, str] = {}


def _set_env_default(name: str, value: str) -> None:
    """Sets ``name`` unless the user did (a value this module set earlier is replaced)."""
    current = os.environ.get(name)
    if current is None or current == _ENV_SET_HERE.get(name):
        os.environ[name] = value
        _ENV_SET_HERE[name] = value


def _permanent(err: BaseException) -> bool:
    """An MLflow error that a retry cannot fix (bad input), as opposed to the server being away."""
    from mlflow.exceptions import MlflowException

    if isinstance(err, MlflowException):
        return getattr(err, "error_code", "") in ("INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS",
                                                  "BAD_REQUEST", "INVALID_STATE", "PERMISSION_DENIED")
    return False


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text.splitlines()[0][:300]


class MLflowWriter:
    """The MLflow client of one sweep: retried calls (also usable from the driver before the
    thread starts, for the set-up), the logging thread, and the record of what was not logged.

    Args:
        tracking_uri: where to log.
        retry: how hard each call is tried.
        not_logged_path: where :meth:`write_not_logged` appends the record (None: nowhere).
        flush_interval_s: how long the thread gathers metrics before writing them.
    """

    def __init__(self, tracking_uri: str, retry: RetryPolicy, *, not_logged_path: str | None = None,
                 flush_interval_s: float = 0.5):
        self.tracking_uri = tracking_uri
        self.retry = retry
        self.not_logged_path = not_logged_path
        self.flush_interval_s = flush_interval_s
        self.client = None
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.run_ids: dict[str, str] = {}  # trial_id -> child run id, created or reopened here
        self.earlier_runs: dict[str, str] = {}  # trial_id -> child run id of an earlier session
        self.not_logged: list[NotLogged] = []
        self.replayed_steps: Counter[str] = Counter()
        self._last_step: dict[str, int] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[Message] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._down = False
        self._consecutive_failures = 0
        self._abandon = False

    # ------------------------------------------------------------------ driver side

    def connect(self):
        """The MLflow client (made once). Our retry loop does the retrying, so MLflow's HTTP
        client fails fast (unless the user set its variables)."""
        if self.client is None:
            _set_env_default("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            _set_env_default("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(math.ceil(self.retry.timeout_s)))))
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.tracking_uri)
        return self.client

    def start(self, experiment_id: str, parent_run_id: str, earlier_runs: Mapping[str, str]) -> None:
        """Starts the logging thread for the sweep's parent run; ``earlier_runs`` are the child
        runs an earlier session of the sweep made (trial id -> run id)."""
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id
        self.earlier_runs = dict(earlier_runs)
        self._thread = threading.Thread(target=self._run, name="haepo-mlflow", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

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
        """Writes what is pending, waiting at most ``retry.close_timeout_s``; what is left
        then is recorded as not logged, without trying it."""
        if self._thread is None:
            return
        self._queue.put(Stop())
        self._thread.join(self.retry.close_timeout_s)
        if self._thread.is_alive():
            self._abandon = True
            self._thread.join(10.0)

    def run_id_of(self, trial_id: str) -> str | None:
        """A trial's child run: created or reopened in this session, or made by an earlier one."""
        return self.run_ids.get(trial_id) or self.earlier_runs.get(trial_id)

    # ------------------------------------------------------------------ calls and the record

    def call(self, what: str, trial_id: str | None, detail: str, fn: Callable[[], Any], *,
             retry_fn: Callable[[], Any] | None = None) -> tuple[bool, Any]:
        """``(True, fn())``, retrying (with ``retry_fn`` when given: a retry after an unanswered
        create must look before it creates); ``(False, None)`` when it fails for good, then
        the failure is recorded."""
        if self._abandon:
            self.record(what, trial_id, detail, "not attempted: sweep ended before MLflow answered")
            return False, None
        attempts = 1 if self._down else self.retry.retries + 1
        error: BaseException | None = None
        for attempt in range(attempts):
            try:
                value = (retry_fn if attempt and retry_fn else fn)()
            except Exception as err:  # noqa: BLE001 - every failure is handled the same way
                error = err
                if _permanent(err):
                    break
                if attempt + 1 < attempts and not self._abandon:
                    time.sleep(self.retry.backoff_s * (2 ** attempt))
                continue
            if self._down:
                logger.warning("MLflow at %s answers again", self.tracking_uri)
            self._down = False
            self._consecutive_failures = 0
            return True, value
        assert error is not None
        if not _permanent(error):
            self._consecutive_failures += 1
            if self._consecutive_failures >= 2 and not self._down:
                self._down = True
                logger.warning(
                    "MLflow at %s does not answer (%s); the sweep goes on, MLflow calls are now "
                    "tried once each and what fails is recorded", self.tracking_uri, _short(error))
        self.record(what, trial_id, detail, _short(error))
        return False, None

    def record(self, what: str, trial_id: str | None, detail: str, error: str) -> None:
        with self._lock:
            self.not_logged.append(NotLogged(what, trial_id, detail, error))
            count = len(self.not_logged)
        if count <= 3 or count % 100 == 0:
            logger.warning("MLflow: not logged: %s%s: %s (%s)", what,
                           f" [trial {trial_id}]" if trial_id else "", detail, error)

    def log_params(self, run_id: str, trial_id: str | None, params: Mapping[str, str]) -> None:
        """Logs ``params`` in batches of MLflow's size."""
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            chunk = items[i:i + MAX_PARAMS_PER_BATCH]
            self.call("params", trial_id, f"{len(chunk)} params ({chunk[0].key} ...)",
                      lambda c=chunk: self.client.log_batch(run_id, params=c))

    def not_logged_summary(self) -> str:
        """What was not logged, counted by kind, with the first 20 items ("" when nothing)."""
        if not self.not_logged:
            return ""
        counts = Counter(n.what for n in self.not_logged)
        trials = sorted({n.trial_id for n in self.not_logged if n.trial_id})
        parts = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
        lines = [f"MLflow ({self.tracking_uri}): not logged after retries: {parts}"
                 + (f"; trials: {', '.join(trials)}" if trials else "")]
        for item in self.not_logged[:20]:
            lines.append(f"  - {item.what}{f' [trial {item.trial_id}]' if item.trial_id else ''}: "
                         f"{item.detail} ({item.error})")
        if len(self.not_logged) > 20:
            lines.append(f"  ... and {len(self.not_logged) - 20} more")
        if self.not_logged_path:
            lines.append(f"  full list: {self.not_logged_path}")
        return "\n".join(lines)

    def write_not_logged(self) -> None:
        """Appends the record to ``not_logged_path`` and warns with its summary."""
        if not self.not_logged:
            return
        path = self.not_logged_path
        if path and "://" not in path:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "a") as fh:
                    for item in self.not_logged:
                        fh.write(json.dumps(asdict(item)) + "\n")
            except OSError as err:
                logger.warning("cannot write %s: %s", path, err)
        logger.warning(self.not_logged_summary())

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
                logger.warning("MLflow logging thread: unexpected error %s", _short(err))
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
                        self.call("status", None, f"parent status {msg.status}",
                                  lambda: self.client.set_terminated(self.parent_run_id, status=msg.status))
                    case Barrier() | Stop():
                        self._flush_metrics(pending)
            except Exception as err:  # a bug here must not stop the logging of the rest
                self.record(msg.what, getattr(msg, "trial_id", None), "internal error of the MLflow callback",
                            _short(err))
            finally:
                if isinstance(msg, Barrier):
                    msg.done.set()
        try:
            self._flush_metrics(pending)
        except Exception as err:
            self.record("metrics", None, "internal error of the MLflow callback", _short(err))

    def _start_run(self, msg: StartRun) -> None:
        trial_id = msg.trial_id
        run_id = self.run_id_of(trial_id)
        earlier = run_id is not None

        def create() -> str:
            tags = tag_values({names.PARENT_RUN: self.parent_run_id, **msg.tags})
            return self.client.create_run(self.experiment_id, tags=tags, run_name=msg.name).info.run_id

        def find_or_create() -> str:  # a retry must not create a second run
            return find_trial_run(self.client, self.experiment_id, self.parent_run_id, trial_id) or create()

        if run_id is None:
            ok, run_id = self.call("child run", trial_id, f"child run of trial {msg.name}", create,
                                   retry_fn=find_or_create)
            if not ok:
                return
        else:
            self.call("status", trial_id, f"status RUNNING of trial {msg.name}",
                      lambda: self.client.update_run(run_id, status="RUNNING"))
        with self._lock:
            self.run_ids[trial_id] = run_id
        logged: Mapping[str, str] = {}
        if earlier:
            # A resumed run: keep what it holds. (A restored trial's config went through JSON,
            # so some values print differently; MLflow refuses to change a param.)
            ok, run = self.call("params", trial_id, "params already logged (resume)",
                                lambda: self.client.get_run(run_id))
            if ok:
                logged = run.data.params
            if trial_id not in self._last_step:
                ok, history = self.call(
                    "metrics", trial_id, f"history of {names.TRAINING_ITERATION} (resume)",
                    lambda: self.client.get_metric_history(run_id, names.TRAINING_ITERATION))
                if ok and history:
                    self._last_step[trial_id] = max(m.step for m in history)
        self.log_params(run_id, trial_id, {k: v for k, v in msg.params.items() if k not in logged})

    def _add_metrics(self, pending: dict[str, list[Metrics]], msg: Metrics) -> None:
        if msg.trial_id not in self.run_ids:
            self.record("metrics", msg.trial_id, f"step {msg.step}: {len(msg.values)} values (no child run)",
                        "the child run could not be created")
            return
        last = self._last_step.get(msg.trial_id)
        if last is not None and msg.step <= last:
            self.replayed_steps[msg.trial_id] += 1
            return
        self._last_step[msg.trial_id] = msg.step
        pending[msg.trial_id].append(msg)

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
                self.call("metrics", trial_id, f"steps {steps[0]}-{steps[-1]}: {len(chunk)} values",
                          lambda c=chunk: self.client.log_batch(run_id, metrics=c))
            if self.replayed_steps.get(trial_id):
                self._log_tags(trial_id, {names.REPLAYED_STEPS: str(self.replayed_steps[trial_id])})

    def _log_tags(self, trial_id: str, tags: Mapping[str, str]) -> None:
        run_id = self.run_ids.get(trial_id)
        if run_id is None:
            self.record("tags", trial_id, f"tags {sorted(tags)} (no child run)", "the child run could not be created")
            return
        from mlflow.entities import RunTag

        batch = [RunTag(k, v) for k, v in tag_values(tags).items()]
        self.call("tags", trial_id, f"tags {sorted(tags)}", lambda: self.client.log_batch(run_id, tags=batch))

    def _end_run(self, msg: EndRun) -> None:
        run_id = self.run_ids.get(msg.trial_id)
        if run_id is None:
            self.record("status", msg.trial_id, f"status {msg.status} (no child run)",
                        "the child run could not be created")
            return
        tags = {names.NUM_FAILURES: str(msg.num_failures)}
        if msg.error:
            tags[names.ERROR] = msg.error[-MAX_TAG_VALUE:]
        self._log_tags(msg.trial_id, tags)
        if msg.checkpoint is not None:
            self._log_checkpoint(msg.trial_id, run_id, msg.checkpoint)
        self.call("status", msg.trial_id, f"status {msg.status}",
                  lambda: self.client.set_terminated(run_id, status=msg.status))

    def _log_checkpoint(self, trial_id: str, run_id: str, checkpoint) -> None:
        path = getattr(checkpoint, "path", None)

        def upload() -> None:
            import pyarrow.fs

            fs = getattr(checkpoint, "filesystem", None)
            if fs is None or isinstance(fs, pyarrow.fs.LocalFileSystem):
                self.client.log_artifacts(run_id, path, artifact_path="checkpoint")
            else:
                with checkpoint.as_directory() as local:
                    self.client.log_artifacts(run_id, local, artifact_path="checkpoint")
            self.client.set_tag(run_id, names.CHECKPOINT, str(path))

        self.call("artifact", trial_id, f"final checkpoint {path}", upload)

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
        self.call("tags", None, "best trial of the sweep",
                  lambda: self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags))
        self.call("artifact", None, "summary.json",
                  lambda: self.client.log_text(self.parent_run_id, text, "summary.json"))
