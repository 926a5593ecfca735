"""Trajectory-level DPO on HAEPO's sampling: ``DPOConfig``, ``DPO`` and its learner.

Formulation (Rafailov et al. 2023, "Direct Preference Optimization", Eq. 7), over the batch
of M complete episodes of every training iteration::

    loss = -1/|P| sum_{(i, j) in P} log sigmoid(beta (L_i - L_i^ref) - beta (L_j - L_j^ref))
    P    = {(i, j) : R_i > R_j}

- L_k = sum_t log pi(a_t|s_t), L_k^ref the same under the reference policy; the transition
  probabilities cancel in L_k - L_k^ref, the trajectory log-ratio of Eq. 7.
- Preferences come from the discounted returns R_k: every pair of episodes whose returns
  differ, the higher one preferred (up to M(M-1)/2 pairs); equal returns give no pair, and a
  batch without a pair (all returns equal, M = 1) gives loss 0 with zero gradient. Only the
  order of the returns matters, so ``reward_normalization`` does not apply.
- ``dpo_beta`` is DPO's beta, the strength of the implicit KL constraint to pi_ref (default
  0.1, a value of the DPO paper's experiments and the common default).
- The reference defaults to ``"initial"``, the policy as it was built: DPO's pi_ref is the
  starting (SFT) model. With ``"behavior"`` (or ``"lagged"``) the implicit rewards restart
  from 0 on every (every n-th) batch: an iterated, on-policy DPO.
- ``beta_ent`` and ``beta_kl`` (HAEPO's regularisers) are not part of DPO: they default to 0
  and validation rejects other values.
- With ``num_learners > 1`` the pairs are those of the whole batch, whichever learner holds
  each episode (HAEPO's listwise loss across learners, :mod:`haepo_ray.listwise`).

See :func:`haepo_ray.baseline_losses.dpo_loss` for the loss itself.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided
from torch import Tensor

from haepo_ray.rl.algorithm import HAEPO, HAEPOConfig
from haepo_ray.baseline_losses import dpo_loss
from haepo_ray.rl.learner import EpisodeBatch, HAEPOTorchLearner
from haepo_ray.upstream import rllib as rllib_internals

__all__ = ["DPO", "DPOConfig", "DPOTorchLearner"]


class DPOConfig(HAEPOConfig):
    """Configuration of trajectory-level DPO; set ``dpo_beta`` with :meth:`training`."""

    def __init__(self, algo_class: type | None = None):
        super().__init__(algo_class=algo_class or DPO)
        self.dpo_beta = 0.1
        self.reference_policy = "initial"
        self.beta_ent = 0.0
        self.beta_kl = 0.0

    def training(self, *, dpo_beta: float | None = NotProvided, **kwargs: Any) -> DPOConfig:
        """Sets ``dpo_beta`` (DPO's beta, > 0) and any of ``HAEPOConfig.training``'s settings."""
        super().training(**kwargs)
        if dpo_beta is not NotProvided:
            self.dpo_beta = dpo_beta
        return self

    def validate(self) -> None:
        super().validate()
        beta = self.dpo_beta
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < math.inf:
            rllib_internals.config_error(self, f"DPO: dpo_beta must be a finite number > 0, got {beta!r}")
        for name in ("beta_ent", "beta_kl"):
            if getattr(self, name) != 0:
                rllib_internals.config_error(self, 
                    f"DPO: {name} must be 0, got {getattr(self, name)!r}; DPO has no entropy "
                    "or KL term (dpo_beta sets its pull towards the reference policy)"
                )

    def get_default_learner_class(self) -> type:
        return DPOTorchLearner


class DPO(HAEPO):
    """Trajectory-level DPO: sample M complete episodes, one DPO update on their return pairs."""

    @classmethod
    def get_default_config(cls) -> DPOConfig:
        return DPOConfig()


class DPOTorchLearner(HAEPOTorchLearner):
    """HAEPO's learner with the DPO loss (same sampling, reference policy and metrics)."""

    def episode_loss(self, episodes: EpisodeBatch, config: DPOConfig) -> tuple[Tensor, dict[str, Tensor]]:
        loss, out = episodes.listwise(partial(dpo_loss, beta=config.dpo_beta))
        return loss, out.diagnostics()

