"""Sweeps as Ray Jobs on a running cluster: the Jobs client and the submission behind ``haepo
submit``, ``jobs``, ``logs`` and ``stop`` (their command lines: :mod:`haepo_ray.cli.jobs`).

    haepo submit SPEC --address http://HEAD:8265 [--follow] [--tracking-uri URI]
                 [--storage-path PATH] [--experiment NAME] [--resume] [--working-dir DIR]
                 [--py-modules] [--pip REQ ...] [--env KEY[=VALUE] ...] [--job-id ID]
    haepo jobs   --address http://HEAD:8265 [--all]
    haepo logs   JOB --address http://HEAD:8265 [--follow]
    haepo stop   JOB --address http://HEAD:8265 [--no-wait]

``submit`` talks to the head's Jobs API (Ray's dashboard, port 8265) with Ray's Jobs SDK. It
packages a working directory (by default a folder holding only SPEC; ``--working-dir DIR``
ships DIR instead), uploads it, and starts on the head node::

    haepo sweep <SPEC> --address auto [--tracking-uri URI] [--storage-path PATH] ...

The job's driver is that sweep: it places the trials on the workers by their resource
requests and logs to MLflow (the driver does all the MLflow logging; trials on the workers
need no MLflow access). Where the cluster lacks haepo-ray, ``--py-modules`` ships this
package's source with the job (entrypoint ``python -m haepo_ray.cli sweep ...``) and
``--pip`` installs what else is missing.

Where things go, decided on the head node:

- MLflow: ``--tracking-uri``, else this shell's ``MLFLOW_TRACKING_URI`` (both passed to the job
  as ``MLFLOW_TRACKING_URI``), else the cluster's own ``MLFLOW_TRACKING_URI`` (set on the head);
- results and checkpoints: ``--storage-path``, else the spec's ``storage_path``, else
  ``HAEPO_STORAGE_PATH`` of this shell, else ``HAEPO_STORAGE_PATH`` of the head node (the
  cluster's shared storage: NFS path or s3:// URI). A trial resumes on another node only when
  every node reaches that path;
- the patch setting: this shell's ``HAEPO_PATCHES``, where set, is the job's (its driver's and
  every actor's, through the job's runtime environment; ``--env`` overrides it).

``haepo stop`` is Ray's job stop: SIGTERM to the driver, which stops the sweep as a Ctrl-C does
(Tune saves its state, the running trials' MLflow runs and the parent end KILLED, ``--resume``
continues it), and SIGKILL :data:`STOP_WAIT_S` later if it has not ended.

Authentication (Ray token authentication), first that is set: ``--auth-token-file``,
``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``; sent as
``Authorization: Bearer <token>``. The address: ``--address``, else ``RAY_API_SERVER_ADDRESS``,
else an ``http(s)://`` ``RAY_ADDRESS``.

What the user must fix (an address, a token, a spec, the cluster's answer) is a
:class:`JobError`; the command line prints its message as a usage error.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from haepo_ray.upstream.core import job_stop_wait
from haepo_ray.upstream.declared import PATCHES_SETTING
from haepo_ray.uris import is_http_url, is_uri, unreachable
from haepo_ray.user_paths import read_text

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
CONNECT_TIMEOUT_S = 10.0
# Never shipped with --working-dir (Ray also leaves out what .gitignore files name).
WORKING_DIR_EXCLUDES = [".git", ".venv", "venv", ".haepo", "mlruns", "__pycache__", "*.egg-info",
                        ".pytest_cache", "node_modules"]
LOCAL_URI_SCHEMES = ("sqlite", "file", "")
# How long Ray's job supervisor waits after ``haepo stop``'s SIGTERM before its SIGKILL (Ray's
# default: 3 s). The sweep ends within a few seconds, and ends itself without Ray after
# haepo_ray.sweep.interrupt.SIGTERM_GRACE_S (20 s); ``--env RAY_JOB_STOP_WAIT_TIME_S=S`` overrides it.
STOP_WAIT_S = 30


class JobError(ValueError):
    """What the user must fix to reach the cluster or submit a job; the message says what."""


# --------------------------------------------------------------------------- connection


@dataclass
class Token:
    value: str
    source: str


def find_token(token_file: str | None = None, environ: Mapping[str, str] | None = None,
               home: Path | None = None) -> Token | None:
    """The Ray auth token to send: ``token_file``, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token`` (first that is set); None when there is none."""
    env = os.environ if environ is None else environ

    def read(path: str, what: str) -> Token:
        p = Path(path).expanduser()
        try:
            value = read_text(p, f"the Ray auth token {what}").strip()
        except ValueError as err:
            raise JobError(str(err)) from None
        if not value:
            raise JobError(f"the Ray auth token file {p} ({what}) is empty")
        return Token(value, f"{what} {p}")

    if token_file:
        return read(token_file, "--auth-token-file")
    if env.get("RAY_AUTH_TOKEN"):
        return Token(env["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN")
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return read(env["RAY_AUTH_TOKEN_PATH"], "$RAY_AUTH_TOKEN_PATH")
    default = (home or Path.home()) / ".ray" / "auth_token"
    if default.is_file():
        return read(str(default), "default token file")
    return None


def resolve_address(address: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``http(s)://host:port`` of the Jobs API; ``host:port`` gets ``http://``."""
    env = os.environ if environ is None else environ
    if not address:
        address = env.get("RAY_API_SERVER_ADDRESS") or ""
        ray_address = env.get("RAY_ADDRESS", "")
        if not address and is_http_url(ray_address):
            address = ray_address
    if not address:
        raise JobError("which cluster? give --address http://HEAD:8265 (the head's dashboard "
                           "port) or set RAY_API_SERVER_ADDRESS")
    address = address.strip().rstrip("/")
    if address.startswith("ray://") or address == "auto":
        raise JobError(f"--address {address}: jobs are submitted to the head's dashboard "
                           "(Jobs API), e.g. http://HEAD:8265, not to a Ray Client or GCS address")
    if not is_uri(address):
        address = f"http://{address}"
    parsed = urlparse(address)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise JobError(f"--address {address}: expected http://HOST:PORT (the head's dashboard)")
    return address


def _reach_hint(address: str) -> str:
    return (f"check the address, that the head node is up and that its dashboard port is "
            f"reachable from here (cloud cluster: `ray dashboard cluster/aws/haepo-cluster.yaml` "
            f"forwards it to http://127.0.0.1:8265; Kubernetes: `kubectl port-forward "
            f"svc/haepo-head-svc 8265:8265`; local cluster: `source <state dir>/env.sh`)")


def _check_reachable(address: str) -> None:
    """A quick TCP connect, so that an unreachable head fails in seconds, not minutes."""
    parsed = urlparse(address)
    reason = unreachable(parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80), CONNECT_TIMEOUT_S)
    if reason:
        raise JobError(f"cannot reach the Ray head at {address} ({reason}): {_reach_hint(address)}")


def _auth_message(address: str, token: Token | None, err: Exception) -> str:
    text = str(getattr(err, "message", None) or err)
    if "401" in text or "required" in text.lower() or "missing" in text.lower():
        return (f"the Ray cluster at {address} requires an authentication token and none was "
                f"sent: give the cluster's token with --auth-token-file PATH, or set "
                f"RAY_AUTH_TOKEN_PATH (see cluster/README.md, 'Tokens')")
    source = token.source if token else "no token"
    return (f"the Ray cluster at {address} refused the authentication token from {source} "
            f"(HTTP 403: wrong token for this cluster): give this cluster's token with "
            f"--auth-token-file PATH or RAY_AUTH_TOKEN_PATH (see cluster/README.md, 'Tokens')")


class JobsClient:
    """A JobSubmissionClient whose failures become JobErrors with a clear message."""

    def __init__(self, address: str | None, token_file: str | None):
        self.address = resolve_address(address)
        self.token = find_token(token_file)
        _check_reachable(self.address)
        headers = {"Authorization": f"Bearer {self.token.value}"} if self.token else None
        self.sdk = self._call(self._make, headers)

    def _make(self, headers):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address, headers=headers)

    def _call(self, fn, *args, **kwargs):
        import requests
        from ray.exceptions import AuthenticationError

        try:
            return fn(*args, **kwargs)
        except AuthenticationError as err:
            raise JobError(_auth_message(self.address, self.token, err)) from None
        except (ConnectionError, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as err:
            raise JobError(f"cannot reach the Ray Jobs API at {self.address} ({err}): "
                               f"{_reach_hint(self.address)}") from None
        except RuntimeError as err:
            text = str(err)
            if "Version check returned 404" in text:
                raise JobError(f"{self.address} answers but is not a Ray dashboard with the "
                                   f"Jobs API (is the port right? install ray[default] on the "
                                   f"head)") from None
            raise JobError(f"the Ray Jobs API at {self.address} answered: {text}") from None

    def __getattr__(self, name: str):
        method = getattr(self.sdk, name)
        return lambda *a, **kw: self._call(method, *a, **kw)


# --------------------------------------------------------------------------- submit


def _local_uri(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in LOCAL_URI_SCHEMES or len(scheme) == 1  # "C:\..." reads as scheme "c"


def _env_vars(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not key:
            raise JobError(f"--env expects KEY or KEY=VALUE, got {pair!r}")
        if not sep:
            if key not in os.environ:
                raise JobError(f"--env {key}: no value given and {key} is not set here")
            value = os.environ[key]
        out[key] = value
    return out


@dataclass(frozen=True)
class SubmitOptions:
    """What to submit and how (``haepo submit``'s options, without argparse)."""

    spec: str
    tracking_uri: str | None = None
    storage_path: str | None = None
    experiment: str | None = None
    resume: bool = False
    working_dir: str | None = None
    py_modules: bool = False
    pip: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # KEY or KEY=VALUE
    job_id: str | None = None
    check: bool = True  # check algorithm, env and setting names here (needs RLlib)


@dataclass
class Submission:
    """What ``haepo submit`` sends: entrypoint and runtime_env; built without a cluster."""

    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    submission_id: str
    notes: list[str]
    working_dir: Path
    temporary: bool


def build_submission(args: SubmitOptions) -> Submission:
    """The entrypoint, runtime_env and metadata of a sweep job; raises JobError."""
    from haepo_ray import __version__
    from haepo_ray.sweep.kinds import load_spec, resolve_plan
    from haepo_ray.sweep.spec import SpecError
    from haepo_ray.tracking.uri import given_tracking_uri

    spec_path = Path(args.spec).expanduser()
    if not spec_path.is_file():
        raise JobError(f"spec not found: {args.spec}" + (" (a folder)" if spec_path.is_dir() else ""))
    spec_path = spec_path.resolve()
    try:
        spec = load_spec(spec_path)
        if args.check:
            resolve_plan(spec)
    except SpecError as err:
        raise JobError(f"invalid spec\n{err}") from None
    try:
        uri = given_tracking_uri(args.tracking_uri, here=False)  # the job opens it, on the cluster
    except ValueError as err:
        raise JobError(str(err)) from None

    notes: list[str] = []
    if args.working_dir:
        working_dir = Path(args.working_dir).expanduser().resolve()
        if not working_dir.is_dir():
            raise JobError(f"--working-dir {args.working_dir}: not a folder")
        try:
            spec_arg = spec_path.relative_to(working_dir).as_posix()
        except ValueError:
            raise JobError(f"the spec {args.spec} is not inside --working-dir {args.working_dir}") from None
        temporary = False
    else:
        spec_arg, temporary = spec_path.name, True
    for key, path in spec.relative_paths().items():  # the job reads them from its working directory
        if temporary or not (working_dir / path).exists():
            raise JobError(f"{key} {path!r} is a path relative to where the sweep starts, which is the job's working "
                           "directory: " + ("give --working-dir DIR with it inside (or an absolute path every node "
                           "reaches)" if temporary else f"it is not inside --working-dir {args.working_dir}"))

    experiment = args.experiment or spec.experiment
    cmd = ["python", "-m", "haepo_ray.cli"] if args.py_modules else ["haepo"]
    cmd += ["sweep", spec_arg, "--address", "auto", "--quiet"]

    env_vars = {"PYTHONUNBUFFERED": "1", **job_stop_wait(STOP_WAIT_S)}
    if PATCHES_SETTING in os.environ:  # the driver and the trials' actors check and apply patches under it
        env_vars[PATCHES_SETTING] = os.environ[PATCHES_SETTING]
    if uri:
        if _local_uri(uri):
            notes.append(f"MLflow: {uri} is read on the head node, not on this machine")
        env_vars["MLFLOW_TRACKING_URI"] = uri
        cmd += ["--tracking-uri", uri]
    else:
        notes.append("MLflow: no --tracking-uri and no MLFLOW_TRACKING_URI here: the job uses the "
                     "head node's MLFLOW_TRACKING_URI, else a SQLite file in its temporary "
                     "working directory (lost with the cluster)")
    if args.experiment:
        cmd += ["--experiment", args.experiment]
    if args.resume:
        cmd.append("--resume")
    entrypoint = shlex.join(cmd)

    local_storage = os.environ.get("HAEPO_STORAGE_PATH")
    if args.storage_path:
        entrypoint += " --storage-path " + shlex.quote(args.storage_path)
        where = args.storage_path
    elif spec.storage_path:
        where = f"{spec.storage_path} (the spec's storage_path)"
    elif local_storage:
        entrypoint += " --storage-path " + shlex.quote(local_storage)
        where = f"{local_storage} ($HAEPO_STORAGE_PATH here)"
    else:
        # Decided on the head node: the cluster's shared storage, when it names one.
        entrypoint += ' ${HAEPO_STORAGE_PATH:+--storage-path "$HAEPO_STORAGE_PATH"}'
        where = "the head node's $HAEPO_STORAGE_PATH"
        notes.append("storage: no --storage-path, no storage_path in the spec and no "
                     "HAEPO_STORAGE_PATH here: results go to the head node's HAEPO_STORAGE_PATH, "
                     "else to its temporary job folder (then a trial cannot resume on another node)")

    env_vars.update(_env_vars(args.env))
    if temporary:  # made last: no error after it leaves the folder behind
        working_dir = Path(tempfile.mkdtemp(prefix="haepo-submit-"))
        shutil.copy2(spec_path, working_dir / spec_path.name)
    runtime_env: dict[str, Any] = {"working_dir": str(working_dir), "env_vars": env_vars}
    if not temporary:
        runtime_env["excludes"] = list(WORKING_DIR_EXCLUDES)
    if args.py_modules:
        runtime_env["py_modules"] = [str(Path(__file__).resolve().parent)]
    if args.pip:
        runtime_env["pip"] = list(args.pip)

    submission_id = args.job_id or (
        f"haepo-{_slug(experiment)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}")
    metadata = {
        "haepo.spec": spec_path.name,
        "haepo.experiment": experiment,
        "haepo.version": __version__,
        "haepo.tracking_uri": uri or "",
        "haepo.storage": where,
    }
    return Submission(entrypoint, runtime_env, metadata, submission_id, notes, working_dir, temporary)


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_" else "-" for c in text)
    return out.strip("-")[:40] or "sweep"


# --------------------------------------------------------------------------- follow / logs


def tail_logs(client: JobsClient, job_id: str, write: Callable[[str], None]) -> None:
    """Passes the job's logs to ``write``, chunk by chunk as Ray streams them, until the job
    ends; whatever breaks the stream (head restarted, network) is raised."""
    async def tail() -> None:
        async for chunk in client.sdk.tail_job_logs(job_id):
            write(chunk)

    asyncio.run(tail())


def job_status(client: JobsClient, job_id: str) -> str:
    """The job's status; a JobError naming the job when the cluster does not know it."""
    try:
        return str(client.get_job_status(job_id).value)
    except JobError as err:
        if "404" in str(err) or "does not exist" in str(err):
            raise JobError(f"no job {job_id!r} on {client.address} (haepo jobs lists them)") from None
        raise


def wait_terminal(client: JobsClient, job_id: str, timeout: float | None) -> str:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = job_status(client, job_id)
        if status in TERMINAL or (deadline is not None and time.monotonic() >= deadline):
            return status
        time.sleep(1.0)
