"""Single-period newsvendor (paper appendix, "Newsvendor")."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from haepo_ray.envs._validation import check_float, check_int


class NewsvendorEnv(gym.Env):
    """Order q in 0..max_order, demand d ~ Poisson(demand_mean), one step per episode.

    Reward (profit) ``price * min(q, d) - cost * q + salvage * max(q - d, 0)``; the paper's
    p=10, c=6, v=2 by default. Requires ``price > cost > salvage >= 0``: otherwise ordering
    nothing, or as much as possible, is trivially optimal. ``info`` holds ``demand`` and
    ``profit``. The observation is a constant zero.
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
        self.salvage = check_float(name, "salvage", salvage, minimum=0.0)
        self.cost = check_float(name, "cost", cost, minimum=self.salvage, strict=True, minimum_name="salvage")
        self.price = check_float(name, "price", price, minimum=self.cost, strict=True, minimum_name="cost")
        self.action_space = gym.spaces.Discrete(self.max_order + 1)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def profit(self, q: int, d: int) -> float:
        """The profit of ordering ``q`` units when the demand is ``d``."""
        return self.price * min(q, d) - self.cost * q + self.salvage * max(q - d, 0)

    def expected_profit(self, q: int) -> float:
        """E[profit(q, D)] for D ~ Poisson(demand_mean), exactly: the profit is flat for d >= q."""
        log_mean = math.log(self.demand_mean)
        pmf = [math.exp(d * log_mean - self.demand_mean - math.lgamma(d + 1)) for d in range(q)]
        below = sum(p * self.profit(q, d) for d, p in enumerate(pmf))
        return below + (1.0 - sum(pmf)) * self.profit(q, q)

    @property
    def optimal_order(self) -> int:
        """The order in 0..max_order with the largest expected profit (the smallest on ties)."""
        return max(range(self.max_order + 1), key=self.expected_profit)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        q, d = int(action), int(self.np_random.poisson(self.demand_mean))
        profit = self.profit(q, d)
        return np.zeros(1, np.float32), profit, True, False, {"demand": d, "profit": profit}
