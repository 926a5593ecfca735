"""The round sampler: unbiased complete episodes through RLlib's own sampling loop.

With several envs per runner, RLlib's ``sample(num_episodes=n)`` returns the first n
episodes to finish; an env that finishes a short episode starts another, so short
episodes are over-represented. Where HAEPO's runner samples through RLlib's loop (the lean
path does not fit the config), it samples in rounds: in a round each of k envs contributes
exactly its first episode, and the other envs are parked (they return their last
observation without stepping and are not counted as env steps), so the episodes of a
batch are i.i.d. draws of the policy, as HAEPO's listwise weights assume.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym


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


def install(vector_env: gym.vector.SyncVectorEnv) -> None:
    """Wraps every sub-env of ``vector_env`` in :class:`OneEpisodePerRound`."""
    vector_env.envs = [OneEpisodePerRound(env) for env in vector_env.envs]


def round_wrappers(vector_env: gym.vector.VectorEnv) -> list[OneEpisodePerRound]:
    """The sub-envs' round wrappers (none unless :func:`install` ran)."""
    return [env for env in getattr(vector_env, "envs", []) if isinstance(env, OneEpisodePerRound)]


def sample_in_rounds(wrappers: list[OneEpisodePerRound], num_episodes: int, sample: Callable[[int], list]) -> list:
    """``num_episodes`` episodes, each round ``sample(k)`` with only the first k envs active."""
    episodes: list = []
    while len(episodes) < num_episodes:
        k = min(len(wrappers), num_episodes - len(episodes))
        for i, wrapper in enumerate(wrappers):
            wrapper.start_round(active=i < k)
        episodes += sample(k)
    return episodes


def take_parked_steps(wrappers: list[OneEpisodePerRound]) -> int:
    """Steps the parked envs pretended to take since the last call (RLlib counted them)."""
    parked = 0
    for wrapper in wrappers:
        parked, wrapper.parked_steps = parked + wrapper.parked_steps, 0
    return parked
