"""MLflow calls that are retried, and the record of those that still failed.

Each call is retried with exponential backoff (:class:`RetryPolicy`); an error that a retry
cannot fix (bad input) is not retried. After two calls in a row failed for good, MLflow counts
as down: each call is then tried once until one succeeds, so that a dead server does not hold
the sweep's end for minutes. What fails is recorded (:class:`NotLogged`; appended as JSON
lines to ``not_logged_path``) and a warning says what was not logged.

A call made with ``hold=True`` (the writer's) that fails because MLflow cannot be reached
(:func:`unreachable`: no connection, a timeout, a gateway's 502/503/504, a database that does
not answer) raises :class:`Unavailable` instead of being recorded: the writer keeps what it
could not write and writes it when MLflow is back.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from haepo_ray.tracking.schema import MAX_PARAMS_PER_BATCH
from haepo_ray.uris import is_uri

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard each MLflow call is tried: ``retries`` after the first attempt, the first
    backoff (doubling each retry), the HTTP timeout of one attempt, and how long the end of
    the sweep waits without a write before it gives up on what is pending."""

    retries: int = 3
    backoff_s: float = 1.0
    timeout_s: float = 30.0
    close_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        problems = [f"{name} must be {rule}, got {value!r}" for name, value, ok, rule in (
            ("retries (HAEPO_MLFLOW_RETRIES)", self.retries, self.retries >= 0, ">= 0"),
            ("backoff_s (HAEPO_MLFLOW_BACKOFF_S)", self.backoff_s, self.backoff_s >= 0, ">= 0"),
            ("timeout_s (HAEPO_MLFLOW_TIMEOUT_S)", self.timeout_s, self.timeout_s > 0, "> 0"),
            ("close_timeout_s (HAEPO_MLFLOW_CLOSE_TIMEOUT_S)", self.close_timeout_s, self.close_timeout_s >= 0,
             ">= 0"),
        ) if not ok]
        if problems:
            raise ValueError("MLflow retry policy: " + "; ".join(problems))

    @classmethod
    def from_env(cls, retries: int | None = None, backoff_s: float | None = None,
                 timeout_s: float | None = None, close_timeout_s: float | None = None) -> RetryPolicy:
        """The given values; for those left out ``HAEPO_MLFLOW_RETRIES`` (3),
        ``HAEPO_MLFLOW_BACKOFF_S`` (1.0), ``HAEPO_MLFLOW_TIMEOUT_S`` (30),
        ``HAEPO_MLFLOW_CLOSE_TIMEOUT_S`` (120)."""
        def pick(value, env: str, default: float) -> float:
            return value if value is not None else env_number(env, default)

        return cls(retries=int(pick(retries, "HAEPO_MLFLOW_RETRIES", 3)),
                   backoff_s=float(pick(backoff_s, "HAEPO_MLFLOW_BACKOFF_S", 1.0)),
                   timeout_s=float(pick(timeout_s, "HAEPO_MLFLOW_TIMEOUT_S", 30.0)),
                   close_timeout_s=float(pick(close_timeout_s, "HAEPO_MLFLOW_CLOSE_TIMEOUT_S", 120.0)))


def env_number(name: str, default: float) -> float:
    """The number in environment variable ``name``; ``default`` where it is unset, empty or not
    a number (that with a warning)."""
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


class Unavailable(Exception):
    """MLflow could not be reached for a call made with ``hold=True``; nothing was recorded."""


_GATEWAY_STATUS = re.compile(r"error code (429|502|503|504)\b")


def unreachable(err: BaseException) -> bool:
    """The error says MLflow (its server or database) cannot be reached now, as opposed to
    an answer refusing the call: a connection error or timeout anywhere in the error's chain,
    a 429/502/503/504 answer, MLflow's ``TEMPORARILY_UNAVAILABLE``, a database's operational
    error (connection refused, database locked)."""
    import requests
    from mlflow.exceptions import MlflowException

    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                              ConnectionError, TimeoutError)):
            return True
        if type(cause).__name__ == "OperationalError":  # sqlalchemy's and the DB drivers'
            return True
        if isinstance(cause, MlflowException) and (
                getattr(cause, "error_code", "") == "TEMPORARILY_UNAVAILABLE"
                or _GATEWAY_STATUS.search(str(cause))):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def short_error(err: BaseException) -> str:
    """The first line of an error, with its type, at most 300 characters."""
    text = f"{type(err).__name__}: {err}"
    return text.splitlines()[0][:300]


class MLflowCalls:
    """The MLflow client of one sweep, whose calls are retried and whose failures are recorded.

    Args:
        tracking_uri: where to log.
        policy: how hard each call is tried.
        not_logged_path: where :meth:`write_not_logged` appends the record (None: nowhere).
    """

    def __init__(self, tracking_uri: str, policy: RetryPolicy, *, not_logged_path: str | None = None):
        self.tracking_uri = tracking_uri
        self.policy = policy
        self.not_logged_path = not_logged_path
        self.client = None
        self.not_logged: list[NotLogged] = []
        self._lock = threading.Lock()
        self._down = False
        self._consecutive_failures = 0
        self._abandoned = False

    def connect(self):
        """The MLflow client (made once). Our retry loop does the retrying, so MLflow's HTTP
        client fails fast (unless the user set its variables)."""
        if self.client is None:
            _set_env_default("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            _set_env_default("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(math.ceil(self.policy.timeout_s)))))
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.tracking_uri)
        return self.client

    def abandon(self) -> None:
        """From now on record every call as not logged, without trying it (the sweep ended
        and waited long enough)."""
        self._abandoned = True

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    @property
    def down(self) -> bool:
        """MLflow did not answer, or failed, the last calls: each call is tried once."""
        return self._down

    def call(self, what: str, trial_id: str | None, detail: str, fn: Callable[[], Any], *,
             retry_fn: Callable[[], Any] | None = None, hold: bool = False) -> tuple[bool, Any]:
        """``(True, fn())``, retrying (with ``retry_fn`` when given: a retry after an unanswered
        create must look before it creates); ``(False, None)`` when it fails for good, then
        the failure is recorded. With ``hold``, a failure because MLflow cannot be reached
        raises :class:`Unavailable` instead (MLflow then counts as down)."""
        if self._abandoned:
            self.record(what, trial_id, detail, "not attempted: sweep ended before MLflow answered")
            return False, None
        attempts = 1 if self._down else self.policy.retries + 1
        error: BaseException | None = None
        for attempt in range(attempts):
            try:
                value = (retry_fn if attempt and retry_fn else fn)()
            except Exception as err:  # noqa: BLE001 - every failure is handled the same way
                error = err
                if _permanent(err):
                    break
                if attempt + 1 < attempts and not self._abandoned:
                    time.sleep(self.policy.backoff_s * (2 ** attempt))
                continue
            if self._down and not hold:  # (the writer says it, with what waited)
                logger.warning("MLflow at %s answers again", self.tracking_uri)
            self._down = False
            self._consecutive_failures = 0
            return True, value
        assert error is not None
        if hold and unreachable(error) and not self._abandoned:
            if not self._down:
                logger.warning("MLflow at %s does not answer (%s); the sweep goes on, what is not "
                               "written waits and is written when MLflow answers again",
                               self.tracking_uri, short_error(error))
            self._down = True
            raise Unavailable(short_error(error))
        if not _permanent(error):
            self._consecutive_failures += 1
            if self._consecutive_failures >= 2 and not self._down:
                self._down = True
                logger.warning(
                    "MLflow at %s %s (%s); the sweep goes on, MLflow calls are now tried once each and what "
                    "fails is recorded", self.tracking_uri,
                    "does not answer" if unreachable(error) else "answers with errors",
                    short_error(error))
        self.record(what, trial_id, detail, short_error(error))
        return False, None

    def record(self, what: str, trial_id: str | None, detail: str, error: str) -> None:
        with self._lock:
            self.not_logged.append(NotLogged(what, trial_id, detail, error))
            count = len(self.not_logged)
        if count <= 3 or count % 100 == 0:
            logger.warning("MLflow: not logged: %s%s: %s (%s)", what,
                           f" [trial {trial_id}]" if trial_id else "", detail, error)

    def log_params(self, run_id: str, trial_id: str | None, params: Mapping[str, str], *,
                   hold: bool = False) -> None:
        """Logs ``params`` in batches of MLflow's size (``hold``: as :meth:`call`)."""
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            chunk = items[i:i + MAX_PARAMS_PER_BATCH]
            self.call("params", trial_id, f"{len(chunk)} params ({chunk[0].key} ...)",
                      lambda c=chunk: self.client.log_batch(run_id, params=c), hold=hold)

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
        if path and not is_uri(path):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "a") as fh:
                    for item in self.not_logged:
                        fh.write(json.dumps(asdict(item)) + "\n")
            except OSError as err:
                logger.warning("cannot write %s: %s", path, err)
        logger.warning(self.not_logged_summary())
