"""Where sweeps log (:mod:`haepo_ray.tracking.uri`): the flag, then ``MLFLOW_TRACKING_URI``,
then the embedded SQLite store with its artifacts beside it."""

from __future__ import annotations

import pytest
from helpers import SMOKE, forbid_ray_start

from haepo_ray import tracking


def test_tracking_uri_flag_then_env_then_embedded_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = tracking.resolve_tracking_uri(cwd=tmp_path)
    assert default == f"sqlite:///{tmp_path.resolve()}/.haepo/mlflow.db"
    assert (tmp_path / ".haepo").is_dir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.resolve_tracking_uri(cwd=tmp_path) == "http://127.0.0.1:5000"
    assert tracking.resolve_tracking_uri("sqlite:///x.db", cwd=tmp_path) == "sqlite:///x.db"


def test_sqlite_artifacts_live_next_to_the_database(tmp_path):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    assert tracking.artifact_location_for(uri) == (tmp_path / "store" / "mlartifacts").as_uri()
    assert tracking.artifact_location_for("http://127.0.0.1:5000") is None


def test_a_uri_mlflow_has_no_store_for_is_refused_naming_where_it_came_from(tmp_path, monkeypatch):
    """Checked without opening a store: the SQLite file of an accepted URI is not created."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError) as err:
        tracking.resolve_tracking_uri("s3://bucket/mlflow", cwd=tmp_path)
    assert str(err.value).startswith("tracking URI s3://bucket/mlflow: MLflow has no tracking store for it; it "
                                     "takes a URI of "), err.value
    assert {"sqlite", "postgresql", "http", "https", "file"} <= set(str(err.value).rpartition(" of ")[2].split(", "))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "htp://127.0.0.1:5000")
    with pytest.raises(ValueError, match=r"^\$MLFLOW_TRACKING_URI htp://127\.0\.0\.1:5000: MLflow has no tracking"):
        tracking.resolve_tracking_uri(cwd=tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for uri in (f"sqlite:///{tmp_path}/a.db", "postgresql+psycopg2://u@db:5432/mlflow", "https://mlflow.example",
                "http://127.0.0.1:5000/prefix", "sqlite:///relative.db", str(tmp_path / "folder"),
                (tmp_path / "files").as_uri()):
        assert tracking.resolve_tracking_uri(uri, cwd=tmp_path) == uri
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(("uri", "problem"), [
    ("http//127.0.0.1:5000", "no '://' after http: write http://HOST:PORT"),
    ("http:/127.0.0.1:5000", "no '://' after http: write http://HOST:PORT"),
    ("HTTPS:mlflow.example", "no '://' after HTTPS: write https://HOST[:PORT]"),
    ("sqlite:mlflow.db", "no '://' after sqlite: write sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db"),
    ("https://", "names no server: write https://HOST[:PORT]"),
    ("http://127.0.0.1:50OO", "its port is not a number: write http://HOST:PORT"),
    ("sqlite://mlflow.db", "'mlflow.db' reads as a host, which a SQLite file has not: write sqlite:///RELATIVE/PATH.db "
                           "or sqlite:////ABSOLUTE/PATH.db"),
    ("sqlite://", "an in-memory SQLite database: each connection opens its own, empty, gone when it closes (a "
                  "sweep's writers found no tables): write sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db"),
    ("sqlite:///:memory:", "an in-memory SQLite database: each connection"),
    ("postgresql+psycopg2://u@db:54x2/mlflow", "not a database URL SQLAlchemy can read (invalid literal for int()"),
    ("postgresql://u@db:5432/mlflow", "SQLAlchemy's driver for it needs the module psycopg, which is not installed: "
                                      "install it, or name an installed driver after a '+' (haepo-ray installs "
                                      "psycopg2: postgresql+psycopg2://...)"),
    ("postgresql+nosuch://u@db/mlflow", "SQLAlchemy cannot open it (Can't load plugin: sqlalchemy.dialects:postgresql"
                                        ".nosuch)"),
    ("mlruns", "a folder, where MLflow keeps runs only with MLFLOW_ALLOW_FILE_STORE=true (its file store is in "
               "maintenance mode): give a database, sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db "
               "(`mlflow migrate-filestore` moves a folder's runs into one), or an MLflow server"),
    ("file:///tmp/mlruns", "a folder, where MLflow keeps runs only with MLFLOW_ALLOW_FILE_STORE=true"),
])
def test_a_uri_mlflow_would_fail_on_at_its_first_use_is_refused_before(tmp_path, monkeypatch, uri, problem):
    """Each failed after Ray's start before (a traceback from the first client, or, for a URL no
    server can have, "not reached: run again with --resume" after the whole sweep); none is
    opened to find out: the SQLite file of an accepted URI is not created."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ValueError) as err:
        tracking.resolve_tracking_uri(uri, create=False)
    assert str(err.value).startswith(f"tracking URI {uri}: {problem}"), err.value
    assert list(tmp_path.iterdir()) == []


def test_haepo_submit_checks_only_the_form_of_a_uri_the_cluster_opens(tmp_path, monkeypatch):
    """A driver or a folder store that this machine lacks may be the head node's (``--pip``, ``--env``)."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for uri in ("postgresql://u@db:5432/mlflow", "/data/mlruns"):
        with pytest.raises(ValueError):
            tracking.uri.given_tracking_uri(uri)
        assert tracking.uri.given_tracking_uri(uri, here=False) == uri
    with pytest.raises(ValueError, match="no '://' after http"):
        tracking.uri.given_tracking_uri("http:/head:5000", here=False)


def test_a_sqlite_file_that_cannot_be_made_is_refused(tmp_path, monkeypatch):
    """MLflow would raise FileExistsError from its first client (in a sweep, after Ray's start);
    a file that exists, or one a folder can be made for, is taken."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "file").write_text("")
    for uri, problem in ((f"sqlite:///{tmp_path}/file/mlflow.db", f"{tmp_path}/file is a file, not a folder"),
                         (f"sqlite:///{tmp_path}", f"{tmp_path} is a folder, not a database file")):
        with pytest.raises(ValueError) as err:
            tracking.resolve_tracking_uri(uri, create=False)
        assert str(err.value) == f"tracking URI {uri}: {problem}"
    for uri in (f"sqlite:///{tmp_path}/file", f"sqlite:///{tmp_path}/new/folder/mlflow.db"):
        assert tracking.resolve_tracking_uri(uri) == uri


def test_a_default_store_below_a_file_is_refused(tmp_path, monkeypatch):
    """A file named .haepo in the working directory: MLflow's FileExistsError, before."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / ".haepo").write_text("")
    for create in (True, False):
        with pytest.raises(ValueError) as err:
            tracking.resolve_tracking_uri(cwd=tmp_path, create=create)
        assert str(err.value) == (f"the default tracking store sqlite:///{tmp_path}/.haepo/mlflow.db: "
                                  f"{tmp_path}/.haepo is a file, not a folder: give --tracking-uri (or set "
                                  "MLFLOW_TRACKING_URI)")


@pytest.mark.parametrize("command", [
    ["sweep", "SPEC"], ["sweep", "SPEC", "--dry-run"], ["report"], ["train", "--env", "CartPole-v1"],
    ["llm", "eval-form", "--experiment", "x", "--out", "forms"], ["submit", "SPEC", "--address", "http://127.0.0.1:9"],
])
def test_each_command_refuses_it_before_it_starts_anything(tmp_path, monkeypatch, capsys, command):
    """Exit 2 and the message, before Ray starts and before any folder is made."""
    from haepo_ray.cli import main

    forbid_ray_start(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = tmp_path / "smoke.yaml"
    spec.write_text(SMOKE.read_text())
    argv = [str(spec) if a == "SPEC" else a for a in command]
    for uri, problem in (("foo://bar", "MLflow has no tracking store for it"), ("http:/127.0.0.1:5000", "no '://'")):
        assert main([*argv, "--tracking-uri", uri]) == 2
        assert f"tracking URI {uri}: {problem}" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["smoke.yaml"]
