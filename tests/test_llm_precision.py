"""Pure bfloat16 weights that an AdamW step of the learning rate cannot move: predicted as AdamW
does it, and a warning with their share when a policy is made to train them."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch

from haepo_ray.llm.policy import Policy
from haepo_ray.llm.precision import frozen_share
from haepo_ray.llm.settings import LLMTrainSettings


def _weights() -> torch.Tensor:
    """Weights as a language model's: most of a linear layer's size (std 0.02), some norm weights (1)."""
    generator = torch.Generator().manual_seed(0)
    return torch.cat([0.02 * torch.randn(20_000, generator=generator), torch.ones(500)]).to(torch.bfloat16)


@pytest.mark.parametrize("lr", [1e-6, 1e-5, 5e-5, 1e-4, 1e-3, 1e-2])
def test_the_predicted_share_is_what_one_adamw_step_leaves_unchanged(lr):
    weights = torch.nn.Parameter(_weights())
    before = weights.detach().clone()
    weights.grad = torch.randn(weights.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    torch.optim.AdamW([weights], lr=lr).step()  # the first step: lr times the gradient's sign, and the decay
    unchanged = float((weights.detach() == before).double().mean())
    # a weight at the start of its binade has half the spacing below it: up to 1/128 of them move
    # down (towards 0) where the prediction, by the spacing above, says they cannot
    assert frozen_share([before], lr) == pytest.approx(unchanged, abs=0.01)
    assert 0.0 <= unchanged <= 1.0


def test_a_policy_that_trains_bfloat16_weights_at_a_learning_rate_too_small_for_them_warns(tiny_lm):
    model, _ = tiny_lm
    settings = LLMTrainSettings(algo="GRPO", model="tiny", dtype="bfloat16", lr=5e-5, sft_lr=1e-2)
    share = frozen_share(list(copy.deepcopy(model).bfloat16().parameters()), 5e-5)
    assert share > 0.4  # the tiny model's weights are initialised as a real one's (std 0.02)
    policy = Policy(copy.deepcopy(model).bfloat16(), settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy.start_sft()  # sft_lr 1e-2 moves them
    with pytest.warns(UserWarning, match=rf"^pure bfloat16: an AdamW step of lr 5e-05 is less than half the bfloat16 "
                                         rf"spacing of {100 * share:.1f}% of the trainable weights, which it leaves "
                                         rf"unchanged: use rounding 'stochastic', precision 'mixed' \(float32 "
                                         rf"weights\) or a larger lr$"):
        policy.start_rl()
    mixed = dataclasses.replace(settings, precision="mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32 weights: nothing to say
        Policy(copy.deepcopy(model).float(), mixed).start_rl()
