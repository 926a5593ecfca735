"""Methods in a language-model spec: ``search_space.algorithm`` values that are an algorithm
with settings of its own (``{HAEPO: {length_normalize: true}}``), as the ranked CPU protocol
compares HAEPO, HAEPO on length-normalised log-likelihoods, GRPO and DPO in one grid."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.tune.search.variant_generator import generate_variants

from haepo_ray.sweep.kinds import load_plan, parse_plan
from haepo_ray.sweep.planned import planned_trials
from haepo_ray.sweep.spec import SpecError

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "tune_configs" / "llm_smoke.yaml"
RANKED = REPO / "tune_configs" / "llm_cpu_ranked.yaml"
VARIANT = {"HAEPO": {"length_normalize": True}}


def spec_with(algorithms: list, **changes) -> dict:
    spec = yaml.safe_load(SMOKE.read_text())
    spec["search_space"] = {"algorithm": {"grid": algorithms}, "seed": {"grid": [0, 1]}}
    for key, value in changes.items():
        spec[key] = {**spec.get(key, {}), **value}
    return spec


def resolved_configs(plan) -> list[dict]:
    """The trial configs Tune resolves from the plan's param_space (grid, then sample_from)."""
    return [resolved["config"] for _, resolved in generate_variants({"config": plan.param_space})]


def test_each_trial_runs_its_method_and_logs_the_values_it_ran_with():
    plan = parse_plan(spec_with(["HAEPO", VARIANT, "GRPO"]), "m.yaml")
    configs = resolved_configs(plan)
    ran = [(c["algo"], c["length_normalize"], c["seed"]) for c in configs]
    assert ran == [("HAEPO", False, 0), ("HAEPO", True, 0), ("GRPO", False, 0),
                   ("HAEPO", False, 1), ("HAEPO", True, 1), ("GRPO", False, 1)]
    # the search values MLflow tags (the report's configuration: only what the method sets)
    assert [plan.search_values(c)["algorithm"] for c in configs[:3]] == [
        {"algo": "HAEPO"}, {"algo": "HAEPO", "length_normalize": True}, {"algo": "GRPO"}]
    # what the trial builds from its config, and what the dry run checks for each planned trial
    from haepo_ray.sweep.kinds.llm.config import trial_settings

    settings = [trial_settings(c) for c in configs]
    assert [(s.algo, s.length_normalize) for s in settings[:3]] == [("HAEPO", False), ("HAEPO", True), ("GRPO", False)]
    planned = [plan.trial_config(t.values) for t in planned_trials(plan)]
    assert planned == settings


def test_the_unbiased_estimator_is_a_method_the_report_names_by_its_setting():
    from haepo_ray.report.runs import config_label
    from haepo_ray.sweep.kinds.llm.config import trial_settings

    plan = parse_plan(spec_with(["HAEPO", {"HAEPO": {"estimator": "unbiased"}}]), "m.yaml")
    configs = resolved_configs(plan)
    assert [trial_settings(c).estimator for c in configs[:2]] == ["weights", "unbiased"]
    method = plan.search_values(configs[1])["algorithm"]
    assert method == {"algo": "HAEPO", "estimator": "unbiased"}
    assert config_label({k: v for k, v in method.items() if k != "algo"}) == "estimator=unbiased"
    bad = parse_plan(spec_with(["HAEPO", {"HAEPO": {"estimator": "paper"}}]), "m.yaml")
    with pytest.raises(SpecError, match=r"estimator must be one of \('weights', 'unbiased'\), got 'paper'"):
        [bad.trial_config(t.values) for t in planned_trials(bad)]  # as the dry run checks each planned trial


def test_a_grid_of_plain_algorithms_keeps_algo_as_its_key():
    plan = parse_plan(spec_with(["HAEPO", "GRPO"]), "m.yaml")
    assert plan.search_keys["algorithm"] == "algo" and "method" not in plan.param_space
    assert [c["algo"] for c in resolved_configs(plan)] == ["HAEPO", "GRPO", "HAEPO", "GRPO"]


def test_the_ranked_protocol_compares_six_methods_and_the_sft_start_from_one_start_per_seed():
    plan = load_plan(RANKED)
    trials = planned_trials(plan)
    configs = [plan.trial_config(t.values) for t in trials]
    methods = {(c.algo, c.length_normalize, c.estimator, c.dpo_pairs) for c in configs}
    assert methods == {("HAEPO", False, "weights", "gold"), ("HAEPO", False, "unbiased", "gold"),
                       ("HAEPO", True, "weights", "gold"), ("GRPO", False, "weights", "gold"),
                       ("DPO", False, "weights", "gold"), ("DPO", False, "weights", "reward")}
    assert all(c.eval_start and c.eval_prompts >= 64 and c.min_new_tokens == 1 and c.max_new_tokens == 32
               and c.aspect == "challenge" and c.max_source_words >= 48 for c in configs)
    starts = {}
    for t in trials:
        starts.setdefault(t.values["seed"], set()).add(plan.trial_columns(t.values)["SFT start"])
    assert sorted(starts) == [0, 1, 2] and all(len(keys) == 1 for keys in starts.values())
    assert len(set().union(*starts.values())) == 3


@pytest.mark.parametrize(("algorithms", "changes", "message"), [
    (["HAEPO", {"HAEPO": {"length_normalise": True}}], {},
     "m.yaml: search_space.algorithm.HAEPO.length_normalise: not a setting a method can set"),
    (["HAEPO", {"HAEPO": {"seed": 3}}], {}, "search_space.algorithm.HAEPO.seed: not a setting a method can set"),
    (["HAEPO", {"PPO": {"lr": 0.1}}], {}, "a method is one algorithm (HAEPO, GRPO, DPO) with a map of its settings"),
    (["HAEPO", {"HAEPO": True}], {}, "a method is one algorithm"),
    (["HAEPO", {"HAEPO": {"lr": 0.1}, "GRPO": {}}], {}, "a method is one algorithm"),
    (["HAEPO", {"HAEPO": {"lr": 0.1}}], {"settings": {"lr": 0.2}},
     "search_space.algorithm.HAEPO.lr: also in settings; keep one"),
    (["HAEPO", {"DPO": {"beta_kl": 0.1}}], {},
     "m.yaml: search_space.algorithm.DPO.beta_kl: DPO trials would ignore it"),
])
def test_a_bad_method_is_a_spec_error_naming_it(algorithms, changes, message):
    with pytest.raises(SpecError) as err:
        parse_plan(spec_with(algorithms, **changes), "m.yaml")
    assert message in str(err.value)


def test_tunes_trials_resolve_the_methods_settings_from_their_config_without_a_deprecation(caplog):
    """A Tune trial resolves each ``sample_from`` with its config itself (not wrapped in a spec,
    as :func:`resolved_configs`' variant generator does); Ray 2.60 warns of a function that
    needs the wrapping, and will drop it."""
    from ray.tune.search.sample import Function

    plan = parse_plan(spec_with(["HAEPO", VARIANT]), "m.yaml")
    functions = {k: v for k, v in plan.param_space.items() if isinstance(v, Function)}
    assert sorted(functions) == ["algo", "length_normalize"]
    with caplog.at_level("WARNING", logger="ray.tune.search.sample"):
        for config in resolved_configs(plan):
            trial = {k: v for k, v in config.items() if k not in functions}
            assert {k: f.sample(config=trial) for k, f in functions.items()} == {
                k: config[k] for k in functions}
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]
