"""Where sweeps log: the tracking URI and the artifact folder of a new experiment.

Tracking URI, first that is set: the ``--tracking-uri`` flag, ``MLFLOW_TRACKING_URI``, else the
embedded default ``sqlite:///<cwd>/.haepo/mlflow.db`` (artifacts in ``<cwd>/.haepo/mlartifacts``).
"""

from __future__ import annotations

import os
from pathlib import Path

from haepo_ray.upstream.mlflow import unknown_store
from haepo_ray.user_paths import unwritable_file

DEFAULT_DIR = ".haepo"
SQLITE = "sqlite:///"


def default_tracking_uri(cwd: str | Path | None = None, *, create: bool = True) -> str:
    """``sqlite:///<cwd>/.haepo/mlflow.db`` (creates ``.haepo/`` unless ``create=False``);
    ``ValueError`` when that file cannot be made (:func:`sqlite_problem`: a file ``.haepo``)."""
    root = Path(cwd or os.getcwd()).resolve() / DEFAULT_DIR
    uri = f"{SQLITE}{root / 'mlflow.db'}"
    problem = sqlite_problem(uri)
    if problem:
        raise ValueError(f"the default tracking store {uri}: {problem}: give --tracking-uri (or set "
                         "MLFLOW_TRACKING_URI)")
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return uri


def resolve_tracking_uri(uri: str | None = None, cwd: str | Path | None = None, *,
                         create: bool = True) -> str:
    """The flag, else ``MLFLOW_TRACKING_URI``, else the embedded SQLite default; ``ValueError``
    as :func:`given_tracking_uri`."""
    return given_tracking_uri(uri) or default_tracking_uri(cwd, create=create)


def given_tracking_uri(uri: str | None = None) -> str | None:
    """The flag, else ``MLFLOW_TRACKING_URI``, else None; ``ValueError`` naming the URI and
    where it came from, when MLflow has no store for it (saying which stores it has) or it is a
    SQLite file that cannot be made (:func:`sqlite_problem`)."""
    given, source = (uri, "tracking URI") if uri else (os.environ.get("MLFLOW_TRACKING_URI"), "$MLFLOW_TRACKING_URI")
    problem = (unknown_store(given) or sqlite_problem(given)) if given else None
    if problem:
        raise ValueError(f"{source} {given}: {problem}")
    return given or None


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` store; None for any other store."""
    return Path(tracking_uri[len(SQLITE):]) if tracking_uri.startswith(SQLITE) else None


def sqlite_problem(tracking_uri: str) -> str | None:
    """Why the ``sqlite:///PATH`` store's file cannot be made (it is a folder; its folder is below
    a file, or not writable), else None; None for any other store, and for a file that exists."""
    db = sqlite_file(tracking_uri)
    return None if db is None or db.is_file() else unwritable_file(db, "database file")


def artifact_location_for(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: next to a SQLite store's file
    (``<db folder>/mlartifacts``; MLflow would use ``./mlruns`` of whatever the working
    directory is); None (the server's choice) for any other store."""
    db = sqlite_file(tracking_uri)
    return None if db is None else (db.parent.resolve() / "mlartifacts").as_uri()
