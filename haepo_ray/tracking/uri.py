"""Where sweeps log: the tracking URI and the artifact folder of a new experiment.

Tracking URI, first that is set: the ``--tracking-uri`` flag, ``MLFLOW_TRACKING_URI``, else the
embedded default ``sqlite:///<cwd>/.haepo/mlflow.db`` (artifacts in ``<cwd>/.haepo/mlartifacts``).
"""

from __future__ import annotations

import os
from pathlib import Path

from haepo_ray.upstream.mlflow import unknown_store

DEFAULT_DIR = ".haepo"
SQLITE = "sqlite:///"


def default_tracking_uri(cwd: str | Path | None = None, *, create: bool = True) -> str:
    """``sqlite:///<cwd>/.haepo/mlflow.db`` (creates ``.haepo/`` unless ``create=False``)."""
    root = Path(cwd or os.getcwd()).resolve() / DEFAULT_DIR
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return f"{SQLITE}{root / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None = None, cwd: str | Path | None = None, *,
                         create: bool = True) -> str:
    """The flag, else ``MLFLOW_TRACKING_URI``, else the embedded SQLite default; ``ValueError``
    as :func:`given_tracking_uri`."""
    return given_tracking_uri(uri) or default_tracking_uri(cwd, create=create)


def given_tracking_uri(uri: str | None = None) -> str | None:
    """The flag, else ``MLFLOW_TRACKING_URI``, else None; ``ValueError`` naming the URI, where
    it came from and the stores MLflow has, when it has none for it."""
    given, source = (uri, "tracking URI") if uri else (os.environ.get("MLFLOW_TRACKING_URI"), "$MLFLOW_TRACKING_URI")
    problem = unknown_store(given) if given else None
    if problem:
        raise ValueError(f"{source} {given}: {problem}")
    return given or None


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` store; None for any other store."""
    return Path(tracking_uri[len(SQLITE):]) if tracking_uri.startswith(SQLITE) else None


def artifact_location_for(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: next to a SQLite store's file
    (``<db folder>/mlartifacts``; MLflow would use ``./mlruns`` of whatever the working
    directory is); None (the server's choice) for any other store."""
    db = sqlite_file(tracking_uri)
    return None if db is None else (db.parent.resolve() / "mlartifacts").as_uri()
