"""Deterministic chain MDP (paper appendix, "Chain MDP")."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from haepo_ray.envs._validation import check_int


class ChainMDPEnv(gym.Env):
    """States s0..s_length; action 0 advances one state, action 1 stays.

    Reaching ``s_length`` terminates with reward 1 (``info["success"]``); every other step
    pays 0. The episode is truncated after ``horizon`` (>= ``length``) steps; the default
    ``horizon = length`` lets only always-advance succeed. The observation is the one-hot
    encoding of the state.
    """

    metadata = {"render_modes": []}
    ADVANCE, STAY = 0, 1

    def __init__(self, length: int = 5, horizon: int | None = None):
        name = type(self).__name__
        self.length = check_int(name, "length", length, 1)
        self.horizon = self.length if horizon is None else check_int(
            name, "horizon", horizon, self.length, minimum_name="length"
        )
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.length + 1,), np.float32)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length + 1, np.float32)
        obs[self.state] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.state, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        if int(action) == self.ADVANCE:
            self.state += 1
        self.t += 1
        terminated = self.state == self.length
        truncated = not terminated and self.t >= self.horizon
        return self._obs(), float(terminated), terminated, truncated, {"success": terminated}
