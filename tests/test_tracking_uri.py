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
                                     "takes a folder, or a URI of "), err.value
    assert {"sqlite", "postgresql", "http", "https", "file"} <= set(str(err.value).rpartition(" of ")[2].split(", "))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "htp://127.0.0.1:5000")
    with pytest.raises(ValueError, match=r"^\$MLFLOW_TRACKING_URI htp://127\.0\.0\.1:5000: MLflow has no tracking"):
        tracking.resolve_tracking_uri(cwd=tmp_path)
    for uri in (f"sqlite:///{tmp_path}/a.db", "postgresql+psycopg2://u@db:5432/mlflow", "https://mlflow.example",
                str(tmp_path / "folder"), (tmp_path / "files").as_uri()):
        assert tracking.resolve_tracking_uri(uri, cwd=tmp_path) == uri
    assert sorted(p.name for p in tmp_path.iterdir()) == []


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
    assert main([*argv, "--tracking-uri", "foo://bar"]) == 2
    assert "tracking URI foo://bar: MLflow has no tracking store for it" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["smoke.yaml"]
