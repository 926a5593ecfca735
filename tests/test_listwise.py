"""One listwise loss across learners: N learners make exactly the update one learner makes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from haepo_ray.baseline_losses import dpo_loss, group_advantage
from haepo_ray.listwise import Shard, listwise_loss
from haepo_ray.loss import haepo_loss

# Episodes of very different lengths: a shard-local softmax would treat them very differently.
LENGTHS = (1, 40, 3, 2, 17)
OBS_DIM = 3


# The losses that go through listwise_loss (GRPO's does not: each learner sums its own
# episodes' per-step terms, weighted 1/M, with advantages from the gathered returns).
LISTWISE_LOSSES = {
    "HAEPO": lambda L, ref, returns: haepo_loss(L, ref, returns, beta_ent=0.1, beta_kl=0.2),
    "DPO": lambda L, ref, returns: dpo_loss(L, ref, returns, beta=0.5),
}


@pytest.mark.parametrize("algorithm", LISTWISE_LOSSES)
def test_learners_shares_average_to_the_gradient_of_the_whole_list(algorithm):
    """DDP in one process: each learner's surrogate has the list's loss as its value, and the
    mean of the learners' gradients is the gradient of the loss of the whole list."""
    torch.manual_seed(0)
    step_logp = torch.randn(12, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 0, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3])
    traj_logp = torch.zeros(4, dtype=torch.float64).index_add(0, index, step_logp)
    ref = torch.randn(4, dtype=torch.float64)
    returns = torch.tensor([0.0, 1.0, 5.0, 2.0], dtype=torch.float64)

    def loss_fn(L):
        return LISTWISE_LOSSES[algorithm](L, ref, returns)

    direct = loss_fn(traj_logp).loss
    (expected,) = torch.autograd.grad(direct, step_logp, retain_graph=True)
    assert float(expected.abs().max()) > 1e-3  # a gradient worth comparing
    for shards in ([Shard(0, 4, 4, 1)], [Shard(0, 1, 4, 2), Shard(1, 3, 4, 2)]):
        grads = []
        for shard in shards:
            surrogate, out = listwise_loss(loss_fn, traj_logp[shard.rows], traj_logp.detach(), shard)
            torch.testing.assert_close(surrogate.detach(), direct.detach(), rtol=0, atol=1e-12)
            torch.testing.assert_close(out.loss.detach(), direct.detach(), rtol=0, atol=1e-12)  # the list's
            grads.append(torch.autograd.grad(surrogate, step_logp, retain_graph=True)[0])
        torch.testing.assert_close(sum(grads) / len(shards), expected, rtol=0, atol=1e-12)
    if algorithm == "HAEPO":
        assert float(out.weight_entropy) > 0


def _episodes() -> list:
    """Complete episodes with float64 observations, random rewards and behaviour log-probs."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    rng = np.random.default_rng(0)
    episodes = []
    for n in LENGTHS:
        episodes.append(
            SingleAgentEpisode(
                observations=list(rng.normal(size=(n + 1, OBS_DIM))),
                actions=list(rng.integers(0, 2, size=n)),
                rewards=list(rng.normal(size=n)),
                extra_model_outputs={Columns.ACTION_LOGP: list(np.log(rng.uniform(0.2, 0.8, size=n)))},
                terminated=True,
                len_lookback_buffer=0,
            ).to_numpy()
        )
    return episodes


def _float64_learner(base: type) -> type:
    """``base`` with float64 weights and batches (RLlib's connectors cast floats to float32).

    Built in a function so that cloudpickle ships the class by value to the learner actors.
    """
    import tree

    class Float64Learner(base):
        def build(self) -> None:
            dtype = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                super().build()
            finally:
                torch.set_default_dtype(dtype)

        def _update(self, batch):
            return super()._update(tree.map_structure(
                lambda x: x.double() if torch.is_tensor(x) and x.is_floating_point() else x, batch
            ))

    return Float64Learner


def _config(algorithm: str, num_learners: int):
    from haepo_ray.rl.algorithm import HAEPOConfig
    from haepo_ray.rl.baselines.dpo import DPOConfig
    from haepo_ray.rl.baselines.grpo import GRPOConfig

    config = {
        # "behavior": the episodes' own log-probs, unlike the policy's: the KL term acts.
        "HAEPO": HAEPOConfig().training(beta_ent=0.1, beta_kl=0.3, reference_policy="behavior"),
        "DPO": DPOConfig().training(reference_policy="behavior"),
        "GRPO": GRPOConfig().training(
            beta_ent=0.05, beta_kl=0.1, clip_param=0.1, reference_policy="behavior"
        ),
    }[algorithm]
    return (
        config.environment(
            observation_space=gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float64),
            action_space=gym.spaces.Discrete(2),
        )
        .training(episodes_per_batch=len(LENGTHS), lr=0.05, num_epochs=2)
        .learners(num_learners=num_learners)
        .rl_module(model_config={"fcnet_hiddens": [4]})
        .debugging(seed=0)
    )


def _update(algorithm: str, num_learners: int, episodes: list, state=None, **training):
    from haepo_ray.rl.algorithm import update_on_episodes

    config = _config(algorithm, num_learners).training(**training)
    config.learners(learner_class=_float64_learner(config.get_default_learner_class()))
    group = config.build_learner_group()
    try:
        # The same start for both groups (RLlib's state holds float32 copies of the weights).
        state = group.get_state() if state is None else state
        group.set_state(state)
        before = _float64_weights(group)
        results = update_on_episodes(group, episodes, timesteps={}, num_epochs=config.num_epochs)
        after = _float64_weights(group)
        if num_learners > 1:
            with pytest.raises(ValueError, match="at least one whole episode"):
                update_on_episodes(group, episodes[:1], timesteps={}, num_epochs=1)
    finally:
        group.shutdown()
    return state, before, after, results


def _float64_weights(group) -> dict[str, np.ndarray]:
    """The first learner's weights at full precision (``get_weights`` rounds to float32)."""
    results = group.foreach_learner(
        lambda learner: {
            name: p.detach().cpu().numpy().copy()
            for name, p in learner.module["default_policy"].unwrapped().state_dict().items()
        }
    )
    return next(iter(r.get() if hasattr(r, "get") else r for r in results))


def _peek(results: list, key: str) -> list[float]:
    values = [result["default_policy"][key] for result in results]  # RLlib Stats objects
    return [float(v.peek() if hasattr(v, "peek") else v) for v in values]


def test_the_grpo_learner_takes_grpos_group_advantage_of_the_discounted_returns():
    """RL GRPO's A_k are LM GRPO's: :func:`group_advantage` (sample std + 1e-4) of the whole
    batch's returns, not HAEPO's population z-score (sqrt(5/4) times as large here)."""
    episodes = _episodes()
    _, _, _, results = _update("GRPO", 0, episodes)
    gamma = _config("GRPO", 0).gamma
    returns = torch.tensor([sum(gamma**t * r for t, r in enumerate(e.get_rewards())) for e in episodes],
                           dtype=torch.float64)
    expected = float(group_advantage(returns).abs().mean())
    assert _peek(results, "advantage_abs_mean") == [pytest.approx(expected, rel=1e-6)]  # logged in float32


def test_the_haepo_learner_trains_with_the_configured_estimator():
    """``estimator="unbiased"`` reaches the learner's loss: from one state on the same episodes it
    makes another update, while the default
    makes the same update twice."""
    episodes = _episodes()
    state, start, weights, _ = _update("HAEPO", 0, episodes)
    _, _, again, _ = _update("HAEPO", 0, episodes, state, estimator="weights")
    _, _, unbiased, _ = _update("HAEPO", 0, episodes, state, estimator="unbiased")
    for name in start:
        np.testing.assert_array_equal(again[name], weights[name], err_msg=name)
    assert max(float(np.abs(unbiased[k] - weights[k]).max()) for k in start) > 1e-2


# Two learner processes per case: HAEPO's in the test command, the baselines' (the same
# gather and surrogate, their losses checked in one process above) in the slow tier.
@pytest.mark.parametrize("algorithm", ["HAEPO", pytest.param("DPO", marks=pytest.mark.slow),
                                       pytest.param("GRPO", marks=pytest.mark.slow)])
def test_two_learners_make_the_single_learner_update(ray_session, algorithm):
    """One learner on M episodes vs two learners (gloo) holding 1 + 4 of them: the same
    parameters after two gradient steps, in float64."""
    episodes = _episodes()
    state, start, single, single_results = _update(algorithm, 0, episodes)
    _, start_2, double, double_results = _update(algorithm, 2, episodes, state)
    assert set(single) == set(double) == set(start)
    for name in start:
        assert start[name].dtype == np.float64
        np.testing.assert_array_equal(start_2[name], start[name])
    assert max(float(np.abs(single[k] - start[k]).max()) for k in start) > 1e-3  # it learnt
    for name in single:
        np.testing.assert_allclose(double[name], single[name], rtol=0, atol=1e-10, err_msg=name)
    # The logged loss and diagnostics are the whole list's on every learner.
    specific = {"HAEPO": "weight_entropy", "DPO": "preference_accuracy", "GRPO": "clip_fraction"}
    for key in ("total_loss", "traj_logp_mean", "policy_entropy", "behavior_logp_gap", specific[algorithm]):
        expected = _peek(single_results, key)[0]
        assert _peek(double_results, key) == pytest.approx([expected] * 2, rel=1e-5, abs=1e-7), key
    assert _peek(single_results, "listwise_size") == [len(LENGTHS)]
    assert _peek(double_results, "listwise_size") == [len(LENGTHS)] * 2
    # Shards balanced by length: the 40-step episode alone, a shard-local softmax's worst case.
    assert sorted(_peek(double_results, "num_episodes")) == [1, 4]
