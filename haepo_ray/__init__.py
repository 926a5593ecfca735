"""haepo-ray: HAEPO as an RLlib algorithm, with Ray Tune sweeps and MLflow tracking.

``import haepo_ray`` is cheap; the RLlib classes load on first use::

    from haepo_ray import HAEPOConfig
    algo = HAEPOConfig().environment("haepo/ChainMDP-v0").build_algo()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from haepo_ray.lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from haepo_ray.rl.algorithm import HAEPO, HAEPOConfig
    from haepo_ray.rl.learner import HAEPOTorchLearner
    from haepo_ray.rl.registry import register_algorithms

_LAZY = {
    "HAEPO": "haepo_ray.rl.algorithm",
    "HAEPOConfig": "haepo_ray.rl.algorithm",
    "HAEPOTorchLearner": "haepo_ray.rl.learner",
    "register_algorithms": "haepo_ray.rl.registry",
}

__all__ = ["HAEPO", "HAEPOConfig", "HAEPOTorchLearner", "__version__", "register_algorithms"]


__getattr__ = lazy_exports(__name__, _LAZY)
