"""Where sweeps log: the tracking URI and the artifact folder of a new experiment.

Tracking URI, first that is set: the ``--tracking-uri`` flag, ``MLFLOW_TRACKING_URI``, else the
embedded default ``sqlite:///<cwd>/.haepo/mlflow.db`` (artifacts in ``<cwd>/.haepo/mlartifacts``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

from haepo_ray.upstream.mlflow import is_sql_store, unknown_store
from haepo_ray.user_paths import unwritable_file

DEFAULT_DIR = ".haepo"
SQLITE = "sqlite:///"
# How each store's URI is written, for the errors; a scheme followed by ":" or "//" but not "://"
# (``http:/host``, ``http//host``, ``sqlite:x.db``) is a typo of one of them.
FORMS = {"http": "http://HOST:PORT", "https": "https://HOST[:PORT]",
         "sqlite": "sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db",
         "postgresql": "postgresql+psycopg2://USER:PASSWORD@HOST:PORT/DATABASE"}
_NO_SLASHES = re.compile(rf"({'|'.join(FORMS)})(\+\w+)?(:|//)", re.IGNORECASE)


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


def given_tracking_uri(uri: str | None = None, *, here: bool = True) -> str | None:
    """The flag, else ``MLFLOW_TRACKING_URI``, else None; ``ValueError`` naming the URI and
    where it came from, when MLflow has no store for it (saying which stores it has), its form is
    wrong (:func:`form_problem`), or (``here``: it is used on this machine) this machine cannot
    open it (:func:`unusable_here`)."""
    given, source = (uri, "tracking URI") if uri else (os.environ.get("MLFLOW_TRACKING_URI"), "$MLFLOW_TRACKING_URI")
    problem = (unknown_store(given) or form_problem(given) or (here and unusable_here(given))) if given else None
    if problem:
        raise ValueError(f"{source} {given}: {problem}")
    return given or None


def form_problem(tracking_uri: str) -> str | None:
    """Why MLflow would fail on ``tracking_uri`` at its first use, by its form alone, else None: a
    scheme without ``://``, a server URL without a host or with a port that is not a number, a
    SQL URL that SQLAlchemy cannot read, or an in-memory SQLite database (one per connection,
    gone when it closes)."""
    typo = _NO_SLASHES.match(tracking_uri)
    if typo and "://" not in tracking_uri:
        return f"no '://' after {typo.group(1)}: write {FORMS[typo.group(1).lower()]}"
    parsed = urlparse(tracking_uri)
    if parsed.scheme in ("http", "https"):
        if not parsed.hostname:
            return f"names no server: write {FORMS[parsed.scheme]}"
        try:
            parsed.port  # urlparse reads the port only when asked
        except ValueError:
            return f"its port is not a number: write {FORMS[parsed.scheme]}"
    if not is_sql_store(tracking_uri):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(tracking_uri)
    except (ArgumentError, ValueError) as err:
        return f"not a database URL SQLAlchemy can read ({err})"
    if url.get_backend_name() != "sqlite":
        return None
    if url.host:
        return f"{url.host!r} reads as a host, which a SQLite file has not: write {FORMS['sqlite']}"
    if url.database in (None, "", ":memory:"):
        return ("an in-memory SQLite database: each connection opens its own, empty, gone when it closes (a sweep's "
                f"writers found no tables): write {FORMS['sqlite']}")
    return None


def unusable_here(tracking_uri: str) -> str | None:
    """Why this machine cannot open the store of a well-formed ``tracking_uri``, else None: a
    folder while MLflow's file store is off (``MLFLOW_ALLOW_FILE_STORE``), a SQLite file that
    cannot be made (:func:`sqlite_problem`), or a SQL driver that is not installed."""
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

    if urlparse(tracking_uri).scheme in ("", "file") and not MLFLOW_ALLOW_FILE_STORE.get():
        return ("a folder, where MLflow keeps runs only with MLFLOW_ALLOW_FILE_STORE=true (its file store is in "
                f"maintenance mode): give a database, {FORMS['sqlite']} (`mlflow migrate-filestore` moves a "
                "folder's runs into one), or an MLflow server")
    if not is_sql_store(tracking_uri):
        return None
    from sqlalchemy import create_engine
    from sqlalchemy.exc import ArgumentError

    try:
        create_engine(tracking_uri).dispose()  # loads the dialect and imports its driver; connects to nothing
    except ModuleNotFoundError as err:
        return (f"SQLAlchemy's driver for it needs the module {err.name}, which is not installed: install it, or "
                "name an installed driver after a '+' (haepo-ray installs psycopg2: postgresql+psycopg2://...)")
    except ArgumentError as err:  # an unknown dialect or driver name
        return f"SQLAlchemy cannot open it ({err})"
    return sqlite_problem(tracking_uri)


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
