"""The baselines' losses as pure PyTorch functions: trajectory-level DPO and GRPO.

- :func:`dpo_loss`: Rafailov et al. 2023, "Direct Preference Optimization", Eq. 7, on pairs
  of episodes ordered by their returns.
- :func:`grpo_loss`: Shao et al. 2024, "DeepSeekMath", Sec. 4.1, Eq. 3 and 4 (outcome
  supervision), the batch of episodes being the group, with the advantage of
  :func:`group_advantage` (TRL's ``GRPOTrainer``'s: sample std plus eps).

:func:`lone_episode_reason` says where a group of one episode keeps its return out of a loss's
gradient (HAEPO's too). Each function's docstring gives its formula, with the paper's equation
in a comment where it is computed; :mod:`haepo_ray.rl.baselines.dpo` and
:mod:`haepo_ray.rl.baselines.grpo` give the full formulations and the choices made to apply
them to RL episodes. Trajectory log-likelihoods enter DPO only through ``logsigmoid`` of
differences, so episodes whose L_k are in the thousands give neither NaN nor underflow. This
module imports nothing from Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor

from haepo_ray.loss import (
    Normalization,
    _check_beta,
    _check_finite,
    _check_vector,
    normalize_returns,
    trajectory_log_likelihood,
)

__all__ = [
    "GRPO_ADVANTAGE_EPS",
    "BaselineLossOutput",
    "DPOLossOutput",
    "GRPOLossOutput",
    "clipped_surrogate",
    "dpo_loss",
    "episode_mean",
    "group_advantage",
    "grpo_loss",
    "grpo_token_loss",
    "implicit_reward",
    "lone_episode_reason",
    "preference_pairs",
    "reference_kl",
]


def _check_same_shape(names: str, *tensors: Tensor) -> None:
    if len({t.shape for t in tensors}) != 1:
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
        raise ValueError(f"{names} must have the same shape, got {shapes}")


@dataclass(frozen=True)
class BaselineLossOutput:
    """A baseline's scalar loss (with gradient); subclasses add 0-d diagnostics."""

    loss: Tensor

    def diagnostics(self) -> dict[str, Tensor]:
        """Every field but ``loss``, by name: what the learner logs as metrics."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "loss"}


# --- DPO ---------------------------------------------------------------------------------


def preference_pairs(returns: Tensor) -> Tensor:
    """The [M, M] mask of preference pairs: ``mask[i, j]`` is True iff R_i > R_j.

    The RL stand-in for DPO's preference data (y_w, y_l): episode i is preferred to j.
    """
    return returns[:, None] > returns[None, :]


def implicit_reward(traj_logp: Tensor, ref_traj_logp: Tensor, beta: float) -> Tensor:
    """DPO's implicit reward r_k = beta log pi(tau_k)/pi_ref(tau_k) = beta (L_k - L_k^ref)."""
    # Rafailov et al. 2023, Eq. 5 (without the beta log Z(x) term, which cancels in Eq. 7)
    return beta * (traj_logp - ref_traj_logp)


@dataclass(frozen=True)
class DPOLossOutput(BaselineLossOutput):
    """The DPO loss and detached diagnostics.

    ``preference_accuracy`` is the fraction of pairs with r_i - r_j > 0 and
    ``reward_margin_mean`` the mean of r_i - r_j over pairs; both are 0 without a pair.
    """

    num_pairs: Tensor
    preference_accuracy: Tensor
    reward_margin_mean: Tensor


def dpo_loss(
    traj_logp: Tensor, ref_traj_logp: Tensor, returns: Tensor, *, beta: float
) -> DPOLossOutput:
    """Trajectory-level DPO loss of a batch of M episodes (Rafailov et al. 2023, Eq. 7).

    ``traj_logp`` (current policy) and ``ref_traj_logp`` (reference policy) are the L_k,
    ``returns`` the R_k; all have shape ``[M]``. ``beta > 0`` is DPO's KL strength. The loss
    is ``-mean_{(i, j): R_i > R_j} log sigmoid(r_i - r_j)``, computed with ``logsigmoid``;
    0 with zero gradient when no two returns differ.
    """
    for name, x in (("traj_logp", traj_logp), ("ref_traj_logp", ref_traj_logp), ("returns", returns)):
        _check_vector(name, x)
    _check_same_shape("traj_logp, ref_traj_logp and returns", traj_logp, ref_traj_logp, returns)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < math.inf:
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")

    pairs = preference_pairs(returns)
    reward = implicit_reward(traj_logp, ref_traj_logp, beta)
    margin = reward[:, None] - reward[None, :]  # r_i - r_j for every ordered pair
    num_pairs = pairs.sum()
    # Eq. 7: -E[log sigmoid(r_w - r_l)], the expectation being the mean over the pairs
    log_likelihood = torch.where(pairs, F.logsigmoid(margin), torch.zeros_like(margin))
    loss = -log_likelihood.sum() / num_pairs.clamp(min=1)

    with torch.no_grad():
        denominator = num_pairs.clamp(min=1).to(margin.dtype)
        return DPOLossOutput(
            loss=loss,
            num_pairs=num_pairs.to(margin.dtype),
            preference_accuracy=(pairs & (margin > 0)).sum() / denominator,
            reward_margin_mean=torch.where(pairs, margin, torch.zeros_like(margin)).sum() / denominator,
        )


# --- GRPO ---------------------------------------------------------------------------------

# TRL's GRPOTrainer: advantages = (rewards - mean) / (std + 1e-4), per group of completions.
GRPO_ADVANTAGE_EPS = 1e-4


def group_advantage(returns: Tensor, normalization: Normalization = "zscore") -> Tensor:
    """GRPO's advantage A_k of each of the group's M episodes from their returns R_k.

    ``"zscore"``, GRPO's outcome supervision (Shao et al. 2024, Sec. 4.1.2) as TRL's
    ``GRPOTrainer`` computes it: (R_k - mean R) / (std R + eps) with the sample std
    (1/(M-1), ``torch.std``'s default) and eps = :data:`GRPO_ADVANTAGE_EPS`; 0 when M = 1 or
    all returns are equal. ``"sum"`` and ``"none"``: HAEPO's other normalisations
    (:func:`~haepo_ray.loss.normalize_returns`) as variants. HAEPO's own z-score keeps the
    paper's population std.
    """
    if normalization != "zscore":
        return normalize_returns(returns, normalization)
    _check_vector("returns", returns)
    if returns.numel() == 1:
        return torch.zeros_like(returns)
    # Sec. 4.1.2: r~_i = (r_i - mean(r)) / std(r); TRL: / (std + 1e-4), std with Bessel's correction
    advantage = (returns - returns.mean()) / (returns.std() + GRPO_ADVANTAGE_EPS)
    # Exact equality: the mean of equal values can be off by one ulp.
    return torch.where(returns.max() == returns.min(), torch.zeros_like(returns), advantage)


def episode_mean(step_values: Tensor, episode_index: Tensor, num_episodes: int) -> Tensor:
    """The per-episode mean 1/T_k sum_{t in k} x_t of a per-step quantity, shape ``[M]``.

    GRPO's 1/|o_i| sum_t (Eq. 3). Checks ``episode_index`` like
    :func:`haepo_ray.loss.trajectory_log_likelihood`, whose segment sum it divides by T_k.
    """
    sums = trajectory_log_likelihood(step_values, episode_index, num_episodes)
    return sums / torch.bincount(episode_index.long(), minlength=num_episodes).to(sums.dtype)


def clipped_surrogate(ratio: Tensor, advantage: Tensor, clip_param: float) -> Tensor:
    """min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t) for every step t."""
    # Shao et al. 2024, Eq. 3 (PPO's clipped surrogate, Schulman et al. 2017, Eq. 7)
    return torch.minimum(ratio * advantage, ratio.clamp(1 - clip_param, 1 + clip_param) * advantage)


def reference_kl(step_logp: Tensor, ref_step_logp: Tensor) -> Tensor:
    """D_t = pi_ref/pi - log(pi_ref/pi) - 1 >= 0 for every step: unbiased for KL(pi || pi_ref)."""
    # Shao et al. 2024, Eq. 4; expm1(d) - d == exp(d) - d - 1 without cancellation near d = 0
    log_ratio = ref_step_logp - step_logp
    return torch.expm1(log_ratio) - log_ratio


@dataclass(frozen=True)
class GRPOLossOutput(BaselineLossOutput):
    """The GRPO loss and its parts (with gradient), and detached diagnostics.

    ``loss == surrogate_loss + kl_loss + entropy_loss``. ``step_kl_to_reference`` is the mean
    over episodes of the episode mean of D_t, ``clip_fraction`` the fraction of steps with
    |rho_t - 1| > eps, ``advantage_abs_mean`` the mean of |A_k|.
    """

    surrogate_loss: Tensor
    kl_loss: Tensor
    entropy_loss: Tensor
    step_kl_to_reference: Tensor
    clip_fraction: Tensor
    advantage_abs_mean: Tensor


def grpo_loss(
    step_logp: Tensor,
    behavior_step_logp: Tensor,
    ref_step_logp: Tensor,
    step_entropy: Tensor,
    episode_index: Tensor,
    returns: Tensor,
    *,
    clip_param: float,
    beta_kl: float | Tensor,
    beta_ent: float | Tensor = 0.0,
    normalization: Normalization = "zscore",
) -> GRPOLossOutput:
    """GRPO loss of a batch of M episodes as one group (Shao et al. 2024, Eq. 3 and 4)::

        -1/M sum_k 1/T_k sum_{t in k} [min(rho_t A_k, clip(rho_t, 1-eps, 1+eps) A_k)
                                       - beta_kl D_t + beta_ent H_t]

    The four step tensors (log-probabilities under the current, behaviour and reference
    policy, and the current policy's entropy H_t) are flat over the batch's timesteps;
    ``episode_index`` gives each step's episode in 0..M-1 and ``returns`` the R_k, shape
    ``[M]``. rho_t = exp(step_logp - behavior_step_logp), D_t is :func:`reference_kl`, and
    A = ``group_advantage(returns, normalization)``: ``"zscore"`` is GRPO's
    outcome-supervision advantage (R_k - mean R) / (std R + eps), 0 when all returns are equal.
    ``clip_param`` is eps, in (0, 1).
    """
    steps = (
        ("step_logp", step_logp),
        ("behavior_step_logp", behavior_step_logp),
        ("ref_step_logp", ref_step_logp),
        ("step_entropy", step_entropy),
    )
    for name, x in steps:
        _check_vector(name, x)
    _check_same_shape(", ".join(name for name, _ in steps), *(x for _, x in steps))
    num_episodes = returns.numel()
    # The first episode_mean checks episode_index before it is used to index the advantages.
    return _grpo(
        step_logp, behavior_step_logp, ref_step_logp, step_entropy, returns,
        per_episode=lambda x: episode_mean(x, episode_index, num_episodes),
        per_step=lambda a: a[episode_index.long()],
        step_mean=torch.mean,
        clip_param=clip_param, beta_kl=beta_kl, beta_ent=beta_ent, normalization=normalization,
    )


def grpo_token_loss(
    token_logp: Tensor,
    behavior_token_logp: Tensor,
    ref_token_logp: Tensor,
    token_entropy: Tensor,
    mask: Tensor,
    returns: Tensor,
    *,
    clip_param: float,
    beta_kl: float | Tensor,
    beta_ent: float | Tensor = 0.0,
    normalization: Normalization = "zscore",
) -> GRPOLossOutput:
    """:func:`grpo_loss` on padded rows: row k of the ``[M, T]`` tensors is episode k and
    ``mask`` marks its steps. The same loss, with shapes that do not depend on the data (the
    language-model objective's form, which the memory simulator runs on fake tensors)."""
    rows = (
        ("token_logp", token_logp),
        ("behavior_token_logp", behavior_token_logp),
        ("ref_token_logp", ref_token_logp),
        ("token_entropy", token_entropy),
        ("mask", mask),
    )
    _check_same_shape(", ".join(name for name, _ in rows), *(x for _, x in rows))
    if token_logp.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"token tensors must be [M, T] with a bool mask, got {tuple(token_logp.shape)}, {mask.dtype}")
    for name, x in rows[:-1]:
        _check_finite(name, x)
    lengths = mask.sum(dim=1)

    def per_episode(x: Tensor) -> Tensor:
        return torch.where(mask, x, torch.zeros_like(x)).sum(dim=1) / lengths

    return _grpo(
        token_logp, behavior_token_logp, ref_token_logp, token_entropy, returns,
        per_episode=per_episode,
        per_step=lambda a: a[:, None],
        step_mean=lambda x: torch.where(mask, x, torch.zeros_like(x)).sum() / lengths.sum(),
        clip_param=clip_param, beta_kl=beta_kl, beta_ent=beta_ent, normalization=normalization,
    )


def _grpo(
    step_logp: Tensor,
    behavior_step_logp: Tensor,
    ref_step_logp: Tensor,
    step_entropy: Tensor,
    returns: Tensor,
    *,
    per_episode: Callable[[Tensor], Tensor],
    per_step: Callable[[Tensor], Tensor],
    step_mean: Callable[[Tensor], Tensor],
    clip_param: float,
    beta_kl: float | Tensor,
    beta_ent: float | Tensor,
    normalization: Normalization,
) -> GRPOLossOutput:
    """The GRPO equations, given how steps are laid out: ``per_episode`` is 1/T_k sum_{t in k},
    ``per_step`` spreads an episode's value over its steps, ``step_mean`` is the mean over steps."""
    _check_vector("returns", returns)
    if isinstance(clip_param, bool) or not isinstance(clip_param, (int, float)) or not 0 < clip_param < 1:
        raise ValueError(f"clip_param must be a number in (0, 1), got {clip_param!r}")
    _check_beta("beta_kl", beta_kl)
    _check_beta("beta_ent", beta_ent)

    kl = per_episode(reference_kl(step_logp, ref_step_logp))
    entropy = per_episode(step_entropy)
    advantage = group_advantage(returns, normalization)  # Sec. 4.1.2: A_{i,t} = r~_i
    ratio = torch.exp(step_logp - behavior_step_logp)
    surrogate = per_episode(clipped_surrogate(ratio, per_step(advantage), clip_param))
    # Eq. 3, negated to a loss: 1/G sum_i 1/|o_i| sum_t [min(...) - beta D_KL], plus entropy
    surrogate_loss = -surrogate.mean()
    kl_loss = beta_kl * kl.mean()
    entropy_loss = -beta_ent * entropy.mean()
    loss = surrogate_loss + kl_loss + entropy_loss

    with torch.no_grad():
        return GRPOLossOutput(
            loss=loss,
            surrogate_loss=surrogate_loss,
            kl_loss=kl_loss,
            entropy_loss=entropy_loss,
            step_kl_to_reference=kl.mean(),
            clip_fraction=step_mean(((ratio - 1).abs() > clip_param).to(ratio.dtype)),
            advantage_abs_mean=advantage.abs().mean(),
        )


def lone_episode_reason(algo: str, *, normalization: Normalization, estimator: str = "weights") -> str | None:
    """Why ``algo``'s loss (HAEPO, GRPO or DPO) on a group of one episode (M = 1: an RL batch
    of one, an LM group of one completion) has a gradient that holds nothing of the episode's
    return, or None where the return reaches it: GRPO, or HAEPO with the unbiased estimator,
    on returns left as they are (``normalization`` none)."""
    if algo == "DPO":  # preference_pairs: no pair
        return "DPO's pairs need two returns that differ"
    if algo == "HAEPO" and estimator == "weights":  # softmax over one: w = 1, whatever L_k
        return "HAEPO's weights are a softmax over the group, and a group of one has weight 1"
    return {"zscore": "normalization zscore makes a group's one return 0",  # normalize_returns, group_advantage
            "sum": "normalization sum makes a group's one return R into R / |R|, its sign"}.get(normalization)
