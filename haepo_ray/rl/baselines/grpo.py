"""GRPO on HAEPO's sampling: ``GRPOConfig``, ``GRPO`` and its learner.

Formulation (Shao et al. 2024, "DeepSeekMath", Sec. 4.1, Eq. 3 and 4, outcome supervision),
the batch of M complete episodes of every training iteration being the group::

    loss = -1/M sum_k 1/T_k sum_{t in k} [ min(rho_t A_k, clip(rho_t, 1-eps, 1+eps) A_k)
                                           - beta_kl D_t + beta_ent H_t ]

- rho_t = pi(a_t|s_t) / pi_behavior(a_t|s_t), the behaviour policy being the one that
  sampled the batch (DeepSeekMath's pi_old): rho_t = 1 at the first of ``num_epochs``
  gradient steps on a batch, so clipping acts from the second one on.
- A_k = (R_k - mean R) / (std R + 1e-4) from the discounted returns (``reward_normalization``
  ``"zscore"``, the default): the sample std (1/(M-1)) plus eps, as TRL's ``GRPOTrainer``
  computes DeepSeekMath's advantage (HAEPO's z-score keeps the paper's population std). All
  returns equal (M = 1 included) gives A = 0: no policy-gradient signal from that batch, only
  the KL and entropy terms. ``"sum"`` and ``"none"`` swap in HAEPO's other normalisations as
  variants (:func:`~haepo_ray.baseline_losses.group_advantage`).
  Every step of episode k shares A_k, and each episode weighs 1/M whatever its length.
- D_t = pi_ref/pi - log(pi_ref/pi) - 1, Eq. 4's unbiased KL estimate, weighted by ``beta_kl``
  (default 0.04, DeepSeekMath's value).
- H_t is the entropy of the action distribution; ``beta_ent`` defaults to 0 (DeepSeekMath's
  GRPO). HAEPO's paper runs GRPO with HAEPO's entropy and KL weights: set both.
- ``clip_param`` is eps (default 0.2, PPO's and the paper's PPO baseline's); ``num_epochs``
  is mu, the gradient steps per batch (default 2, the fewest with which the clip acts).
  DeepSeekMath's own runs take mu = 1 (``num_epochs=1``): a REINFORCE with a group-mean
  baseline and the KL term, the clip inert.
- The reference is HAEPO's default ``"lagged"``: a frozen copy refreshed every
  ``reference_update_interval`` iterations, as in DeepSeekMath's iterative GRPO
  (Algorithm 1 sets pi_ref <- pi_theta at every outer iteration).
- With ``num_learners > 1`` the group is still the whole batch. The loss is a mean over the
  M episodes of per-episode terms that depend on the other episodes only through A_k, so
  each learner computes the advantages from all M returns and its episodes' share of the
  mean: ``grpo_loss`` on its own episodes (a mean over its M_i) times M_i / M. The shares
  sum to the loss of the group, and N learners make the update one learner makes.

See :func:`haepo_ray.baseline_losses.grpo_loss` for the loss itself.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.algorithm_config import NotProvided
from torch import Tensor

from haepo_ray.rl.algorithm import HAEPO, HAEPOConfig
from haepo_ray.baseline_losses import group_advantage, grpo_loss
from haepo_ray.rl.learner import EpisodeBatch, HAEPOTorchLearner
from haepo_ray.listwise import all_reduce_sum
from haepo_ray.upstream import rllib as rllib_internals

__all__ = ["GRPO", "GRPOConfig", "GRPOTorchLearner"]


class GRPOConfig(HAEPOConfig):
    """Configuration of GRPO; set ``clip_param`` (and ``num_epochs``) with :meth:`training`."""

    def __init__(self, algo_class: type | None = None):
        super().__init__(algo_class=algo_class or GRPO)
        self.clip_param = 0.2
        self.num_epochs = 2
        self.beta_ent = 0.0
        self.beta_kl = 0.04

    def training(self, *, clip_param: float | None = NotProvided, **kwargs: Any) -> GRPOConfig:
        """Sets ``clip_param`` (eps, in (0, 1)) and any of ``HAEPOConfig.training``'s settings."""
        super().training(**kwargs)
        if clip_param is not NotProvided:
            self.clip_param = clip_param
        return self

    def validate(self) -> None:
        super().validate()
        eps = self.clip_param
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            rllib_internals.config_error(self, f"GRPO: clip_param must be a number in (0, 1), got {eps!r}")
        n = self.num_epochs
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            rllib_internals.config_error(self, f"GRPO: num_epochs must be an integer >= 1, got {n!r}")

    def get_default_learner_class(self) -> type:
        return GRPOTorchLearner


class GRPO(HAEPO):
    """GRPO: sample M complete episodes as one group, ``num_epochs`` clipped updates."""

    @classmethod
    def get_default_config(cls) -> GRPOConfig:
        return GRPOConfig()


class GRPOTorchLearner(HAEPOTorchLearner):
    """HAEPO's learner with the GRPO loss (same sampling, reference policy and metrics)."""

    def episode_loss(self, episodes: EpisodeBatch, config: GRPOConfig) -> tuple[Tensor, dict[str, Tensor]]:
        shard = episodes.shard
        # The group is the batch: advantages from all M returns, each episode weighing 1/M.
        advantage = group_advantage(episodes.all_returns, config.reward_normalization)
        out = grpo_loss(
            episodes.step_logp,
            episodes.behavior_step_logp,
            episodes.ref_step_logp,
            episodes.step_entropy,
            episodes.episode_index,
            advantage[shard.rows],
            clip_param=config.clip_param,
            beta_kl=episodes.beta_kl,
            beta_ent=episodes.beta_ent,
            normalization="none",
        )
        # out is a mean over this learner's M_i episodes (clip_fraction: over its steps);
        # weighted by M_i / M (steps / all steps) the learners' values sum to the group's.
        share = shard.size / shard.num_episodes
        step_share = episodes.step_logp.numel() / float(episodes.all_lengths.sum())
        diagnostics = out.diagnostics()
        weights = [step_share if name == "clip_fraction" else share for name in diagnostics]
        totals = all_reduce_sum(
            torch.stack([out.loss.detach() * share]
                        + [value * w for value, w in zip(diagnostics.values(), weights)]),
            shard,
        )
        # Value: the group's loss; gradient: N * this share, which DDP's mean makes the sum.
        loss = totals[0] + shard.world_size * share * (out.loss - out.loss.detach())
        return loss, dict(zip(diagnostics, totals[1:]))

