"""bench/held_out_best.py: the held-out spec of a paper sweep trains exactly the chosen setting
(a spec of one setting: that setting), on other seeds. (Its sweeps and tables: REPRODUCTION.md,
the bandit and CartPole.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import bench_module, sqlite_store

from haepo_ray import names
from haepo_ray.sweep.kinds import parse_plan

PAPER = Path(__file__).resolve().parents[1] / "tune_configs" / "paper"
SELECTING = sorted(p for p in PAPER.glob("*.yaml")  # the specs that search more than seeds
                   if set(yaml.safe_load(p.read_text()).get("search_space", {})) - {"seed"})


CHECKED = [PAPER / f"{name}.yaml"  # one of each algorithm, a string setting, a spec of one setting
           for name in ("bandit_k10_dpo", "bandit_k10_haepo", "bandit_k10_ppo", "chain_mdp_haepo", "cartpole_haepo")]


def test_the_specs_that_search_settings_are_the_bandits_and_the_normalisation_comparisons():
    bandits = [f"bandit_k{k}_{a}" for k in (10, 20, 30) for a in ("dpo", "haepo", "ppo")]
    assert [p.stem for p in SELECTING] == [*bandits, "chain_mdp_haepo", "newsvendor_haepo"]


@pytest.mark.parametrize("path", CHECKED, ids=[p.stem for p in CHECKED])
def test_the_held_out_spec_trains_the_chosen_setting_on_the_new_seeds(path):
    held_out = bench_module("held_out_best")
    spec = yaml.safe_load(path.read_text())
    setting = {key: values["grid"][-1] for key, values in spec["search_space"].items() if key != "seed"}
    held = held_out.held_out_spec(spec, setting, [5, 6])
    assert held["name"] == f"{path.stem}_heldout" and held["search_space"] == {"seed": {"grid": [5, 6]}}
    original, again = parse_plan(spec, str(path)), parse_plan(held, "held-out")
    for seed in (5, 6):
        before = original.trial_config({**setting, "seed": seed}).to_dict()
        after = again.trial_config({"seed": seed}).to_dict()
        assert {key for key in before.keys() | after.keys() if str(before.get(key)) != str(after.get(key))} == set()
    assert original.trial_config({**setting, "seed": 5}).to_dict() != again.trial_config({"seed": 6}).to_dict()


def test_a_setting_the_spec_does_not_search_is_refused():
    held_out = bench_module("held_out_best")
    spec = yaml.safe_load(SELECTING[0].read_text())
    with pytest.raises(ValueError, match=r"bandit_k10_dpo: \['gamma'\] are not in its search_space"):
        held_out.held_out_spec(spec, {"gamma": 0.9}, [5])


def _sweep(uri: str, experiment: str, trials: list[tuple[dict, float]]) -> None:
    """An MLflow experiment of finished trials: (search values, final regret) each."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment(experiment)
    parent = client.create_run(exp, tags={names.ROLE: "sweep"}).info.run_id
    for values, regret in trials:
        run = client.create_run(exp, tags={"mlflow.parentRunId": parent, names.ROLE: "trial",
                                           names.ALGORITHM: "HAEPO", names.ENV: "haepo/GaussianBandit-v0",
                                           names.SEARCH_VALUES: json.dumps(values)}).info.run_id
        client.log_batch(run, metrics=[Metric(names.REGRET_PER_STEP, regret, 0, 1),
                                       Metric(names.TIME_TOTAL_S, 1.0, 0, 1)])
        client.set_terminated(run)


def test_a_missing_sweep_seeds_that_are_not_held_out_and_a_stored_run_of_other_seeds_are_refused(tmp_path):
    held_out = bench_module("held_out_best")
    path = PAPER / "bandit_k10_haepo.yaml"
    uri = sqlite_store(tmp_path / "mlflow.db")
    run = lambda seeds: held_out.run_held_out(path, uri, tmp_path, "regret", seeds, "no-haepo-here")  # noqa: E731
    with pytest.raises(SystemExit, match=f"no sweep bandit_k10_haepo in {uri}: run bench/reproduce.sh first"):
        run([5, 6])
    _sweep(uri, "bandit_k10_haepo", [({"lr": lr, "batch_size": 8, "seed": seed}, regret)
                                     for lr, regret in ((0.001, 0.3), (0.005, 0.1)) for seed in (0, 1)])
    with pytest.raises(SystemExit, match=r"seeds \[1\] picked the best setting: they are not held out"):
        run([1, 2])
    _sweep(uri, "bandit_k10_haepo_heldout", [({"seed": 5}, 0.2)])
    with pytest.raises(SystemExit, match=r"ran seeds \[5\], not \[5, 6\]"):
        run([5, 6])
    row = run([5])  # read from the store: nothing runs (no haepo command to run it with)
    assert row == ("| bandit_k10_haepo | batch_size=8, lr=0.005 | 2 | 0.1 [0.1, 0.1] (seeds 0-1) "
                   "| 0.2 (n=1, no interval) (seeds 5-5) |")
