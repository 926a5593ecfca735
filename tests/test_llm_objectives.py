"""HAEPO, GRPO and DPO on LM groups: exact micro-batched backward, a float64 gradient check."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from haepo_ray.llm.objectives import ObjectiveSettings, backward, effective_num_trajectories, group_loss
from haepo_ray.llm.rollout import completion_batch, sequence_logp, token_stats

PROMPTS = ["the model writes", "the model writes", "the model writes",
           "we propose a method", "we propose a method", "we propose a method"]
COMPLETIONS = ["a short summary", "the paper", "results show the method improves accuracy",
               "for parsing", "a cat sat on the mat", "the method"]


def _batch(tokenizer):
    batch = completion_batch(tokenizer, PROMPTS, COMPLETIONS)
    # Two prompts of three completions each.
    return type(batch)(batch.input_ids, batch.attention_mask, batch.completion_mask,
                       torch.tensor([0, 0, 0, 1, 1, 1]))


def _ref_logp(model, batch):
    with torch.no_grad():  # a reference that differs from the policy, so the KL terms matter
        return token_stats(model, batch)[0] * 1.1


RETURNS = {
    "HAEPO": torch.tensor([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], dtype=torch.float64),
    "GRPO": torch.tensor([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], dtype=torch.float64),
    "DPO": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64),  # gold first, then samples
}


def _gradient(model, batch, loss_fn, micro_batch_size, with_entropy):
    model.zero_grad(set_to_none=True)
    loss, _ = backward(model, batch, loss_fn, micro_batch_size=micro_batch_size, with_entropy=with_entropy)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return loss, grads


@pytest.mark.parametrize("algo", ["HAEPO", "GRPO", "DPO"])
def test_micro_batched_backward_equals_the_full_group_gradient(tiny_lm, algo):
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    loss_fn = group_loss(ObjectiveSettings(algo=algo), batch, RETURNS[algo], _ref_logp(model, batch))
    full_loss, full = _gradient(model, batch, loss_fn, 0, algo == "GRPO")
    assert full.abs().max() > 1e-4
    for size in (1, 4):
        loss, grads = _gradient(model, batch, loss_fn, size, algo == "GRPO")
        torch.testing.assert_close(loss, full_loss, rtol=1e-12, atol=0)
        assert (grads - full).norm() / full.norm() < 1e-10, size


def _rms_norm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)


def test_haepo_gradient_through_the_lm_matches_finite_differences(tiny_lm, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    # Llama's RMSNorm rounds to float32 inside; a float64 check needs float64 throughout.
    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_norm_in_input_dtype)
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    settings = ObjectiveSettings(algo="HAEPO", weight_temperature=4.0)  # weights not one-hot
    loss_fn = group_loss(settings, batch, RETURNS["HAEPO"], _ref_logp(model, batch))
    _, grads = _gradient(model, batch, loss_fn, 1, False)
    params = list(model.parameters())
    direction = [torch.randn(p.shape, generator=torch.Generator().manual_seed(i), dtype=p.dtype)
                 for i, p in enumerate(params)]
    norm = torch.cat([d.flatten() for d in direction]).norm()
    direction = [d / norm for d in direction]  # a unit step: eps is the distance moved

    def loss_at(step):
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(step * d)
            value = loss_fn(token_stats(model, batch)[0], None).item()
            for p, d in zip(params, direction):
                p.sub_(step * d)
        return value

    eps = 1e-6
    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    analytic = float(grads @ torch.cat([d.flatten() for d in direction]))
    assert abs(analytic) > 1e-4
    assert abs(numeric - analytic) <= 1e-8 * abs(analytic)  # measured 5e-11


def test_dpo_on_gold_and_samples_is_the_mean_over_gold_vs_sample_pairs(tiny_lm):
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    ref = _ref_logp(model, batch)
    with torch.no_grad():
        logp = token_stats(model, batch)[0]
        loss = group_loss(ObjectiveSettings(algo="DPO", dpo_beta=0.5), batch, RETURNS["DPO"], ref)(logp, None)
    margin = 0.5 * (sequence_logp(logp, batch.completion_mask) - sequence_logp(ref, batch.completion_mask))
    # Per prompt: gold (row 0 / 3) against each of its two samples; the update averages the prompts.
    hand = [-(F.logsigmoid(margin[g] - margin[g + 1]) + F.logsigmoid(margin[g] - margin[g + 2])) / 2 for g in (0, 3)]
    torch.testing.assert_close(loss, (hand[0] + hand[1]) / 2, rtol=1e-12, atol=0)


def test_effective_number_of_trajectories_and_weight_options(tiny_lm):
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    with torch.no_grad():
        logp = token_stats(model, batch)[0]
    plain = effective_num_trajectories(ObjectiveSettings(), batch, logp)
    hot = effective_num_trajectories(ObjectiveSettings(weight_temperature=1e9), batch, logp)
    normalised = effective_num_trajectories(ObjectiveSettings(length_normalize=True), batch, logp)
    # Completions of 3 to 7 tokens differ by nats in L_k: far from uniform weights.
    assert 1.0 <= plain < 2.0
    assert hot == pytest.approx(3.0, abs=1e-6)  # tau -> inf: uniform over the three completions
    assert plain < normalised <= 3.0
    L = sequence_logp(logp, batch.completion_mask)
    w = torch.softmax(L[:3], 0)
    first_group = 1 / (w**2).sum()
    assert plain == pytest.approx(float((first_group + 1 / (torch.softmax(L[3:], 0) ** 2).sum()) / 2), rel=1e-12)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"algo": "PPO"}, r"algo must be one of \('HAEPO', 'GRPO', 'DPO'\), got 'PPO'"),
    ({"beta_kl": -1.0}, "beta_kl must be a finite number >= 0"),
    ({"weight_temperature": 0.0}, "weight_temperature must be a finite number > 0"),
    ({"dpo_beta": math.inf}, "dpo_beta must be a finite number > 0"),
    ({"clip_param": 1.5}, r"clip_param must be in \(0, 1\)"),
    ({"normalization": "minmax"}, "normalization must be one of"),
])
def test_objective_settings_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ObjectiveSettings(**kwargs)
