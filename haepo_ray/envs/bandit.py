"""Gaussian K-armed bandit (paper, "Multi-armed Bandit")."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

from haepo_ray.envs._validation import check_float, check_int
from haepo_ray.envs._vector import NumpyVectorEnv


class GaussianBanditEnv(gym.Env):
    """K arms with means mu_k ~ U[0, 1]; pulling arm k pays r ~ N(mu_k, reward_std^2).

    One pull per episode (T = 1); the observation is a constant zero. The means are drawn
    once and then held fixed for the env's lifetime, whatever later resets do:

    - ``arm_means`` given: these are the means (``num_arms``, if given, must match);
    - else ``means_seed`` given: drawn at construction from that seed, the same means a
      first ``reset(seed=means_seed)`` would draw;
    - else: drawn at the first ``reset``, from its ``seed`` if it has one.

    Env copies seeded differently (as RLlib seeds its env runners and vector sub-envs)
    share one bandit only with ``arm_means`` or ``means_seed``. ``info`` holds ``regret``,
    the expected regret ``optimal_mean - mu[action]`` of the pull, and ``optimal_mean``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        num_arms: int | None = None,
        reward_std: float = 1.0,
        arm_means: Sequence[float] | None = None,
        means_seed: int | None = None,
    ):
        name = type(self).__name__
        self.reward_std = check_float(name, "reward_std", reward_std, minimum=0.0, strict=True)
        self.arm_means: np.ndarray | None = None
        if arm_means is not None:
            if means_seed is not None:
                raise ValueError(f"{name}: pass arm_means or means_seed, not both")
            self.arm_means = _check_means(name, arm_means)
            if num_arms is not None and num_arms != len(self.arm_means):
                raise ValueError(
                    f"{name}: num_arms must equal len(arm_means) ({len(self.arm_means)}), got {num_arms!r}"
                )
            self.num_arms = len(self.arm_means)
        else:
            self.num_arms = check_int(name, "num_arms", 10 if num_arms is None else num_arms, 2)
            if means_seed is not None:
                rng, _ = seeding.np_random(check_int(name, "means_seed", means_seed, 0))
                self.arm_means = self.draw_means(rng)
        self.action_space = gym.spaces.Discrete(self.num_arms)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def draw_means(self, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(0.0, 1.0, self.num_arms)

    @property
    def optimal_mean(self) -> float:
        """The largest arm mean."""
        if self.arm_means is None:
            raise RuntimeError(f"{type(self).__name__}: the arm means are drawn at the first reset")
        return float(self.arm_means.max())

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.arm_means is None:
            self.arm_means = self.draw_means(self.np_random)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        mean = float(self.arm_means[int(action)])
        reward = float(self.np_random.normal(mean, self.reward_std))
        info = {"regret": self.optimal_mean - mean, "optimal_mean": self.optimal_mean}
        return np.zeros(1, np.float32), reward, True, False, info


class GaussianBanditVectorEnv(NumpyVectorEnv):
    """``num_envs`` Gaussian bandits as one numpy batch, each a :class:`GaussianBanditEnv`
    of the same arguments.

    With ``arm_means`` or ``means_seed`` the sub-envs share those means; otherwise each
    draws its own at the first reset, as separately seeded single envs would. One
    generator serves all sub-envs; with ``num_envs=1`` it draws exactly what a single env
    seeded alike draws. A pull ends the episode; the sub-env resets at its next ``step``
    (NEXT_STEP autoreset, :class:`~haepo_ray.envs._vector.NumpyVectorEnv`). ``info``
    holds ``regret`` and ``optimal_mean`` per pull.
    """

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(GaussianBanditEnv(**kwargs), num_envs)
        self.arm_means: np.ndarray | None = (
            None if self.single.arm_means is None else np.tile(self.single.arm_means, (self.num_envs, 1))
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.arm_means is None:
            self.arm_means = np.stack([self.single.draw_means(self.np_random) for _ in range(self.num_envs)])
        self._resetting[:] = False
        return self._zeros(), {}

    def step(self, actions):
        pulled = ~self._resetting
        rows = np.flatnonzero(pulled)
        means = self.arm_means[rows, np.asarray(actions)[rows]]
        optimal = self.arm_means[rows].max(axis=1)
        rewards = np.zeros(self.num_envs)
        rewards[rows] = self.np_random.normal(means, self.single.reward_std)
        info = {"regret": np.zeros(self.num_envs), "optimal_mean": np.zeros(self.num_envs),
                "_regret": pulled.copy(), "_optimal_mean": pulled.copy()}
        info["regret"][rows], info["optimal_mean"][rows] = optimal - means, optimal
        self._resetting = pulled
        return self._zeros(), rewards, pulled.copy(), np.zeros(self.num_envs, bool), info

    def _zeros(self) -> np.ndarray:
        return np.zeros((self.num_envs, 1), np.float32)


def _check_means(name: str, arm_means: Sequence[float]) -> np.ndarray:
    """``arm_means`` as a float64 array; raise unless it holds at least 2 finite numbers."""
    try:
        values = list(arm_means)
    except TypeError:
        values = None
    if values is None or len(values) < 2:
        raise ValueError(f"{name}: arm_means must be a sequence of at least 2 numbers, got {arm_means!r}")
    return np.array([check_float(name, f"arm_means[{i}]", m) for i, m in enumerate(values)])
