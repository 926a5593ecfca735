"""HAEPO's live metrics as Ray custom metrics (Prometheus gauges, for Grafana).

Ray exports each gauge on its nodes' metrics endpoints as ``ray_<name>``; the dashboard
in ``dashboards/`` plots them next to Ray's own node and GPU metrics.
"""

from __future__ import annotations

from typing import Any

from haepo_ray import names

# gauge name -> (description, result key in haepo_ray.names, "/"-nested)
GAUGES: dict[str, tuple[str, str]] = {
    "haepo_episode_return_mean": ("Mean return of the last 100 episodes", names.EPISODE_RETURN_MEAN),
    "haepo_weight_entropy": ("Entropy H(w) of the Plackett-Luce weights", names.WEIGHT_ENTROPY),
    "haepo_kl_to_reference": ("KL(w || w_ref) to the reference policy", names.KL_TO_REFERENCE),
    "haepo_effective_num_trajectories": ("1 / sum_k w_k^2", names.EFFECTIVE_NUM_TRAJECTORIES),
    "haepo_max_weight": ("Largest Plackett-Luce weight", names.MAX_WEIGHT),
    "haepo_policy_entropy": ("Mean entropy of the action distribution", names.POLICY_ENTROPY),
    "haepo_env_steps_sampled": ("Env steps sampled so far", names.ENV_STEPS),
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
        for name, (_, key_path) in GAUGES.items():
            value: Any = result
            for key in key_path.split("/"):
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                self._gauges[name].set(float(value), tags=tags)
