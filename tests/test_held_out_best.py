"""bench/held_out_best.py: the held-out spec of a paper sweep trains exactly the chosen setting
(a spec of one setting: that setting), on other seeds. (Its sweeps and tables: REPRODUCTION.md,
the bandit and CartPole.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import bench_module

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
