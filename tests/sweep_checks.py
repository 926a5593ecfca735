"""What a finished sweep leaves in MLflow, checked: its parent and one child run per trial, with
their params, tags, metric histories and checkpoints (test_sweep_e2e and test_tracking_callback),
and a run's provenance and device tags (test_llm_sweep too)."""

from __future__ import annotations

import math
import os

from helpers import ENV_STEPS, METRIC


def check_provenance(tags) -> None:
    """A run's provenance tags are this checkout's, this machine's and these libraries' (the
    GPUs are those the process saw: a trial sees those Ray gave it)."""
    from haepo_ray.provenance import provenance

    assert {k: v for k, v in provenance().items() if k != "haepo.machine.gpus"}.items() <= tags.items()
    assert "haepo.machine.gpus" in tags


def check_cpu_devices(tags, *parts: str) -> None:
    """A trial that asked Ray for no GPU tags the CPU as the device of each of ``parts`` (its
    learner, env runner or policy), no Ray GPU id, and its CUDA_VISIBLE_DEVICES as it was."""
    from haepo_ray import names

    assert {tags[f"haepo.device.{part}"] for part in parts} == {"cpu"}, tags
    assert tags[names.DEVICE_RAY_GPU_IDS] == ""
    assert tags[names.DEVICE_CUDA_VISIBLE] in ("", os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))


def check_sweep_in_mlflow(uri: str, experiment: str, result, *, iterations: int,
                          checkpoints: bool = True) -> None:
    """The MLflow side of a finished sweep: one parent, exactly one child per trial, each
    with its params, tags (provenance too), per-iteration metrics with increasing steps and
    its checkpoint; the sweep's summary (``result``) agrees with what MLflow holds."""
    from mlflow.tracking import MlflowClient

    from haepo_ray.tracking import find_sweep_runs

    client = MlflowClient(uri)
    parent, children = find_sweep_runs(uri, experiment, result.parent_run_id)
    assert parent.data.tags["haepo.role"] == "sweep"
    assert parent.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"spec.yaml", "summary.json"}
    assert parent.data.params["algorithm"] == "HAEPO"
    check_provenance(parent.data.tags)

    by_trial: dict[str, list] = {}
    for child in children:
        by_trial.setdefault(child.data.tags["haepo.trial_id"], []).append(child)
    assert sorted(by_trial) == sorted(t.trial_id for t in result.trials)
    assert all(len(runs) == 1 for runs in by_trial.values()), "duplicate child runs"

    for trial in result.trials:
        (child,) = by_trial[trial.trial_id]
        run_id = child.info.run_id
        assert trial.run_id == run_id
        assert child.info.status == "FINISHED"
        tags = child.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["haepo.algorithm"] == "HAEPO"
        assert tags["haepo.env"] == "haepo/ChainMDP-v0"
        assert tags["haepo.seed"] == str(trial.values["seed"])
        assert tags["haepo.node_ip"] and tags["haepo.hostname"]
        check_provenance(tags)
        check_cpu_devices(tags, "learner", "env_runner")
        params = child.data.params
        assert float(params["lr"]) == trial.values["lr"]
        assert params["seed"] == str(trial.values["seed"])
        assert params["episodes_per_batch"] == "8"
        assert params["env_config/length"] == "5"
        assert params["_model_config/fcnet_hiddens"] == "[16]"
        assert params["beta_ent"] == "0.05"  # the spec sets it (to the default)
        assert "gamma" not in params  # a default the spec does not name

        history = sorted(client.get_metric_history(run_id, "training_iteration"), key=lambda m: m.step)
        steps = [m.step for m in history]
        assert steps == list(range(1, iterations + 1))
        assert [m.value for m in history] == steps
        for key in ("time_total_s", ENV_STEPS):
            history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
            assert [m.step for m in history] == steps, key
            values = [m.value for m in history]
            assert values == sorted(values) and values[-1] > values[0], key
        assert "learners/default_policy/weight_entropy" in child.data.metrics
        if checkpoints:
            files = {a.path for a in client.list_artifacts(run_id, "checkpoint")}
            assert "checkpoint/rllib_checkpoint.json" in files

        # The summary's value is the trial's last reported metric, which MLflow holds too.
        assert math.isclose(child.data.metrics[METRIC], trial.value, rel_tol=1e-9)

    best = result.best
    assert parent.data.tags["haepo.best_trial_id"] == best.trial_id
    assert parent.data.tags["haepo.best_run_id"] == best.run_id
    assert math.isclose(parent.data.metrics[f"best/{METRIC}"], best.value)
    mlflow_best = max(children, key=lambda r: r.data.metrics[METRIC]).data.metrics[METRIC]
    assert math.isclose(best.value, mlflow_best)
