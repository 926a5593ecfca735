"""HAEPO as an RLlib algorithm on a real local Ray: sampling, learning, checkpoints, Tune."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from haepo_ray.rl.algorithm import HAEPOConfig
from haepo_ray.rl.callbacks import EpisodeInfoMetrics

CHAIN = "haepo/ChainMDP-v0"
BANDIT = "haepo/GaussianBandit-v0"
BANDIT_MEANS = [0.0, 0.25, 0.5, 0.75, 1.0]


def chain_config(num_env_runners: int = 0, seed: int = 0) -> HAEPOConfig:
    return (
        HAEPOConfig()
        .environment(CHAIN)
        .env_runners(num_env_runners=num_env_runners)
        .training(episodes_per_batch=8, lr=0.05, beta_ent=0.01, beta_kl=0.01)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=seed)
    )


def train(config: HAEPOConfig, iterations: int) -> tuple[list[dict], object]:
    algo = config.build_algo()
    results = [algo.train() for _ in range(iterations)]
    return results, algo


def episode_return(result: dict) -> float:
    return result["env_runners"]["episode_return_mean"]


# --- Config validation (no Ray needed) ---------------------------------------------------


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"beta_ent": -0.1}, "beta_ent"),
        ({"beta_kl": -1.0}, "beta_kl"),
        ({"beta_kl": float("nan")}, "beta_kl"),
        ({"beta_ent": [[0, 0.1], [0, 0.2]]}, "beta_ent"),
        ({"beta_ent": {"type": "cosine", "start": 0.1}}, "beta_ent"),
        ({"episodes_per_batch": 0}, "episodes_per_batch"),
        ({"episodes_per_batch": 2.5}, "episodes_per_batch"),
        ({"reward_normalization": "minmax"}, "reward_normalization"),
        ({"estimator": "paper"}, r"estimator must be one of \('weights', 'unbiased'\), got 'paper'"),
        ({"reference_policy": "old"}, "reference_policy"),
        ({"reference_update_interval": 0}, "reference_update_interval"),
        ({"minibatch_size": 32}, "minibatch_size"),
    ],
)
def test_invalid_settings_fail_validation_naming_the_field(settings, field):
    config = HAEPOConfig().environment(CHAIN).training(**settings)
    with pytest.raises(ValueError, match=field):
        config.validate()


@pytest.mark.parametrize("baseline", ["GRPO", "DPO"])
def test_the_unbiased_estimator_is_refused_for_the_baselines(baseline):
    from haepo_ray.rl.baselines.dpo import DPOConfig
    from haepo_ray.rl.baselines.grpo import GRPOConfig

    config = {"GRPO": GRPOConfig, "DPO": DPOConfig}[baseline]().environment(CHAIN).training(estimator="unbiased")
    with pytest.raises(ValueError, match=f"estimator 'unbiased' is HAEPO's gradient estimator, not {baseline}'s"):
        config.validate()
    HAEPOConfig().environment(CHAIN).training(estimator="unbiased").validate()


@pytest.mark.parametrize(("algo", "settings", "reason"), [
    ("HAEPO", {}, "HAEPO's weights are a softmax over the group, and a group of one has weight 1"),
    ("HAEPO", {"estimator": "unbiased"}, "normalization zscore makes a group's one return 0"),
    ("GRPO", {"reward_normalization": "sum"}, "normalization sum makes a group's one return R into R / |R|"),
    ("DPO", {"reward_normalization": "none"}, "DPO's pairs need two returns that differ"),
    ("HAEPO", {"estimator": "unbiased", "reward_normalization": "none"}, None),  # REINFORCE on the return
    ("GRPO", {"reward_normalization": "none"}, None),
])
def test_one_episode_per_batch_is_refused_where_its_return_cannot_reach_the_gradient(algo, settings, reason):
    """What baseline_losses.lone_episode_reason says, which test_baselines checks on the losses."""
    from haepo_ray.rl.baselines.dpo import DPOConfig
    from haepo_ray.rl.baselines.grpo import GRPOConfig

    config_cls = {"HAEPO": HAEPOConfig, "GRPO": GRPOConfig, "DPO": DPOConfig}[algo]
    config = config_cls().environment(CHAIN).training(episodes_per_batch=1, **settings)
    if reason is None:
        config.validate()
        return
    with pytest.raises(ValueError, match=re.escape(f"{algo}: episodes_per_batch 1: {reason}")):
        config.validate()
    config.training(episodes_per_batch=2).validate()


def test_more_learners_than_episodes_fails_validation():
    config = HAEPOConfig().environment(CHAIN).training(episodes_per_batch=2).learners(num_learners=3)
    with pytest.raises(ValueError, match="num_learners"):
        config.validate()


def test_defaults_validate_and_reference_is_not_behavior():
    config = HAEPOConfig().environment(CHAIN)
    config.validate()
    assert config.reference_policy == "lagged" and config.beta_kl > 0


@pytest.mark.parametrize("algo", ["HAEPO", "GRPO", "PPO"])
def test_every_algorithm_of_haepo_ray_takes_observations_that_are_not_a_box(algo):
    """RLlib's own PPOConfig cannot build a model for FrozenLake's Discrete(16) squares; as
    haepo-ray builds configs (haepo train, sweeps), every algorithm can, and a connector of
    the config's own is kept."""
    import gymnasium as gym
    from ray.rllib.algorithms.ppo import PPOConfig

    from haepo_ray.rl import configs
    from haepo_ray.rl.observations import flatten_non_box
    from haepo_ray.upstream.rllib import connector_factories

    spaces = (gym.spaces.Discrete(16), gym.spaces.Discrete(4))
    with pytest.raises(ValueError, match=r"PPO's model for FrozenLake-v1 cannot be built: observations Discrete\(16\)"):
        configs.check_model(PPOConfig().environment("FrozenLake-v1"), *spaces)
    config = configs.build_config(algo, "FrozenLake-v1")
    assert connector_factories(config) == (flatten_non_box, None)
    configs.check_model(config, *spaces)

    def own(env, spaces, device):
        return []

    kept = configs.apply_defaults(PPOConfig().environment("FrozenLake-v1").env_runners(env_to_module_connector=own))
    assert connector_factories(kept)[0] is own



def test_a_model_config_key_the_default_model_would_not_read_is_refused():
    """RLlib's default RLModules ignore a key they do not read: with ``fcnet_hidden: [8]`` HAEPO
    built the default [256, 256] without a word. A key the algorithm adds (DQN's ``dueling``) is
    read; a custom RLModule's keys are its own."""
    import gymnasium as gym
    from ray.rllib.algorithms.bc.torch.default_bc_torch_rl_module import DefaultBCTorchRLModule
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from haepo_ray.rl import configs

    config = configs.build_config("HAEPO", "CartPole-v1", settings={"model_config": {"fcnet_hidden": [8]}})
    spaces = {DEFAULT_MODULE_ID: (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))}
    widths = [m.out_features for m in config.get_rl_module_spec(spaces=spaces).build().modules()
              if isinstance(m, torch.nn.Linear)]
    assert widths == [256, 256, 2], widths  # RLlib alone: the typo dropped
    with pytest.raises(ValueError) as err:
        configs.validate(config)
    assert str(err.value) == (
        "HAEPO: model_config 'fcnet_hidden' (did you mean fcnet_hiddens?): RLlib's DefaultBCTorchRLModule would "
        "not read it; it reads the fields of DefaultModelConfig (ray.rllib.core.rl_module.default_model_config), "
        "and ignores any other key")
    config.rl_module(model_config={"fcnet_hiddens": [8], "vf_share_layers:true": None, "use_attention": True})
    assert configs.unread_model_keys(config).startswith(
        "'use_attention', 'vf_share_layers:true' (YAML reads it as one key: write vf_share_layers: true, with a "
        "space): RLlib's DefaultBCTorchRLModule would not read them;")
    dqn = configs.build_config("DQN", "CartPole-v1", settings={"model_config": {"dueling": False, "twin_q": True}})
    assert configs.unread_model_keys(dqn).startswith("'twin_q': RLlib's DefaultDQNTorchRLModule would not read it; "
                                                     "it reads the fields of DefaultModelConfig")
    assert "and double_q, dueling, epsilon, num_atoms, std_init, v_max, v_min," in configs.unread_model_keys(dqn)

    class OwnModule(DefaultBCTorchRLModule):
        pass

    config.rl_module(rl_module_spec=RLModuleSpec(module_class=OwnModule))
    assert configs.unread_model_keys(config) is None
    assert configs.unread_model_keys(configs.build_config("PPO", "CartPole-v1", settings={
        "model_config": {"fcnet_hiddens": [8], "vf_share_layers": True, "head_fcnet_hiddens": [4]}})) is None

# --- Sampling ------------------------------------------------------------------------------


# 2 remote runners of 1 env each: a slow twin of (2, 3), which samples across runners too.
@pytest.mark.parametrize("num_env_runners, envs_per_runner",
                         [(0, 1), pytest.param(2, 1, marks=pytest.mark.slow), (2, 3)])
def test_batches_hold_exactly_m_complete_episodes(ray_session, num_env_runners, envs_per_runner):
    config = (
        chain_config(num_env_runners)
        .environment(CHAIN, env_config={"horizon": 12})
        .env_runners(num_envs_per_env_runner=envs_per_runner)
        .training(episodes_per_batch=7)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            episodes, _ = algo.sample_episodes(7)
            assert len(episodes) == 7
            assert all(e.is_done for e in episodes)
            assert all(e.is_terminated or len(e) == 12 for e in episodes)
        result = algo.train()
        learner = result["learners"]["default_policy"]
        assert learner["num_episodes"] == 7
        assert result["env_runners"]["num_episodes"] == 7
    finally:
        algo.stop()


class CoinLengthEnv:
    """Episodes of length 1 or 30 with equal probability, whatever the actions; observations a
    Box or (``discrete_observations``) a Discrete, actions a Discrete or (``multi_discrete_actions``)
    a MultiDiscrete."""

    def __new__(cls, env_config=None):
        import gymnasium as gym

        env_config = env_config or {}
        discrete = env_config.get("discrete_observations", False)

        class _Env(gym.Env):
            observation_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(0.0, 1.0, (1,), np.float32)
            action_space = (gym.spaces.MultiDiscrete([2, 2]) if env_config.get("multi_discrete_actions")
                            else gym.spaces.Discrete(2))

            def obs(self):
                return 0 if discrete else np.zeros(1, np.float32)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.length, self.t = (1 if self.np_random.random() < 0.5 else 30), 0
                return self.obs(), {}

            def step(self, action):
                self.t += 1
                return self.obs(), 1.0, self.t >= self.length, False, {}

        return _Env()


class PerStepCallback(EpisodeInfoMetrics):
    """A callback with a per-step hook: HAEPO's runner then samples through RLlib's loop."""

    def on_episode_step(self, **kwargs) -> None:
        pass


SAMPLING_PATHS = {"lean": EpisodeInfoMetrics, "rllib-loop": PerStepCallback}


@pytest.mark.parametrize(("path", "env_config", "blocker"), [
    ("lean", {}, None),
    ("rllib-loop", {}, "callbacks with per-step hooks"),
    ("lean", {"discrete_observations": True}, None),  # one-hot, as RLlib's FlattenObservations makes them
    ("lean", {"multi_discrete_actions": True}, "action space is neither Box nor Discrete"),  # the env blocks it
])
def test_vectorised_sampling_is_not_biased_towards_short_episodes(ray_session, path, env_config, blocker):
    """RLlib's sample(num_episodes=n) over 4 envs returns the first n episodes to finish:
    mostly length-1 ones. HAEPO's runner takes the first n episodes to start (lean path) or
    one episode per env per round (RLlib's loop), whether the config, the env or the module
    blocks the lean path."""
    from ray.tune.registry import register_env

    register_env("test/CoinLength-v0", CoinLengthEnv)
    config = (
        HAEPOConfig().environment("test/CoinLength-v0", env_config=env_config)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4)
        .training(episodes_per_batch=6).debugging(seed=0, log_sys_usage=False)
        .callbacks(SAMPLING_PATHS[path])
    )
    algo = config.build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        assert runner.lean_path_blocker() == blocker
        lengths = []
        for _ in range(40):
            episodes, metrics = algo.sample_episodes(6)
            assert len(episodes) == 6
            assert metrics[0]["num_env_steps_sampled"] == sum(len(e) for e in episodes)
            lengths += [len(e) for e in episodes]
    finally:
        algo.stop()
    assert set(lengths) == {1, 30}
    standard_error = 14.5 / np.sqrt(len(lengths))
    assert abs(np.mean(lengths) - 15.5) < 4 * standard_error


# FrozenLake (slippery): Discrete(16) observations and random moves; Blackjack: a Tuple of Discretes
@pytest.mark.parametrize("env", ["CartPole-v1", "FrozenLake-v1", "Blackjack-v1"])
def test_lean_sampling_reproduces_rllibs_loop_exactly(ray_session, env):
    """One env, one episode per call: the lean path draws the same episodes, action for
    action, as RLlib's own loop (same seeds, same random streams, same log-probabilities), its
    observations flattened as RLlib's FlattenObservations does where they are not a Box."""
    sampled = {}
    for path, callbacks in SAMPLING_PATHS.items():
        config = (
            HAEPOConfig().environment(env)
            .env_runners(num_env_runners=0).debugging(seed=7, log_sys_usage=False).callbacks(callbacks)
        )
        algo = config.build_algo()
        try:
            runner = algo.env_runner_group.local_env_runner
            assert (runner.lean_path_blocker() is None) == (path == "lean")
            sampled[path] = [runner.sample(num_episodes=1)[0] for _ in range(4)]
        finally:
            algo.stop()
    for lean, loop in zip(sampled["lean"], sampled["rllib-loop"]):
        lean.validate()
        assert len(lean) == len(loop) and lean.is_terminated == loop.is_terminated
        assert lean.observation_space == loop.observation_space
        assert lean.get_observations().dtype == loop.get_observations().dtype
        np.testing.assert_array_equal(lean.get_observations(), loop.get_observations())
        np.testing.assert_array_equal(lean.get_actions(), loop.get_actions())
        np.testing.assert_array_equal(lean.get_rewards(), loop.get_rewards())
        for column in ("action_logp", "action_dist_inputs"):
            np.testing.assert_allclose(
                lean.get_extra_model_outputs(column), loop.get_extra_model_outputs(column), rtol=1e-6
            )


def _demand_streams(seed: int, worker_index: int, envs: int = 4, calls: int = 5) -> list[tuple]:
    """Each sub-env's newsvendor demands over ``calls`` batches of one episode per env."""
    from haepo_ray.rl.env_runner import HAEPOEnvRunner

    config = (HAEPOConfig().environment("haepo/Newsvendor-v0")
              .env_runners(num_envs_per_env_runner=envs).debugging(seed=seed))
    runner = HAEPOEnvRunner(config=config, worker_index=worker_index)
    streams: list[list[int]] = [[] for _ in range(envs)]
    try:
        for _ in range(calls):
            for i, episode in enumerate(runner.sample(num_episodes=envs)):  # 1-step episodes, env order
                streams[i].append(int(episode.get_infos()[-1]["demand"]))
    finally:
        runner.stop()
    return [tuple(stream) for stream in streams]


def test_env_streams_are_independent_across_envs_runners_and_seeds(ray_session):
    """RLlib seeds sub-env i of runner w with seed + w + i: runner 2's env 0 would replay
    runner 1's env 1, and trial seed 1 would replay seed 0's streams shifted by one env."""
    streams = {key: _demand_streams(*key) for key in [(0, 1), (0, 2), (1, 1)]}
    every = [stream for runner in streams.values() for stream in runner]
    assert len(set(every)) == len(every) == 12
    assert _demand_streams(0, 1) == streams[(0, 1)]  # and reproducible


@pytest.mark.parametrize("runner_name", ["HAEPOEnvRunner", "IndependentSeedsEnvRunner"])
def test_rllib_loop_seeds_every_sub_env_independently(ray_session, runner_name):
    """The first observations of 4 CartPoles of runners (seed 0, runner 1), (0, 2) and (1, 1),
    sampled through RLlib's loop (as PPO samples): 12 distinct initial states, reproducible."""
    from haepo_ray.rl import env_runner

    def first_observations(seed: int, worker_index: int) -> list[tuple]:
        config = (HAEPOConfig().environment("CartPole-v1")
                  .env_runners(num_envs_per_env_runner=4).debugging(seed=seed))
        runner = getattr(env_runner, runner_name)(config=config, worker_index=worker_index)
        try:
            episodes = runner.sample(num_timesteps=4)
        finally:
            runner.stop()
        return [tuple(np.round(e.get_observations(0), 6)) for e in episodes]

    observations = {key: first_observations(*key) for key in [(0, 1), (0, 2), (1, 1)]}
    every = [obs for runner in observations.values() for obs in runner]
    assert len(set(every)) == len(every) == 12
    assert first_observations(0, 1) == observations[(0, 1)]


def test_rounds_of_the_first_batch_are_not_replayed(ray_session):
    """On RLlib's loop, 8 episodes from 4 envs are two rounds of one sample() each; the
    second round must continue the envs' streams, not re-seed them (same 4 demands twice)."""
    config = (HAEPOConfig().environment("haepo/Newsvendor-v0").callbacks(PerStepCallback)
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4).debugging(seed=0))
    algo = config.build_algo()
    try:
        episodes, _ = algo.sample_episodes(8)
    finally:
        algo.stop()
    demands = [int(e.get_infos()[-1]["demand"]) for e in episodes]
    assert demands[:4] != demands[4:], demands


def test_first_gradient_step_uses_the_behavior_log_likelihood(ray_session):
    """At the first gradient step on a batch, L_k equals the sum of the behaviour log-probs."""
    results, algo = train(chain_config().training(num_epochs=1), 2)
    algo.stop()
    for result in results:
        assert result["learners"]["default_policy"]["behavior_logp_gap"] < 1e-5


def test_default_reference_makes_the_kl_term_act(ray_session):
    results, algo = train(chain_config(), 3)
    algo.stop()
    kls = [r["learners"]["default_policy"]["kl_to_reference"] for r in results]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # iteration 1: reference == initial == current
    assert max(kls[1:]) > 1e-4


def test_lagged_reference_refreshes_every_n_training_iterations(ray_session):
    """reference_update_interval counts train() calls, not updates: with several updates per
    iteration and interval 2, the reference is the policy after iterations 0, 2, 4."""
    config = (chain_config().training(reference_update_interval=2)
              .reporting(min_sample_timesteps_per_iteration=100))
    algo = config.build_algo()

    def weights_and_reference() -> tuple[dict, dict, int]:
        state = algo.learner_group.get_state()["learner"]  # numpy views of the live tensors
        ref = state["haepo_reference"]
        copy = lambda arrays: {k: np.array(v) for k, v in arrays.items()}  # noqa: E731
        return copy(state["rl_module"]["default_policy"]), copy(ref["modules"]["default_policy"]), ref["num_updates"]

    try:
        weights, references = [weights_and_reference()[0]], []
        for _ in range(5):
            algo.train()
            w, ref, num_updates = weights_and_reference()
            weights.append(w)
            references.append(ref)
    finally:
        algo.stop()
    assert num_updates >= 15  # >= 3 updates per iteration
    for iteration, expected in zip(range(1, 6), [0, 0, 2, 2, 4]):
        for name, value in references[iteration - 1].items():
            np.testing.assert_array_equal(value, weights[expected][name], err_msg=f"{iteration} {name}")
    assert any(not np.array_equal(weights[2][k], weights[0][k]) for k in weights[0])


def test_recurrent_modules_fail_validation():
    config = HAEPOConfig().environment(CHAIN).rl_module(model_config={"use_lstm": True})
    with pytest.raises(ValueError, match="use_lstm.*stateful"):
        config.validate()


@pytest.mark.parametrize("algo", ["HAEPO", "DPO", "GRPO"])
def test_multi_agent_configs_fail_validation_with_their_policies(algo):
    from haepo_ray.rl.registry import algorithm_class

    config = algorithm_class(algo).get_default_config().environment(CHAIN)
    if algo == "DPO":
        config.training(beta_ent=0.0, beta_kl=0.0)
    config.validate()  # single-agent: valid
    config.multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda agent_id, *args, **kwargs: f"p{agent_id}")
    with pytest.raises(ValueError, match=rf"^{algo}: multi-agent configs are not supported \(policies \['p0', 'p1'\]\)"):
        config.validate()


def test_behavior_reference_is_inert_with_one_gradient_step(ray_session):
    results, algo = train(chain_config().training(reference_policy="behavior", num_epochs=1), 3)
    algo.stop()
    assert all(abs(r["learners"]["default_policy"]["kl_to_reference"]) < 1e-6 for r in results)


def test_episodes_are_not_replayed_across_iterations(ray_session):
    """RLlib re-seeds envs at every sample(num_episodes=..) call; HAEPO's runner seeds once."""
    config = HAEPOConfig().environment(BANDIT, env_config={"num_arms": 5}).debugging(seed=3)
    algo = config.build_algo()
    try:
        first, _ = algo.sample_episodes(8)
        second, _ = algo.sample_episodes(8)
        rewards = lambda eps: [float(e.get_rewards()[0]) for e in eps]  # noqa: E731
        assert rewards(first) != rewards(second)
    finally:
        algo.stop()


def test_nan_reward_is_a_clear_error(ray_session):
    import gymnasium as gym
    from ray.tune.registry import register_env

    class NaNRewardEnv(gym.Env):
        observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(1, np.float32), {}

        def step(self, action):
            return np.zeros(1, np.float32), float("nan"), True, False, {}

    register_env("test/NaNReward-v0", lambda cfg: NaNRewardEnv())
    algo = HAEPOConfig().environment("test/NaNReward-v0").build_algo()
    try:
        with pytest.raises(Exception, match="non-finite reward"):
            algo.train()
    finally:
        algo.stop()


@pytest.mark.parametrize("num_env_runners", [0, 2])
def test_env_runners_sample_with_the_learners_weights_after_every_update(
    ray_session, monkeypatch, num_env_runners
):
    """The lone local runner gets the weights directly (no ray.put); remote runners through
    EnvRunnerGroup.sync_weights. Either way with the learner's weights_seq_no."""
    import ray

    config = (
        HAEPOConfig().environment(BANDIT, env_config={"num_arms": 5})
        .env_runners(num_env_runners=num_env_runners)
        .reporting(min_sample_timesteps_per_iteration=30)  # one-step episodes: 4 updates
        .debugging(seed=0)
    )
    algo = config.build_algo()
    if num_env_runners == 0:
        def no_put(*args, **kwargs):
            raise AssertionError("ray.put with no remote env runner")

        monkeypatch.setattr(ray, "put", no_put)
    try:
        for _ in range(2):
            result = algo.train()
        learner = algo.learner_group.get_state(components="learner/rl_module", inference_only=True)["learner"]
        runner = algo.env_runner_group.foreach_env_runner(
            lambda r: r.get_state(components="rl_module"), local_env_runner=num_env_runners == 0
        )[0]
    finally:
        monkeypatch.undo()
        algo.stop()
    assert result["num_training_step_calls_per_iteration"] > 1
    assert runner["weights_seq_no"] == learner["weights_seq_no"] > 2
    weights = learner["rl_module"]["default_policy"]
    assert runner["rl_module"].keys() == weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(runner["rl_module"][name], value, err_msg=name)


# --- Learning ------------------------------------------------------------------------------


# Learning with remote env runners is learning plus the weight sync and sampling that
# test_env_runners_sample_with_the_learners_weights_after_every_update[2] and
# test_batches_hold_exactly_m_complete_episodes[2-3] check exactly: a slow twin.
@pytest.mark.parametrize("num_env_runners", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_learns_the_chain_mdp(ray_session, num_env_runners):
    """A random policy reaches the end of the 5-step chain with probability 1/32."""
    results, algo = train(chain_config(num_env_runners), 40)
    algo.stop()
    assert episode_return(results[0]) < 0.3
    assert episode_return(results[-1]) > 0.6


# The bandit with remote env runners: a slow twin, as the chain's.
@pytest.mark.parametrize("num_env_runners", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_learns_a_gaussian_bandit(ray_session, num_env_runners):
    config = (
        HAEPOConfig()
        .environment(BANDIT, env_config={"arm_means": BANDIT_MEANS})
        .env_runners(num_env_runners=num_env_runners)
        .training(episodes_per_batch=16, lr=0.05, beta_ent=0.01, beta_kl=0.01)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=1)
    )
    results, algo = train(config, 40)
    algo.stop()
    random_policy = float(np.mean(BANDIT_MEANS))
    assert episode_return(results[0]) < random_policy + 0.2
    assert episode_return(results[-1]) > 0.8


def test_learns_a_frozen_lake_from_one_hot_squares(ray_session):
    """FrozenLake's observation is its square, Discrete(9), which reaches the model one-hot
    (haepo_ray.rl.observations). The way round the holes (H) is right, right, down, down: the
    policy must tell squares apart, so it learns only if the encoding reaches the learner."""
    import torch

    config = (
        HAEPOConfig()
        .environment("FrozenLake-v1", env_config={"desc": ["SFF", "HHF", "FFG"], "is_slippery": False})
        .training(episodes_per_batch=8, lr=0.05, beta_ent=0.01, beta_kl=0.01)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    results, algo = train(config, 30)
    try:
        assert episode_return(results[0]) < 0.5
        assert np.mean([episode_return(r) for r in results[-5:]]) > 0.9
        module = algo.get_module()
        with torch.no_grad():
            logits = module.forward_inference({"obs": torch.eye(9)[[0, 1, 2, 5]]})["action_dist_inputs"]
        assert logits.argmax(dim=-1).tolist() == [2, 2, 1, 1]  # right, right, down, down
    finally:
        algo.stop()


def test_continuous_actions_train_and_a_continuous_bandit_improves(ray_session):
    import gymnasium as gym
    from ray.tune.registry import register_env

    class ContinuousBandit(gym.Env):
        """One step; reward -(a - 0.7)^2 for a in [-2, 2]."""

        observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(1, np.float32), {}

        def step(self, action):
            reward = -float((np.clip(action[0], -2, 2) - 0.7) ** 2)
            return np.zeros(1, np.float32), reward, True, False, {}

    register_env("test/ContinuousBandit-v0", lambda cfg: ContinuousBandit())
    config = (
        HAEPOConfig()
        .environment("test/ContinuousBandit-v0")
        .training(episodes_per_batch=16, lr=0.02, beta_ent=0.0, beta_kl=0.0)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    results, algo = train(config, 40)
    algo.stop()
    assert episode_return(results[-1]) > episode_return(results[0]) + 0.3


# --- Checkpoints, inference, Tune ----------------------------------------------------------


def _weights(algo) -> list[np.ndarray]:
    state = algo.learner_group.get_weights()["default_policy"]
    return [np.asarray(v) for v in state.values()]


def test_checkpoint_round_trip_continues_identically(ray_session, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    config = chain_config().training(beta_ent=[[0, 0.1], [200, 0.0]])
    algo = config.build_algo()
    for _ in range(3):
        algo.train()
    algo.save_to_path(str(tmp_path / "ckpt"))
    original = [episode_return(algo.train()) for _ in range(3)]
    original_weights = _weights(algo)
    algo.stop()

    restored = Algorithm.from_checkpoint(str(tmp_path / "ckpt"))
    continued = [episode_return(restored.train()) for _ in range(3)]
    restored_weights = _weights(restored)
    restored.stop()
    assert continued == original
    for a, b in zip(original_weights, restored_weights):
        np.testing.assert_array_equal(a, b)


def test_trained_module_loads_alone_for_inference(ray_session, tmp_path):
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP, COMPONENT_RL_MODULE
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.rl_module import RLModule

    results, algo = train(chain_config(), 40)
    algo.save_to_path(str(tmp_path / "ckpt"))
    algo.stop()
    module = RLModule.from_checkpoint(
        tmp_path / "ckpt" / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / COMPONENT_RL_MODULE / "default_policy"
    )
    obs = torch.zeros(1, 6)
    obs[0, 0] = 1.0  # state s0 of the chain
    logits = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    assert logits.argmax(-1).item() == 0  # the trained policy advances


def test_tune_runs_haepo_by_name(ray_session, tmp_path):
    from ray import tune

    from haepo_ray import register_algorithms

    register_algorithms()
    tuner = tune.Tuner(
        "HAEPO",
        param_space=chain_config(),
        run_config=tune.RunConfig(
            stop={"training_iteration": 2}, storage_path=str(tmp_path), verbose=0
        ),
    )
    grid = tuner.fit()
    assert not grid.errors
    assert grid[0].metrics["training_iteration"] == 2
    assert "weight_entropy" in grid[0].metrics["learners"]["default_policy"]


def test_algorithms_resolve_by_name_importing_only_the_one_named():
    """In a fresh interpreter: RLlib's PPO by name imports PPO alone and warns nothing (Tune's
    lookup imports every RLlib algorithm, and DreamerV3's import made gymnasium warn of a box
    that is not the user's env); a Tune registration of a name comes first; a typo names the
    closest algorithm."""
    from helpers import fresh_python

    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "from ray import tune\n"
        "from ray.rllib.algorithms.dqn import DQN\n"
        "from haepo_ray.rl.registry import UnknownAlgorithm, algorithm_class\n"
        "print(algorithm_class('PPO').__name__, 'ray.rllib.algorithms.dreamerv3' in sys.modules)\n"
        "tune.register_trainable('MyDQN', DQN)\n"
        "print(algorithm_class('MyDQN').__name__, algorithm_class('HAEPO').__name__)\n"
        "for name in ('ppo', 'GRPPO', 'Nothing'):\n"
        "    try:\n"
        "        algorithm_class(name)\n"
        "    except UnknownAlgorithm as err:\n"
        "        print(str(err).split(';')[0])\n"
    )
    assert fresh_python(code) == ["PPO False", "DQN HAEPO", "unknown algorithm 'ppo' (did you mean PPO?)",
                                  "unknown algorithm 'GRPPO' (did you mean GRPO?)", "unknown algorithm 'Nothing'"]


# --- Several learners ------------------------------------------------------------------------


class _Episode:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


def test_whole_episodes_are_sharded_without_splitting():
    from haepo_ray.rl.algorithm import shard_whole_episodes

    episodes = [_Episode(n) for n in (500, 3, 3, 3, 200, 10, 1)]
    shards = shard_whole_episodes(episodes, 3)
    assert sorted(id(e) for s in shards for e in s) == sorted(id(e) for e in episodes)
    assert all(shards)
    assert sorted(sum(map(len, s)) for s in shards) == [20, 200, 500]


# Two learner processes: test_listwise's HAEPO case (two learners make exactly the one
# learner's update from a 1 + 4 split of the episodes) stands for this in the test command.
@pytest.mark.slow
def test_two_learners_each_get_whole_episodes_and_learn(ray_session):
    config = (
        chain_config()
        .environment(CHAIN, env_config={"horizon": 8})
        .learners(num_learners=2)
        .training(episodes_per_batch=8)
    )
    results, algo = train(config, 30)
    algo.stop()
    learner = results[-1]["learners"]["default_policy"]
    # Each learner holds 4 whole episodes on average; the softmax runs over all 8.
    assert learner["num_episodes"] == pytest.approx(4.0)
    assert learner["listwise_size"] == 8
    assert episode_return(results[-1]) > episode_return(results[0])


# --- The paper's metrics -----------------------------------------------------------------


def test_regret_and_success_rate_are_reported(ray_session):
    results, algo = train(
        HAEPOConfig().environment(BANDIT, env_config={"arm_means": BANDIT_MEANS}).debugging(seed=0), 2
    )
    algo.stop()
    runners = results[-1]["env_runners"]
    # the expected regret of a pull is 1 - mu[a]: 0.5 on average for a near-uniform policy
    assert 0.3 < runners["regret_per_step_mean"] < 0.7
    results, algo = train(chain_config().environment("haepo/RandomWalk-v0", env_config={"target": 2, "horizon": 6}), 2)
    algo.stop()
    runners = results[-1]["env_runners"]
    # the walk's return is 1 exactly on success: the two windowed means agree
    assert runners["success_rate"] == pytest.approx(runners["episode_return_mean"])
