"""MLflow tracking for sweeps: the tracking URI, one parent run per sweep, one nested child
run per trial, logged from the Tune driver.

Tracking URI, first that is set: the ``--tracking-uri`` flag, ``MLFLOW_TRACKING_URI``, else the
embedded default ``sqlite:///<cwd>/.haepo/mlflow.db`` (artifacts in ``<cwd>/.haepo/mlartifacts``).

:class:`MLflowSweepCallback` is a Ray Tune callback; it runs on the driver, so trials need no
MLflow access. What it writes:

- parent run (tag ``haepo.role=sweep``): the spec's params, the resolved spec as an artifact
  (``spec.yaml``, and the file as written, ``spec_source.yaml``), at the end the best trial
  (tags ``haepo.best_trial_id`` / ``haepo.best_run_id``, metric ``best/<metric>``) and
  ``summary.json``;
- one child per trial (``mlflow.parentRunId`` = the parent; tag ``haepo.trial_id``): params =
  the trial's config flattened with ``/``; metrics every training iteration with
  ``step=training_iteration`` (the keys matching :data:`DEFAULT_METRICS`, among them wall-clock
  ``time_total_s`` and env steps ``env_runners/num_env_steps_sampled_lifetime``); tags
  algorithm, env, seed, trial id/name, the trial's search values and its Ray node (ip and host
  name); the final checkpoint as artifacts under ``checkpoint/``.

Runs are found again, never duplicated: a resumed sweep finds its parent by the tag
``haepo.sweep_dir`` and every trial's child by ``haepo.trial_id``; a trial restored from a
checkpoint (retry, resume) does not log again the steps it already logged (the first values
stay; the tag ``haepo.replayed_steps`` counts the skipped ones).

Logging never raises into Tune and never blocks it: calls run on a background thread that
batches metrics; each call is retried with exponential backoff (``retries``, ``backoff_s``,
``timeout_s``; env ``HAEPO_MLFLOW_RETRIES``, ``HAEPO_MLFLOW_BACKOFF_S``,
``HAEPO_MLFLOW_TIMEOUT_S``); what still fails is recorded (:attr:`MLflowSweepCallback.not_logged`,
``mlflow_not_logged.jsonl`` in the sweep folder) and a warning says what was not logged.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import queue
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback

logger = logging.getLogger(__name__)

DEFAULT_DIR = ".haepo"
ROLE_TAG = "haepo.role"
SWEEP_DIR_TAG = "haepo.sweep_dir"
TRIAL_ID_TAG = "haepo.trial_id"
PARENT_TAG = "mlflow.parentRunId"
STEP_METRIC = "training_iteration"
# Result keys a sweep trial carried over from an earlier iteration (see haepo_ray.sweep.trainable).
CARRIED_OVER_KEY = "haepo_carried_over"

# Result keys logged every iteration (glob patterns over the "/"-flattened result).
DEFAULT_METRICS = (
    "training_iteration",
    "time_total_s",
    "time_this_iter_s",
    "num_env_steps_sampled_lifetime",
    "env_runners/num_env_steps_sampled_lifetime",
    "env_runners/num_episodes_lifetime",
    "env_runners/episode_return_mean",
    "env_runners/episode_return_min",
    "env_runners/episode_return_max",
    "env_runners/episode_len_mean",
    "env_runners/regret_per_step_mean",
    "env_runners/success_rate",
    "learners/*",
)

_MAX_PARAMS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAM_VALUE = 6000
_MAX_TAG_VALUE = 5000
_MAX_KEY = 250


# --------------------------------------------------------------------------- URI


def default_tracking_uri(cwd: str | Path | None = None, *, create: bool = True) -> str:
    """``sqlite:///<cwd>/.haepo/mlflow.db`` (creates ``.haepo/`` unless ``create=False``)."""
    root = Path(cwd or os.getcwd()).resolve() / DEFAULT_DIR
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def artifact_location_for(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: next to a SQLite store's file
    (``<db folder>/mlartifacts``; MLflow would use ``./mlruns`` of whatever the working
    directory is); None (the server's choice) for any other store."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        return (db.parent.resolve() / "mlartifacts").as_uri()
    return None


def resolve_tracking_uri(uri: str | None = None, cwd: str | Path | None = None, *,
                         create: bool = True) -> str:
    """The flag, else ``MLFLOW_TRACKING_URI``, else the embedded SQLite default."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(cwd, create=create)


# --------------------------------------------------------------------------- helpers


def flatten(data: Mapping[str, Any], prefix: str = "", sep: str = "/") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name, sep))
        else:
            out[name] = value
    return out


_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def sanitize_key(key: str) -> str:
    """A valid MLflow key (letters, digits, ``_-. /``), at most 250 characters."""
    return _BAD_KEY_CHARS.sub("_", key)[:_MAX_KEY]


def _param_value(value: Any) -> str:
    if isinstance(value, type):
        text = f"{value.__module__}.{value.__qualname__}"
    elif callable(value) and hasattr(value, "__qualname__"):
        text = f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    else:
        text = str(value)
    return text[:_MAX_PARAM_VALUE]


def _is_metric_value(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or (
        hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind in "iuf"
    )


def select_metrics(result: Mapping[str, Any], patterns: Iterable[str]) -> dict[str, float]:
    """Numeric values of the flattened ``result`` whose keys match any glob in ``patterns``,
    without the values the trainable carried over from an earlier iteration."""
    carried = set(result.get(CARRIED_OVER_KEY) or ())
    flat = flatten({k: v for k, v in result.items() if k not in ("config", CARRIED_OVER_KEY)})
    pats = list(patterns)
    out: dict[str, float] = {}
    for key, value in flat.items():
        if key in carried:
            continue
        if _is_metric_value(value) and any(fnmatch.fnmatchcase(key, p) for p in pats):
            out[sanitize_key(key)] = float(value)
    return out


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

    what: str  # "parent run", "child run", "params", "metrics", "tags", "artifact", "status"
    trial_id: str | None
    detail: str
    error: str


_ENV_SET_HERE: dict[str, str] = {}


def _set_env_default(name: str, value: str) -> None:
    """Sets ``name`` unless the user did (a value this module set earlier is replaced)."""
    current = os.environ.get(name)
    if current is None or current == _ENV_SET_HERE.get(name):
        os.environ[name] = value
        _ENV_SET_HERE[name] = value


def _permanent(err: BaseException) -> bool:
    """An MLflow error that a retry cannot fix (bad input), as opposed to the server being away."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:  # pragma: no cover
        return False
    if isinstance(err, MlflowException):
        code = getattr(err, "error_code", "")
        return code in ("INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST",
                        "INVALID_STATE", "PERMISSION_DENIED")
    return False


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    text = text.splitlines()[0] if text else text
    return text[:300]


# --------------------------------------------------------------------------- the callback


_STOP = object()


class _AlreadyRecorded(Exception):
    """A failure that was retried and recorded already: do not retry or record it again."""


class MLflowSweepCallback(Callback):
    """One MLflow parent run per sweep, one nested child per trial; see the module doc.

    Args:
        tracking_uri: where to log (see :func:`resolve_tracking_uri`).
        experiment_name: the MLflow experiment (created when missing).
        sweep_name: the parent run's name.
        sweep_dir: the sweep's Ray results folder; identifies the sweep on resume and receives
            ``mlflow_not_logged.jsonl``.
        resume: look for the parent and children of an earlier run of this sweep first.
        parent_params / parent_tags: logged on the parent.
        spec_yaml / spec_source: texts logged as the parent's ``spec.yaml`` / ``spec_source.yaml``.
        trial_tags: static tags for every child (algorithm, env, ...).
        metric, mode: what "best" means for the parent's summary.
        metrics: glob patterns of result keys to log (default :data:`DEFAULT_METRICS`).
        config_metrics: config keys logged as ``config/<key>`` metrics every iteration
            (the values Population Based Training mutates).
        log_checkpoints: upload each trial's final checkpoint.
        retries, backoff_s, timeout_s: per call: retries after the first attempt, first backoff
            (doubles each retry), HTTP timeout; defaults from ``HAEPO_MLFLOW_RETRIES`` (3),
            ``HAEPO_MLFLOW_BACKOFF_S`` (1.0), ``HAEPO_MLFLOW_TIMEOUT_S`` (30).
        flush_interval_s: how long the logging thread gathers metrics before writing them.
        close_timeout_s: how long the end of the sweep waits for pending logging.
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        sweep_name: str,
        *,
        sweep_dir: str | Path | None = None,
        resume: bool = False,
        parent_params: Mapping[str, Any] | None = None,
        parent_tags: Mapping[str, str] | None = None,
        spec_yaml: str | None = None,
        spec_source: str | None = None,
        trial_tags: Mapping[str, str] | None = None,
        metric: str | None = None,
        mode: str = "max",
        metrics: Iterable[str] | None = None,
        config_metrics: Iterable[str] = (),
        log_checkpoints: bool = True,
        retries: int | None = None,
        backoff_s: float | None = None,
        timeout_s: float | None = None,
        flush_interval_s: float = 0.5,
        close_timeout_s: float = 120.0,
        artifact_location: str | None = None,
    ):
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.sweep_name = sweep_name
        self.sweep_dir = str(sweep_dir) if sweep_dir is not None else None
        self.resume = resume
        self.parent_params = dict(parent_params or {})
        self.parent_tags = dict(parent_tags or {})
        self.spec_yaml = spec_yaml
        self.spec_source = spec_source
        self.trial_tags = dict(trial_tags or {})
        self.metric = metric
        self.mode = mode
        self.metric_patterns = tuple(metrics) if metrics else DEFAULT_METRICS
        self.config_metrics = tuple(config_metrics)
        self.log_checkpoints = log_checkpoints
        self.retries = int(retries if retries is not None else _env_number("HAEPO_MLFLOW_RETRIES", 3))
        self.backoff_s = float(backoff_s if backoff_s is not None else _env_number("HAEPO_MLFLOW_BACKOFF_S", 1.0))
        self.timeout_s = float(timeout_s if timeout_s is not None else _env_number("HAEPO_MLFLOW_TIMEOUT_S", 30.0))
        self.flush_interval_s = flush_interval_s
        self.close_timeout_s = close_timeout_s
        self.artifact_location = artifact_location

        self.client = None
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.run_ids: dict[str, str] = {}  # trial_id -> child run id
        self.not_logged: list[NotLogged] = []
        self.replayed_steps: Counter[str] = Counter()
        self._existing_children: dict[str, str] = {}
        self._existing_status: dict[str, str] = {}
        self._reconciled = False
        self._last_step: dict[str, int] = {}
        self._node: dict[str, tuple[str, str]] = {}
        self._started_trials: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._down = False
        self._consecutive_failures = 0
        self._abandon = False
        self._closed = False
        self._started = False

    # Tune pickles its callbacks into tuner.pkl: keep only the settings, never the live state.
    _SETTINGS = ("tracking_uri", "experiment_name", "sweep_name", "sweep_dir", "resume",
                 "parent_params", "parent_tags", "spec_yaml", "spec_source", "trial_tags", "metric",
                 "mode", "config_metrics", "log_checkpoints", "retries", "backoff_s", "timeout_s",
                 "flush_interval_s", "close_timeout_s", "artifact_location")

    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in self._SETTINGS}
        state["metrics"] = self.metric_patterns
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.__init__(state.pop("tracking_uri"), state.pop("experiment_name"), state.pop("sweep_name"), **state)

    # ------------------------------------------------------------------ set-up

    def start(self) -> str | None:
        """Connects, finds or creates the experiment and the parent run; starts the logging
        thread. Returns the parent run id, or None when MLflow cannot be reached (then nothing
        is logged and the sweep goes on). Idempotent."""
        if self._started:
            return self.parent_run_id
        self._started = True
        # Our own retry loop does the retrying; MLflow's HTTP client should fail fast (unless
        # the user set these variables).
        _set_env_default("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        _set_env_default("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(math.ceil(self.timeout_s)))))
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        ok, exp_id = self._call("experiment", None, f"experiment {self.experiment_name!r}",
                                self._get_or_create_experiment)
        if ok:
            self.experiment_id = exp_id
            try:
                ok, run_id = self._call("parent run", None, f"parent run of {self.sweep_name!r}",
                                        self._find_or_create_parent)
            except _AlreadyRecorded:
                ok = False
            if ok:
                self.parent_run_id = run_id
        if self.parent_run_id is None:
            logger.warning(
                "MLflow at %s cannot be reached: this sweep runs without tracking "
                "(nothing will be logged to MLflow)", self.tracking_uri,
            )
            self._write_not_logged()
            return None
        self._thread = threading.Thread(target=self._worker, name="haepo-mlflow", daemon=True)
        self._thread.start()
        return self.parent_run_id

    def _get_or_create_experiment(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        try:
            return self.client.create_experiment(self.experiment_name, artifact_location=self.artifact_location)
        except Exception:
            exp = self.client.get_experiment_by_name(self.experiment_name)
            if exp is None:
                raise
            return exp.experiment_id

    def _search(self, filter_string: str) -> list:
        return search_all_runs(self.client, self.experiment_id, filter_string)

    def _find_parent(self) -> str | None:
        if self.sweep_dir is None:
            return None
        runs = self._search(f"tags.`{ROLE_TAG}` = 'sweep' and tags.`{SWEEP_DIR_TAG}` = '{_q(self.sweep_dir)}'")
        if not runs:
            return None
        runs.sort(key=lambda r: r.info.start_time or 0)
        return runs[0].info.run_id

    def _find_or_create_parent(self) -> str:
        run_id = self._find_parent() if self.resume else None
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            for run in self._search(f"tags.`{PARENT_TAG}` = '{run_id}'"):
                trial_id = run.data.tags.get(TRIAL_ID_TAG)
                if trial_id and trial_id not in self._existing_children:
                    self._existing_children[trial_id] = run.info.run_id
                    self._existing_status[trial_id] = run.info.status
            logger.info("MLflow: resuming parent run %s (%d child runs)", run_id, len(self._existing_children))
            return run_id
        tags = {ROLE_TAG: "sweep", "haepo.sweep": self.sweep_name, **self.parent_tags}
        if self.sweep_dir is not None:
            tags[SWEEP_DIR_TAG] = self.sweep_dir

        def create() -> str:
            return self.client.create_run(self.experiment_id, tags=_tags(tags), run_name=self.sweep_name).info.run_id

        def find_or_create() -> str:  # a retry must not create a second parent
            return self._find_parent() or create()

        ok, run_id = self._call("parent run", None, f"parent run of {self.sweep_name!r}", create,
                                retry_fn=find_or_create)
        if not ok:
            raise _AlreadyRecorded()
        from mlflow.entities import Param

        params = [Param(sanitize_key(k), _param_value(v)) for k, v in flatten(self.parent_params).items()]
        for i in range(0, len(params), _MAX_PARAMS_PER_BATCH):
            chunk = params[i:i + _MAX_PARAMS_PER_BATCH]
            self._call("params", None, f"{len(chunk)} params of the parent run",
                       lambda c=chunk: self.client.log_batch(run_id, params=c))
        for text, name in ((self.spec_yaml, "spec.yaml"), (self.spec_source, "spec_source.yaml")):
            if text:
                self._call("artifact", None, name, lambda t=text, n=name: self.client.log_text(run_id, t, n))
        return run_id

    # ------------------------------------------------------------------ Tune hooks (driver)

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.start()

    def on_step_begin(self, iteration, trials, **info):
        if self.resume and not self._reconciled and self._active():
            self._reconciled = True
            self._reconcile(trials)

    def _reconcile(self, trials) -> None:
        """After a driver crash: what the old driver had queued but not written is recovered
        from each trial's ``result.json`` (steps MLflow lacks), and trials that had finished
        get their final status and checkpoint."""
        for trial in trials:
            status = getattr(trial, "status", "")
            if trial.trial_id not in self._existing_children and status not in ("TERMINATED", "ERROR"):
                continue  # not started before the crash: its run is created when it starts
            if self._existing_status.get(trial.trial_id) in ("FINISHED", "FAILED"):
                continue  # its end was written, so was everything queued before it
            self._enqueue_start(trial)
            for row in _read_results(trial):
                step = int(row.get(STEP_METRIC, 0) or 0)
                ts = int(float(row.get("timestamp", time.time())) * 1000)
                self._queue.put(("metrics", trial.trial_id, (step, ts, select_metrics(row, self.metric_patterns))))
            logged = self._existing_status.get(trial.trial_id)
            if status == "TERMINATED" and logged != "FINISHED":
                self._queue.put(("end", trial.trial_id, ("FINISHED", self._checkpoint_of(trial), None,
                                                         trial.num_failures)))
            elif status == "ERROR" and logged != "FAILED":
                self._queue.put(("end", trial.trial_id, ("FAILED", self._checkpoint_of(trial), None,
                                                         trial.num_failures)))

    def on_trial_start(self, iteration, trials, trial, **info):
        self._enqueue_start(trial)

    def on_trial_restore(self, iteration, trials, trial, **info):
        self._enqueue_start(trial)

    def on_trial_recover(self, iteration, trials, trial, **info):
        if self._active():
            self._enqueue_start(trial)
            self._queue.put(("tags", trial.trial_id, {"haepo.num_failures": str(trial.num_failures)}))
        logger.warning("trial %s failed (failure %d); Tune retries it from its last checkpoint",
                       trial.trial_id, trial.num_failures)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self._active():
            return
        self._enqueue_start(trial)
        step = int(result.get(STEP_METRIC, 0) or 0)
        values = select_metrics(result, self.metric_patterns)
        config = result.get("config") or trial.config or {}
        for key in self.config_metrics:
            value = config.get(key)
            if _is_metric_value(value):
                values[sanitize_key(f"config/{key}")] = float(value)
        self._queue.put(("metrics", trial.trial_id, (step, int(time.time() * 1000), values)))
        node = (str(result.get("node_ip", "")), str(result.get("hostname", "")))
        if self._node.get(trial.trial_id) != node:
            self._node[trial.trial_id] = node
            self._queue.put(("tags", trial.trial_id, {"haepo.node_ip": node[0], "haepo.hostname": node[1]}))

    def on_trial_complete(self, iteration, trials, trial, **info):
        if self._active():
            self._enqueue_start(trial)
            self._queue.put(("end", trial.trial_id, ("FINISHED", self._checkpoint_of(trial), None,
                                                     trial.num_failures)))

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
            self._queue.put(("end", trial.trial_id, ("FAILED", self._checkpoint_of(trial), error,
                                                     trial.num_failures)))

    def on_experiment_end(self, trials, **info):
        statuses = [getattr(t, "status", "") for t in trials]
        status = "FAILED" if any(s == "ERROR" for s in statuses) else (
            "FINISHED" if all(s == "TERMINATED" for s in statuses) else "KILLED")
        self.close(status=status, trials=trials)

    def run_id_of(self, trial_id: str) -> str | None:
        """The child run of a trial: created or found in this session, or (on resume) by an
        earlier one."""
        return self.run_ids.get(trial_id) or self._existing_children.get(trial_id)

    # ------------------------------------------------------------------ end

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything queued so far is written (or given up). True when done."""
        if not self._thread or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._queue.put(("barrier", None, done))
        return done.wait(timeout)

    def close(self, status: str = "FINISHED", trials: Iterable[Any] | None = None) -> None:
        """Writes what is pending (waiting at most ``close_timeout_s``), the best trial, the
        parent's status; warns about anything not logged. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            if trials is not None:
                self._queue.put(("summary", None, summarize_trials(trials, self.metric, self.mode)))
            self._queue.put(("parent_end", None, status))
            self._queue.put((_STOP, None, None))
            self._thread.join(self.close_timeout_s)
            if self._thread.is_alive():
                self._abandon = True  # record the rest as not logged, quickly
                self._thread.join(10.0)
        self._write_not_logged()

    def not_logged_summary(self) -> str:
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
        path = self._not_logged_path()
        if path:
            lines.append(f"  full list: {path}")
        return "\n".join(lines)

    def _not_logged_path(self) -> str | None:
        return os.path.join(self.sweep_dir, "mlflow_not_logged.jsonl") if self.sweep_dir else None

    def _write_not_logged(self) -> None:
        if not self.not_logged:
            return
        path = self._not_logged_path()
        if path and "://" not in path:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "a") as fh:
                    for item in self.not_logged:
                        fh.write(json.dumps(asdict(item)) + "\n")
            except OSError as err:
                logger.warning("cannot write %s: %s", path, err)
        logger.warning(self.not_logged_summary())

    # ------------------------------------------------------------------ queueing (driver)

    def _active(self) -> bool:
        if not self._started:
            self.start()
        return self._thread is not None and not self._closed

    def _enqueue_start(self, trial) -> None:
        if not self._active() or trial.trial_id in self._started_trials:
            return
        self._started_trials.add(trial.trial_id)
        config = dict(trial.config or {})
        tags = {
            ROLE_TAG: "trial",
            TRIAL_ID_TAG: trial.trial_id,
            "haepo.trial_name": str(trial),
            "haepo.sweep": self.sweep_name,
            **self.trial_tags,
        }
        if "seed" in config:
            tags["haepo.seed"] = str(config["seed"])
        evaluated = getattr(trial, "evaluated_params", None) or {}
        if evaluated:
            tags["haepo.search_values"] = json.dumps(
                {str(k): v for k, v in evaluated.items()}, default=str, sort_keys=True)
        params = {sanitize_key(k): _param_value(v) for k, v in flatten(config).items()}
        self._queue.put(("start", trial.trial_id, (str(trial), tags, params)))

    @staticmethod
    def _checkpoint_of(trial) -> Any:
        try:
            return trial.checkpoint
        except Exception:  # pragma: no cover - Tune internals
            return None

    # ------------------------------------------------------------------ worker thread

    def _worker(self) -> None:
        while True:
            first = self._queue.get()
            items = [first]
            if first[0] == "metrics" and self.flush_interval_s > 0:
                time.sleep(self.flush_interval_s)
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = False
            try:
                stop = self._process(items)
            except Exception as err:  # never let the thread die silently
                logger.warning("MLflow logging thread: unexpected error %s", _short(err))
            if stop:
                return

    def _process(self, items: list) -> bool:
        pending: dict[str, list] = defaultdict(list)
        stop = False
        for kind, trial_id, payload in items:
            if kind is _STOP:
                stop = True
                continue
            try:
                if kind == "barrier":
                    self._flush_metrics(pending)
                elif kind == "metrics":
                    self._add_metrics(pending, trial_id, payload)
                else:
                    if trial_id is not None and pending.get(trial_id):
                        self._flush_metrics({trial_id: pending.pop(trial_id)})
                    else:
                        self._flush_metrics(pending)
                    getattr(self, f"_do_{kind}")(trial_id, payload)
            except Exception as err:  # a bug here must not stop the logging of the rest
                self._record(kind, trial_id, "internal error of the MLflow callback", _short(err))
            finally:
                if kind == "barrier":
                    payload.set()
        try:
            self._flush_metrics(pending)
        except Exception as err:
            self._record("metrics", None, "internal error of the MLflow callback", _short(err))
        return stop

    def _call(self, what: str, trial_id: str | None, detail: str, fn, *args, retry_fn=None):
        """Runs ``fn`` with retries; on final failure records it and returns (False, None)."""
        if self._abandon:
            self._record(what, trial_id, detail, "not attempted: sweep ended before MLflow answered")
            return False, None
        attempts = 1 if self._down else self.retries + 1
        error: BaseException | None = None
        for attempt in range(attempts):
            try:
                value = (retry_fn if attempt and retry_fn else fn)(*args)
            except _AlreadyRecorded:
                raise
            except Exception as err:  # noqa: BLE001 - every failure is handled the same way
                error = err
                if _permanent(err):
                    break
                if attempt + 1 < attempts and not self._abandon:
                    time.sleep(self.backoff_s * (2 ** attempt))
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
        self._record(what, trial_id, detail, _short(error))
        return False, None

    def _record(self, what: str, trial_id: str | None, detail: str, error: str) -> None:
        item = NotLogged(what, trial_id, detail, error)
        with self._lock:
            self.not_logged.append(item)
        if len(self.not_logged) <= 3 or len(self.not_logged) % 100 == 0:
            logger.warning("MLflow: not logged: %s%s: %s (%s)", what,
                           f" [trial {trial_id}]" if trial_id else "", detail, error)

    # ---- operations (worker thread)

    def _find_child(self, trial_id: str) -> str | None:
        runs = self._search(f"tags.`{PARENT_TAG}` = '{self.parent_run_id}' and "
                            f"tags.`{TRIAL_ID_TAG}` = '{_q(trial_id)}'")
        return runs[0].info.run_id if runs else None

    def _do_start(self, trial_id: str, payload) -> None:
        name, tags, params = payload
        run_id = self.run_ids.get(trial_id) or self._existing_children.get(trial_id)
        existing = run_id is not None

        def create() -> str:
            run = self.client.create_run(
                self.experiment_id, tags=_tags({PARENT_TAG: self.parent_run_id, **tags}), run_name=name)
            return run.info.run_id

        def find_or_create() -> str:  # a retry must not create a second run
            return self._find_child(trial_id) or create()

        if run_id is None:
            ok, run_id = self._call("child run", trial_id, f"child run of trial {name}", create,
                                    retry_fn=find_or_create)
            if not ok:
                return
        else:
            self._call("status", trial_id, f"status RUNNING of trial {name}",
                       lambda: self.client.update_run(run_id, status="RUNNING"))
        with self._lock:
            self.run_ids[trial_id] = run_id
        logged_params: dict[str, str] = {}
        if existing:
            # A resumed run: keep what it holds. (A restored trial's config went through JSON,
            # so some values print differently; MLflow refuses to change a param.)
            ok, run = self._call("params", trial_id, "params already logged (resume)",
                                 lambda: self.client.get_run(run_id))
            if ok:
                logged_params = dict(run.data.params)
            if trial_id not in self._last_step:
                ok, history = self._call("metrics", trial_id, "history of training_iteration (resume)",
                                         lambda: self.client.get_metric_history(run_id, STEP_METRIC))
                if ok and history:
                    self._last_step[trial_id] = max(m.step for m in history)
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items()) if k not in logged_params]
        for i in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            chunk = items[i:i + _MAX_PARAMS_PER_BATCH]
            self._call("params", trial_id, f"{len(chunk)} params ({chunk[0].key} ...)",
                       lambda c=chunk: self.client.log_batch(run_id, params=c))

    def _add_metrics(self, pending: dict[str, list], trial_id: str, payload) -> None:
        step, ts, values = payload
        if trial_id not in self.run_ids:
            self._record("metrics", trial_id, f"step {step}: {len(values)} values (no child run)",
                         "the child run could not be created")
            return
        last = self._last_step.get(trial_id)
        if last is not None and step <= last:
            self.replayed_steps[trial_id] += 1
            return
        self._last_step[trial_id] = step
        pending[trial_id].append((step, ts, values))

    def _flush_metrics(self, pending: dict[str, list]) -> None:
        from mlflow.entities import Metric

        for trial_id in list(pending):
            rows = pending.pop(trial_id)
            if not rows:
                continue
            run_id = self.run_ids[trial_id]
            metrics = [Metric(k, v, ts, step) for step, ts, values in rows for k, v in values.items()]
            for i in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
                chunk = metrics[i:i + _MAX_METRICS_PER_BATCH]
                steps = sorted({m.step for m in chunk})
                self._call("metrics", trial_id,
                           f"steps {steps[0]}-{steps[-1]}: {len(chunk)} values",
                           lambda c=chunk: self.client.log_batch(run_id, metrics=c))
            if self.replayed_steps.get(trial_id):
                self._do_tags(trial_id, {"haepo.replayed_steps": str(self.replayed_steps[trial_id])})

    def _do_tags(self, trial_id: str, tags: Mapping[str, str]) -> None:
        run_id = self.run_ids.get(trial_id)
        if run_id is None:
            self._record("tags", trial_id, f"tags {sorted(tags)} (no child run)", "the child run could not be created")
            return
        from mlflow.entities import RunTag

        self._call("tags", trial_id, f"tags {sorted(tags)}",
                   lambda: self.client.log_batch(run_id, tags=[RunTag(k, str(v)[:_MAX_TAG_VALUE])
                                                               for k, v in tags.items()]))

    def _do_end(self, trial_id: str, payload) -> None:
        status, checkpoint, error, num_failures = payload
        run_id = self.run_ids.get(trial_id)
        if run_id is None:
            self._record("status", trial_id, f"status {status} (no child run)", "the child run could not be created")
            return
        tags = {"haepo.num_failures": str(num_failures)}
        if error:
            tags["haepo.error"] = error[-_MAX_TAG_VALUE:]
        self._do_tags(trial_id, tags)
        if checkpoint is not None and self.log_checkpoints:
            self._log_checkpoint(trial_id, run_id, checkpoint)
        self._call("status", trial_id, f"status {status}",
                   lambda: self.client.set_terminated(run_id, status=status))

    def _log_checkpoint(self, trial_id: str, run_id: str, checkpoint) -> None:
        path = getattr(checkpoint, "path", None)

        def upload() -> None:
            import pyarrow.fs

            fs = getattr(checkpoint, "filesystem", None)
            if fs is None or isinstance(fs, pyarrow.fs.LocalFileSystem):
                local = path
                self.client.log_artifacts(run_id, local, artifact_path="checkpoint")
            else:
                with checkpoint.as_directory() as local:
                    self.client.log_artifacts(run_id, local, artifact_path="checkpoint")
            self.client.set_tag(run_id, "haepo.checkpoint", str(path))

        self._call("artifact", trial_id, f"final checkpoint {path}", upload)

    def _do_summary(self, trial_id: None, summary: dict) -> None:
        from mlflow.entities import Metric, RunTag

        best = summary.get("best")
        tags = [RunTag("haepo.num_trials", str(summary.get("num_trials", 0)))]
        metrics = []
        if best:
            run_id = self.run_id_of(best["trial_id"])
            tags.append(RunTag("haepo.best_trial_id", best["trial_id"]))
            if run_id:
                tags.append(RunTag("haepo.best_run_id", run_id))
            if best.get("value") is not None and self.metric:
                metrics.append(Metric(sanitize_key(f"best/{self.metric}"), float(best["value"]),
                                      int(time.time() * 1000), 0))
        summary = dict(summary, run_ids={**self._existing_children, **self.run_ids},
                       parent_run_id=self.parent_run_id)
        self._call("tags", None, "best trial of the sweep",
                   lambda: self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags))
        self._call("artifact", None, "summary.json",
                   lambda: self.client.log_text(self.parent_run_id, json.dumps(summary, indent=2, default=str),
                                                "summary.json"))

    def _do_parent_end(self, trial_id: None, status: str) -> None:
        self._call("status", None, f"parent status {status}",
                   lambda: self.client.set_terminated(self.parent_run_id, status=status))


def _read_results(trial) -> list[dict[str, Any]]:
    """The results Tune wrote for ``trial`` (``result.json``: one JSON object per line), from
    whichever of its folders (driver staging, storage) holds the most."""
    best: list[dict[str, Any]] = []
    for attr in ("local_path", "path"):
        try:
            folder = getattr(trial, attr, None)
        except Exception:  # pragma: no cover - Tune internals
            folder = None
        if not folder or "://" in str(folder):
            continue
        path = Path(folder) / "result.json"
        if not path.is_file():
            continue
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by the crash
        if len(rows) > len(best):
            best = rows
    return best


def summarize_trials(trials: Iterable[Any], metric: str | None, mode: str = "max") -> dict[str, Any]:
    """The best trial by the *last* reported value of ``metric`` (Tune's ``scope="last"``)."""
    trials = list(trials)
    rows = []
    for trial in trials:
        last = flatten(getattr(trial, "last_result", None) or {})
        value = last.get(metric) if metric else None
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            rows.append({"trial_id": trial.trial_id, "value": float(value)})
    if not rows:
        return {"num_trials": len(trials), "best": None, "metric": metric, "mode": mode}
    best = (max if mode == "max" else min)(rows, key=lambda r: r["value"])
    return {"num_trials": len(trials), "best": best, "metric": metric, "mode": mode}


def _q(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v)[:_MAX_TAG_VALUE] for k, v in tags.items()}



def find_sweep_runs(tracking_uri: str, experiment_name: str, parent_run_id: str | None = None):
    """``(parent, children)`` of a sweep in MLflow: the parent run (the newest sweep of the
    experiment unless ``parent_run_id`` is given) and its child runs, as MLflow Run objects."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        raise LookupError(f"no MLflow experiment {experiment_name!r} at {tracking_uri}")
    if parent_run_id is None:
        parents = client.search_runs([exp.experiment_id], f"tags.`{ROLE_TAG}` = 'sweep'",
                                     order_by=["attributes.start_time DESC"], max_results=1)
        if not parents:
            raise LookupError(f"no sweep in MLflow experiment {experiment_name!r}")
        parent = parents[0]
    else:
        parent = client.get_run(parent_run_id)
    return parent, search_all_runs(client, exp.experiment_id, f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")


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
