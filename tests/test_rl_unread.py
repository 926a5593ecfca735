"""Which settings an RL run reads (``haepo_ray.rl.unread.READ_WHEN``): each claim checked by
training with two values of the setting and comparing the weights."""

from __future__ import annotations

import numpy as np
import pytest
from ray.rllib.algorithms.ppo import PPOConfig

from haepo_ray.rl.algorithm import HAEPOConfig
from haepo_ray.rl.baselines import DPOConfig, GRPOConfig
from haepo_ray.rl.unread import READ_WHEN, unread

CHAIN = "haepo/ChainMDP-v0"
# Two values of each setting; each pair changes the weights within 2 iterations wherever the setting
# is read (reference_update_interval: with a KL weight of 0.5, so that the reference matters).
VALUES = {"reference_update_interval": (1, 3), "beta_kl": (0.0, 0.5), "reward_normalization": ("zscore", "none"),
          "clip_param": (0.01, 0.5)}
CONFIGS = {"HAEPO": HAEPOConfig, "GRPO": GRPOConfig, "DPO": DPOConfig}
# (setting, algorithm, the settings that decide whether it is read): both sides of each rule
CASES = [
    *[("reference_update_interval", "HAEPO", {"reference_policy": ref, "beta_kl": 0.5})
      for ref in ("lagged", "initial", "behavior")],
    *[("beta_kl", algo, {"reference_policy": ref, "num_epochs": n})
      for algo in ("HAEPO", "GRPO") for ref, n in (("lagged", 1), ("initial", 1), ("behavior", 1), ("behavior", 2))],
    *[("reward_normalization", algo, {}) for algo in CONFIGS],
    *[("clip_param", "GRPO", {"num_epochs": n}) for n in (1, 2)],
]
# Where a run ignores a setting the weights may still differ by float rounding: the 'behavior'
# reference's log-probabilities come from the sampler's forward pass, the policy's from the learner's.
ROUNDING = 1e-6


def test_every_rule_has_a_proof_here():
    assert set(READ_WHEN) == set(VALUES) == {name for name, _, _ in CASES}
    for name, algo, decided in CASES:
        assert set(decided) - {"beta_kl"} == set(READ_WHEN[name][0]), name


def _config(algo: str, settings: dict):
    config = (CONFIGS[algo]().environment(CHAIN).env_runners(num_env_runners=0)
              .training(episodes_per_batch=8, lr=0.05, **settings)
              .rl_module(model_config={"fcnet_hiddens": [16]})
              .debugging(seed=0, log_sys_usage=False))  # Tune's usage monitor: stop() would wait 0.7 s for it
    if algo == "HAEPO":
        config.training(beta_ent=0.01)
    return config


def _trained_weights(config, iterations: int = 2) -> dict[str, np.ndarray]:
    algo = config.build_algo()
    try:
        for _ in range(iterations):
            algo.train()
        state = algo.learner_group.get_state()["learner"]["rl_module"]["default_policy"]
        return {key: np.array(value) for key, value in state.items()}
    finally:
        algo.stop()


@pytest.mark.parametrize(("name", "algo", "decided"), CASES)
def test_a_run_reads_a_setting_exactly_where_read_when_says(ray_session, name, algo, decided):
    configs = [_config(algo, {**decided, name: value}) for value in VALUES[name]]
    first, second = (_trained_weights(config) for config in configs)
    change = max(float(np.abs(first[key] - second[key]).max()) for key in first)
    ignored = name in unread(configs[:1], [name])
    assert ignored == (change < ROUNDING), (name, algo, decided, change)
    assert ignored or change > 1e3 * ROUNDING  # a read setting is not near the rounding


def test_unread_says_why_with_the_values_that_decide_it():
    initial = HAEPOConfig().training(reference_policy="initial")
    assert unread([initial], ["reference_update_interval", "lr", "beta_kl"]) == {
        "reference_update_interval": READ_WHEN["reference_update_interval"][2] + " (here: reference_policy 'initial')"}
    behavior = GRPOConfig().training(reference_policy="behavior", num_epochs=1)
    assert list(unread([behavior], ["beta_kl", "clip_param", "reward_normalization"])) == ["beta_kl", "clip_param"]
    assert "(here: reference_policy 'behavior', num_epochs 1)" in unread([behavior], ["beta_kl"])["beta_kl"]
    assert unread([DPOConfig()], ["reward_normalization"]) == {
        "reward_normalization": "DPO's loss reads only the order of the returns"}
    # PPO's clip_param is PPO's own (its minibatches move the ratio); RLlib's settings are not judged here
    assert unread([PPOConfig().training(num_epochs=1)], ["clip_param", "lr"]) == {}
    # a sweep's trials: refused when none reads it, with every value that decides it
    runs = [initial, HAEPOConfig().training(reference_policy="behavior"), initial]
    assert unread(runs, ["reference_update_interval"])["reference_update_interval"].endswith(
        "(here: reference_policy 'initial' or 'behavior')")
    assert unread([*runs, HAEPOConfig().training(reference_policy="lagged")], ["reference_update_interval"]) == {}
