"""Where sweeps log (:mod:`haepo_ray.tracking.uri`): the flag, then ``MLFLOW_TRACKING_URI``,
then the embedded SQLite store with its artifacts beside it."""

from __future__ import annotations

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
