"""What a sweep writes to MLflow and in which form (:mod:`haepo_ray.tracking.schema`): the
metrics selected and flattened, and the one best-trial rule."""

from __future__ import annotations

from types import SimpleNamespace

from haepo_ray import tracking


def test_metrics_are_selected_flattened_and_numeric():
    result = {
        "training_iteration": 3,
        "time_total_s": 1.5,
        "done": False,
        "config": {"lr": 0.1},
        "env_runners": {"episode_return_mean": 0.5, "num_env_steps_sampled_lifetime": 120,
                        "agent_episode_returns_mean": {"default_agent": 0.5}},
        "learners": {"default_policy": {"weight_entropy": 1.2, "note": "text"}},
    }
    metrics = tracking.select_metrics(result, tracking.DEFAULT_METRICS)
    assert metrics == {
        "training_iteration": 3.0,
        "time_total_s": 1.5,
        "env_runners/episode_return_mean": 0.5,
        "env_runners/num_env_steps_sampled_lifetime": 120.0,
        "learners/default_policy/weight_entropy": 1.2,
    }
    assert not any(k.startswith("config") for k in tracking.select_metrics(result, ["*"]))
    assert tracking.sanitize_key("a:b/c d=e") == "a_b/c d_e"


def test_carried_over_keys_and_the_keys_below_them_are_not_logged():
    from haepo_ray import names
    from haepo_ray.rl.evaluation import mark_stale_evaluation

    result = {"training_iteration": 3, "env_runners": {"episode_return_mean": 0.5},
              "evaluation": {"env_runners": {"episode_return_mean": 0.7, "episode_len_mean": 4}},
              "evaluation_extra": {"x": 1.0}}
    assert tracking.select_metrics(result, tracking.DEFAULT_METRICS) == {
        "training_iteration": 3.0, "env_runners/episode_return_mean": 0.5,
        "evaluation/env_runners/episode_return_mean": 0.7, "evaluation/env_runners/episode_len_mean": 4.0}
    every_second = SimpleNamespace(evaluation_interval=2, offline_evaluation_interval=None)
    assert mark_stale_evaluation({**result, "training_iteration": 4}, every_second).get(names.CARRIED_OVER) is None
    stale = mark_stale_evaluation({**result, names.CARRIED_OVER: ["env_runners/episode_return_mean"]}, every_second)
    assert stale[names.CARRIED_OVER] == ["env_runners/episode_return_mean", "evaluation"]
    assert tracking.select_metrics(stale, ["*"]) == {"training_iteration": 3.0, "evaluation_extra/x": 1.0}
    offline = SimpleNamespace(evaluation_interval=None, offline_evaluation_interval=3)
    assert names.CARRIED_OVER not in mark_stale_evaluation(dict(result), offline)


def test_one_best_trial_rule_for_mlflow_and_the_sweep_summary():
    """The parent run's best trial and the sweep's printed ranking come from one rule: the
    last reported value, NaN and missing values last, ties in trial order."""
    from haepo_ray.sweep.results import SweepResult, TrialSummary

    last = {"a": 0.5, "b": float("nan"), "c": 0.9, "d": None, "e": 0.9, "f": 0.1}
    trials = [SimpleNamespace(trial_id=k, last_result={"env_runners": {"episode_return_mean": v}})
              for k, v in last.items()]
    for mode, ranked in (("max", "ceafbd"), ("min", "facebd")):
        summary = tracking.schema.summarize_trials(trials, "env_runners/episode_return_mean", mode)
        assert summary["num_trials"] == 6
        assert summary["best"] == {"trial_id": ranked[0], "value": last[ranked[0]]}
        result = SweepResult("dir", "exp", None, None, "env_runners/episode_return_mean", mode, trials=[
            TrialSummary(t.trial_id, t.trial_id, "TERMINATED", 1,
                         tracking.metric_value(t.last_result, "env_runners/episode_return_mean"), {}, None)
            for t in trials])
        assert "".join(t.trial_id for t in result.ranked()) == ranked
        assert result.best.trial_id == ranked[0]
    assert tracking.schema.summarize_trials(trials[1:2], "env_runners/episode_return_mean")["best"] is None
