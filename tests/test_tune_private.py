"""In a sweep of short trials Tune keeps the actors it launches (a cached actor never takes the
trial of an actor that is already starting, whose start would be thrown away), every trial
still runs once, and a finished trial's running statistics are let go."""

from __future__ import annotations

import io

from ray.tune.execution.tune_controller import TuneController

from haepo_ray.sweep import tune_private
from haepo_ray.sweep.results import TrialRecorder
from haepo_ray.sweep.plan import parse_plan
from haepo_ray.sweep.runner import run_sweep

TRIALS = 12


def short_trials() -> dict:
    """One-iteration bandit trials: far shorter than a trial actor's start."""
    return {
        "name": "short", "algorithm": "HAEPO", "env": "haepo/GaussianBandit-v0", "env_config": {"num_arms": 4},
        "settings": {"num_env_runners": 0, "batch_size": 4, "model_config": {"fcnet_hiddens": [8]}},
        "search_space": {"seed": {"grid": list(range(TRIALS))}}, "search": {"algorithm": "grid"},
        "metric": "env_runners/episode_return_mean", "mode": "max", "stop": {"iterations": 1},
        "resources": {"cpus": 1, "gpus": 0}, "reuse_actors": True, "checkpoint_frequency": 0,
        "checkpoint_at_end": False, "max_failures": 0,
    }


def test_a_sweep_of_short_trials_kills_no_actor_while_it_starts(ray_session, tmp_path, monkeypatch):
    removed = []  # for each actor Tune removed: was it starting?
    remove_actor = TuneController._remove_actor

    def recording_remove(self, tracked_actor, *args, **kwargs):
        removed.append(tune_private.launching(self, tracked_actor))
        return remove_actor(self, tracked_actor, *args, **kwargs)

    monkeypatch.setattr(TuneController, "_remove_actor", recording_remove)
    recorder = TrialRecorder()
    result = run_sweep(parse_plan(short_trials(), "short.yaml"), track=False, storage_path=str(tmp_path),
                       out=io.StringIO(), verbose=0, extra_callbacks=[recorder])
    assert sorted(t.values["seed"] for t in result.trials) == list(range(TRIALS))
    assert all(t.status == "TERMINATED" and t.iterations == 1 for t in result.trials)
    assert removed and not any(removed), f"{sum(removed)} of {len(removed)} removed actors were starting"

    for trial in recorder.trials:  # released: no deques, no second config; the statistics stay
        assert trial.run_metadata.metric_n_steps == {}
        assert trial.last_result["config"] is trial.config
        assert trial.metric_analysis["training_iteration"]["last"] == 1
        assert '"metric_n_steps": {}' in trial.run_metadata.get_json_state()
    assert {r.metrics["config"]["seed"] for r in result.result_grid} == set(range(TRIALS))
