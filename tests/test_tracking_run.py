"""One MLflow run without a parent (:mod:`haepo_ray.tracking.run`): what ``haepo train`` logs."""

from __future__ import annotations

import logging

from helpers import free_port, sqlite_store
from mlflow.tracking import MlflowClient

from haepo_ray import tracking


def test_a_train_run_is_one_run_without_parent_in_a_trials_form(tmp_path):
    """``haepo train``'s run: its tags, its params flattened, each result's default metrics at
    its iteration (once per step), the node of its results, the status it ends with."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    run = tracking.MLflowRun(uri, "train", "HAEPO-chain", retry=tracking.RetryPolicy(retries=0))
    assert run.start({"haepo.algorithm": "HAEPO"}, {"lr": 0.1, "model_config": {"fcnet_hiddens": [8]}})
    for step in (1, 2):
        run.log_result({"training_iteration": step, "time_total_s": 0.5 * step, "node_ip": "10.0.0.1",
                        "hostname": "h", "env_runners": {"episode_return_mean": float(step), "x": 1.0}})
    run.end("KILLED")

    client = MlflowClient(uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("train").experiment_id])
    assert logged.info.run_id == run.run_id and logged.info.status == "KILLED"
    assert logged.info.run_name == "HAEPO-chain" and "mlflow.parentRunId" not in logged.data.tags
    assert {k: logged.data.tags[k] for k in ("haepo.role", "haepo.algorithm", "haepo.node_ip", "haepo.hostname")} == {
        "haepo.role": tracking.TRAIN_ROLE, "haepo.algorithm": "HAEPO", "haepo.node_ip": "10.0.0.1", "haepo.hostname": "h"}
    assert logged.data.params == {"lr": "0.1", "model_config/fcnet_hiddens": "[8]"}
    assert set(logged.data.metrics) == {"training_iteration", "time_total_s", "env_runners/episode_return_mean"}
    for key in logged.data.metrics:
        assert [m.step for m in client.get_metric_history(run.run_id, key)] == [1, 2], key
    assert not run.not_logged


def test_a_train_run_without_reachable_mlflow_warns_and_trains_on(caplog):
    run = tracking.MLflowRun(f"http://127.0.0.1:{free_port()}", "train", "r",
                             retry=tracking.RetryPolicy(retries=1, backoff_s=0.05, timeout_s=2))
    with caplog.at_level(logging.WARNING, logger="haepo_ray.tracking"):
        assert run.start({}, {"lr": 0.1}) is None
        run.log_result({"training_iteration": 1})
        run.end("FINISHED")
    assert [n.what for n in run.not_logged] == ["experiment"]
    assert "trains without tracking" in caplog.text
