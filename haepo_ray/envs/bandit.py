"""Gaussian K-armed bandit (paper, "Multi-armed Bandit")."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from haepo_ray.envs._validation import check_float, check_int


class GaussianBanditEnv(gym.Env):
    """K arms with means mu_k ~ U[0, 1]; pulling arm k pays r ~ N(mu_k, reward_std^2).

    One pull per episode (T = 1). The observation is a constant zero. The means are drawn
    once, from the seed of the first seeded ``reset`` (or given as ``arm_means``), and are
    then held fixed for the env's lifetime. ``info`` holds ``regret``, the expected regret
    ``optimal_mean - mu[action]`` of the pull, and ``optimal_mean``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        num_arms: int = 10,
        reward_std: float = 1.0,
        arm_means: Sequence[float] | None = None,
    ):
        name = type(self).__name__
        self.reward_std = check_float(name, "reward_std", reward_std, minimum=0.0, strict=True)
        if arm_means is not None:
            means = [check_float(name, f"arm_means[{i}]", m) for i, m in enumerate(arm_means)]
            if len(means) < 2:
                raise ValueError(f"{name}: arm_means must hold at least 2 means, got {len(means)}")
            num_arms = len(means)
            self.arm_means: np.ndarray | None = np.asarray(means, dtype=np.float64)
        else:
            num_arms = check_int(name, "num_arms", num_arms, 2)
            self.arm_means = None
        self.num_arms = num_arms
        self.action_space = gym.spaces.Discrete(num_arms)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    @property
    def optimal_mean(self) -> float:
        if self.arm_means is None:
            raise RuntimeError("GaussianBanditEnv: the arm means are drawn at the first reset")
        return float(self.arm_means.max())

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.arm_means is None:
            self.arm_means = self.np_random.uniform(0.0, 1.0, self.num_arms)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        mean = float(self.arm_means[int(action)])
        reward = float(self.np_random.normal(mean, self.reward_std))
        info = {"regret": self.optimal_mean - mean, "optimal_mean": self.optimal_mean}
        return np.zeros(1, np.float32), reward, True, False, info
