"""The paper's baselines on HAEPO's plumbing: trajectory-level DPO and GRPO.

:func:`haepo_ray.rl.registry.register_algorithms` registers them with Ray Tune as ``"DPO"`` and
``"GRPO"`` (RLlib's registry has neither name). PPO is RLlib's own. The formulations, their
sources and the choices made to apply them to RL episodes are in :mod:`haepo_ray.rl.baselines.dpo`
and :mod:`haepo_ray.rl.baselines.grpo`; the losses, pure PyTorch, in
:mod:`haepo_ray.baseline_losses` (importing it loads no RLlib: the classes below load on
first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from haepo_ray.lazy import lazy_exports

if TYPE_CHECKING:
    from haepo_ray.rl.baselines.dpo import DPO, DPOConfig, DPOTorchLearner
    from haepo_ray.rl.baselines.grpo import GRPO, GRPOConfig, GRPOTorchLearner

_LAZY = {
    **dict.fromkeys(("DPO", "DPOConfig", "DPOTorchLearner"), "haepo_ray.rl.baselines.dpo"),
    **dict.fromkeys(("GRPO", "GRPOConfig", "GRPOTorchLearner"), "haepo_ray.rl.baselines.grpo"),
}

__all__ = ["DPO", "DPOConfig", "DPOTorchLearner", "GRPO", "GRPOConfig", "GRPOTorchLearner"]


__getattr__ = lazy_exports(__name__, _LAZY)
