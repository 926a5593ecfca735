"""The pieces of HAEPO's env runner (haepo_ray.rl.sampling): the lean path's episode cutting,
seeding and random-state checkpoints, and how the runner picks its vector env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from haepo_ray.envs import GaussianBanditVectorEnv, RandomWalkEnv, RandomWalkVectorEnv
from haepo_ray.rl.sampling import lean, seeding


class ScriptedPolicy:
    """Random actions; the log-prob of sub-env i at call c is c + i / 100, so every
    recorded step says which call and sub-env it came from."""

    def __init__(self, seed: int = 0):
        self.rng, self.calls = np.random.default_rng(seed), 0

    def __call__(self, obs: np.ndarray, t: int) -> lean.PolicyStep:
        n = len(obs)
        actions = self.rng.integers(0, 2, n)
        logp = self.calls + np.arange(n) / 100
        self.calls += 1
        return lean.PolicyStep(actions, actions, logp, np.stack([logp, -logp], axis=1))


@pytest.mark.parametrize("num_envs, num_episodes", [(4, 4), (3, 10), (6, 2)])
def test_lean_episodes_replay_on_the_single_env(num_envs, num_episodes):
    """Every episode is complete, in start order, and is what a single RandomWalkEnv does
    with its actions; its log-probs are those of the calls that acted in it."""
    env = RandomWalkVectorEnv(num_envs=num_envs, target=2, horizon=6)
    trajectories = lean.run_episodes(env, ScriptedPolicy(), num_episodes, seed=0)
    assert len(trajectories) == num_episodes
    assert [t.env_index for t in trajectories[:num_envs]] == list(range(min(num_envs, num_episodes)))
    for trajectory in trajectories:
        steps = len(trajectory.actions)
        assert len(trajectory.observations) == len(trajectory.infos) == steps + 1
        assert trajectory.terminated or trajectory.truncated
        single = RandomWalkEnv(target=2, horizon=6)
        obs, _ = single.reset()
        np.testing.assert_array_equal(trajectory.observations[0], obs)
        for k, action in enumerate(trajectory.actions):
            obs, reward, terminated, truncated, info = single.step(int(action))
            np.testing.assert_array_equal(trajectory.observations[k + 1], obs)
            assert trajectory.rewards[k] == reward and trajectory.infos[k + 1] == info
            assert (terminated or truncated) == (k == steps - 1)
        assert (trajectory.terminated, trajectory.truncated) == (terminated, truncated)
        calls = np.floor(trajectory.logp).astype(int)
        np.testing.assert_array_equal(np.diff(calls), 1)  # one call per step, none skipped
        np.testing.assert_allclose(trajectory.logp - calls, trajectory.env_index / 100)
        np.testing.assert_allclose(trajectory.dist_inputs[:, 1], -trajectory.logp)
        assert trajectory.rewards.dtype == np.float64


def test_episodes_start_in_order_and_a_finished_env_takes_the_next():
    """Episode k + n starts on the sub-env whose episode ended first (its first
    observation one step after the end: NEXT_STEP autoreset)."""
    env = RandomWalkVectorEnv(num_envs=2, target=1, horizon=3)

    class Policy(ScriptedPolicy):  # sub-env 0 always succeeds at once, sub-env 1 never
        def __call__(self, obs, t):
            step = super().__call__(obs, t)
            step.actions[:] = step.env_actions[:] = [1, 0]
            return step

    trajectories = lean.run_episodes(env, Policy(), 4)
    assert [(t.env_index, len(t.actions)) for t in trajectories] == [(0, 1), (1, 3), (0, 1), (0, 1)]
    # calls: 0 (both), 1 (sub-env 1; 0 autoresets), 2 (both end), none (0 autoresets,
    # 1 is not needed any more), 3 (sub-env 0)
    assert [int(t.logp[0]) for t in trajectories] == [0, 0, 2, 3]


def test_steps_where_every_recorded_env_autoresets_skip_the_forward_pass():
    """One-pull bandit episodes, 8 episodes from 4 sub-envs: pull, autoreset, pull."""
    policy = ScriptedPolicy()
    trajectories = lean.run_episodes(GaussianBanditVectorEnv(num_envs=4, num_arms=2), policy, 8, seed=1)
    assert policy.calls == 2
    assert [len(t.actions) for t in trajectories] == [1] * 8
    assert all("regret" in t.infos[1] and t.infos[0] == {} for t in trajectories)


def test_info_rows_follow_gymnasiums_masks():
    info = {"a": np.array([1, 2]), "_a": np.array([True, False]),
            "nested": {"b": np.array([3.0, 4.0]), "_b": np.array([False, True])},
            "_nested": np.array([True, True])}
    assert lean.info_row(info, 0) == {"a": 1, "nested": {}}
    assert lean.info_row(info, 1) == {"nested": {"b": 4.0}}
    assert lean.info_row({}, 0) == {}


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.uint8, np.int64])
def test_observations_become_the_tensors_rllibs_connector_makes(dtype):
    from ray.rllib.utils.torch_utils import convert_to_torch_tensor

    obs = (np.arange(12).reshape(3, 4) * 1.5).astype(dtype)
    expected = convert_to_torch_tensor(obs)
    got = lean.to_tensor(obs, torch.device("cpu"))
    assert got.dtype == expected.dtype and torch.equal(got, expected)


# --- Seeding and random state ----------------------------------------------------------------


def test_seeds_fit_the_vector_env_and_differ_by_seed_runner_and_evaluation():
    sync = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    vectorised = gym.make_vec("CartPole-v1", num_envs=3)
    seeds = seeding.independent_seeds(sync, 0, 1, False)
    assert isinstance(seeds, list) and len(set(seeds)) == 3
    assert isinstance(seeding.independent_seeds(vectorised, 0, 1, False), int)
    keys = [(0, 1, False), (0, 2, False), (1, 1, False), (0, 1, True)]
    assert len({seeding.independent_seeds(vectorised, *key) for key in keys}) == 4
    assert seeding.independent_seeds(vectorised, 0, 1, False) == seeding.independent_seeds(vectorised, 0, 1, False)
    assert len(seeding.env_generators(sync)) == 3 and len(seeding.env_generators(vectorised)) == 1


def test_random_state_round_trip_continues_a_vectorised_env_identically():
    env = GaussianBanditVectorEnv(num_envs=4, arm_means=[0.0, 1.0])
    env.reset(seed=3)
    state = seeding.rng_state(env, seeded=True, worker_index=1)
    first = env.step(np.zeros(4, np.int64))[1]
    assert not seeding.restore_rng_state(env, state, worker_index=2)  # another runner's
    assert seeding.restore_rng_state(env, state, worker_index=1)
    env.reset()
    np.testing.assert_array_equal(env.step(np.zeros(4, np.int64))[1], first)


# --- The runner's choice of vector env -------------------------------------------------------


def _runner(env: str, callbacks=None, **env_runners):
    from haepo_ray import HAEPOConfig
    from haepo_ray.rl.env_runner import HAEPOEnvRunner

    config = HAEPOConfig().environment(env).env_runners(num_envs_per_env_runner=4, **env_runners).debugging(seed=0)
    if callbacks is not None:
        config.callbacks(callbacks)
    return HAEPOEnvRunner(config=config, worker_index=1)


@pytest.mark.parametrize("env, expected", [
    ("CartPole-v1", "CartPoleVectorEnv"),
    ("haepo/GaussianBandit-v0", "GaussianBanditVectorEnv"),
    ("haepo/RandomWalk-v0", "RandomWalkVectorEnv"),
    ("haepo/ChainMDP-v0", "SyncVectorEnv"),  # no vector entry point
])
def test_the_runner_uses_a_vector_entry_point_where_the_env_offers_one(ray_session, env, expected):
    runner = _runner(env)
    try:
        assert type(runner.env.unwrapped).__name__ == expected
        assert runner.lean_path_blocker() is None
        episodes = runner.sample(num_episodes=6)
        assert len(episodes) == 6 and all(e.is_done for e in episodes)
    finally:
        runner.stop()


def test_rllibs_loop_keeps_sync_envs_in_rounds(ray_session):
    from haepo_ray.rl.callbacks import EpisodeInfoMetrics
    from haepo_ray.rl.sampling import rounds

    class PerStep(EpisodeInfoMetrics):
        def on_episode_step(self, **kwargs) -> None:
            pass

    runner = _runner("CartPole-v1", PerStep)
    try:
        assert isinstance(runner.env.unwrapped, gym.vector.SyncVectorEnv)
        assert runner.lean_path_blocker() == "callbacks with per-step hooks"
        assert len(rounds.round_wrappers(runner.env.unwrapped)) == 4
    finally:
        runner.stop()


# FrozenLake: Discrete(16); Blackjack: Tuple(Discrete(32), Discrete(11), Discrete(2)).
@pytest.mark.parametrize("env, width, ones", [("FrozenLake-v1", 16, 1), ("Blackjack-v1", 45, 3)])
def test_observations_that_are_not_a_box_reach_the_model_one_hot(ray_session, env, width, ones):
    runner = _runner(env)
    try:
        assert runner.lean_path_blocker() is None  # flattened on the lean path too
        assert runner.module.observation_space.shape == (width,)
        episodes = runner.sample(num_episodes=6)
        obs = np.concatenate([e.get_observations() for e in episodes])
        assert obs.shape[1] == width and set(np.unique(obs)) == {0.0, 1.0}
        assert (obs.sum(axis=1) == ones).all()
        if env == "FrozenLake-v1":  # every episode starts on square 0
            assert [int(e.get_observations()[0].argmax()) for e in episodes] == [0] * 6
    finally:
        runner.stop()


def test_a_connector_of_the_configs_own_closes_the_lean_path(ray_session):
    runner = _runner("CartPole-v1", env_to_module_connector=lambda env, spaces, device: [])
    try:
        assert runner.lean_path_blocker() == "custom connectors"
    finally:
        runner.stop()


@pytest.mark.parametrize("env, spaces, pieces", [
    (gym.make("FrozenLake-v1"), None, 1),
    (gym.make("CartPole-v1"), None, 0),
    (None, {"__env_single__": (gym.spaces.Discrete(3), gym.spaces.Discrete(2))}, 1),  # the driver's call
    (None, {"__env_single__": (gym.spaces.Box(0, 1, (2,)), gym.spaces.Discrete(2))}, 0),
    (None, None, 0),
])
def test_only_observations_that_are_not_a_box_are_flattened(env, spaces, pieces):
    from ray.rllib.connectors.env_to_module import FlattenObservations

    from haepo_ray.rl.observations import flatten_non_box

    made = flatten_non_box(env, spaces, None)
    assert len(made) == pieces and all(isinstance(piece, FlattenObservations.func) for piece in made)


def test_a_vectorised_runner_restores_its_streams_from_its_state(ray_session):
    runner = _runner("haepo/GaussianBandit-v0")
    try:
        runner.sample(num_episodes=4)
        state = runner.get_state()
        rewards = [float(e.get_rewards()[0]) for e in runner.sample(num_episodes=8)]
        runner.set_state(state)
        assert [float(e.get_rewards()[0]) for e in runner.sample(num_episodes=8)] == rewards
    finally:
        runner.stop()
