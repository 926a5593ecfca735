"""The HAEPO loss as pure PyTorch functions, one per equation of the paper.

Equation names follow ``shared/paper/haepo.tex`` ("Proposed Method" and the appendix
"Comprehensive Mathematical Derivation of HAEPO Loss"). Everything that involves the
Plackett-Luce weights is computed in log-space (``log_softmax``), so episodes of 10^4 steps,
whose log-likelihoods are in the thousands, neither underflow nor produce NaN.

This module imports nothing from Ray: RLlib's learner calls it with flat tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from haepo_ray.upstream.torch import is_fake  # checks of values are skipped on the memory simulator's tensors

Normalization = Literal["zscore", "sum", "none"]
NORMALIZATIONS: tuple[str, ...] = ("zscore", "sum", "none")
# The gradient estimator (haepo_loss): "weights", the gradient through the weights alone (Sec. 3's
# Eq. orig-haepo-grad, the default); "unbiased", the appendix's Monte Carlo estimator hat G_M, which
# adds the score-function term of the sampling distribution (score_function_term).
Estimator = Literal["weights", "unbiased"]
ESTIMATORS: tuple[str, ...] = ("weights", "unbiased")

__all__ = [
    "ESTIMATORS",
    "NORMALIZATIONS",
    "HAEPOLossOutput",
    "haepo_loss",
    "is_fake",
    "negative_entropy",
    "normalize_returns",
    "plackett_luce_log_weights",
    "reward_term",
    "score_function_term",
    "trajectory_log_likelihood",
    "weight_kl",
]


def _check_finite(name: str, x: Tensor) -> None:
    if is_fake(x):
        return
    if not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).nonzero().flatten()[:5].tolist()
        raise ValueError(f"{name} holds NaN or inf values (at positions {bad}, first 5)")


def _check_vector(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1 or x.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    _check_finite(name, x)


def trajectory_log_likelihood(
    step_logp: Tensor, episode_index: Tensor, num_episodes: int
) -> Tensor:
    """Trajectory log-likelihood L_k = sum_t log pi(a_t | s_t) of each episode.

    ``step_logp[i]`` is the log-probability of step ``i``, which belongs to episode
    ``episode_index[i]`` in ``0..num_episodes-1``; steps of one episode need not be
    contiguous. Returns a tensor of shape ``[num_episodes]``. Every episode must own at
    least one step.
    """
    # Eq. "Trajectory Log-Likelihood" (Sec. 3.1): L_k = sum_{t=1}^{T_k} log pi_theta(a_t | s_t)
    _check_vector("step_logp", step_logp)
    if episode_index.shape != step_logp.shape:
        raise ValueError(
            f"episode_index has shape {tuple(episode_index.shape)} but step_logp has "
            f"shape {tuple(step_logp.shape)}: one episode index per step is needed"
        )
    if episode_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"episode_index must be an integer tensor, got {episode_index.dtype}")
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes must be an integer >= 1, got {num_episodes!r}")
    episode_index = episode_index.long()
    lo, hi = int(episode_index.min()), int(episode_index.max())
    if lo < 0 or hi >= num_episodes:
        raise ValueError(
            f"episode_index values must lie in 0..{num_episodes - 1}, got range {lo}..{hi}"
        )
    steps = torch.bincount(episode_index, minlength=num_episodes)
    if (steps == 0).any():
        empty = (steps == 0).nonzero().flatten()[:5].tolist()
        raise ValueError(f"episodes {empty} (first 5) have no steps in step_logp")
    return step_logp.new_zeros(num_episodes).index_add(0, episode_index, step_logp)


def normalize_returns(returns: Tensor, method: Normalization = "zscore") -> Tensor:
    """Normalise the batch's episode returns R_k (Sec. "Reward Normalization").

    - ``"zscore"``: (R - mu) / sigma with the population std sigma. If all returns are
      equal (this includes M = 1) there is no preference between episodes and the result
      is all zeros.
    - ``"sum"``: R / |sum R|. For positive returns this is the paper's R / sum R (which
      sums to 1); dividing by the absolute value keeps a batch whose returns sum to a
      negative number from reversing the order of its episodes. If sum R == 0 the result
      is all zeros. Meant for positive, dense returns; prefer ``"zscore"`` otherwise.
    - ``"none"``: R unchanged.
    """
    _check_vector("returns", returns)
    if method == "none":
        return returns
    if method == "zscore":
        # R^_k = (R_k - mu) / sigma, sigma^2 = M^-1 sum_j (R_j - mu)^2
        centred = returns - returns.mean()
        sigma = centred.square().mean().sqrt()
        # Exact equality, not sigma == 0: the mean of equal values can be off by one ulp.
        degenerate = (returns.max() == returns.min()) | (sigma == 0)
        safe_sigma = torch.where(degenerate, torch.ones_like(sigma), sigma)
        return torch.where(degenerate, torch.zeros_like(returns), centred / safe_sigma)
    if method == "sum":
        # R~_k = R_k / sum_j R_j
        total = returns.sum()
        degenerate = total == 0
        safe_total = torch.where(degenerate, torch.ones_like(total), total.abs())
        return torch.where(degenerate, torch.zeros_like(returns), returns / safe_total)
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {method!r}")


def plackett_luce_log_weights(traj_logp: Tensor) -> Tensor:
    """log w_k of the Plackett-Luce first-choice weights w = softmax(L)."""
    # Eq. (pl-weights): w_k = exp(L_k) / sum_j exp(L_j), computed as log_softmax
    return torch.log_softmax(traj_logp, dim=0)


def reward_term(weights: Tensor, normalized_returns: Tensor) -> Tensor:
    """-sum_k w_k R~_k, the original HAEPO loss on normalised returns."""
    # Eq. (orig-plpo): L_orig = -sum_k R_k w_k
    return -(weights * normalized_returns).sum()


def negative_entropy(weights: Tensor, log_weights: Tensor) -> Tensor:
    """sum_k w_k log w_k = -H(w)."""
    # Eq. (er-loss), second term without beta
    return (weights * log_weights).sum()


def weight_kl(weights: Tensor, log_weights: Tensor, ref_log_weights: Tensor) -> Tensor:
    """KL(w || w_ref) = sum_k w_k (log w_k - log w_k^ref) = sum_k w_k D_k."""
    # Eq. (traj-kl): D_k = log w_k - log w_k^ref; Eq. (final-loss), third term without lambda
    return (weights * (log_weights - ref_log_weights)).sum()


def score_function_term(batch_loss: Tensor, sample_logp: Tensor) -> Tensor:
    """A term of value 0 whose gradient is ``batch_loss * grad log p(tau; theta)``.

    ``sample_logp`` are log pi_theta(tau_k) of the M sampled episodes, so that
    log p(tau; theta) = sum_k log pi_theta(tau_k) (the episodes are i.i.d.; the environment's
    transition probabilities do not depend on theta); ``batch_loss`` is taken without gradient.
    """
    # Appendix, "Sampling and Joint Density": p(tau; theta) = prod_{i=1}^M pi_theta(tau_i)
    log_p = sample_logp.sum()
    # Appendix, "Monte Carlo Estimator", second term: -(sum_k R_k w_k) grad log p(tau; theta), with
    # -(sum_k R_k w_k) the batch's loss (plus the regularisers': "Extension to Regularization")
    return batch_loss.detach() * (log_p - log_p.detach())


@dataclass(frozen=True)
class HAEPOLossOutput:
    """The loss and its parts (with gradient), and detached diagnostics.

    ``loss == reward_term + entropy_term + kl_term + score_term``; ``score_term`` is 0 in value
    (it only adds the ``"unbiased"`` estimator's gradient) and 0 with ``"weights"``.
    """

    loss: Tensor
    reward_term: Tensor
    entropy_term: Tensor
    kl_term: Tensor
    score_term: Tensor
    weights: Tensor
    log_weights: Tensor
    normalized_returns: Tensor
    weight_entropy: Tensor
    kl: Tensor
    effective_num_trajectories: Tensor
    max_weight: Tensor


def _check_beta(name: str, value: float | Tensor) -> None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not (0.0 <= v < float("inf")):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def haepo_loss(
    traj_logp: Tensor,
    ref_traj_logp: Tensor,
    returns: Tensor,
    *,
    beta_ent: float | Tensor,
    beta_kl: float | Tensor,
    normalization: Normalization = "zscore",
    estimator: Estimator = "weights",
    sample_logp: Tensor | None = None,
) -> HAEPOLossOutput:
    """The final HAEPO loss for a batch of M episodes (Eq. final-loss).

    ``traj_logp`` are the L_k of the current policy, ``ref_traj_logp`` those of the frozen
    reference policy, ``returns`` the discounted episode returns R_k (normalised here with
    ``normalization``). All three have shape ``[M]``. Returns the scalar loss

        l(tau; theta) = -sum_k w_k R~_k + beta_ent * sum_k w_k log w_k + beta_kl * sum_k w_k (log w_k - log w_k^ref)

    with ``w = softmax(traj_logp)`` and ``w_ref = softmax(ref_traj_logp)``.

    ``estimator`` picks its gradient. ``"weights"`` (the default): grad l, the gradient through
    the weights alone (Eq. orig-haepo-grad and its regularised form, Eq. grad-compact).
    ``"unbiased"``: the appendix's Monte Carlo estimator ("Unbiasedness via the Score-Function
    Trick"). The objective is the expectation over the sampled batch tau ~ p(tau; theta),

        L(theta) = -E_{p(tau; theta)}[sum_k R_k w_k(tau; theta)]                       (appendix)

    whose gradient (Eq. true_grad_corrected, product rule and grad p = p grad log p) has two terms,

        G(theta) = -int sum_k R_k w_k grad log w_k p dtau - int (sum_k R_k w_k) grad log p p dtau,

    estimated on one batch without bias by

        hat G_M = -sum_k R_k w_k grad log w_k - (sum_k R_k w_k) grad log p(tau; theta).

    The first term is ``"weights"``'s gradient; the second, :func:`score_function_term`, does not
    vanish when the weights are one-hot (then -sum_k R_k w_k = -R_top while grad w_k = 0). With the
    regularisers the same argument ("Extension to Regularization") gives grad l + l grad log p:
    this loss's value, gradient hat G_M. ``sample_logp`` are log pi_theta(tau_k) of the episodes,
    with gradient: by default ``traj_logp``; the caller passes them where ``traj_logp`` are
    rescaled log-likelihoods (length-normalised or tempered). Returns are normalised per batch
    (R~); the estimator is then unbiased for the objective on R~.
    """
    for name, x in (("traj_logp", traj_logp), ("ref_traj_logp", ref_traj_logp), ("returns", returns)):
        _check_vector(name, x)
    if not traj_logp.shape == ref_traj_logp.shape == returns.shape:
        raise ValueError(
            "traj_logp, ref_traj_logp and returns must have the same shape [M], got "
            f"{tuple(traj_logp.shape)}, {tuple(ref_traj_logp.shape)}, {tuple(returns.shape)}"
        )
    _check_beta("beta_ent", beta_ent)
    _check_beta("beta_kl", beta_kl)
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if sample_logp is not None:
        _check_vector("sample_logp", sample_logp)
        if sample_logp.shape != traj_logp.shape:
            raise ValueError(f"sample_logp has shape {tuple(sample_logp.shape)} but traj_logp has shape "
                             f"{tuple(traj_logp.shape)}: one log pi(tau_k) per episode is needed")

    log_w = plackett_luce_log_weights(traj_logp)
    w = log_w.exp()
    ref_log_w = plackett_luce_log_weights(ref_traj_logp)
    norm_r = normalize_returns(returns, normalization)

    reward = reward_term(w, norm_r)
    neg_entropy = negative_entropy(w, log_w)
    kl = weight_kl(w, log_w, ref_log_w)
    entropy_term = beta_ent * neg_entropy
    kl_term = beta_kl * kl
    # Eq. (final-loss): L = -sum w R~ + beta_ent sum w log w + beta_kl sum w (log w - log w_ref)
    batch_loss = reward + entropy_term + kl_term
    if estimator == "unbiased":
        # Appendix, Eq. (true_grad_corrected) and "Monte Carlo Estimator": hat G_M = grad l + l grad log p
        score = score_function_term(batch_loss, traj_logp if sample_logp is None else sample_logp)
    else:
        score = torch.zeros_like(batch_loss)
    loss = batch_loss + score

    with torch.no_grad():
        effective = torch.exp(-torch.logsumexp(2.0 * log_w, dim=0))  # 1 / sum_k w_k^2
    return HAEPOLossOutput(
        loss=loss,
        reward_term=reward,
        entropy_term=entropy_term,
        kl_term=kl_term,
        score_term=score,
        weights=w.detach(),
        log_weights=log_w.detach(),
        normalized_returns=norm_r.detach(),
        weight_entropy=-neg_entropy.detach(),
        kl=kl.detach(),
        effective_num_trajectories=effective,
        max_weight=w.detach().max(),
    )
