"""1-D random walk with a sparse success reward (paper, "Random Walk")."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from haepo_ray.envs._validation import check_int
from haepo_ray.envs._vector import NumpyVectorEnv


class RandomWalkEnv(gym.Env):
    """Start at 0, step -1 (action 0) or +1 (action 1); reward 1 on reaching ``+target``.

    Reaching the target terminates the episode with return 1 (``info["success"]``);
    otherwise it is truncated after ``horizon`` (>= ``target``) steps with return 0. The
    walk is deterministic and unbounded below. The observation is
    ``[position / target, steps_left / horizon]``.
    """

    metadata = {"render_modes": []}

    def __init__(self, target: int = 10, horizon: int = 500):
        name = type(self).__name__
        self.target = check_int(name, "target", target, 1)
        self.horizon = check_int(name, "horizon", horizon, self.target, minimum_name="target")
        self.action_space = gym.spaces.Discrete(2)
        low = -self.horizon / self.target
        self.observation_space = gym.spaces.Box(
            np.array([low, 0.0], np.float32), np.array([1.0, 1.0], np.float32), dtype=np.float32
        )

    def _obs(self) -> np.ndarray:
        return np.array([self.position / self.target, 1.0 - self.t / self.horizon], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.position += 1 if int(action) == 1 else -1
        self.t += 1
        success = self.position >= self.target
        truncated = not success and self.t >= self.horizon
        return self._obs(), float(success), success, truncated, {"success": success}


class RandomWalkVectorEnv(NumpyVectorEnv):
    """``num_envs`` random walks as one numpy batch: sub-env for sub-env the transitions,
    rewards, flags and ``info["success"]`` of :class:`RandomWalkEnv` (same arguments), with
    NEXT_STEP autoreset (:class:`~haepo_ray.envs._vector.NumpyVectorEnv`).
    """

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(RandomWalkEnv(**kwargs), num_envs)
        self.position = np.zeros(self.num_envs, np.int64)
        self.t = np.zeros(self.num_envs, np.int64)

    def _obs(self) -> np.ndarray:
        obs = np.stack([self.position / self.single.target, 1.0 - self.t / self.single.horizon], axis=1)
        return obs.astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position[:], self.t[:], self._resetting[:] = 0, 0, False
        return self._obs(), {}

    def step(self, actions):
        moving = ~self._resetting
        self.position = np.where(moving, self.position + np.where(np.asarray(actions) == 1, 1, -1), 0)
        self.t = np.where(moving, self.t + 1, 0)
        success = moving & (self.position >= self.single.target)
        truncated = moving & ~success & (self.t >= self.single.horizon)
        self._resetting = success | truncated
        info = {"success": success, "_success": moving}
        return self._obs(), success.astype(np.float64), success, truncated, info
