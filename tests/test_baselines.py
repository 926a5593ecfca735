"""The baselines: trajectory-level DPO and GRPO losses against hand arithmetic and finite
differences, their degenerate inputs, and both algorithms learning on a real local Ray."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import fresh_python

from haepo_ray.rl.baselines import DPO, GRPO, DPOConfig, GRPOConfig
from haepo_ray.baseline_losses import (GRPO_ADVANTAGE_EPS, dpo_loss, group_advantage, grpo_loss,
                                      lone_episode_reason, preference_pairs)
from haepo_ray.loss import ESTIMATORS, NORMALIZATIONS, haepo_loss

F64 = torch.float64
CHAIN = "haepo/ChainMDP-v0"


def _finite_difference(f, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Central differences (f(x + eps e_i) - f(x - eps e_i)) / (2 eps) for every i."""
    return torch.stack([(f(x + e) - f(x - e)) / (2 * eps) for e in torch.eye(x.numel(), dtype=x.dtype) * eps])


def _check_gradients(loss_of, inputs: dict[str, torch.Tensor], differentiable: tuple[str, ...]) -> None:
    """Autograd against central differences (float64, eps 1e-6) for each named input."""
    for name in differentiable:
        def f(x, name=name):
            return loss_of(**{**inputs, name: x}).detach()

        x = inputs[name].clone().requires_grad_(True)
        (autograd,) = torch.autograd.grad(loss_of(**{**inputs, name: x}), x)
        numeric = _finite_difference(f, inputs[name])
        assert autograd.abs().max() > 1e-3, f"the check must exercise a non-trivial gradient ({name})"
        assert (autograd - numeric).abs().max() <= 1e-6, name


# --- DPO loss -----------------------------------------------------------------------------


def _dpo_batch(seed: int, m: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    traj_logp = -torch.rand(m, generator=g, dtype=F64) * 5.0
    return {
        "traj_logp": traj_logp,
        "ref_traj_logp": traj_logp + torch.randn(m, generator=g, dtype=F64),
        "returns": torch.tensor([1.0, 0.0, 2.0, 1.0, -1.0, 0.5], dtype=F64)[:m],  # one tie
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dpo_finite_difference_gradient_matches_autograd(seed):
    batch = _dpo_batch(seed)
    _check_gradients(lambda **b: dpo_loss(**b, beta=0.5).loss, batch, ("traj_logp", "ref_traj_logp"))


def test_dpo_loss_is_piecewise_constant_in_the_returns():
    """Only the order of the returns matters: away from ties the gradient is 0 (and none)."""
    batch = {**_dpo_batch(0), "returns": torch.tensor([1.0, 0.0, 2.0, 1.5, -1.0, 0.5], dtype=F64)}
    f = lambda r: dpo_loss(batch["traj_logp"], batch["ref_traj_logp"], r, beta=0.5).loss  # noqa: E731
    assert _finite_difference(f, batch["returns"]).abs().max() == 0.0
    returns = batch["returns"].clone().requires_grad_(True)
    loss = dpo_loss(batch["traj_logp"].requires_grad_(True), batch["ref_traj_logp"], returns, beta=0.5).loss
    assert torch.autograd.grad(loss, returns, allow_unused=True) == (None,)


def test_dpo_torch_gradcheck():
    batch = _dpo_batch(3)
    assert torch.autograd.gradcheck(
        lambda a, b: dpo_loss(a, b, batch["returns"], beta=0.3).loss,
        (batch["traj_logp"].requires_grad_(True), batch["ref_traj_logp"].requires_grad_(True)),
        eps=1e-6,
        atol=1e-8,
    )


def test_dpo_hand_computed_three_episodes():
    # R = [1, 0, 0]: pairs (0, 1) and (0, 2); episodes 1 and 2 tie, no pair.
    # r = beta (L - L_ref) = 0.5 * ([-1, -2, -3] - (-1.5)) = [0.25, -0.25, -0.75]
    # margins r_0 - r_1 = 0.5, r_0 - r_2 = 1.0
    # loss = -(log sigmoid(0.5) + log sigmoid(1.0)) / 2 = (log(1 + e^-0.5) + log(1 + e^-1)) / 2
    traj_logp = torch.tensor([-1.0, -2.0, -3.0], dtype=F64, requires_grad=True)
    out = dpo_loss(traj_logp, torch.full((3,), -1.5, dtype=F64), torch.tensor([1.0, 0.0, 0.0], dtype=F64), beta=0.5)
    assert out.loss.item() == pytest.approx((math.log1p(math.exp(-0.5)) + math.log1p(math.exp(-1.0))) / 2, abs=1e-12)
    assert out.num_pairs.item() == 2
    assert out.preference_accuracy.item() == 1.0
    assert out.reward_margin_mean.item() == pytest.approx(0.75, abs=1e-12)  # (0.5 + 1.0) / 2
    # d loss / d L = -beta/2 * [s(-0.5) + s(-1), -s(-0.5), -s(-1)] with s the logistic sigmoid
    s = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    (grad,) = torch.autograd.grad(out.loss, traj_logp)
    expected = [-0.25 * (s(-0.5) + s(-1.0)), 0.25 * s(-0.5), 0.25 * s(-1.0)]
    assert grad.tolist() == pytest.approx(expected, abs=1e-12)


def test_preference_pairs_are_the_strictly_ordered_pairs():
    assert preference_pairs(torch.tensor([0.0, 2.0, 0.0])).nonzero().tolist() == [[1, 0], [1, 2]]


@pytest.mark.parametrize("returns", [[1.0], [0.5, 0.5, 0.5]], ids=["M=1", "equal returns"])
def test_dpo_without_a_pair_has_zero_loss_and_zero_gradient(returns):
    m = len(returns)
    traj_logp = (-torch.arange(1.0, m + 1, dtype=F64)).requires_grad_(True)
    out = dpo_loss(traj_logp, torch.zeros(m, dtype=F64), torch.tensor(returns, dtype=F64), beta=0.1)
    assert out.loss.item() == 0.0 and out.num_pairs.item() == 0
    assert out.preference_accuracy.item() == 0.0 and out.reward_margin_mean.item() == 0.0
    out.loss.backward()  # the loss stays in the graph: an RLlib update on it is a no-op
    assert torch.equal(traj_logp.grad, torch.zeros(m, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_dpo_long_episodes_are_finite(dtype):
    """L around -7000 (10^4 steps); a margin of -700 saturates log sigmoid without NaN."""
    traj_logp = torch.tensor([-7000.0, -6990.0, -7003.0], dtype=dtype, requires_grad=True)
    ref = torch.tensor([-2.0, -6995.0, -6998.0], dtype=dtype)
    out = dpo_loss(traj_logp, ref, torch.tensor([1.0, 0.0, 0.0], dtype=dtype), beta=0.1)
    # r = 0.1 * [-6998, 5, -5] = [-699.8, 0.5, -0.5]: log sigmoid(-700.3) ~ -700.3, log sigmoid(-699.3) ~ -699.3
    assert out.loss.item() == pytest.approx((700.3 + 699.3) / 2, rel=1e-5)
    out.loss.backward()
    assert torch.isfinite(traj_logp.grad).all()
    assert traj_logp.grad.tolist() == pytest.approx([-0.1, 0.05, 0.05], rel=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["traj_logp", "ref_traj_logp", "returns"])
def test_dpo_non_finite_inputs_raise_naming_the_tensor(name, bad):
    batch = _dpo_batch(0, m=3)
    batch[name][1] = bad
    with pytest.raises(ValueError, match=f"{name} holds NaN or inf"):
        dpo_loss(**batch, beta=0.1)


@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan"), float("inf")])
def test_dpo_invalid_beta_raises(beta):
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(**_dpo_batch(0), beta=beta)


# --- GRPO loss ------------------------------------------------------------------------------


def _grpo_batch(seed: int) -> dict[str, torch.Tensor]:
    """4 episodes of 3, 1, 4 and 2 steps, steps interleaved; ratios on both sides of the clip."""
    g = torch.Generator().manual_seed(seed)
    episode_index = torch.tensor([0, 2, 1, 0, 2, 3, 2, 0, 3, 2])
    n = episode_index.numel()
    behavior = -torch.rand(n, generator=g, dtype=F64) * 2.0 - 0.1
    return {
        "step_logp": behavior + 0.4 * torch.randn(n, generator=g, dtype=F64),
        "behavior_step_logp": behavior,
        "ref_step_logp": behavior + 0.3 * torch.randn(n, generator=g, dtype=F64),
        "step_entropy": torch.rand(n, generator=g, dtype=F64),
        "episode_index": episode_index,
        "returns": torch.tensor([1.0, 0.0, 3.0, 0.5], dtype=F64),
    }


GRPO_SETTINGS = dict(clip_param=0.2, beta_kl=0.1, beta_ent=0.05)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_finite_difference_gradient_matches_autograd(seed):
    batch = _grpo_batch(seed)
    ratio = (batch["step_logp"] - batch["behavior_step_logp"]).exp()
    clipped = ((ratio - 1).abs() > 0.2).float().mean()
    assert 0 < clipped < 1, "the batch must hold clipped and unclipped steps"
    _check_gradients(
        lambda **b: grpo_loss(**b, **GRPO_SETTINGS).loss,
        batch,
        ("step_logp", "behavior_step_logp", "ref_step_logp", "step_entropy", "returns"),
    )


def test_grpo_torch_gradcheck():
    batch = _grpo_batch(3)
    names = ("step_logp", "behavior_step_logp", "ref_step_logp", "step_entropy", "returns")

    def loss(*tensors):
        return grpo_loss(**{**batch, **dict(zip(names, tensors))}, **GRPO_SETTINGS).loss

    assert torch.autograd.gradcheck(
        loss, tuple(batch[n].requires_grad_(True) for n in names), eps=1e-6, atol=1e-8
    )


def test_grpo_hand_computed_two_episodes():
    # Episode 0 has steps 0 and 1, episode 1 step 2. R = [1, 0]: mean 0.5, sample std
    # sqrt((0.25 + 0.25) / 1) = 1/sqrt(2), A = [a, -a] with a = 0.5 / (1/sqrt(2) + 1e-4).
    # Ratios pi / pi_behavior = [0.6/0.4, 0.45/0.5, 0.3/0.5] = [1.5, 0.9, 0.6].
    # Clipped surrogate (eps 0.2): step 0: min(1.5a, 1.2a) = 1.2a; step 1: min(0.9a, 0.9a) = 0.9a;
    # step 2: min(-0.6a, -0.8a) = -0.8a. Episode means [1.05a, -0.8a], surrogate term -(0.25a / 2).
    # pi_ref / pi = [0.5, 1, 2]: D = [0.5 + log 2 - 1, 0, 2 - log 2 - 1]; episode means
    # [(log 2 - 0.5) / 2, 1 - log 2], KL term 0.1 * their mean.
    # Entropy [0.6, 0.4, 0.2]: episode means [0.5, 0.2], entropy term -0.5 * 0.35.
    log = lambda xs: torch.tensor(xs, dtype=F64).log()  # noqa: E731
    out = grpo_loss(
        log([0.6, 0.45, 0.3]),
        log([0.4, 0.5, 0.5]),
        log([0.3, 0.45, 0.6]),
        torch.tensor([0.6, 0.4, 0.2], dtype=F64),
        torch.tensor([0, 0, 1]),
        torch.tensor([1.0, 0.0], dtype=F64),
        clip_param=0.2,
        beta_kl=0.1,
        beta_ent=0.5,
    )
    kl = ((math.log(2) - 0.5) / 2 + 1 - math.log(2)) / 2
    a = 0.5 / (1 / math.sqrt(2) + 1e-4)
    assert out.surrogate_loss.item() == pytest.approx(-0.125 * a, abs=1e-12)
    assert out.step_kl_to_reference.item() == pytest.approx(kl, abs=1e-12)
    assert out.kl_loss.item() == pytest.approx(0.1 * kl, abs=1e-12)
    assert out.entropy_loss.item() == pytest.approx(-0.175, abs=1e-12)
    assert out.loss.item() == pytest.approx(-0.125 * a + 0.1 * kl - 0.175, abs=1e-12)
    assert out.clip_fraction.item() == pytest.approx(2 / 3)
    assert out.advantage_abs_mean.item() == pytest.approx(a, abs=1e-12)


def test_grpo_first_step_is_a_policy_gradient_with_group_baseline():
    """With pi = pi_behavior = pi_ref: d loss / d logp_t = -A_k / (M T_k), KL gradient 0."""
    batch = {**_grpo_batch(0)}
    step_logp = batch["behavior_step_logp"].clone().requires_grad_(True)
    out = grpo_loss(**{**batch, "step_logp": step_logp, "ref_step_logp": batch["behavior_step_logp"]},
                    clip_param=0.2, beta_kl=1.0)
    (grad,) = torch.autograd.grad(out.loss, step_logp)
    r = batch["returns"]
    advantage = (r - r.mean()) / (r.std() + 1e-4)  # TRL's: the sample std plus 1e-4
    steps = torch.bincount(batch["episode_index"]).to(F64)
    k = batch["episode_index"]
    assert torch.allclose(grad, -advantage[k] / (4 * steps[k]), atol=1e-12)
    assert out.step_kl_to_reference.item() == 0.0 and out.clip_fraction.item() == 0.0


def test_grpo_group_advantage_by_hand():
    """GRPO's advantage as TRL computes it: (R - mean) / (sample std + 1e-4), not HAEPO's
    population std. R = [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], squares sum to 14,
    sample std sqrt(14 / 3) = 2.1602 (population: sqrt(14 / 4) = 1.8708)."""
    std = math.sqrt(14 / 3)
    expected = [-2 / (std + 1e-4), -1 / (std + 1e-4), 0.0, 3 / (std + 1e-4)]
    returns = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=F64)
    assert group_advantage(returns).tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert GRPO_ADVANTAGE_EPS == 1e-4
    assert group_advantage(returns, "none").tolist() == returns.tolist()
    assert group_advantage(returns, "sum").tolist() == pytest.approx([1 / 12, 2 / 12, 3 / 12, 6 / 12], rel=1e-12)


# [0.1] * 3: the mean is 0.1 - 1.4e-17, so without the equality check A would be 1.4e-13.
@pytest.mark.parametrize("returns", [[2.0], [0.5, 0.5, 0.5, 0.5], [0.1, 0.1, 0.1]],
                         ids=["M=1", "equal returns", "equal returns, inexact mean"])
def test_grpo_degenerate_group_has_zero_advantage(returns):
    batch = _grpo_batch(0)
    m = len(returns)
    batch["episode_index"] = batch["episode_index"] % m
    step_logp = batch["step_logp"].clone().requires_grad_(True)
    out = grpo_loss(**{**batch, "step_logp": step_logp, "returns": torch.tensor(returns, dtype=F64)},
                    clip_param=0.2, beta_kl=0.0)
    assert out.advantage_abs_mean.item() == 0.0 and out.surrogate_loss.item() == 0.0
    out.loss.backward()
    assert torch.equal(step_logp.grad, torch.zeros_like(step_logp))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_grpo_long_episodes_are_finite(dtype):
    """Two episodes of 7000 steps at log-prob ~ -1 each (L ~ -7000): per-step terms stay O(1)."""
    n = 7000
    g = torch.Generator().manual_seed(0)
    behavior = -0.5 - torch.rand(2 * n, generator=g, dtype=dtype)
    step_logp = (behavior + 0.1 * torch.randn(2 * n, generator=g, dtype=dtype)).requires_grad_(True)
    out = grpo_loss(step_logp, behavior, behavior, torch.ones(2 * n, dtype=dtype),
                    torch.arange(2 * n) // n, torch.tensor([1.0, 0.0], dtype=dtype), **GRPO_SETTINGS)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(step_logp.grad).all()
    assert abs(out.loss.item()) < 10


@pytest.mark.parametrize(
    "name", ["step_logp", "behavior_step_logp", "ref_step_logp", "step_entropy", "returns"]
)
def test_grpo_non_finite_inputs_raise_naming_the_tensor(name):
    batch = _grpo_batch(0)
    batch[name][1] = float("nan")
    with pytest.raises(ValueError, match=f"{name} holds NaN or inf"):
        grpo_loss(**batch, **GRPO_SETTINGS)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"clip_param": 0.0}, "clip_param"),
        ({"clip_param": 1.0}, "clip_param"),
        ({"beta_kl": -0.1}, "beta_kl"),
        ({"episode_index": torch.tensor([0, 2, 1, 0, 2, 4, 2, 0, 4, 2])}, "episode_index"),
        ({"step_entropy": torch.ones(3, dtype=F64)}, "same shape"),
    ],
)
def test_grpo_invalid_arguments_raise(change, match):
    batch, settings = _grpo_batch(0), dict(GRPO_SETTINGS)
    for key, value in change.items():
        (batch if key in batch else settings)[key] = value
    with pytest.raises(ValueError, match=match):
        grpo_loss(**batch, **settings)


# --- Configs (no Ray needed) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "config_cls, settings, field",
    [
        (DPOConfig, {"dpo_beta": 0.0}, "dpo_beta"),
        (DPOConfig, {"dpo_beta": float("nan")}, "dpo_beta"),
        (DPOConfig, {"dpo_beta": "0.1"}, "dpo_beta"),
        (DPOConfig, {"beta_kl": 0.05}, "beta_kl"),
        (DPOConfig, {"beta_ent": 0.01}, "beta_ent"),
        (DPOConfig, {"reference_policy": "old"}, "reference_policy"),
        (GRPOConfig, {"clip_param": 0.0}, "clip_param"),
        (GRPOConfig, {"clip_param": 1.5}, "clip_param"),
        (GRPOConfig, {"num_epochs": 0}, "num_epochs"),
        (GRPOConfig, {"num_epochs": 2.5}, "num_epochs"),
        (GRPOConfig, {"beta_kl": -1.0}, "beta_kl"),
    ],
)
def test_invalid_settings_fail_validation_naming_the_field(config_cls, settings, field):
    config = config_cls().environment(CHAIN).training(**settings)
    with pytest.raises(ValueError, match=field):
        config.validate()


def test_defaults_validate_with_the_documented_references():
    dpo, grpo = DPOConfig().environment(CHAIN), GRPOConfig().environment(CHAIN)
    dpo.validate()
    grpo.validate()
    assert (dpo.algo_class, dpo.reference_policy, dpo.dpo_beta) == (DPO, "initial", 0.1)
    assert (grpo.algo_class, grpo.reference_policy, grpo.clip_param) == (GRPO, "lagged", 0.2)
    assert grpo.num_epochs > 1 and grpo.beta_kl > 0


def test_a_sweep_spec_names_the_baselines_in_a_fresh_interpreter():
    """The sweep loader resolves the baselines by name (haepo_ray.rl.registry), nothing imported first."""
    code = (
        "from haepo_ray.sweep.kinds import parse_plan\n"
        "for name, key in (('DPO', 'dpo_beta'), ('GRPO', 'clip_param')):\n"
        "    plan = parse_plan({'algorithm': name, 'env': 'haepo/ChainMDP-v0', 'settings': {key: 0.3},\n"
        "                       'stop': {'iterations': 1}})\n"
        "    config = plan.trial_config({})\n"
        "    print(type(config).__name__, getattr(config, key))\n"
    )
    assert fresh_python(code)[:2] == ["DPOConfig 0.3", "GRPOConfig 0.3"]


# --- Learning on a real local Ray ----------------------------------------------------------


def _chain(config_cls, seed: int = 0):
    """The same chain MDP settings as HAEPO's learning test (tests/test_algorithm.py)."""
    return (
        config_cls()
        .environment(CHAIN, env_config={"length": 5})
        .env_runners(num_env_runners=0)
        .training(episodes_per_batch=8, lr=0.05)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=seed)
    )


def _train(config, iterations: int) -> list[dict]:
    algo = config.build_algo()
    try:
        return [algo.train() for _ in range(iterations)]
    finally:
        algo.stop()


def _return(result: dict) -> float:
    return result["env_runners"]["episode_return_mean"]


def _learner(result: dict) -> dict:
    return result["learners"]["default_policy"]


def test_dpo_learns_the_chain_mdp(ray_session):
    """A random policy reaches the end of the 5-step chain with probability 1/32."""
    results = _train(_chain(DPOConfig), 40)
    assert _return(results[0]) < 0.3
    assert _return(results[-1]) > 0.6
    # The "initial" reference is not inert: implicit rewards move away from 0.
    assert max(_learner(r)["preference_accuracy"] for r in results) > 0.5


def test_grpo_learns_the_chain_mdp(ray_session):
    results = _train(_chain(GRPOConfig), 40)
    assert _return(results[0]) < 0.3
    assert _return(results[-1]) > 0.6
    # With the default 2 epochs the clip acts, and the lagged reference gives a KL.
    assert max(_learner(r)["clip_fraction"] for r in results) > 0
    assert max(_learner(r)["step_kl_to_reference"] for r in results) > 1e-4


# Slow tier: test_algorithm's test_tune_runs_haepo_by_name runs HAEPO the same way (the names
# register_algorithms gives Tune), test_a_sweep_spec_names_the_baselines_in_a_fresh_interpreter
# resolves DPO by name and test_dpo_learns_the_chain_mdp trains it.
@pytest.mark.slow
def test_tune_runs_dpo_by_name(ray_session, tmp_path):
    from ray import tune

    from haepo_ray import register_algorithms

    register_algorithms()  # explicit: nothing registers on import
    grid = tune.Tuner(
        "DPO",
        param_space=_chain(DPOConfig).training(dpo_beta=0.2),
        run_config=tune.RunConfig(stop={"training_iteration": 2}, storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert not grid.errors
    assert grid[0].metrics["training_iteration"] == 2
    assert grid[0].config["dpo_beta"] == 0.2
    assert "preference_accuracy" in grid[0].metrics["learners"]["default_policy"]


def _lone_gradient(algo: str, normalization: str, estimator: str, ret: float) -> torch.Tensor:
    """The gradient, in float64, of ``algo``'s loss on one episode of 3 steps with return ``ret``."""
    step_logp = torch.tensor([-0.7, -1.2, -0.4], dtype=torch.float64, requires_grad=True)
    ref, returns = torch.tensor([-0.9, -1.0, -0.6], dtype=torch.float64), torch.tensor([ret], dtype=torch.float64)
    traj = step_logp.sum()[None]
    if algo == "HAEPO":
        loss = haepo_loss(traj, ref.sum()[None], returns, beta_ent=0.05, beta_kl=0.05, normalization=normalization,
                          estimator=estimator).loss
    elif algo == "GRPO":
        loss = grpo_loss(step_logp, step_logp.detach() * 1.1, ref, torch.full((3,), 0.5, dtype=torch.float64),
                         torch.zeros(3, dtype=torch.long), returns, clip_param=0.2, beta_kl=0.05, beta_ent=0.05,
                         normalization=normalization).loss
    else:
        loss = dpo_loss(traj, ref.sum()[None], returns, beta=0.1).loss
    return torch.autograd.grad(loss, step_logp, allow_unused=True)[0]


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize(("algo", "estimator"), [("HAEPO", e) for e in ESTIMATORS] + [("GRPO", "weights"),
                                                                                      ("DPO", "weights")])
def test_a_lone_episodes_return_misses_the_gradient_exactly_where_a_reason_is_given(algo, normalization, estimator):
    """Two returns of one lone episode (M = 1): the same gradient exactly where
    lone_episode_reason says why (what HAEPOConfig and the LM settings refuse M = 1 for)."""
    grads = [_lone_gradient(algo, normalization, estimator, ret) for ret in (0.3, 0.8)]
    same = all(g is None for g in grads) or torch.equal(*grads)
    assert same == (lone_episode_reason(algo, normalization=normalization, estimator=estimator) is not None)
