"""HAEPO's live metrics as Ray custom metrics (Prometheus gauges, for Grafana).

Ray exports each gauge on its nodes' metrics endpoints as ``ray_<name>``; the dashboard
in ``dashboards/`` plots them next to Ray's own node and GPU metrics.
"""

from __future__ import annotations

from typing import Any

# gauge name -> (description, path in an RLlib training result)
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "haepo_episode_return_mean": ("Mean return of the last 100 episodes", ("env_runners", "episode_return_mean")),
    "haepo_weight_entropy": ("Entropy H(w) of the Plackett-Luce weights", ("learners", "default_policy", "weight_entropy")),
    "haepo_kl_to_reference": ("KL(w || w_ref) to the reference policy", ("learners", "default_policy", "kl_to_reference")),
    "haepo_effective_num_trajectories": ("1 / sum_k w_k^2", ("learners", "default_policy", "effective_num_trajectories")),
    "haepo_max_weight": ("Largest Plackett-Luce weight", ("learners", "default_policy", "max_weight")),
    "haepo_policy_entropy": ("Mean entropy of the action distribution", ("learners", "default_policy", "policy_entropy")),
    "haepo_env_steps_sampled": ("Env steps sampled so far", ("env_runners", "num_env_steps_sampled_lifetime")),
}
TAG_KEYS = ("algorithm", "trial_id", "env")


class MetricsExporter:
    """Sets one Ray gauge per entry of :data:`GAUGES` from each training result."""

    def __init__(self) -> None:
        from ray.util.metrics import Gauge

        self._gauges = {
            name: Gauge(name, description=description, tag_keys=TAG_KEYS)
            for name, (description, _) in GAUGES.items()
        }

    def export(self, result: dict[str, Any], tags: dict[str, str]) -> None:
        for name, (_, path) in GAUGES.items():
            value: Any = result
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                self._gauges[name].set(float(value), tags=tags)
