"""The paper's baselines on HAEPO's plumbing: trajectory-level DPO and GRPO.

Importing this package registers them with Ray Tune as ``"DPO"`` and ``"GRPO"``
(RLlib's registry has neither name). PPO is RLlib's own. The formulations, their sources
and the choices made to apply them to RL episodes are in :mod:`haepo_ray.baselines.dpo` and
:mod:`haepo_ray.baselines.grpo`; the losses in :mod:`haepo_ray.baselines.losses`.
"""

from __future__ import annotations

from haepo_ray.baselines.dpo import DPO, DPOConfig, DPOTorchLearner
from haepo_ray.baselines.grpo import GRPO, GRPOConfig, GRPOTorchLearner

__all__ = ["DPO", "DPOConfig", "DPOTorchLearner", "GRPO", "GRPOConfig", "GRPOTorchLearner"]
