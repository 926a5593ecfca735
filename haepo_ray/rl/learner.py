"""HAEPOTorchLearner: a batch of complete episodes -> :func:`haepo_ray.loss.haepo_loss`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.rllib.utils.typing import ModuleID, TensorType

from haepo_ray.rl.connectors import EPISODE_INDEX, EPISODE_RETURN, AddEpisodeIndexAndReturn
from haepo_ray.listwise import LossOutput, Shard, gather_episodes, listwise_loss
from haepo_ray.loss import haepo_loss, trajectory_log_likelihood
from haepo_ray.rl.schedules import parse_schedule
from haepo_ray.upstream import rllib as rllib_internals

if TYPE_CHECKING:
    from haepo_ray.rl.algorithm import HAEPOConfig

REFERENCE_STATE = "haepo_reference"
# Key of ``timesteps`` (Learner.update) holding the Algorithm's completed training iterations.
TRAINING_ITERATION = "haepo_training_iteration"
Out = TypeVar("Out", bound=LossOutput)


@dataclass(frozen=True)
class EpisodeBatch:
    """A learner's whole episodes, flat over its timesteps, and the batch's list of all M.

    With several learners each holds some whole episodes (its shard); the ``all_*`` fields
    are the per-episode scalars of all M episodes of the batch, gathered from every learner
    (:mod:`haepo_ray.listwise`). With one learner both views are the same episodes.
    """

    step_logp: torch.Tensor  # log pi(a_t|s_t) under the current policy, with gradient
    behavior_step_logp: torch.Tensor  # under the policy that sampled the batch
    step_entropy: torch.Tensor  # entropy of the current action distribution, with gradient
    ref_step_logp: torch.Tensor  # under the reference policy (no gradient)
    episode_index: torch.Tensor  # this learner's episode of each timestep, in 0..M_i-1
    beta_ent: float  # current values of the schedules
    beta_kl: float
    shard: Shard  # where this learner's episodes sit in the list of M
    all_traj_logp: torch.Tensor  # [M] L_k of every episode (detached)
    all_ref_traj_logp: torch.Tensor  # [M] L_k^ref
    all_returns: torch.Tensor  # [M] discounted returns R_k
    all_lengths: torch.Tensor  # [M] T_k

    def traj_logp(self, step_logp: torch.Tensor) -> torch.Tensor:
        """Per-episode sums of ``step_logp`` over this learner's episodes, shape [M_i]."""
        return trajectory_log_likelihood(step_logp, self.episode_index, self.shard.size)

    def listwise(
        self, loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Out]
    ) -> tuple[torch.Tensor, Out]:
        """``loss_fn(L, L_ref, R)`` over the list of all M episodes, as this learner's loss.

        Returns ``(loss, out)``: ``out`` is ``loss_fn`` on the whole list; ``loss`` has its
        value, and a gradient that DDP's mean over the learners turns into the whole list's
        (:func:`haepo_ray.listwise.listwise_loss`).
        """
        return listwise_loss(
            lambda traj_logp: loss_fn(traj_logp, self.all_ref_traj_logp, self.all_returns),
            self.traj_logp(self.step_logp),
            self.all_traj_logp,
            self.shard,
        )


class HAEPOTorchLearner(TorchLearner):
    """Computes the HAEPO loss over the complete episodes of the batch.

    The reference policy (``config.reference_policy``) is

    - ``"lagged"``: a frozen copy of the policy, refreshed every ``reference_update_interval``
      training iterations (``Algorithm.train()`` calls, however many updates each runs);
    - ``"initial"``: a frozen copy of the policy as it was built, never refreshed;
    - ``"behavior"``: the policy that sampled the batch (its ``action_logp``). With one
      gradient step per batch the current policy *is* this policy, so the KL term has zero
      gradient; it acts only from the second of ``num_epochs`` steps on.

    The reference lives on the learner's device and travels in checkpoints, not in the
    weights sent to the env runners.

    With several learners each receives whole episodes, and the loss is the loss of the
    whole batch: one Plackett-Luce list over all M episodes (:mod:`haepo_ray.listwise`), so
    N learners make the update one learner makes. ``listwise_size`` logs M.
    """

    def build(self) -> None:
        super().build()
        cfg: HAEPOConfig = self.config
        if cfg.add_default_connectors_to_learner_pipeline:
            rllib_internals.learner_connector(self).prepend(AddEpisodeIndexAndReturn(gamma=cfg.gamma))
        self._beta_ent = parse_schedule("beta_ent", cfg.beta_ent)
        self._beta_kl = parse_schedule("beta_kl", cfg.beta_kl)
        self._env_steps = 0
        self._num_updates = 0  # Learner.update calls: the iteration count without an Algorithm
        self._refreshed_at = 0  # training iteration of the last refresh of the reference
        self._reference: dict[ModuleID, torch.nn.Module] = {}
        for module_id in self.module.keys():
            if self.module[module_id].is_stateful():
                raise ValueError(
                    f"HAEPO: module {module_id!r} is stateful (recurrent); HAEPO's learner "
                    "sums log-probabilities over flat timesteps and does not support "
                    "zero-padded sequences: use a stateless RLModule"
                )
            if cfg.reference_policy != "behavior":
                # A copy of the module already on the learner's device.
                ref = copy.deepcopy(self.module[module_id].unwrapped())
                ref.requires_grad_(False)
                self._reference[module_id] = ref

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self._env_steps = timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0) or 0
        # Refresh at the first update of every interval-th iteration: after `interval` whole
        # iterations, whatever number of updates each ran.
        iteration = timesteps.get(TRAINING_ITERATION, self._num_updates)
        interval = self.config.reference_update_interval
        if (
            self.config.reference_policy == "lagged"
            and iteration > self._refreshed_at
            and iteration % interval == 0
        ):
            for module_id, ref in self._reference.items():
                ref.load_state_dict(self.module[module_id].unwrapped().state_dict())
            self._refreshed_at = iteration

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
        step_entropy = dist.entropy()
        episode_index = batch[EPISODE_INDEX].long()
        num_local = int(episode_index.max()) + 1
        behavior_step_logp = batch[Columns.ACTION_LOGP].to(step_logp.dtype)
        ref_step_logp = (
            behavior_step_logp
            if config.reference_policy == "behavior"
            else self._reference_step_logp(module_id, batch)
        )

        # Per episode: sums of the step columns (L_k, L_k^ref, L_k^behavior, entropy, T_k)
        # and the return R_k; then those of every learner's episodes, the whole list of M.
        steps = torch.stack(
            [step_logp, ref_step_logp, behavior_step_logp, step_entropy, torch.ones_like(step_logp)], 1
        ).detach()
        returns = batch[EPISODE_RETURN].to(steps.dtype)[:, None]  # R_k on every step of k
        local = torch.cat([
            steps.new_zeros(num_local, steps.shape[1]).index_add(0, episode_index, steps),
            steps.new_zeros(num_local, 1).scatter(0, episode_index[:, None], returns),
        ], dim=1)
        table, shard = gather_episodes(
            local, distributed=self.config.num_learners > 1  # RLlib wraps the modules in DDP then
        )
        all_traj_logp, all_ref, all_behavior, all_entropy, all_lengths, all_returns = table.unbind(1)
        episodes = EpisodeBatch(
            step_logp=step_logp,
            behavior_step_logp=behavior_step_logp,
            step_entropy=step_entropy,
            ref_step_logp=ref_step_logp,
            episode_index=episode_index,
            beta_ent=self._beta_ent.value(self._env_steps),
            beta_kl=self._beta_kl.value(self._env_steps),
            shard=shard,
            all_traj_logp=all_traj_logp,
            all_ref_traj_logp=all_ref,
            all_returns=all_returns,
            all_lengths=all_lengths,
        )
        loss, diagnostics = self.episode_loss(episodes, config)
        # |L_k - L_k(behavior)|: 0 at the first gradient step on a batch, then the drift.
        diagnostics["behavior_logp_gap"] = (all_traj_logp - all_behavior).abs().mean()
        diagnostics["traj_logp_mean"] = all_traj_logp.mean()
        diagnostics["policy_entropy"] = all_entropy.sum() / all_lengths.sum()
        values = torch.stack([v.detach().float() for v in diagnostics.values()]).tolist()  # one sync
        self.metrics.log_dict(
            {
                **dict(zip(diagnostics, values)),
                "num_episodes": shard.size,
                "listwise_size": shard.num_episodes,
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
        """The HAEPO loss of the batch's list of episodes, and its diagnostics.

        Returns a loss whose value is the loss of all M episodes and whose gradient, summed
        over the learners (DDP), is that loss's gradient. Subclasses (the baselines)
        override this to train other episode-level losses on the same sampling, reference
        policy and metrics.
        """
        loss, out = episodes.listwise(
            lambda traj_logp, ref_traj_logp, returns: haepo_loss(
                traj_logp,
                ref_traj_logp,
                returns,
                beta_ent=episodes.beta_ent,
                beta_kl=episodes.beta_kl,
                normalization=config.reward_normalization,
                estimator=config.estimator,
            )
        )
        return loss, {
            "weight_entropy": out.weight_entropy,
            "kl_to_reference": out.kl,
            "max_weight": out.max_weight,
            "effective_num_trajectories": out.effective_num_trajectories,
            "reward_loss": out.reward_term.detach(),
            "entropy_loss": out.entropy_term.detach(),
            "kl_loss": out.kl_term.detach(),
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

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict[str, Any]:
        """Learner state; the reference only where asked for (checkpoints), not in the
        ``rl_module`` weights that ``sync_weights`` sends to the env runners every iteration."""
        state = super().get_state(components, not_components=not_components, **kwargs)
        if rllib_internals.wants_component(self, REFERENCE_STATE, components, not_components):
            state[REFERENCE_STATE] = {
                "num_updates": self._num_updates,
                "refreshed_at": self._refreshed_at,
                "modules": {
                    mid: {k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()}
                    for mid, ref in self._reference.items()
                },
            }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if REFERENCE_STATE in state:
            ref_state = state[REFERENCE_STATE]
            self._num_updates = ref_state["num_updates"]
            self._refreshed_at = ref_state.get("refreshed_at", 0)
            for mid, weights in ref_state["modules"].items():
                if mid in self._reference:
                    # load_state_dict copies into the reference's own device (CPU <-> GPU).
                    self._reference[mid].load_state_dict(
                        {k: torch.as_tensor(v) for k, v in weights.items()}
                    )
