"""``haepo sweep`` end to end on a real local Ray with a real SQLite MLflow store.

- the smoke sweep (tune_configs/smoke.yaml): parent run, one child per trial with params,
  per-iteration metrics, tags, checkpoint; the printed best-trial summary matches MLflow;
- a trial whose env raises once: retried from its checkpoint, one MLflow run (the slow tier's
  test_multinode kills a node under a trial too);
- the driver killed mid-sweep (SIGKILL), then ``--resume``: every trial completes once, no
  duplicate MLflow runs or steps (the slow tier's test_postgres beside a second sweep on PostgreSQL).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import sys
import threading
import weakref
from pathlib import Path

import pytest
import yaml
from drivers import kill_driver_when, killed_sweep, logged_rows, metric_rows, resume_driver
from helpers import ENV_STEPS, LOGGED, METRIC, SMOKE, sqlite_store
from mlflow.tracking import MlflowClient
from ray import cloudpickle
from sweep_checks import check_sweep_in_mlflow

from haepo_ray.envs import ChainMDPEnv
from haepo_ray.sweep.planned import planned_trials
from haepo_ray.sweep.kinds import load_plan, parse_plan
from haepo_ray.sweep.results import format_summary
from haepo_ray.sweep.runner import run_sweep
from haepo_ray.sweep.kinds.rl.trainable import sweep_trainable
from haepo_ray.tracking import find_sweep_runs

# The flaky env below is defined in this test module, which Ray's workers cannot import.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_smoke_sweep_sqlite(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = load_plan(SMOKE)
    out = io.StringIO()
    result = run_sweep(spec, tracking_uri=uri, storage_path=str(tmp_path / "results"), out=out,
                       spec_text=SMOKE.read_text())

    assert len(result.trials) == 4
    assert {(t.values["lr"], t.values["seed"]) for t in result.trials} == {
        (lr, seed) for lr in (0.05, 0.1) for seed in (0, 1)}
    assert all(t.status == "TERMINATED" and t.iterations == 8 for t in result.trials)
    assert not result.not_logged
    check_sweep_in_mlflow(uri, "smoke", result, iterations=8)

    printed = out.getvalue()
    assert f"MLflow tracking URI: {uri}" in printed
    assert result.parent_run_id in printed
    assert format_summary(result) in printed
    assert all(t.run_id in printed for t in result.trials)
    summary = json.loads((Path(result.run_dir) / "haepo_summary.json").read_text())
    assert summary["best_trial_id"] == result.best.trial_id


def test_a_resume_after_every_trial_ended_writes_what_mlflow_lacks(ray_session, tmp_path, monkeypatch):
    """The driver's every trial ended but MLflow got none of them (here: a first run without
    tracking; in a big sweep, a writer behind when the driver was killed). ``--resume`` has
    no trial left to run, so Tune takes no step: the runs are still written, from each
    trial's ``result.json``, once."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store(tmp_path / "mlflow.db")
    data = yaml.safe_load(SMOKE.read_text())
    data.update(name="ended", search_space={"seed": {"grid": [0, 1]}, "lr": {"grid": [0.05]}})
    data["stop"] = {"iterations": 3}
    plan = parse_plan(data, "ended.yaml")
    first = run_sweep(plan, storage_path=str(tmp_path / "results"), out=io.StringIO(), track=False)
    assert [t.status for t in first.trials] == ["TERMINATED"] * 2

    result = run_sweep(plan, tracking_uri=uri, storage_path=str(tmp_path / "results"), out=io.StringIO(),
                       resume=True)
    assert not result.not_logged
    check_sweep_in_mlflow(uri, "ended", result, iterations=3)


# --------------------------------------------------------------------------- failure injection


class FlakyChainEnv(ChainMDPEnv):
    """The chain MDP, raising once at its ``fail_at``-th step (a marker file remembers)."""

    def __init__(self, fail_at: int, marker: str, **kwargs):
        super().__init__(**kwargs)
        self.fail_at, self.marker, self.steps = fail_at, marker, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at and not os.path.exists(self.marker):
            Path(self.marker).write_text("failed once")
            raise RuntimeError(f"injected failure at env step {self.steps}")
        return super().step(action)


def _flaky_env(config):
    return FlakyChainEnv(**config)


# The fast tier's retry. Slow tier: test_multinode's test_sweep_survives_the_loss_of_a_worker_node
# fails a trial (its node killed) and checks the same: retried by Tune from its last checkpoint
# (max_failures), not from scratch, to the last iteration; one MLflow run, FINISHED,
# haepo.num_failures recorded, every step logged once.
def test_failed_trial_is_retried_from_checkpoint(ray_session, tmp_path, monkeypatch):
    from ray.tune.registry import register_env

    monkeypatch.chdir(tmp_path)
    register_env("haepo-test/FlakyChain-v0", _flaky_env)
    marker = tmp_path / "failed"
    spec = parse_plan({
        "name": "flaky",
        "algorithm": "HAEPO",
        "env": "haepo-test/FlakyChain-v0",
        "env_config": {"length": 3, "fail_at": 40, "marker": str(marker)},
        "settings": {"num_env_runners": 0, "batch_size": 4, "lr": 0.05, "seed": 3,
                     "model_config": {"fcnet_hiddens": [8]}},
        "search": {"algorithm": "grid"},
        "stop": {"iterations": 7},
        "max_failures": 2,
        "checkpoint_frequency": 1,
    }, "flaky.yaml")
    uri = sqlite_store(tmp_path / "mlflow.db")
    result = run_sweep(spec, tracking_uri=uri, storage_path=str(tmp_path / "results"), out=io.StringIO())

    assert marker.exists(), "the injected failure did not happen"
    (trial,) = result.trials
    assert trial.status == "TERMINATED"
    assert trial.num_failures == 1
    assert trial.iterations == 7
    last = result.result_grid[0].metrics
    # Restored from a checkpoint, not started over: fewer iterations since the restore.
    assert last["iterations_since_restore"] < last["training_iteration"] == 7

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    _, children = find_sweep_runs(uri, "flaky", result.parent_run_id)
    assert len(children) == 1
    (child,) = children
    assert child.data.tags["haepo.trial_id"] == trial.trial_id
    assert child.data.tags["haepo.num_failures"] == "1"
    assert child.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "training_iteration"))
    assert steps == list(range(1, 8))


# --------------------------------------------------------------------------- driver killed


# The RL sweep's metrics, without its step key (training_iteration): the writer learns what
# is logged from what the spec logs, whatever it is.
# The fast tier's killed-driver resume (MLflow on SQLite). Slow tier: test_postgres runs this
# sweep, killed and resumed, with these checks, beside a second sweep logging at once (MLflow
# on PostgreSQL; CI installs it), and test_llm_sweep's killed driver a language-model sweep on
# SQLite (re-read results and replayed updates).
def test_killed_driver_resumes_without_duplicates(ray_session, tmp_path, monkeypatch, capfd):
    """The driver of an RL sweep that logs no training_iteration, SIGKILLed mid-sweep, then
    resumed: every trial completes once, one MLflow run per trial, every (run, metric, step)
    exactly once and none missing."""
    spec_data = yaml.safe_load(SMOKE.read_text())
    spec_data.update(name="resumable", max_failures=0, checkpoint_frequency=2, tracking={"metrics": LOGGED})
    spec_data["stop"] = {"iterations": 10}
    # Slow the iterations down so that the kill lands mid-sweep.
    spec_data["settings"]["min_time_s_per_iteration"] = 0.4
    db, uri, results, args = killed_sweep(tmp_path, spec_data, ray_session.get_runtime_context().gcs_address)

    kill_driver_when(args, tmp_path, lambda: bool(list(results.glob("resumable/*/experiment_state-*.json")))
                     and metric_rows(db, "time_total_s") >= 3)
    assert metric_rows(db, "time_total_s") >= 3
    monkeypatch.chdir(tmp_path)
    resume_driver(args, monkeypatch, capfd)

    (run_dir,) = list(results.glob("resumable/*"))
    assert not (run_dir / "mlflow_not_logged.jsonl").exists(), (run_dir / "mlflow_not_logged.jsonl").read_text()
    summary = json.loads((run_dir / "haepo_summary.json").read_text())
    trials = summary["trials"]
    assert len(trials) == 4
    assert all(t["status"] == "TERMINATED" and t["iterations"] == 10 for t in trials), trials

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("resumable")
    parents = client.search_runs([exp.experiment_id], "tags.`haepo.role` = 'sweep'")
    assert len(parents) == 1, "a second parent run was created on resume"
    assert parents[0].info.status == "FINISHED"
    _, children = find_sweep_runs(uri, "resumable", parents[0].info.run_id)
    assert sorted(c.data.tags["haepo.trial_id"] for c in children) == sorted(t["trial_id"] for t in trials)
    # The resumed driver's summary names the runs, those made before the kill included.
    assert {t["trial_id"]: t["run_id"] for t in trials} == {
        c.data.tags["haepo.trial_id"]: c.info.run_id for c in children}
    all_runs = client.search_runs([exp.experiment_id])
    assert len(all_runs) == 1 + len(trials), "duplicate runs in MLflow"
    rows = logged_rows(uri, "resumable")
    assert not {k: n for k, n in rows.items() if n > 1}, "(run, metric, step) logged more than once"
    for child in children:
        assert child.info.status == "FINISHED"
        assert "training_iteration" not in child.data.metrics
        for key in ("time_total_s", ENV_STEPS, "learners/default_policy/weight_entropy"):
            assert sorted(s for (run, k, s) in rows if run == child.info.run_id and k == key) == \
                list(range(1, 11)), key
        assert {a.path for a in client.list_artifacts(child.info.run_id)} == {"checkpoint"}


# --------------------------------------------------------------------------- other algorithms,
# searchers and schedulers


def _tiny(**overrides) -> dict:
    data = {
        "algorithm": "HAEPO",
        "env": "haepo/ChainMDP-v0",
        "env_config": {"length": 3},
        "settings": {"num_env_runners": 0, "batch_size": 4, "model_config": {"fcnet_hiddens": [8]}},
        "stop": {"iterations": 4},
        "max_concurrent_trials": 2,
    }
    data.update(overrides)
    return data


def _monitors() -> set:
    return {t for t in threading.enumerate() if type(t).__name__ == "UtilMonitor"}


def test_a_reused_trial_actor_runs_one_utilisation_monitor(ray_session):
    """Tune's trainable samples CPU and memory for every result (perf/); the algorithm inside
    it starts no monitor of its own, whose thread each trial's stop would join (up to 0.7 s
    per trial when Tune reuses the actor)."""
    plan = parse_plan(_tiny(name="reuse"), "reuse.yaml")
    cls = sweep_trainable(plan.spec.algorithm, plan.spec.metric)
    before = _monitors()
    trainable = cls(config=plan.trial_config({}).to_dict())
    try:
        assert len(_monitors() - before) == 1
        assert "perf" in trainable.train()
        assert trainable.reset_config(plan.trial_config({}).update_from_dict({"seed": 1}).to_dict())
        assert len(_monitors() - before) == 1
        assert "perf" in trainable.train()
    finally:
        trainable.stop()
    assert not _monitors() - before


def test_a_reused_trial_actor_lets_the_stopped_learner_go(ray_session):
    """A stopped RLlib algorithm leaves its learner (module, optimiser, metrics) in reference
    cycles, which a process full of Ray, RLlib and PyTorch collects rarely: the reset collects
    them before it builds the next trial's (a reused process grew by 1.3 MB per CartPole trial:
    BENCHMARKS.md, "A reused trial process")."""
    plan = parse_plan(_tiny(name="reuse"), "reuse.yaml")
    trainable = sweep_trainable(plan.spec.algorithm, plan.spec.metric)(config=plan.trial_config({}).to_dict())
    try:
        trainable.train()
        stopped = [r.get() for r in trainable.algo.learner_group.foreach_learner(weakref.ref)]
        assert trainable.reset_config(plan.trial_config({}).update_from_dict({"seed": 1}).to_dict())
        assert [learner() for learner in stopped] == [None], "the first trial's learner outlived the reset"
        assert "perf" in trainable.train()
    finally:
        trainable.stop()


def test_iterations_that_end_no_episode_do_not_end_the_sweep(ray_session, tmp_path, monkeypatch):
    """RLlib's PPO runs from a spec too (its trials make the haepo envs; batch_size is its
    train_batch_size_per_learner; it reports the envs' success rate like HAEPO), here with
    64-step batches on 200-step random walks: most iterations end no episode, so RLlib's
    result has no episode_return_mean, which Tune treats as fatal for the whole sweep. The
    trial runs to the end; Tune sees the last return carried over (NaN before the first
    episode); MLflow holds only the returns of iterations that ended an episode."""
    monkeypatch.chdir(tmp_path)
    spec = parse_plan(_tiny(name="long", algorithm="PPO", env="haepo/RandomWalk-v0",
                            env_config={"target": 30, "horizon": 200},
                            settings={"num_env_runners": 0, "batch_size": 64, "minibatch_size": 32,
                                      "num_epochs": 1, "model_config": {"fcnet_hiddens": [8]}},
                            search_space={"seed": {"grid": [0]}}, stop={"iterations": 10}),
                      "long.yaml")
    uri = sqlite_store(tmp_path / "mlflow.db")
    result = run_sweep(spec, tracking_uri=uri, storage_path=str(tmp_path / "results"), out=io.StringIO())
    assert [(t.status, t.iterations) for t in result.trials] == [("TERMINATED", 10)]
    assert result.missing_metric is None  # reported late, but reported

    (trial,) = result.result_grid
    rows = trial.metrics_dataframe.set_index("training_iteration")
    ended = [int(i) for i in rows.index[rows["env_runners/num_episodes"] > 0]]
    assert ended and ended[0] > 1 and len(ended) < 10, f"the case needs iterations without episodes: {ended}"
    returns = rows[METRIC]
    for i in rows.index:
        earlier = [j for j in ended if j < i]
        if i not in ended and earlier:
            assert returns[i] == returns[max(earlier)]  # carried over
        elif i not in ended:
            assert math.isnan(returns[i])  # no episode yet

    client = MlflowClient(uri)
    _, (child,) = find_sweep_runs(uri, "long", result.parent_run_id)
    logged = client.get_metric_history(child.info.run_id, METRIC)
    assert sorted(m.step for m in logged) == ended
    assert all(m.value == returns[m.step] for m in logged)
    assert child.data.tags["haepo.algorithm"] == "PPO"
    assert child.data.params["_train_batch_size_per_learner"] == "64"
    assert 0.0 <= child.data.metrics["env_runners/success_rate"] <= 1.0  # the paper's episode metric


def test_a_metric_no_trial_reports_is_said_as_the_first_trial_ends(ray_session, tmp_path, monkeypatch, caplog):
    """A misspelt metric: the sweep runs (a metric may come late), and the first trial to end
    without it brings one warning naming the result keys closest to it; the summary says it again.
    So does a glob of tracking.metrics that selects no value MLflow could log (once; the others
    are not said)."""
    monkeypatch.chdir(tmp_path)
    globs = ["env_runner/episode_len_*", "learners/*/policy_entropy", "env_runners/num_episodes"]
    plan = parse_plan(_tiny(name="typo", metric="env_runners/episode_return_meen", stop={"iterations": 2},
                            search_space={"seed": {"grid": [0, 1]}}, tracking={"metrics": globs}), "typo.yaml")
    with caplog.at_level(logging.WARNING, logger="haepo_ray.sweep.metric_watch"):
        result = run_sweep(plan, tracking_uri=sqlite_store(tmp_path / "mlflow.db"), storage_path=str(tmp_path / "r"),
                           out=io.StringIO(), verbose=0)
    assert [t.status for t in result.trials] == ["TERMINATED"] * 2
    said = [r.getMessage() for r in caplog.records if r.name == "haepo_ray.sweep.metric_watch"]
    assert len(said) == 2, said
    assert said[0].startswith("no result so far has a value that tracking.metrics 'env_runner/episode_len_*' selects "
                              "(did you mean env_runners/episode_len_"), said
    assert re.search(r"\): MLflow logs nothing for it; fix tracking.metrics in the spec \(trial \w+ ended\)$", said[0])
    assert said[1].startswith("no trial has reported the sweep's metric 'env_runners/episode_return_meen' "
                              "(did you mean env_runners/episode_return_mean"), said
    assert result.missing_metric is not None and result.missing_metric in said[1]
    assert f"warning: {result.missing_metric}" in format_summary(result)


def test_the_carried_metric_survives_a_restore(ray_session, tmp_path):
    """A trial restored from a checkpoint (a retry, a resumed sweep, PBT's exploit into a
    reused actor) carries on the metric value it had, not NaN. PPO on 32-step random walks
    (never reaching the target) in 16-step batches: every second iteration ends an episode
    (return 0). Checkpointed after the second, the actor takes another config and that
    checkpoint, as PBT's exploit does; its next iteration, in a fresh episode, ends none."""
    from haepo_ray.names import CARRIED_OVER

    plan = parse_plan(_tiny(name="carry", algorithm="PPO", env="haepo/RandomWalk-v0",
                            env_config={"target": 32, "horizon": 32},
                            settings={"num_env_runners": 0, "batch_size": 16, "minibatch_size": 16,
                                      "num_epochs": 1, "model_config": {"fcnet_hiddens": [8]}}), "carry.yaml")
    trainable = sweep_trainable(plan.spec.algorithm, plan.spec.metric)(config=plan.trial_config({}).to_dict())
    try:
        results = [trainable.train(), trainable.train()]
        assert [CARRIED_OVER in r for r in results] == [True, False]
        assert math.isnan(results[0]["env_runners"][METRIC.split("/")[1]])
        assert results[1]["env_runners"][METRIC.split("/")[1]] == 0.0
        checkpoint = trainable.save(str(tmp_path / "checkpoint"))
        assert trainable.reset_config(plan.trial_config({}).update_from_dict({"seed": 1}).to_dict())
        trainable.restore(checkpoint)
        after = trainable.train()
    finally:
        trainable.stop()
    assert after[CARRIED_OVER] == [METRIC]
    assert after["env_runners"][METRIC.split("/")[1]] == 0.0


def test_optuna_tpe_with_asha(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = parse_plan(_tiny(
        name="optuna",
        search_space={"lr": {"loguniform": [1e-3, 1e-1]}, "beta_ent": {"uniform": [0.0, 0.1]},
                      "reward_normalization": {"choice": ["zscore", "sum"]}},
        search={"algorithm": "optuna", "num_samples": 4, "seed": 0},
        scheduler={"type": "asha", "max_t": 3, "grace_period": 1, "reduction_factor": 2},
        stop={"iterations": 10},
    ), "optuna.yaml")
    out = io.StringIO()
    result = run_sweep(spec, track=False, storage_path=str(tmp_path / "results"), out=out)
    assert len(result.trials) == 4
    assert all(t.status == "TERMINATED" for t in result.trials)
    assert len({t.values["lr"] for t in result.trials}) == 4  # Optuna suggested 4 points
    assert all(1e-3 <= t.values["lr"] <= 1e-1 for t in result.trials)
    assert all(t.values["reward_normalization"] in ("zscore", "sum") for t in result.trials)
    # ASHA is in charge: it stops every trial by max_t = 3 (the stop criterion says 10), some
    # maybe earlier at its rungs.
    assert all(1 <= t.iterations <= 3 for t in result.trials)
    assert max(t.iterations for t in result.trials) == 3


def test_population_based_training_mutates_lr_and_betas(ray_session, tmp_path, monkeypatch):
    """PBT replaces the values of the population's lower half with an upper trial's,
    perturbed or resampled, after iteration 2; the runs log the values in use every
    iteration. 2 trials (a lower and an upper half of one each; 4 on 2 CPUs took twice as
    long, pausing and restoring trials, for the same claim): synch (each trial waits for the
    other at each interval) and no max_concurrent_trials (Tune creates both trials at once,
    not each as a slot frees) make the interval compare both, whatever the timing."""
    monkeypatch.chdir(tmp_path)
    mutations = {"lr": {"loguniform": [1e-3, 1e-1]}, "beta_ent": {"loguniform": [1e-3, 1e-1]},
                 "beta_kl": {"choice": [0.0, 0.01, 0.1]}}
    spec = parse_plan(_tiny(
        name="pbt",
        search_space={**mutations, "seed": {"grid": [0, 1]}},
        search={"algorithm": "random", "seed": 0},
        scheduler={"type": "pbt", "perturbation_interval": 2, "mutations": mutations, "seed": 0,
                   "quantile_fraction": 0.5, "resample_probability": 0.5, "synch": True},
        stop={"iterations": 4},  # PBT is not asked at the last iteration: one interval
        checkpoint_frequency=2,
        max_concurrent_trials=None,
    ), "pbt.yaml")
    planned = {tuple(sorted(t.values.items())) for t in planned_trials(spec)}
    uri = sqlite_store(tmp_path / "mlflow.db")
    result = run_sweep(spec, tracking_uri=uri, storage_path=str(tmp_path / "results"), out=io.StringIO())
    assert [(t.status, t.iterations) for t in result.trials] == [("TERMINATED", 4)] * 2
    # The dry run showed the values the sweep started from.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    _, children = find_sweep_runs(uri, "pbt", result.parent_run_id)
    assert len(children) == 2
    started = {tuple(sorted({"lr": float(c.data.params["lr"]), "beta_ent": float(c.data.params["beta_ent"]),
                             "beta_kl": float(c.data.params["beta_kl"]),
                             "seed": int(c.data.params["seed"])}.items())) for c in children}
    assert started == planned
    # The values in use are logged every iteration; PBT changed those of the lower half (1 of
    # the 2 trials) after iteration 2.
    changed = 0
    for child in children:
        history = client.get_metric_history(child.info.run_id, "config/lr")
        assert len(history) >= 3
        changed += len({m.value for m in history}) > 1
    assert changed == 1


def _five_results(config):
    from ray import tune

    for i in range(5):
        tune.report({"x": float(i)})


def test_tune_asks_the_scheduler_about_each_result_but_the_stopping_one(ray_session, tmp_path):
    """Why the spec refuses an ASHA grace_period or a PBT perturbation_interval at or above
    stop.iterations (SweepSpec._scheduler_acts_before_stop): the scheduler never sees the
    result that meets the stop criterion."""
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler

    seen: list[int] = []

    class Recording(FIFOScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            seen.append(result["training_iteration"])
            return super().on_trial_result(tune_controller, trial, result)

    tune.Tuner(_five_results, tune_config=tune.TuneConfig(scheduler=Recording()),
               run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 3},
                                         verbose=0)).fit()
    assert seen == [1, 2]


@pytest.mark.parametrize("compare", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["json-only", "and-the-same-results"])
def test_trial_folders_hold_the_json_results_only_and_the_same_results(compare, ray_session, tmp_path,
                                                                       monkeypatch):
    """A sweep keeps Tune's JSON logger only (params.json, params.pkl, result.json: what a
    resume and ``metrics_dataframe`` read), not its CSV and TensorBoard ones; and (the slow
    tier: a second sweep, its actor's start) the trials' results are those of a run with all
    three loggers, value for value. One trial per sweep: a second trial of the same spec writes
    its folder through the same loggers."""
    from haepo_ray.sweep import runner

    def sweep(name: str) -> tuple[dict, list]:
        plan = parse_plan(_tiny(name=name, search_space={"seed": {"grid": [0]}}, stop={"iterations": 2},
                                checkpoint_at_end=False), f"{name}.yaml")
        result = run_sweep(plan, track=False, storage_path=str(tmp_path / "results"), out=io.StringIO(), verbose=0)
        folders = sorted(Path(r.path) for r in result.result_grid)
        files = [sorted(p.name for p in f.iterdir() if p.is_file()) for f in folders]
        # What training computes (the learner's values, the episodes), not clocks or machines.
        kept = ("learners/default_policy/", "env_runners/episode_return", "env_runners/episode_len",
                "env_runners/num_env_steps_sampled_lifetime", "env_runners/num_episodes", "training_iteration")
        clock = ("time", "duration", "_sec", "throughput", "timer")
        rows = {}
        for r in result.result_grid:
            seed = r.config["seed"]
            frame = r.metrics_dataframe  # read from result.json
            rows[seed] = [{k: v for k, v in row.items() if k.startswith(kept) and not any(c in k for c in clock)}
                          for row in frame.to_dict("records")]
        return rows, files

    lean, files = sweep("lean")
    assert all({"params.json", "params.pkl", "result.json"} <= set(f) for f in files), files
    assert not any(n == "progress.csv" or n.startswith("events.out") for f in files for n in f), files
    if not compare:
        return

    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

    monkeypatch.setattr(runner, "result_loggers",
                        lambda: [JsonLoggerCallback(), CSVLoggerCallback(), TBXLoggerCallback()])
    full, files = sweep("full")
    assert all({"progress.csv", "result.json"} <= set(f) for f in files), files
    assert lean.keys() == full.keys() == {0}
    for seed in lean:
        assert len(lean[seed]) == len(full[seed]) == 2
        for a, b in zip(lean[seed], full[seed]):
            assert a.keys() == b.keys() and len(a) > 20
            assert a["env_runners/episode_return_mean"] == b["env_runners/episode_return_mean"]
            for key in a:
                assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), (seed, key, a[key], b[key])
