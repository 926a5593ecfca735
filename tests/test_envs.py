"""The paper's environments: registration, env checker, seeding, reward formulas, validation."""

from __future__ import annotations

import importlib
import math
import pickle
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import haepo_ray.envs
from haepo_ray.envs import (
    ChainMDPEnv,
    GaussianBanditEnv,
    GaussianBanditVectorEnv,
    NewsvendorEnv,
    RandomWalkEnv,
    RandomWalkVectorEnv,
    check_env_id,
    register_with_ray,
    registered_envs,
)

IDS = list(registered_envs())
ACTIONS = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 2, 3, 4, 5] * 3


def rollout(env: gym.Env, seed: int | None, actions: list[int]) -> list[tuple]:
    """Observations, rewards, flags and infos of ``actions``, resetting after each episode."""
    obs, info = env.reset(seed=seed)
    out = [(obs.tolist(), info)]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a % env.action_space.n)
        out.append((obs.tolist(), reward, terminated, truncated, info))
        if terminated or truncated:
            obs, info = env.reset()
            out.append((obs.tolist(), info))
    return out


def test_ids_are_the_papers_environments():
    assert IDS == ["haepo/GaussianBandit-v0", "haepo/RandomWalk-v0", "haepo/ChainMDP-v0", "haepo/Newsvendor-v0"]
    assert all(isinstance(d, str) and d and "\n" not in d for d in registered_envs().values())


@pytest.mark.parametrize("env_id", IDS)
def test_make_and_env_checker_without_warnings(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make(env_id)
        check_env(env.unwrapped, skip_render_check=True)
        rollout(env, 0, ACTIONS)  # through gymnasium's passive checker too
    assert gym.spec(env_id).max_episode_steps is None  # the envs end their own episodes


def test_make_passes_constructor_kwargs():
    assert gym.make("haepo/GaussianBandit-v0", num_arms=3).action_space.n == 3
    assert gym.make("haepo/RandomWalk-v0", target=2, horizon=4).unwrapped.horizon == 4
    assert gym.make("haepo/ChainMDP-v0", length=3).observation_space.shape == (4,)
    assert gym.make("haepo/Newsvendor-v0", max_order=20, price=12).unwrapped.price == 12.0


def test_registration_is_idempotent_and_import_does_not_need_ray():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(haepo_ray.envs)
    code = "import sys, haepo_ray.envs; assert 'ray' not in sys.modules, 'imports ray'"
    subprocess.run([sys.executable, "-W", "error", "-c", code], check=True)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_trajectory(env_id):
    assert rollout(gym.make(env_id), 7, ACTIONS) == rollout(gym.make(env_id), 7, ACTIONS)


@pytest.mark.parametrize("env_id", ["haepo/GaussianBandit-v0", "haepo/Newsvendor-v0"])
def test_different_seeds_differ_where_the_env_is_stochastic(env_id):
    assert rollout(gym.make(env_id), 1, ACTIONS) != rollout(gym.make(env_id), 2, ACTIONS)


@pytest.mark.parametrize("env_id", IDS)
def test_pickled_env_continues_identically(env_id):
    env = gym.make(env_id).unwrapped
    rollout(env, 3, ACTIONS[:5])
    copy = pickle.loads(pickle.dumps(env))
    assert rollout(copy, None, ACTIONS) == rollout(env, None, ACTIONS)


def test_unknown_env_id_is_a_clear_error():
    check_env_id("CartPole-v1")
    with pytest.raises(ValueError, match=r"unknown env 'Nope-v9': not a .*haepo/ChainMDP-v0"):
        check_env_id("Nope-v9")
    close = r"unknown env 'CartPol-v1' \(did you mean CartPole-v1, CartPole-v0\?\): not a "
    with pytest.raises(ValueError, match=close):
        check_env_id("CartPol-v1")
    with pytest.raises(ValueError, match=r"\(did you mean haepo/ChainMDP-v0\?\)"):
        check_env_id("haepo/ChainMdp-v0")


def test_registered_with_ray_without_a_cluster():
    from ray.tune.registry import ENV_CREATOR, _global_registry

    register_with_ray()
    register_with_ray()
    assert all(_global_registry.contains(ENV_CREATOR, env_id) for env_id in IDS)
    env = _global_registry.get(ENV_CREATOR, "haepo/ChainMDP-v0")({"length": 3})
    assert isinstance(env, ChainMDPEnv) and env.length == 3
    assert isinstance(_global_registry.get(ENV_CREATOR, "haepo/Newsvendor-v0")({}), NewsvendorEnv)


# --- Gaussian bandit -----------------------------------------------------------------------


def test_bandit_means_are_drawn_once_from_the_seed():
    env = GaussianBanditEnv(num_arms=20)
    assert env.arm_means is None
    env.reset(seed=5)
    means = env.arm_means.copy()
    assert means.shape == (20,) and ((0 <= means) & (means <= 1)).all() and len(set(means)) == 20
    env.reset(seed=6)
    env.reset()
    np.testing.assert_array_equal(env.arm_means, means)  # held fixed for the env's lifetime
    other = GaussianBanditEnv(num_arms=20)
    other.reset(seed=5)
    np.testing.assert_array_equal(other.arm_means, means)
    assert env.optimal_mean == means.max()
    # means_seed draws them at construction, as the first reset(seed=means_seed) would
    fixed = GaussianBanditEnv(num_arms=20, means_seed=5)
    np.testing.assert_array_equal(fixed.arm_means, means)
    fixed.reset(seed=99)
    np.testing.assert_array_equal(fixed.arm_means, means)
    seeded_elsewhere = GaussianBanditEnv(num_arms=20)
    seeded_elsewhere.reset(seed=6)
    assert not np.array_equal(seeded_elsewhere.arm_means, means)


def test_bandit_regret_and_reward_distribution():
    env = GaussianBanditEnv(arm_means=[0.1, 0.9, 0.4])
    assert env.num_arms == 3 and env.optimal_mean == 0.9
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(2)
    assert terminated and not truncated
    assert info["regret"] == pytest.approx(0.5) and info["optimal_mean"] == 0.9
    assert env.step(1)[4]["regret"] == 0.0
    rewards = []
    for _ in range(4000):
        env.reset()
        rewards.append(env.step(0)[1])
    assert abs(np.mean(rewards) - 0.1) < 5 / np.sqrt(4000)  # within 5 standard errors of mu
    assert np.std(rewards) == pytest.approx(1.0, abs=0.05)


# --- Random walk and chain -------------------------------------------------------------------


def test_random_walk_success_and_time_limit():
    env = RandomWalkEnv(target=4, horizon=16)
    obs, _ = env.reset(seed=0)
    assert obs.tolist() == [0.0, 1.0]
    steps = [env.step(1) for _ in range(4)]
    assert [s[1] for s in steps] == [0.0, 0.0, 0.0, 1.0]
    assert [s[2] for s in steps] == [False, False, False, True] and not any(s[3] for s in steps)
    assert steps[-1][0].tolist() == [1.0, 0.75] and steps[-1][4]["success"]
    env.reset()
    steps = [env.step(0) for _ in range(16)]
    assert sum(s[1] for s in steps) == 0.0 and not any(s[2] for s in steps)
    assert [s[3] for s in steps] == [False] * 15 + [True] and not steps[-1][4]["success"]
    assert steps[-1][0].tolist() == [-4.0, 0.0] and env.observation_space.contains(steps[-1][0])
    tight = RandomWalkEnv(target=3, horizon=3)  # success on the last step is not a time-out
    tight.reset(seed=0)
    assert [tight.step(1)[1:4] for _ in range(3)][-1] == (1.0, True, False)


def test_chain_always_advance_succeeds_and_any_stay_fails():
    env = ChainMDPEnv(length=5)
    env.reset(seed=0)
    steps = [env.step(ChainMDPEnv.ADVANCE) for _ in range(5)]
    assert [s[1] for s in steps] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert [s[2] for s in steps] == [False] * 4 + [True] and not any(s[3] for s in steps)
    assert steps[-1][0].tolist() == [0, 0, 0, 0, 0, 1] and steps[-1][4]["success"]
    for stay_at in range(5):
        env.reset()
        actions = [ChainMDPEnv.STAY if t == stay_at else ChainMDPEnv.ADVANCE for t in range(5)]
        steps = [env.step(a) for a in actions]
        assert sum(s[1] for s in steps) == 0.0 and not any(s[2] for s in steps)
        assert [s[3] for s in steps] == [False] * 4 + [True]
        assert steps[-1][0].tolist() == [0, 0, 0, 0, 1, 0]


# --- Newsvendor ------------------------------------------------------------------------------


@pytest.mark.parametrize("q, d, profit", [(5, 3, 4.0), (0, 4, 0.0), (10, 12, 40.0), (7, 0, -28.0), (5, 5, 20.0)])
def test_newsvendor_profit_by_hand(q, d, profit):
    assert NewsvendorEnv().profit(q, d) == profit


def test_newsvendor_step_reports_demand_and_profit():
    env = NewsvendorEnv()
    env.reset(seed=0)
    for q in range(11):
        _, reward, terminated, truncated, info = env.step(q)
        assert terminated and not truncated
        assert reward == info["profit"] == env.profit(q, info["demand"])


def test_newsvendor_expected_profit_matches_monte_carlo():
    env = NewsvendorEnv()
    assert env.expected_profit(0) == 0.0
    assert env.expected_profit(1) == pytest.approx(4 - 8 * math.exp(-5))  # loses 8 only if d = 0
    env.reset(seed=0)
    profits = [env.step(6)[1] for _ in range(20000)]
    assert abs(np.mean(profits) - env.expected_profit(6)) < 5 * np.std(profits) / np.sqrt(20000)


@pytest.mark.parametrize(
    "kwargs, optimum",
    [
        ({}, 5),  # critical ratio (10 - 6) / (10 - 2) = 0.5: the median of Poisson(5)
        ({"cost": 3.0, "salvage": 1.0}, 7),  # 7/9: the smallest q with P(D <= q) >= 0.778
        ({"demand_mean": 2.0, "max_order": 3}, 2),
    ],
)
def test_newsvendor_optimal_order_is_the_critical_fractile(kwargs, optimum):
    env = NewsvendorEnv(**kwargs)
    expected = [env.expected_profit(q) for q in range(env.max_order + 1)]
    assert env.optimal_order == int(np.argmax(expected)) == optimum
    ratio = (env.price - env.cost) / (env.price - env.salvage)
    cdf = np.cumsum([math.exp(-env.demand_mean) * env.demand_mean**d / math.factorial(d) for d in range(50)])
    assert optimum == int(np.argmax(cdf >= ratio))


# --- Constructor validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (GaussianBanditEnv, {"num_arms": 1}, r"GaussianBanditEnv: num_arms must be an integer >= 2, got 1"),
        (GaussianBanditEnv, {"num_arms": True}, "num_arms must be an integer"),
        (RandomWalkEnv, {"target": True}, "target must be an integer"),
        (GaussianBanditEnv, {"num_arms": 3.0}, "num_arms must be an integer"),
        (GaussianBanditEnv, {"reward_std": 0.0}, "reward_std must be a finite number > 0"),
        (GaussianBanditEnv, {"reward_std": float("nan")}, "reward_std must be a finite number"),
        (GaussianBanditEnv, {"reward_std": True}, "reward_std must be a finite number"),
        (GaussianBanditEnv, {"arm_means": [0.5]}, "arm_means must be a sequence of at least 2"),
        (GaussianBanditEnv, {"arm_means": 0.5}, "arm_means must be a sequence"),
        (GaussianBanditEnv, {"arm_means": [0.5, float("nan")]}, r"arm_means\[1\] must be a finite number"),
        (GaussianBanditEnv, {"arm_means": [0.5, 0.2], "num_arms": 3}, r"num_arms must equal len\(arm_means\)"),
        (GaussianBanditEnv, {"arm_means": [0.5, 0.2], "means_seed": 0}, "arm_means or means_seed"),
        (GaussianBanditEnv, {"means_seed": -1}, "means_seed must be an integer >= 0"),
        (RandomWalkEnv, {"target": 0}, "target must be an integer >= 1"),
        (RandomWalkEnv, {"horizon": 2.5}, "horizon must be an integer"),
        (RandomWalkEnv, {"target": 10, "horizon": 9}, r"horizon must be an integer >= target \(10\), got 9"),
        (ChainMDPEnv, {"length": 0}, "length must be an integer >= 1"),
        (ChainMDPEnv, {"length": False}, "length must be an integer"),
        (ChainMDPEnv, {"length": 5, "horizon": 3}, r"horizon must be an integer >= length \(5\), got 3"),
        (NewsvendorEnv, {"max_order": 0}, "max_order must be an integer >= 1"),
        (NewsvendorEnv, {"max_order": "10"}, "max_order must be an integer"),
        (NewsvendorEnv, {"demand_mean": -1}, "demand_mean must be a finite number > 0"),
        (NewsvendorEnv, {"price": 5.0}, r"price must be a finite number > cost \(6.0\), got 5.0"),
        (NewsvendorEnv, {"cost": 2.0}, r"cost must be a finite number > salvage \(2.0\)"),
        (NewsvendorEnv, {"salvage": -1.0}, "salvage must be a finite number >= 0"),
        (NewsvendorEnv, {"salvage": float("inf")}, "salvage must be a finite number"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


# --- Numpy-vectorised versions -------------------------------------------------------------


def test_vectorised_versions_are_gymnasiums_and_rays_vector_entry_points():
    from ray.tune.registry import ENV_CREATOR, _global_registry

    assert isinstance(gym.make_vec("haepo/GaussianBandit-v0", num_envs=3), GaussianBanditVectorEnv)
    assert isinstance(gym.make_vec("haepo/RandomWalk-v0", num_envs=3, target=4), RandomWalkVectorEnv)
    register_with_ray()
    creator = _global_registry.get(ENV_CREATOR, "haepo/RandomWalk-v0")
    assert isinstance(creator({"num_envs": 2, "target": 3}), RandomWalkVectorEnv)  # RLlib's vector entry point
    assert isinstance(creator({"target": 3}), RandomWalkEnv)
    assert gym.spec("haepo/ChainMDP-v0").vector_entry_point is None


def _vector_rollout(env: gym.vector.VectorEnv, seed: int, actions: np.ndarray) -> list[tuple]:
    out = [env.reset(seed=seed)]
    out += [env.step(a) for a in actions]
    return out


@pytest.mark.parametrize("kwargs", [{"num_arms": 4}, {"arm_means": [0.1, 0.9, 0.4]}, {"num_arms": 5, "means_seed": 3}])
def test_one_vectorised_bandit_draws_what_the_single_bandit_draws(kwargs):
    """Same seed, same pulls: the same means, rewards and infos, with the vector env's
    NEXT_STEP autoreset in between (reward 0, no info)."""
    pulls = [0, 2, 1, 2, 0, 1, 1, 2]
    single = GaussianBanditEnv(**kwargs)
    single.reset(seed=11)
    expected = []
    for a in pulls:
        _, reward, terminated, _, info = single.step(a)
        expected.append((reward, info["regret"], info["optimal_mean"]))
        assert terminated
        single.reset()
    vector = GaussianBanditVectorEnv(num_envs=1, **kwargs)
    vector.reset(seed=11)
    np.testing.assert_array_equal(vector.arm_means[0], single.arm_means)
    got = []
    for a in pulls:
        _, reward, terminated, truncated, info = vector.step(np.array([a]))
        assert terminated[0] and not truncated[0] and info["_regret"][0]
        got.append((reward[0], info["regret"][0], info["optimal_mean"][0]))
        _, reward, terminated, _, info = vector.step(np.array([0]))  # the autoreset step
        assert reward[0] == 0.0 and not terminated[0] and not info["_regret"][0]
    assert got == expected


def test_vectorised_bandits_draw_independent_means_and_the_reward_distribution():
    env = GaussianBanditVectorEnv(num_envs=500, num_arms=3)
    env.reset(seed=0)
    means = env.arm_means
    assert means.shape == (500, 3) and ((0 <= means) & (means <= 1)).all()
    assert abs(means.mean() - 0.5) < 5 * np.sqrt(1 / 12 / means.size)  # U[0, 1]
    assert len({tuple(row) for row in means}) == 500  # every sub-env its own bandit
    shared = GaussianBanditVectorEnv(num_envs=4000, arm_means=[0.1, 0.9, 0.4])
    shared.reset(seed=1)
    rewards = []
    for _ in range(5):
        _, reward, _, _, info = shared.step(np.zeros(4000, np.int64))
        rewards.append(reward)
        assert info["regret"] == pytest.approx(0.8) and (info["optimal_mean"] == 0.9).all()
        shared.step(np.zeros(4000, np.int64))  # autoreset
    rewards = np.concatenate(rewards)
    assert abs(rewards.mean() - 0.1) < 5 / np.sqrt(rewards.size)
    assert rewards.std() == pytest.approx(1.0, abs=0.03)
    again = GaussianBanditVectorEnv(num_envs=4000, arm_means=[0.1, 0.9, 0.4])
    again.reset(seed=1)
    np.testing.assert_array_equal(again.step(np.zeros(4000, np.int64))[1], rewards[:4000])


def test_vectorised_random_walk_steps_each_sub_env_as_the_single_walk():
    """Random actions per sub-env; each sub-env's observations, rewards, flags and
    successes equal a single RandomWalkEnv's given the same actions, episode after episode."""
    n, steps = 6, 200
    actions = np.random.default_rng(0).integers(0, 2, (steps, n))
    actions[:, 0] = 1  # one sub-env that succeeds every `target` steps
    vector = RandomWalkVectorEnv(num_envs=n, target=3, horizon=7)
    out = _vector_rollout(vector, 0, actions)
    for i in range(n):
        single = RandomWalkEnv(target=3, horizon=7)
        obs, _ = single.reset(seed=0)
        np.testing.assert_array_equal(out[0][0][i], obs)
        restart = False
        for t in range(steps):
            got_obs, got_reward, got_term, got_trunc, info = out[t + 1]
            if restart:  # NEXT_STEP autoreset: the start observation, reward 0, no info
                obs, _ = single.reset()
                expected = (obs, 0.0, False, False)
                assert not info["_success"][i]
            else:
                obs, reward, terminated, truncated, single_info = single.step(int(actions[t, i]))
                expected = (obs, reward, terminated, truncated)
                assert info["_success"][i] and info["success"][i] == single_info["success"]
            np.testing.assert_array_equal(got_obs[i], expected[0])
            assert (got_reward[i], got_term[i], got_trunc[i]) == expected[1:]
            restart = bool(got_term[i] or got_trunc[i])


@pytest.mark.parametrize("cls", [GaussianBanditVectorEnv, RandomWalkVectorEnv])
def test_vectorised_envs_validate_their_arguments(cls):
    with pytest.raises(ValueError, match="num_envs"):
        cls(num_envs=0)
    with pytest.raises(ValueError, match="target|num_arms"):
        cls(num_envs=2, **({"target": 0} if cls is RandomWalkVectorEnv else {"num_arms": 1}))
