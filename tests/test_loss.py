"""The HAEPO loss against the paper: gradients, special cases, degenerate and hostile inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from haepo_ray.loss import (
    haepo_loss,
    normalize_returns,
    plackett_luce_log_weights,
    trajectory_log_likelihood,
)

F64 = torch.float64


def _batch(seed: int, m: int = 6, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    new_lp = -torch.rand(m, generator=g, dtype=dtype) * 5.0
    old_lp = new_lp + 0.3 * torch.randn(m, generator=g, dtype=dtype)
    returns = torch.randn(m, generator=g, dtype=dtype) * 2.0 + 1.0
    return new_lp, old_lp, returns


def _central_difference(f, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    grad = torch.zeros_like(x)
    for i in range(x.numel()):
        xp, xm = x.clone(), x.clone()
        xp[i] += eps
        xm[i] -= eps
        grad[i] = (f(xp) - f(xm)) / (2 * eps)
    return grad


# --- Code Sanity Check (appendix): central finite differences in float64, eps = 1e-6 ---------


@pytest.mark.parametrize("normalization", ["zscore", "sum", "none"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finite_difference_gradient_matches_autograd(normalization, seed):
    new_lp, old_lp, returns = _batch(seed)
    if normalization == "sum":
        returns = returns.abs() + 0.1  # sum-normalisation is defined for positive returns
    kwargs = dict(beta_ent=0.05, beta_kl=0.05, normalization=normalization)

    def loss_of(which: int):
        def f(x):
            args = [new_lp, old_lp, returns]
            args[which] = x
            return haepo_loss(*args, **kwargs).loss.item()

        return f

    for which, x in enumerate((new_lp, old_lp, returns)):
        x_req = x.clone().requires_grad_(True)
        args = [new_lp, old_lp, returns]
        args[which] = x_req
        (autograd,) = torch.autograd.grad(haepo_loss(*args, **kwargs).loss, x_req)
        numeric = _central_difference(loss_of(which), x)
        assert autograd.abs().max() > 1e-3, "the check must exercise a non-trivial gradient"
        assert (autograd - numeric).abs().max() <= 1e-6


def test_torch_gradcheck_all_inputs():
    new_lp, old_lp, returns = (t.requires_grad_(True) for t in _batch(3))
    assert torch.autograd.gradcheck(
        lambda a, b, c: haepo_loss(a, b, c, beta_ent=0.1, beta_kl=0.2).loss,
        (new_lp, old_lp, returns),
        eps=1e-6,
        atol=1e-8,
    )


# --- Final Gradient Form (appendix) ------------------------------------------------------


def _closed_form_grad_wrt_L(traj_logp, ref_traj_logp, norm_returns, beta_ent, beta_kl):
    """Appendix "Final Gradient Form" with grad_theta L_k = e_k:
    dL/dL_k = -w_k c_k + w_k sum_j w_j c_j, c_k = R~_k - beta(1 + log w_k) - lambda D_k."""
    log_w = torch.log_softmax(traj_logp, 0)
    w = log_w.exp()
    d = log_w - torch.log_softmax(ref_traj_logp, 0)
    c = norm_returns - beta_ent * (1 + log_w) - beta_kl * d
    return -w * c + w * (w * c).sum()


def _normalized_as_the_paper_says(returns: torch.Tensor, normalization: str) -> torch.Tensor:
    """Sec. "Reward Normalization", written out in numpy (float64) apart from the code's
    ``normalize_returns``. Z-score: R^_k = (R_k - mu) / sigma with mu = M^-1 sum_j R_j and
    sigma^2 = M^-1 sum_j (R_j - mu)^2 (the population variance; the code adds no epsilon).
    Sum: R~_k = R_k / sum_j R_j (the code divides by |sum_j R_j|, the same for the positive
    returns used here)."""
    r = returns.detach().numpy()
    m = len(r)
    if normalization == "zscore":
        mu = r.sum() / m
        sigma = np.sqrt(((r - mu) ** 2).sum() / m)
        out = (r - mu) / sigma
    elif normalization == "sum":
        assert (r > 0).all()
        out = r / r.sum()
    else:
        out = r
    return torch.from_numpy(out)


@pytest.mark.parametrize("normalization", ["zscore", "sum", "none"])
def test_closed_form_gradient_equals_autograd_per_step(normalization):
    g = torch.Generator().manual_seed(7)
    lengths = [3, 1, 5, 2, 4]
    episode_index = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    episode_index = episode_index[torch.randperm(len(episode_index), generator=g)]  # interleaved
    step_logp = (-torch.rand(len(episode_index), generator=g, dtype=F64)).requires_grad_(True)
    ref_step_logp = step_logp.detach() + 0.2 * torch.randn(len(episode_index), generator=g, dtype=F64)
    returns = torch.rand(len(lengths), generator=g, dtype=F64) * 3 + 0.5
    beta_ent, beta_kl = 0.3, 0.7

    traj_logp = trajectory_log_likelihood(step_logp, episode_index, len(lengths))
    ref_traj_logp = trajectory_log_likelihood(ref_step_logp, episode_index, len(lengths))
    out = haepo_loss(
        traj_logp, ref_traj_logp, returns, beta_ent=beta_ent, beta_kl=beta_kl,
        normalization=normalization,
    )
    (autograd,) = torch.autograd.grad(out.loss, step_logp)

    per_episode = _closed_form_grad_wrt_L(
        traj_logp.detach(), ref_traj_logp, _normalized_as_the_paper_says(returns, normalization), beta_ent, beta_kl
    )
    closed_form = per_episode[episode_index]  # dL_k / d log pi(a_t|s_t) = 1 for t in episode k
    assert torch.allclose(autograd, closed_form, atol=1e-12, rtol=0)


def test_trajectory_log_likelihood_is_segment_sum():
    step_logp = torch.tensor([-1.0, -2.0, -0.5, -0.25, -4.0], dtype=F64)
    episode_index = torch.tensor([0, 1, 0, 2, 1])
    traj = trajectory_log_likelihood(step_logp, episode_index, 3)
    assert traj.tolist() == [-1.5, -6.0, -0.25]


# --- Sum-normalisation with T_k = 1: softmax / Exp3 update --------------------------------


def test_sum_normalisation_single_step_is_exp3_softmax_update():
    """With T_k = 1 and a tabular softmax policy, grad_theta L_k = e_{a_k} - pi, the pi cancels
    in grad log w_k, and the descent direction on the logits is the exponential-weights
    (Exp3 / Hedge) update sum_k w_k (R~_k - sum_j w_j R~_j) e_{a_k}."""
    num_arms = 6
    logits = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5, -0.4], dtype=F64, requires_grad=True)
    actions = torch.tensor([0, 2, 4, 5, 2])
    rewards = torch.tensor([1.0, 3.0, 0.5, 2.0, 2.5], dtype=F64)
    lr = 0.5

    step_logp = torch.log_softmax(logits, 0)[actions]
    traj_logp = trajectory_log_likelihood(step_logp, torch.arange(len(actions)), len(actions))
    out = haepo_loss(traj_logp, traj_logp.detach(), rewards, beta_ent=0.0, beta_kl=0.0,
                     normalization="sum")
    (grad,) = torch.autograd.grad(out.loss, logits)

    # w_k = pi(a_k) / sum_j pi(a_j): the partition function cancels.
    pi = torch.softmax(logits.detach(), 0)
    w = pi[actions] / pi[actions].sum()
    r_tilde = rewards / rewards.sum()
    expected_ascent = torch.zeros(num_arms, dtype=F64).index_add(
        0, actions, w * (r_tilde - (w * r_tilde).sum())
    )
    assert torch.allclose(-grad, expected_ascent, atol=1e-14)

    # Exponential-weights form: pi_new(a) is proportional to pi(a) * exp(lr * ascent_a).
    pi_new = torch.softmax(logits.detach() - lr * grad, 0)
    hedge = pi * torch.exp(lr * expected_ascent)
    assert torch.allclose(pi_new, hedge / hedge.sum(), atol=1e-14)
    # The step moves probability towards the arm whose weighted normalised reward is highest.
    assert pi_new[2] > pi[2] and pi_new[4] < pi[4]


# --- Regularisers ------------------------------------------------------------------------


def test_entropy_term_raises_weight_entropy():
    traj_logp = torch.tensor([-1.0, -3.0, -0.2, -5.0], dtype=F64, requires_grad=True)
    returns = torch.ones(4, dtype=F64)  # equal returns: no reward signal, only the entropy term
    out = haepo_loss(traj_logp, traj_logp.detach(), returns, beta_ent=1.0, beta_kl=0.0)
    (grad,) = torch.autograd.grad(out.loss, traj_logp)
    stepped = haepo_loss(traj_logp.detach() - 0.1 * grad, traj_logp.detach(), returns,
                         beta_ent=1.0, beta_kl=0.0)
    assert stepped.weight_entropy > out.weight_entropy + 1e-3


def test_kl_term_is_zero_with_zero_gradient_when_reference_equals_current():
    traj_logp = torch.tensor([-1.0, -3.0, -0.2, -5.0], dtype=F64, requires_grad=True)
    returns = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=F64)
    out = haepo_loss(traj_logp, traj_logp.detach().clone(), returns, beta_ent=0.0, beta_kl=1.0)
    assert out.kl.item() == 0.0 and out.kl_term.item() == 0.0
    (grad_kl,) = torch.autograd.grad(out.kl_term, traj_logp)
    assert grad_kl.abs().max().item() <= 1e-15  # zero up to float64 rounding


def test_kl_term_pulls_towards_reference():
    traj_logp = torch.tensor([-1.0, -3.0, -0.2, -5.0], dtype=F64, requires_grad=True)
    ref_traj_logp = torch.tensor([-2.0, -1.0, -1.5, -2.0], dtype=F64)
    returns = torch.ones(4, dtype=F64)  # no reward signal
    out = haepo_loss(traj_logp, ref_traj_logp, returns, beta_ent=0.0, beta_kl=1.0)
    assert out.kl > 0.1
    (grad,) = torch.autograd.grad(out.loss, traj_logp)
    stepped = haepo_loss(traj_logp.detach() - 0.5 * grad, ref_traj_logp, returns,
                         beta_ent=0.0, beta_kl=1.0)
    assert stepped.kl < out.kl - 1e-3


def test_loss_parts_and_diagnostics():
    new_lp, old_lp, returns = _batch(11)
    out = haepo_loss(new_lp, old_lp, returns, beta_ent=0.2, beta_kl=0.3)
    assert torch.allclose(out.loss, out.reward_term + out.entropy_term + out.kl_term)
    w = torch.softmax(new_lp, 0)
    assert torch.allclose(out.weights, w)
    assert torch.allclose(out.weight_entropy, -(w * w.log()).sum())
    assert torch.allclose(out.effective_num_trajectories, 1 / (w * w).sum())
    assert out.max_weight == w.max()
    assert torch.allclose(out.normalized_returns, (returns - returns.mean()) / returns.std(unbiased=False))


# --- Degenerate inputs: defined behaviour, never NaN -------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_long_episodes_do_not_underflow(dtype):
    """Episodes of 10^4 steps give L_k around -7000; exp(L) underflows, log_softmax does not."""
    g = torch.Generator().manual_seed(0)
    m, steps = 8, 10_000
    step_logp = (-torch.rand(m * steps, generator=g, dtype=dtype) * 1.4).requires_grad_(True)
    episode_index = torch.arange(m).repeat_interleave(steps)
    traj = trajectory_log_likelihood(step_logp, episode_index, m)
    assert traj.max() < -6000
    out = haepo_loss(traj, traj.detach() + 3.0 * torch.randn(m, generator=g, dtype=dtype),
                     torch.rand(m, generator=g, dtype=dtype), beta_ent=0.1, beta_kl=0.1)
    (grad,) = torch.autograd.grad(out.loss, step_logp)
    for value in (out.loss, out.weight_entropy, out.kl, out.effective_num_trajectories):
        assert torch.isfinite(value).all()
    assert torch.isfinite(grad).all()
    assert math.isclose(out.weights.sum().item(), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("normalization", ["zscore", "sum", "none"])
def test_single_episode_batch(normalization):
    traj_logp = torch.tensor([-12.0], requires_grad=True)
    out = haepo_loss(traj_logp, torch.tensor([-11.0]), torch.tensor([3.0]), beta_ent=0.1,
                     beta_kl=0.1, normalization=normalization)
    (grad,) = torch.autograd.grad(out.loss, traj_logp)
    assert out.weights.tolist() == [1.0]
    assert out.effective_num_trajectories.item() == 1.0
    assert grad.tolist() == [0.0]  # one episode: w = 1 whatever the policy, nothing to learn
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("value", [0.0, 0.1, -7.3, 1e6])
def test_zscore_of_equal_returns_is_zero(value):
    returns = torch.full((8,), value, dtype=torch.float32)
    assert normalize_returns(returns, "zscore").tolist() == [0.0] * 8
    traj_logp = torch.randn(8, requires_grad=True)
    out = haepo_loss(traj_logp, traj_logp.detach(), returns, beta_ent=0.0, beta_kl=0.0)
    (grad,) = torch.autograd.grad(out.loss, traj_logp)
    assert out.loss.item() == 0.0 and grad.abs().max().item() == 0.0


def test_sum_normalisation_of_zero_sum_is_zero():
    assert normalize_returns(torch.zeros(5), "sum").tolist() == [0.0] * 5
    assert normalize_returns(torch.tensor([2.0, -2.0, 0.0]), "sum").tolist() == [0.0] * 3


def test_sum_normalisation_keeps_order_when_the_sum_is_negative():
    normed = normalize_returns(torch.tensor([-1.0, -3.0, 2.0]), "sum")
    assert torch.allclose(normed, torch.tensor([-0.5, -1.5, 1.0]))
    positive = normalize_returns(torch.tensor([1.0, 3.0, 4.0]), "sum")
    assert torch.allclose(positive, torch.tensor([0.125, 0.375, 0.5]))
    assert math.isclose(positive.sum().item(), 1.0)


def test_zscore_uses_population_std():
    normed = normalize_returns(torch.tensor([1.0, 3.0], dtype=F64), "zscore")
    assert normed.tolist() == [-1.0, 1.0]


def test_weights_are_plackett_luce_first_choice_probabilities():
    traj_logp = torch.tensor([-700.0, -701.0, -703.0], dtype=F64)
    expected = torch.tensor([1.0, math.exp(-1), math.exp(-3)], dtype=F64)
    assert torch.allclose(plackett_luce_log_weights(traj_logp).exp(), expected / expected.sum())


# --- Unbiasedness via the Score-Function Trick (appendix): the "unbiased" estimator ----------

# A policy over K = 3 one-step episodes, pi_theta = softmax(theta), returns R per episode, and M = 3
# i.i.d. episodes per batch: the K^M = 27 batches can be enumerated, so expectations are exact.
OUTCOME_RETURNS = torch.tensor([1.0, -0.5, 2.0], dtype=F64)
THETA = torch.tensor([0.3, -0.2, 0.5], dtype=F64)
THETA_REF = torch.tensor([0.0, 0.4, -0.1], dtype=F64)
BATCHES = [torch.tensor(b) for b in np.ndindex(3, 3, 3)]


def _batch_loss(theta, batch, estimator, **kwargs):
    """The loss of one sampled batch: L_k = log pi_theta(tau_k), the reference's at THETA_REF."""
    traj_logp = torch.log_softmax(theta, 0)[batch]
    ref_traj_logp = torch.log_softmax(THETA_REF, 0)[batch]
    return haepo_loss(traj_logp, ref_traj_logp, OUTCOME_RETURNS[batch], estimator=estimator, **kwargs).loss


def _log_p(theta, batch):
    """log p(tau; theta) = sum_i log pi_theta(tau_i) (appendix, "Sampling and Joint Density")."""
    return torch.log_softmax(theta, 0)[batch].sum()


@pytest.mark.parametrize("normalization", ["none", "zscore"])
@pytest.mark.parametrize("betas", [(0.0, 0.0), (0.3, 0.7)])
def test_unbiased_estimator_has_the_gradient_of_the_appendix_objective_in_expectation(normalization, betas):
    """E_p[hat G_M] = G(theta) = grad of L(theta) = E_{p(tau; theta)}[l(tau; theta)], the expectation
    summed over all 27 batches and differentiated by autograd in float64; the "weights" estimator
    (the gradient through the weights alone) misses the second term of Eq. true_grad_corrected."""
    kwargs = dict(beta_ent=betas[0], beta_kl=betas[1], normalization=normalization)
    theta = THETA.clone().requires_grad_(True)
    objective = sum(_log_p(theta, b).exp() * _batch_loss(theta, b, "weights", **kwargs) for b in BATCHES)
    (true_grad,) = torch.autograd.grad(objective, theta)

    def expected_estimate(estimator):
        total = torch.zeros_like(THETA)
        for b in BATCHES:
            theta = THETA.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(_batch_loss(theta, b, estimator, **kwargs), theta)
            total += _log_p(THETA, b).exp() * grad
        return total

    assert true_grad.abs().max() > 1e-2
    torch.testing.assert_close(expected_estimate("unbiased"), true_grad, rtol=0, atol=1e-12)
    assert (expected_estimate("weights") - true_grad).abs().max() > 1e-2


def test_unbiased_estimator_on_one_batch_is_hat_g_m():
    """On one batch the gradient is the appendix's hat G_M written out with Eq. (score):
    -sum_k R_k w_k (grad L_k - sum_j w_j grad L_j) - (sum_k R_k w_k) sum_i grad L_i; its value is
    the loss's."""
    batch = torch.tensor([0, 2, 2, 1])
    theta = THETA.clone().requires_grad_(True)
    out_kwargs = dict(beta_ent=0.0, beta_kl=0.0, normalization="none")
    loss = _batch_loss(theta, batch, "unbiased", **out_kwargs)
    (grad,) = torch.autograd.grad(loss, theta)

    jac = torch.autograd.functional.jacobian(lambda t: torch.log_softmax(t, 0)[batch], THETA)  # [M, 3]: grad L_k
    w = torch.softmax(torch.log_softmax(THETA, 0)[batch], 0)
    r = OUTCOME_RETURNS[batch]
    hat_g = -((r * w)[:, None] * (jac - (w[:, None] * jac).sum(0))).sum(0) - (r * w).sum() * jac.sum(0)
    torch.testing.assert_close(grad, hat_g, rtol=0, atol=1e-14)
    torch.testing.assert_close(loss.detach(), _batch_loss(THETA, batch, "weights", **out_kwargs), rtol=0, atol=0)


def test_with_one_hot_weights_only_the_score_function_term_has_a_gradient():
    """Summed log-likelihoods 60 and 80 nats apart make the weights one-hot: the gradient through
    the weights (reward, entropy and KL terms alike) vanishes, the score-function term's does not:
    dLoss/dL_k = l = -R~_top + beta_kl * KL for every episode."""
    traj_logp = torch.tensor([0.0, -60.0, -80.0], dtype=F64, requires_grad=True)
    ref_traj_logp = torch.tensor([0.5, -61.0, -79.0], dtype=F64)
    returns = torch.tensor([1.0, 0.0, 2.0], dtype=F64)
    kwargs = dict(beta_ent=0.01, beta_kl=0.01)
    weights = haepo_loss(traj_logp, ref_traj_logp, returns, **kwargs)
    (through_weights,) = torch.autograd.grad(weights.loss, traj_logp)
    assert weights.max_weight == 1.0
    assert through_weights.abs().max() < 1e-20
    unbiased = haepo_loss(traj_logp, ref_traj_logp, returns, estimator="unbiased", **kwargs)
    (grad,) = torch.autograd.grad(unbiased.loss, traj_logp)
    assert float(unbiased.score_term.detach()) == 0.0 and float(unbiased.loss.detach()) == float(weights.loss.detach())
    torch.testing.assert_close(grad, weights.loss.detach().expand(3), rtol=0, atol=1e-15)
    assert float(weights.loss) == pytest.approx(-float(normalize_returns(returns)[0]), abs=1e-3)  # -R~_top


def test_unbiased_estimator_takes_log_p_from_sample_logp():
    """Where the weights come from rescaled L_k (length-normalised, tempered), grad log p is that of
    the episodes' own log-likelihoods, ``sample_logp``."""
    sample_logp = torch.tensor([-3.0, -5.0, -4.0], dtype=F64, requires_grad=True)
    returns = torch.tensor([1.0, 0.0, 2.0], dtype=F64)
    traj_logp = sample_logp / 4.0
    out = haepo_loss(traj_logp, traj_logp.detach(), returns, beta_ent=0.0, beta_kl=0.0, estimator="unbiased",
                     sample_logp=sample_logp)
    (grad,) = torch.autograd.grad(out.loss, sample_logp)
    w = torch.softmax(traj_logp.detach(), 0)
    r = normalize_returns(returns)
    through_weights = (-w * r + w * (w * r).sum()) / 4.0
    torch.testing.assert_close(grad, through_weights + out.loss.detach(), rtol=0, atol=1e-14)


# --- Hostile inputs: clear errors --------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_non_finite_inputs_raise(bad, position):
    args = [torch.zeros(3), torch.zeros(3), torch.ones(3)]
    args[position] = args[position].clone()
    args[position][1] = bad
    name = ("traj_logp", "ref_traj_logp", "returns")[position]
    with pytest.raises(ValueError, match=f"{name} holds NaN or inf"):
        haepo_loss(*args, beta_ent=0.1, beta_kl=0.1)


def test_non_finite_step_logp_raises():
    with pytest.raises(ValueError, match="step_logp holds NaN"):
        trajectory_log_likelihood(torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]), 1)


@pytest.mark.parametrize(
    "beta_ent, beta_kl, match",
    [(-0.1, 0.0, "beta_ent"), (0.0, -1e-9, "beta_kl"), (float("nan"), 0.0, "beta_ent"),
     (0.0, float("inf"), "beta_kl"), ("big", 0.0, "beta_ent")],
)
def test_invalid_betas_raise(beta_ent, beta_kl, match):
    with pytest.raises((ValueError, TypeError), match=match):
        haepo_loss(torch.zeros(2), torch.zeros(2), torch.ones(2), beta_ent=beta_ent, beta_kl=beta_kl)


def test_unknown_normalization_raises():
    with pytest.raises(ValueError, match="normalization must be one of"):
        haepo_loss(torch.zeros(2), torch.zeros(2), torch.ones(2), beta_ent=0.0, beta_kl=0.0,
                   normalization="minmax")


def test_unknown_estimator_and_bad_sample_logp_raise():
    with pytest.raises(ValueError, match=r"estimator must be one of \('weights', 'unbiased'\), got 'paper'"):
        haepo_loss(torch.zeros(2), torch.zeros(2), torch.ones(2), beta_ent=0.0, beta_kl=0.0, estimator="paper")
    with pytest.raises(ValueError, match="sample_logp has shape"):
        haepo_loss(torch.zeros(2), torch.zeros(2), torch.ones(2), beta_ent=0.0, beta_kl=0.0, estimator="unbiased",
                   sample_logp=torch.zeros(3))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape"):
        haepo_loss(torch.zeros(2), torch.zeros(3), torch.ones(2), beta_ent=0.0, beta_kl=0.0)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        haepo_loss(torch.zeros(0), torch.zeros(0), torch.ones(0), beta_ent=0.0, beta_kl=0.0)


@pytest.mark.parametrize(
    "episode_index, num_episodes, match",
    [([0, 3], 3, "must lie in 0..2"), ([0, 0], 2, r"episodes \[1\]"), ([-1, 0], 2, "must lie in"),
     ([0], 1, "one episode index per step")],
)
def test_bad_episode_index_raises(episode_index, num_episodes, match):
    with pytest.raises(ValueError, match=match):
        trajectory_log_likelihood(torch.zeros(2), torch.tensor(episode_index), num_episodes)
