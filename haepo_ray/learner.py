"""HAEPOTorchLearner: a batch of complete episodes -> :func:`haepo_ray.loss.haepo_loss`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.rllib.utils.typing import ModuleID, TensorType

from haepo_ray.connectors import EPISODE_INDEX, EPISODE_RETURN, AddEpisodeIndexAndReturn
from haepo_ray.loss import haepo_loss, trajectory_log_likelihood
from haepo_ray.schedules import parse_schedule

if TYPE_CHECKING:
    from haepo_ray.algorithm import HAEPOConfig

REFERENCE_STATE = "haepo_reference"


@dataclass(frozen=True)
class EpisodeBatch:
    """A learner's batch of M complete episodes, flat over timesteps."""

    step_logp: torch.Tensor  # log pi(a_t|s_t) under the current policy, with gradient
    behavior_step_logp: torch.Tensor  # under the policy that sampled the batch
    step_entropy: torch.Tensor  # entropy of the current action distribution, with gradient
    ref_step_logp: torch.Tensor  # under the reference policy (no gradient)
    episode_index: torch.Tensor  # episode of each timestep, in 0..M-1
    num_episodes: int  # M
    returns: torch.Tensor  # [M] discounted episode returns R_k
    beta_ent: float  # current values of the schedules
    beta_kl: float

    def traj_logp(self, step_logp: torch.Tensor) -> torch.Tensor:
        """Per-episode sums L_k of ``step_logp``."""
        return trajectory_log_likelihood(step_logp, self.episode_index, self.num_episodes)


class HAEPOTorchLearner(TorchLearner):
    """Computes the HAEPO loss over the complete episodes of its batch.

    The reference policy (``config.reference_policy``) is

    - ``"lagged"``: a frozen copy of the policy, refreshed after every
      ``reference_update_interval`` learner updates (training iterations);
    - ``"initial"``: a frozen copy of the policy as it was built, never refreshed;
    - ``"behavior"``: the policy that sampled the batch (its ``action_logp``). With one
      gradient step per batch the current policy *is* this policy, so the KL term has zero
      gradient; it acts only from the second of ``num_epochs`` steps on.

    With several learners each one receives whole episodes, and the Plackett-Luce softmax
    runs over each learner's own episodes (a per-shard list); gradients are then averaged.
    """

    def build(self) -> None:
        super().build()
        cfg: HAEPOConfig = self.config
        if cfg.add_default_connectors_to_learner_pipeline:
            self._learner_connector.prepend(AddEpisodeIndexAndReturn(gamma=cfg.gamma))
        self._beta_ent = parse_schedule("beta_ent", cfg.beta_ent)
        self._beta_kl = parse_schedule("beta_kl", cfg.beta_kl)
        self._env_steps = 0
        self._num_updates = 0
        self._reference: dict[ModuleID, torch.nn.Module] = {}
        if cfg.reference_policy != "behavior":
            for module_id in self.module.keys():
                ref = copy.deepcopy(self.module[module_id].unwrapped())
                ref.requires_grad_(False)
                self._reference[module_id] = ref

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self._env_steps = timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0) or 0

    def compute_loss_for_module(
        self,
        *,
        module_id: ModuleID,
        config: HAEPOConfig,
        batch: dict[str, Any],
        fwd_out: dict[str, TensorType],
    ) -> TensorType:
        module = self.module[module_id].unwrapped()
        dist_cls = module.get_train_action_dist_cls()
        dist = dist_cls.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        step_logp = dist.logp(batch[Columns.ACTIONS])
        episode_index = batch[EPISODE_INDEX].long()
        num_episodes = int(episode_index.max()) + 1
        behavior_step_logp = batch[Columns.ACTION_LOGP]
        episodes = EpisodeBatch(
            step_logp=step_logp,
            behavior_step_logp=behavior_step_logp,
            step_entropy=dist.entropy(),
            ref_step_logp=(
                behavior_step_logp
                if config.reference_policy == "behavior"
                else self._reference_step_logp(module_id, batch)
            ),
            episode_index=episode_index,
            num_episodes=num_episodes,
            returns=step_logp.new_zeros(num_episodes).scatter(
                0, episode_index, batch[EPISODE_RETURN].to(step_logp.dtype)
            ),
            beta_ent=self._beta_ent.value(self._env_steps),
            beta_kl=self._beta_kl.value(self._env_steps),
        )
        loss, diagnostics = self.episode_loss(episodes, config)
        traj_logp = episodes.traj_logp(episodes.step_logp)
        # |L_k - L_k(behavior)|: 0 at the first gradient step on a batch, then the drift.
        diagnostics["behavior_logp_gap"] = (
            traj_logp - episodes.traj_logp(behavior_step_logp)
        ).abs().mean()
        diagnostics["traj_logp_mean"] = traj_logp.mean()
        diagnostics["policy_entropy"] = episodes.step_entropy.mean()
        values = torch.stack([v.detach().float() for v in diagnostics.values()]).tolist()  # one sync
        self.metrics.log_dict(
            {
                **dict(zip(diagnostics, values)),
                "num_episodes": num_episodes,
                "beta_ent": episodes.beta_ent,
                "beta_kl": episodes.beta_kl,
            },
            key=module_id,
            window=1,
        )
        return loss

    def episode_loss(
        self, episodes: EpisodeBatch, config: HAEPOConfig
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The HAEPO loss of a batch of complete episodes, and its diagnostics.

        Subclasses (the baselines) override this to train other episode-level losses on
        the same sampling, reference policy and metrics.
        """
        out = haepo_loss(
            episodes.traj_logp(episodes.step_logp),
            episodes.traj_logp(episodes.ref_step_logp),
            episodes.returns,
            beta_ent=episodes.beta_ent,
            beta_kl=episodes.beta_kl,
            normalization=config.reward_normalization,
        )
        return out.loss, {
            "weight_entropy": out.weight_entropy,
            "kl_to_reference": out.kl,
            "max_weight": out.max_weight,
            "effective_num_trajectories": out.effective_num_trajectories,
            "reward_loss": out.reward_term,
            "entropy_loss": out.entropy_term,
            "kl_loss": out.kl_term,
        }

    def _reference_step_logp(self, module_id: ModuleID, batch: dict[str, Any]) -> torch.Tensor:
        ref = self._reference[module_id]
        with torch.no_grad():
            ref_out = ref.forward_train(batch)
            dist = ref.get_train_action_dist_cls().from_logits(ref_out[Columns.ACTION_DIST_INPUTS])
            return dist.logp(batch[Columns.ACTIONS])

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self._num_updates += 1
        if (
            self.config.reference_policy == "lagged"
            and self._num_updates % self.config.reference_update_interval == 0
        ):
            for module_id, ref in self._reference.items():
                ref.load_state_dict(self.module[module_id].unwrapped().state_dict())

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        state[REFERENCE_STATE] = {
            "num_updates": self._num_updates,
            "modules": {
                mid: {k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()}
                for mid, ref in self._reference.items()
            },
        }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if REFERENCE_STATE in state:
            self._num_updates = state[REFERENCE_STATE]["num_updates"]
            for mid, weights in state[REFERENCE_STATE]["modules"].items():
                if mid in self._reference:
                    self._reference[mid].load_state_dict(
                        {k: torch.as_tensor(v) for k, v in weights.items()}
                    )
