"""Env-runner callback that turns the paper's per-step env infos into training metrics.

The paper plots per-step regret (bandit) and success rate (random walk). The envs put
``regret`` and ``success`` in their step infos; this callback logs, per completed
episode, the mean regret per step and whether it succeeded, under ``env_runners/`` in
every algorithm's results: HAEPO and the baselines have it by default, and sweeps and
``haepo train`` add it to other algorithms (RLlib's PPO): :func:`haepo_ray.rl.configs.apply_defaults`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.callbacks.callbacks import RLlibCallback

# info key -> (metric name, reduction over the episode's steps)
EPISODE_INFO_METRICS: dict[str, tuple[str, str]] = {
    "regret": ("regret_per_step_mean", "mean"),
    "success": ("success_rate", "last"),
}


class EpisodeInfoMetrics(RLlibCallback):
    """Logs ``regret_per_step_mean`` and ``success_rate`` where the env reports them."""

    def on_episode_end(self, *, episode, metrics_logger=None, **kwargs: Any) -> None:
        infos = episode.get_infos()[1:]  # index 0 is the reset info
        for key, (metric, reduction) in EPISODE_INFO_METRICS.items():
            values = [float(info[key]) for info in infos if key in info]
            if values and metrics_logger is not None:
                value = float(np.mean(values)) if reduction == "mean" else values[-1]
                metrics_logger.log_value(metric, value, reduce="mean", window=100)

