"""The paper's environments: registration, env checker, seeding, reward formulas, validation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from haepo_ray.envs import (
    ChainMDPEnv,
    GaussianBanditEnv,
    NewsvendorEnv,
    RandomWalkEnv,
    check_env_id,
    registered_envs,
)

IDS = list(registered_envs())


def rollout(env: gym.Env, seed: int, actions: list[int]) -> list[tuple]:
    obs, _ = env.reset(seed=seed)
    out = [tuple(np.asarray(obs).tolist())]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        out.append((tuple(np.asarray(obs).tolist()), reward, terminated, truncated))
        if terminated or truncated:
            obs, _ = env.reset()
            out.append(tuple(np.asarray(obs).tolist()))
    return out


def test_ids_are_the_papers_environments():
    assert IDS == ["haepo/GaussianBandit-v0", "haepo/RandomWalk-v0", "haepo/ChainMDP-v0", "haepo/Newsvendor-v0"]


@pytest.mark.parametrize("env_id", IDS)
def test_make_and_env_checker(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_trajectory(env_id):
    actions = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1] * 3
    assert rollout(gym.make(env_id), 7, actions) == rollout(gym.make(env_id), 7, actions)


@pytest.mark.parametrize("env_id", ["haepo/GaussianBandit-v0", "haepo/Newsvendor-v0"])
def test_different_seeds_differ_where_the_env_is_stochastic(env_id):
    actions = [1, 2, 3, 4, 5] * 4
    assert rollout(gym.make(env_id), 1, actions) != rollout(gym.make(env_id), 2, actions)


def test_unknown_env_id_is_a_clear_error():
    check_env_id("CartPole-v1")
    with pytest.raises(ValueError, match="unknown env 'Nope-v9'.*haepo/ChainMDP-v0"):
        check_env_id("Nope-v9")


# --- Gaussian bandit -----------------------------------------------------------------------


def test_bandit_means_are_drawn_once_from_the_seed():
    env = GaussianBanditEnv(num_arms=20)
    env.reset(seed=5)
    means = env.arm_means.copy()
    assert means.shape == (20,) and ((0 <= means) & (means <= 1)).all()
    env.reset(seed=6)
    env.reset()
    np.testing.assert_array_equal(env.arm_means, means)  # held fixed for the env's lifetime
    other = GaussianBanditEnv(num_arms=20)
    other.reset(seed=5)
    np.testing.assert_array_equal(other.arm_means, means)
    assert env.optimal_mean == means.max()


def test_bandit_regret_and_reward_distribution():
    env = GaussianBanditEnv(arm_means=[0.1, 0.9, 0.4])
    env.reset(seed=0)
    _, _, terminated, _, info = env.step(2)
    assert terminated and info["regret"] == pytest.approx(0.5) and info["optimal_mean"] == 0.9
    rewards = []
    for _ in range(4000):
        env.reset()
        rewards.append(env.step(1)[1])
    # mean within 5 standard errors of mu = 0.9; std close to 1
    assert abs(np.mean(rewards) - 0.9) < 5 / np.sqrt(4000)
    assert np.std(rewards) == pytest.approx(1.0, abs=0.05)


# --- Random walk and chain -------------------------------------------------------------------


def test_random_walk_success_and_time_limit():
    env = RandomWalkEnv(target=4, horizon=20)
    env.reset(seed=0)
    steps = [env.step(1) for _ in range(4)]
    assert [s[1] for s in steps] == [0.0, 0.0, 0.0, 1.0]
    assert steps[-1][2] and not steps[-1][3]
    env.reset()
    steps = [env.step(0) for _ in range(20)]
    assert sum(s[1] for s in steps) == 0.0
    assert steps[-1][3] and not steps[-1][2] and not any(s[3] for s in steps[:-1])


def test_chain_always_advance_succeeds_and_any_stay_fails():
    env = ChainMDPEnv(length=5)
    env.reset(seed=0)
    steps = [env.step(ChainMDPEnv.ADVANCE) for _ in range(5)]
    assert [s[1] for s in steps] == [0, 0, 0, 0, 1.0] and steps[-1][2]
    assert steps[-1][0].tolist() == [0, 0, 0, 0, 0, 1]
    env.reset()
    steps = [env.step(a) for a in (0, 1, 0, 0, 0)]
    assert sum(s[1] for s in steps) == 0 and steps[-1][3] and not steps[-1][2]


# --- Newsvendor ------------------------------------------------------------------------------


@pytest.mark.parametrize("q, d, profit", [(5, 3, 4.0), (0, 4, 0.0), (10, 12, 40.0), (7, 0, -28.0), (5, 5, 20.0)])
def test_newsvendor_profit_by_hand(q, d, profit):
    assert NewsvendorEnv().profit(q, d) == profit


def test_newsvendor_expected_profit_and_optimal_order():
    env = NewsvendorEnv()
    env.reset(seed=0)
    profits = [env.step(6)[1] for _ in range(20000)]
    assert abs(np.mean(profits) - env.expected_profit(6)) < 5 * np.std(profits) / np.sqrt(20000)
    # critical ratio (p - c) / (p - v) = 0.5: the median of Poisson(5), 5
    assert env.optimal_order == 5
    assert env.expected_profit(5) == max(env.expected_profit(q) for q in range(11))


# --- Constructor validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (GaussianBanditEnv, {"num_arms": 1}, "num_arms must be an integer >= 2"),
        (GaussianBanditEnv, {"num_arms": True}, "num_arms"),
        (GaussianBanditEnv, {"reward_std": 0.0}, "reward_std must be a finite number > 0"),
        (GaussianBanditEnv, {"arm_means": [0.5]}, "at least 2"),
        (GaussianBanditEnv, {"arm_means": [0.5, float("nan")]}, r"arm_means\[1\]"),
        (RandomWalkEnv, {"target": 0}, "target must be an integer >= 1"),
        (RandomWalkEnv, {"horizon": 2.5}, "horizon"),
        (ChainMDPEnv, {"length": 0}, "length"),
        (ChainMDPEnv, {"length": 5, "horizon": 3}, "horizon must be an integer >= 5"),
        (NewsvendorEnv, {"demand_mean": -1}, "demand_mean"),
        (NewsvendorEnv, {"price": 5.0}, "price > cost > salvage"),
        (NewsvendorEnv, {"salvage": float("inf")}, "salvage must be a finite number"),
        (NewsvendorEnv, {"max_order": "10"}, "max_order"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_registered_with_ray(ray_session):
    from ray.tune.registry import ENV_CREATOR, _global_registry

    assert all(_global_registry.contains(ENV_CREATOR, env_id) for env_id in IDS)
