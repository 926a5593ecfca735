"""HAEPOEnvRunner: RLlib's SingleAgentEnvRunner, sampling unbiased complete episodes fast.

HAEPO's listwise weights assume the M episodes of a batch are i.i.d. draws of the current
policy. RLlib's ``sample(num_episodes=n)`` favours short episodes (with several envs it
returns the first n to finish), re-seeds every env at every call (every batch replays the
same initial states and env noise) and seeds sub-envs so that runners and trial seeds
share streams. This runner composes the pieces of :mod:`haepo_ray.rl.sampling`:

- seeding (:mod:`~haepo_ray.rl.sampling.seeding`): an independent stream per sub-env, seeded
  at the first reset only, and carried through checkpoints with PyTorch's sampler: a
  restored algorithm with one env runner (``num_env_runners=0``) continues exactly as the
  original would have; with remote runners, the runner whose state was saved takes it
  back and the others keep their own seeded streams;
- the lean path (:mod:`~haepo_ray.rl.sampling.lean`) wherever it fits: one batched forward
  pass per step, the first n episodes to start; where the env offers gymnasium's vector
  entry point (CartPole, the paper's bandit and random walk) and the config keeps RLlib's
  default ``gym_env_vectorize_mode="sync"``, the runner builds that vectorised env
  instead (its copy of the config says so);
- otherwise (the config, the env or the module blocks the lean path) RLlib's own loop, in
  rounds of one episode per env (:mod:`~haepo_ray.rl.sampling.rounds`).

:class:`IndependentSeedsEnvRunner` is the seeding alone, for algorithms that sample the
RLlib way (PPO): :func:`haepo_ray.rl.configs.apply_defaults`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from haepo_ray.rl.sampling import lean, rounds, seeding
from haepo_ray.upstream import rllib as rllib_internals
from haepo_ray.upstream.tune import registered_env_creator

RNG_STATE = "haepo_rng_state"
VECTOR_ENTRY_POINT = gym.VectorizeMode.VECTOR_ENTRY_POINT.value
logger = logging.getLogger(__name__)


class IndependentSeedsEnvRunner(rllib_internals.SamplingHooks):
    """RLlib's SingleAgentEnvRunner with an independent seed per random stream
    (:func:`haepo_ray.rl.sampling.seeding.independent_seeds`)."""

    def __init__(self, *, config, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        if rllib_internals.seeds(self) is not None and self.env is not None:
            rllib_internals.set_seeds(self, seeding.independent_seeds(
                self.env.unwrapped, config.seed, self.worker_index or 0, config.in_evaluation
            ))


class HAEPOEnvRunner(IndependentSeedsEnvRunner):
    """A SingleAgentEnvRunner that samples unbiased complete episodes and seeds its envs once."""

    def make_env(self) -> None:
        fits = lean.config_blocker(self.config, rllib_internals.callback_objects(self)) is None
        if (fits and self.config.gym_env_vectorize_mode == gym.VectorizeMode.SYNC.value
                and offers_vector_entry_point(self.config.env)):
            self.config.gym_env_vectorize_mode = VECTOR_ENTRY_POINT  # this runner's own copy
        super().make_env()
        if getattr(self, "module", None) is not None:  # a new env for a runner's module: else make_module
            self._rounds_where_the_lean_path_is_blocked()

    def make_module(self) -> None:
        super().make_module()
        self._rounds_where_the_lean_path_is_blocked()

    def _rounds_where_the_lean_path_is_blocked(self) -> None:
        """With several envs, RLlib's loop samples in rounds wherever the lean path is blocked
        (by the config, the env or the module): else it would favour short episodes."""
        vector_env = self.env.unwrapped if self.env is not None else None
        if (vector_env is None or self.num_envs == 1 or rounds.round_wrappers(vector_env)
                or self.lean_path_blocker() is None):
            return
        if isinstance(vector_env, gym.vector.SyncVectorEnv):
            rounds.install(vector_env)
        else:
            logger.warning("HAEPOEnvRunner: %s is not a SyncVectorEnv; sampling episodes the "
                           "RLlib way, which favours short episodes", type(vector_env).__name__)

    def sample(self, *args: Any, num_episodes: int | None = None, **kwargs: Any):
        wrappers = rounds.round_wrappers(self.env.unwrapped)
        if num_episodes is None or not wrappers:
            return super().sample(*args, num_episodes=num_episodes, **kwargs)
        return rounds.sample_in_rounds(
            wrappers, num_episodes, lambda k: super(HAEPOEnvRunner, self).sample(*args, num_episodes=k, **kwargs)
        )

    def sample_loop(self, *, num_episodes: int | None = None, explore: bool,
                    random_actions: bool = False, **kwargs: Any):
        if num_episodes is None or random_actions or self.lean_path_blocker() is not None:
            episodes = super().sample_loop(num_episodes=num_episodes, explore=explore,
                                           random_actions=random_actions, **kwargs)
        else:
            episodes = self._sample_lean(num_episodes, explore)
        rllib_internals.set_seeds(self, None)  # seeded once; later resets continue the streams
        return episodes

    def lean_path_blocker(self) -> str | None:
        """Why this runner must sample through RLlib's loop, or None if the lean path fits."""
        return (lean.config_blocker(self.config, rllib_internals.callback_objects(self))
                or lean.env_blocker(self.env.unwrapped, self.module, self.config))

    def _sample_lean(self, num_episodes: int, explore: bool) -> list[SingleAgentEpisode]:
        policy = lean.BatchedPolicy(
            self.module, explore=explore, device=rllib_internals.device(self),
            action_space=self.env.single_action_space,
            normalize_actions=self.config.normalize_actions, clip_actions=self.config.clip_actions,
        )
        flatten = lean.flattener(self.env.single_observation_space)
        with policy.sampling():
            trajectories = lean.run_episodes(
                self.env.unwrapped, policy, num_episodes,
                seed=rllib_internals.seeds(self), t0=self.num_env_steps_sampled_lifetime, flatten=flatten,
            )
        # the module's: the space of FlattenObservations' output, which RLlib's loop gives its episodes
        space = self.env.single_observation_space if flatten is None else self.module.observation_space
        episodes = [self._to_episode(trajectory, space) for trajectory in trajectories]
        rllib_internals.record_sampled(self, episodes, sum(len(e) for e in episodes))
        return episodes

    def _to_episode(self, trajectory: lean.Trajectory, observation_space: gym.Space) -> SingleAgentEpisode:
        """The trajectory as RLlib's loop would have built it, after ``on_episode_end``:
        numpy data, or per-step lists where the config keeps episodes as lists."""
        column = (lambda a: a) if self.episodes_to_numpy else list
        episode = SingleAgentEpisode(
            observations=column(trajectory.observations), infos=trajectory.infos,
            actions=column(trajectory.actions), rewards=column(trajectory.rewards),
            terminated=trajectory.terminated, truncated=trajectory.truncated,
            extra_model_outputs={
                Columns.ACTION_LOGP: column(trajectory.logp),
                Columns.ACTION_DIST_INPUTS: column(trajectory.dist_inputs),
                WEIGHTS_SEQ_NO: column(np.full(len(trajectory.actions), rllib_internals.weights_seq_no(self))),
            },
            observation_space=observation_space,
            action_space=self.env.single_action_space,
            len_lookback_buffer=0,
            t_started=0,
        )
        rllib_internals.set_episode_times(episode, trajectory.start_time, time.perf_counter())
        make_callback(
            "on_episode_end",
            callbacks_objects=rllib_internals.callback_objects(self),
            callbacks_functions=self.config.callbacks_on_episode_end,
            kwargs=dict(episode=episode, env_runner=self, metrics_logger=self.metrics,
                        env=self.env.unwrapped, rl_module=self.module, env_index=trajectory.env_index,
                        prev_episode_chunks=[]),
        )
        return episode

    def count_sampled(self, num_steps: int, num_episodes_completed: int) -> int:
        parked = rounds.take_parked_steps(rounds.round_wrappers(self.env.unwrapped))
        return super().count_sampled(num_steps - parked, num_episodes_completed)

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        if self.env is not None:
            rng = seeding.rng_state(self.env.unwrapped, rllib_internals.seeds(self) is None, self.worker_index)
            if rng is not None:
                state[RNG_STATE] = rng
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if self.env is not None and seeding.restore_rng_state(
            self.env.unwrapped, state.get(RNG_STATE), self.worker_index
        ):
            rllib_internals.set_seeds(self, None)


def offers_vector_entry_point(env: Any) -> bool:
    """Whether ``env`` (``config.env``) has a vectorised version that RLlib's
    ``gym_env_vectorize_mode="vector_entry_point"`` builds: a gymnasium id with a
    ``vector_entry_point``, or a Ray-registered creator that says it has one (haepo-ray's
    own, :func:`haepo_ray.envs.register_with_ray`)."""
    if not isinstance(env, str):
        return False
    creator = registered_env_creator(env)
    if creator is not None:
        return getattr(creator, "vector_cls", None) is not None
    return env in gym.registry and gym.spec(env).vector_entry_point is not None
