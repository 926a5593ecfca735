"""HAEPOEnvRunner: RLlib's SingleAgentEnvRunner, sampling complete episodes without bias.

Length bias: with several envs per runner, RLlib's ``sample(num_episodes=n)`` returns the
first n episodes to finish; an env that finishes a short episode starts another, so short
episodes are over-represented. This runner samples in rounds: in a round each of k envs
contributes exactly its first episode, and the other envs are parked (they return their
last observation without stepping and are not counted as env steps), so the episodes of
a batch are i.i.d. draws of the policy, as HAEPO's listwise weights assume.

Seeding: RLlib 2.60's ``sample(num_episodes=n)`` re-seeds every env with the configured seed on
each call, so with ``config.debugging(seed=...)`` every batch would start from the same
initial states and draw the same env noise. This runner seeds its envs only at the first
reset; later resets continue each env's own random stream. Its state (and so an
Algorithm checkpoint) also holds the random state of its envs and of PyTorch's sampler,
so a restored algorithm with one env runner (``num_env_runners=0``) continues exactly as
the original would have; with remote runners, the runner whose state was saved takes it
back and the others keep their own seeded streams.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

RNG_STATE = "haepo_rng_state"
logger = logging.getLogger(__name__)


class OneEpisodePerRound(gym.Wrapper):
    """Lets its env run one episode per round, then parks it until the next round."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.active = True  # may run an episode in this round
        self.started = False  # has started this round's episode
        self.parked = False
        self.parked_steps = 0
        self._obs = None

    def start_round(self, active: bool) -> None:
        self.active, self.started = active, False

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)  # also on parking: keeps seeding deterministic
        self._obs = obs
        self.parked = not self.active or self.started
        self.started = True
        return obs, info

    def step(self, action):
        if self.parked:
            self.parked_steps += 1
            return self._obs, 0.0, False, False, {}
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._obs = obs
        return obs, reward, terminated, truncated, info


class HAEPOEnvRunner(SingleAgentEnvRunner):
    """A SingleAgentEnvRunner that samples unbiased complete episodes and seeds its envs once."""

    def make_env(self) -> None:
        super().make_env()
        vector_env = self.env.unwrapped
        if self.num_envs > 1:
            if isinstance(vector_env, gym.vector.SyncVectorEnv):
                vector_env.envs = [OneEpisodePerRound(env) for env in vector_env.envs]
            else:
                logger.warning(
                    "HAEPOEnvRunner: %s is not a SyncVectorEnv; sampling episodes the "
                    "RLlib way, which favours short episodes", type(vector_env).__name__,
                )

    def sample(self, *args: Any, num_episodes: int | None = None, **kwargs: Any):
        rounds = self._round_wrappers()
        if num_episodes is None or not rounds:
            episodes = super().sample(*args, num_episodes=num_episodes, **kwargs)
        else:
            episodes = []
            while len(episodes) < num_episodes:
                k = min(len(rounds), num_episodes - len(episodes))
                for i, wrapper in enumerate(rounds):
                    wrapper.start_round(active=i < k)
                episodes += super().sample(*args, num_episodes=k, **kwargs)
        self._seed = None  # the envs are seeded; later resets continue their streams
        return episodes

    def _increase_sampled_metrics(self, num_steps: int, num_episodes_completed: int) -> int:
        parked = 0
        for wrapper in self._round_wrappers():
            parked, wrapper.parked_steps = parked + wrapper.parked_steps, 0
        return super()._increase_sampled_metrics(num_steps - parked, num_episodes_completed)

    def _round_wrappers(self) -> list[OneEpisodePerRound]:
        return [env for env in self._sub_envs() or [] if isinstance(env, OneEpisodePerRound)]

    def _sub_envs(self) -> list | None:
        envs = getattr(getattr(self.env, "unwrapped", None), "envs", None)
        return list(envs) if envs is not None else None  # None for async vector envs

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        sub_envs = self._sub_envs()
        if sub_envs is not None:
            state[RNG_STATE] = {
                "torch": torch.get_rng_state().numpy(),
                "envs": [env.unwrapped.np_random.bit_generator.state for env in sub_envs],
                "seeded": self._seed is None,
                "worker_index": self.worker_index,
            }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        rng = state.get(RNG_STATE)
        sub_envs = self._sub_envs()
        # Only the runner the state came from takes its random streams: two runners with
        # one stream would sample identical episodes.
        if (
            rng is None
            or rng["worker_index"] != self.worker_index
            or sub_envs is None
            or len(sub_envs) != len(rng["envs"])
        ):
            return
        torch.set_rng_state(torch.as_tensor(rng["torch"]))
        if rng["seeded"]:
            for env, env_state in zip(sub_envs, rng["envs"]):
                env.unwrapped.np_random.bit_generator.state = env_state
            self._seed = None
