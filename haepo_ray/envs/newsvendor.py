"""Single-period newsvendor (paper appendix, "Newsvendor")."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from haepo_ray.envs._validation import check_float, check_int


class NewsvendorEnv(gym.Env):
    """Order q in 0..max_order, demand d ~ Poisson(demand_mean), one step per episode.

    Reward (profit) ``price * min(q, d) - cost * q + salvage * max(q - d, 0)``; the paper's
    p=10, c=6, v=2 by default. Requires ``price > cost > salvage >= 0`` (otherwise ordering
    nothing, or everything, is trivially optimal). ``info`` holds ``demand`` and ``profit``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        max_order: int = 10,
        demand_mean: float = 5.0,
        price: float = 10.0,
        cost: float = 6.0,
        salvage: float = 2.0,
    ):
        name = type(self).__name__
        self.max_order = check_int(name, "max_order", max_order, 1)
        self.demand_mean = check_float(name, "demand_mean", demand_mean, minimum=0.0, strict=True)
        self.price = check_float(name, "price", price, minimum=0.0, strict=True)
        self.cost = check_float(name, "cost", cost, minimum=0.0, strict=True)
        self.salvage = check_float(name, "salvage", salvage, minimum=0.0)
        if not self.price > self.cost > self.salvage:
            raise ValueError(
                f"{name}: need price > cost > salvage, got price={price}, cost={cost}, salvage={salvage}"
            )
        self.action_space = gym.spaces.Discrete(self.max_order + 1)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def profit(self, q: int, d: int) -> float:
        return self.price * min(q, d) - self.cost * q + self.salvage * max(q - d, 0)

    def expected_profit(self, q: int) -> float:
        """E[profit(q, d)] over the Poisson demand, the tail below 1e-12 left out."""
        total, d, pmf = 0.0, 0, math.exp(-self.demand_mean)
        while d <= self.demand_mean or pmf >= 1e-12:
            total += pmf * self.profit(q, d)
            d += 1
            pmf *= self.demand_mean / d
        return total

    @property
    def optimal_order(self) -> int:
        return max(range(self.max_order + 1), key=self.expected_profit)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        q, d = int(action), int(self.np_random.poisson(self.demand_mean))
        profit = self.profit(q, d)
        return np.zeros(1, np.float32), profit, True, False, {"demand": d, "profit": profit}
