"""HAEPO, GRPO and DPO on LM groups: exact micro-batched backward, a float64 gradient check."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from haepo_ray.llm.objectives import (OBJECTIVES, backward, effective_num_trajectories, group_loss, objective_of,
                                      rows_per_prompt, training_batch)
from haepo_ray.llm.rollout import completion_batch, sequence_logp, token_stats
from haepo_ray.llm.settings import ALGORITHMS, ObjectiveSettings
from helpers import RETURNS
from helpers import group_batch as _batch


def _ref_logp(model, batch):
    with torch.no_grad():  # a reference that differs from the policy, so the KL terms matter
        return token_stats(model, batch)[0] * 1.1


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
    loss_fn = group_loss(ObjectiveSettings(algo=algo), batch, RETURNS[algo], _ref_logp(model, batch), group_rows=3)
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
    loss_fn = group_loss(settings, batch, RETURNS["HAEPO"], _ref_logp(model, batch), group_rows=3)
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
        loss = group_loss(ObjectiveSettings(algo="DPO", dpo_beta=0.5), batch, RETURNS["DPO"], ref, group_rows=3)(logp, None)
    margin = 0.5 * (sequence_logp(logp, batch.completion_mask) - sequence_logp(ref, batch.completion_mask))
    # Per prompt: gold (row 0 / 3) against each of its two samples; the update averages the prompts.
    hand = [-(F.logsigmoid(margin[g] - margin[g + 1]) + F.logsigmoid(margin[g] - margin[g + 2])) / 2 for g in (0, 3)]
    torch.testing.assert_close(loss, (hand[0] + hand[1]) / 2, rtol=1e-12, atol=0)


def test_dpo_on_gold_trains_on_each_prompts_gold_row_then_its_samples(tiny_lm):
    """training_batch: a worker's samples of prompts 3 and 5 (two each) and their gold rows become
    [gold 3, its samples, gold 5, its samples], returns 1 for gold, the rows the loss's groups take."""
    _, tokenizer = tiny_lm
    samples = completion_batch(tokenizer, ["the model writes"] * 2 + ["we propose a method"] * 2,
                               ["a short summary", "the paper", "for parsing", "the method"])
    samples = dataclasses.replace(samples, prompt_index=torch.tensor([3, 3, 5, 5]))
    gold = completion_batch(tokenizer, ["the model writes", "we propose a method"],
                            ["a cat sat on the mat", "the mat"])
    rewards = torch.tensor([0.2, 0.8, 0.4, 0.6], dtype=torch.float64)
    settings = ObjectiveSettings(algo="DPO")
    batch, returns, sample_rows = training_batch(settings, samples, rewards, gold, tokenizer.pad_token_id)

    def completions(b):
        return [tokenizer.decode(ids[mask]) for ids, mask in zip(b.input_ids[:, b.prompt_width:], b.completion_mask)]

    got, gold_texts, sample_texts = completions(batch), completions(gold), completions(samples)
    assert got == [gold_texts[0], *sample_texts[:2], gold_texts[1], *sample_texts[2:]]
    assert batch.prompt_index.tolist() == [3, 3, 3, 5, 5, 5]
    assert returns.tolist() == [1, 0, 0, 1, 0, 0] and returns.dtype == rewards.dtype
    assert sample_rows.tolist() == [False, True, True, False, True, True]
    assert len(batch) == 2 * rows_per_prompt(settings, 2)
    group_loss(settings, batch, returns, None, group_rows=3)  # consecutive groups, as the loss takes them
    # without gold: the samples and their rewards, every row a sample
    batch, returns, sample_rows = training_batch(ObjectiveSettings(algo="HAEPO"), samples, rewards, None, 0)
    assert batch is samples and returns is rewards and sample_rows.all()
    for algo, given, message in (("DPO", None, "DPO: gold rows are required"),
                                 ("GRPO", gold, "GRPO: gold rows are not used"),
                                 ("DPO", gold.rows(slice(0, 0)), "4 samples do not split into groups for 0 gold rows")):
        with pytest.raises(ValueError, match=message):
            training_batch(ObjectiveSettings(algo=algo), samples, rewards, given, 0)


def test_dpo_on_reward_pairs_prefers_each_groups_best_sample_to_its_worst(tiny_lm):
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    ref = _ref_logp(model, batch)
    settings = ObjectiveSettings(algo="DPO", dpo_beta=0.5, dpo_pairs="reward")
    assert rows_per_prompt(settings, 3) == 3 and not objective_of(settings).with_gold  # samples only, no gold
    returns = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], dtype=torch.float64)  # best, worst: (1, 2), (5, 4)
    with torch.no_grad():
        logp = token_stats(model, batch)[0]
        loss = group_loss(settings, batch, returns, ref, group_rows=3)(logp, None)
    margin = 0.5 * (sequence_logp(logp, batch.completion_mask) - sequence_logp(ref, batch.completion_mask))
    hand = -(F.logsigmoid(margin[1] - margin[2]) + F.logsigmoid(margin[5] - margin[4])) / 2
    torch.testing.assert_close(loss, hand, rtol=1e-12, atol=0)
    # a group whose rewards are all equal has no pair: it adds 0 and no gradient
    tied = torch.tensor([0.4, 0.4, 0.4, 0.5, 0.2, 0.7], dtype=torch.float64)
    leaf = logp.clone().requires_grad_(True)
    loss = group_loss(settings, batch, tied, ref, group_rows=3)(leaf, None)
    torch.testing.assert_close(loss, -F.logsigmoid(margin[5] - margin[4]) / 2, rtol=1e-12, atol=0)
    loss.backward()
    assert (leaf.grad[:3] == 0).all() and leaf.grad[3:].abs().sum() > 0


def test_effective_number_of_trajectories_and_weight_options(tiny_lm):
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    with torch.no_grad():
        logp = token_stats(model, batch)[0]
    plain = effective_num_trajectories(ObjectiveSettings(), batch, logp, group_rows=3)
    hot = effective_num_trajectories(ObjectiveSettings(weight_temperature=1e9), batch, logp, group_rows=3)
    normalised = effective_num_trajectories(ObjectiveSettings(length_normalize=True), batch, logp, group_rows=3)
    # Completions of 3 to 7 tokens differ by nats in L_k: far from uniform weights.
    assert 1.0 <= plain < 2.0
    assert hot == pytest.approx(3.0, abs=1e-6)  # tau -> inf: uniform over the three completions
    assert plain < normalised <= 3.0
    L = sequence_logp(logp, batch.completion_mask)
    w = torch.softmax(L[:3], 0)
    first_group = 1 / (w**2).sum()
    assert plain == pytest.approx(float((first_group + 1 / (torch.softmax(L[3:], 0) ** 2).sum()) / 2), rel=1e-12)


def test_grpo_on_padded_token_rows_equals_grpo_on_flat_steps(tiny_lm):
    from haepo_ray.baseline_losses import grpo_loss

    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    with torch.no_grad():
        logp, entropy = token_stats(model, batch.to("cpu"), True)
    ref = _ref_logp(model, batch)
    mask = batch.completion_mask
    logp = logp.double().requires_grad_(True)
    settings = ObjectiveSettings(algo="GRPO", beta_kl=0.1, beta_ent=0.05)
    grouped = group_loss(settings, batch, RETURNS["GRPO"], ref.double(), group_rows=3)(logp, entropy.double())
    (grad,) = torch.autograd.grad(grouped, logp)
    flat = []
    for g in (slice(0, 3), slice(3, 6)):  # the flat form: each group's steps and their episode
        m = mask[g]
        flat.append(grpo_loss(logp[g][m], logp[g][m].detach(), ref.double()[g][m], entropy.double()[g][m],
                              m.nonzero()[:, 0], RETURNS["GRPO"][g], clip_param=0.2, beta_kl=0.1,
                              beta_ent=0.05).loss)
    flat = torch.stack(flat).mean()
    (flat_grad,) = torch.autograd.grad(flat, logp)
    torch.testing.assert_close(grouped, flat, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, flat_grad, rtol=1e-12, atol=1e-15)
    assert flat_grad.abs().max() > 1e-3



def test_grpo_advantage_is_each_groups_trl_zscore_with_the_sample_std(tiny_lm):
    """With ratio 1 and no KL or entropy term, d loss / d logp_{k,t} = -A_k / (P M T_k) (P
    prompts, M completions each): the advantages read back from the gradient are the hand
    computed (R_k - mean R) / (sample std R + 1e-4) of each prompt's group.
    Group 1: R = [1, 2, 6], mean 3, deviations [-2, -1, 3], sample std sqrt(14 / 2) = sqrt(7)
    (population: sqrt(14 / 3)). Group 2: R = [0, 1, 2], mean 1, sample std 1."""
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    with torch.no_grad():
        logp, entropy = token_stats(model, batch, True)
    logp = logp.double().requires_grad_(True)
    returns = torch.tensor([1.0, 2.0, 6.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    settings = ObjectiveSettings(algo="GRPO", beta_kl=0.0, beta_ent=0.0)
    loss = group_loss(settings, batch, returns, logp.detach(), group_rows=3)(logp, entropy.double())
    (grad,) = torch.autograd.grad(loss, logp)
    mask = batch.completion_mask
    lengths = mask.sum(dim=1).double()
    advantage = -(grad * mask).sum(dim=1) * 2 * 3  # the sum over T_k tokens of -A_k / (2 * 3 * T_k)
    s1, s2 = math.sqrt(7) + 1e-4, 1 + 1e-4
    expected = torch.tensor([-2 / s1, -1 / s1, 3 / s1, -1 / s2, 0.0, 1 / s2], dtype=torch.float64)
    torch.testing.assert_close(advantage, expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad * mask, -(expected / (6 * lengths))[:, None] * mask, rtol=1e-12, atol=1e-15)

def test_rows_of_a_group_must_be_consecutive(tiny_lm):
    _, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    shuffled = type(batch)(batch.input_ids, batch.attention_mask, batch.completion_mask,
                           torch.tensor([0, 1, 0, 1, 0, 1]))
    with pytest.raises(ValueError, match="consecutive groups of 3 per prompt"):
        group_loss(ObjectiveSettings(), shuffled, RETURNS["HAEPO"], torch.zeros(6, 1), group_rows=3)
    with pytest.raises(ValueError, match="6 rows do not split into groups of 4"):
        group_loss(ObjectiveSettings(), batch, RETURNS["HAEPO"], torch.zeros(6, 1), group_rows=4)


def test_every_algorithm_has_one_objective_that_says_what_it_needs(tiny_lm):
    assert sorted(OBJECTIVES) == sorted(ALGORITHMS)
    needs = {name: (o.with_entropy, o.with_gold) for name, o in OBJECTIVES.items()}
    assert needs == {"HAEPO": (False, False), "GRPO": (True, False), "DPO": (False, True)}
    assert [rows_per_prompt(ObjectiveSettings(algo=a), 4) for a in ALGORITHMS] == [4, 4, 5]
    _, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    loss = group_loss(ObjectiveSettings(algo="GRPO"), batch, RETURNS["GRPO"], torch.zeros(6, 1), group_rows=3)
    with pytest.raises(ValueError, match="GRPO needs the token entropies"):
        loss(torch.zeros(6, 1), None)


def test_unbiased_estimator_adds_each_groups_loss_times_grad_log_p_of_its_completions(tiny_lm):
    """``estimator="unbiased"``: on top of the default's gradient, every completion token of group g
    gets l_g / G (G groups, the mean over prompts): the score-function term l_g grad log p, with log p
    the plain sum of the tokens' log-probs even where the weights come from L_k / n_k / tau."""
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    with torch.no_grad():
        logp = token_stats(model, batch)[0]
    ref = _ref_logp(model, batch)
    mask = batch.completion_mask
    settings = ObjectiveSettings(algo="HAEPO", length_normalize=True, weight_temperature=2.0)

    def grad(s):
        leaf = logp.clone().requires_grad_(True)
        loss = group_loss(s, batch, RETURNS["HAEPO"], ref, group_rows=3)(leaf, None)
        return loss.detach(), torch.autograd.grad(loss, leaf)[0]

    losses = OBJECTIVES["HAEPO"].group_losses(settings, logp, None, ref, logp, mask, RETURNS["HAEPO"],
                                              [slice(0, 3), slice(3, 6)])
    weights_loss, weights_grad = grad(settings)
    unbiased_loss, unbiased_grad = grad(dataclasses.replace(settings, estimator="unbiased"))
    torch.testing.assert_close(unbiased_loss, weights_loss, rtol=0, atol=0)
    per_row = torch.stack(losses).repeat_interleave(3)[:, None] / 2
    assert per_row.abs().min() > 1e-4
    torch.testing.assert_close(unbiased_grad - weights_grad, per_row * mask, rtol=0, atol=1e-12)


def test_the_estimator_reaches_the_loss_from_a_runs_settings():
    from haepo_ray.llm.settings import LLMTrainSettings

    assert LLMTrainSettings(estimator="unbiased").objective().estimator == "unbiased"
    assert LLMTrainSettings().objective().estimator == "weights"  # today's loss by default
    with pytest.raises(ValueError, match="estimator 'unbiased' is HAEPO's gradient estimator, not GRPO's"):
        LLMTrainSettings(algo="GRPO", estimator="unbiased")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"estimator": "paper"}, r"estimator must be one of \('weights', 'unbiased'\), got 'paper'"),
    ({"algo": "DPO", "estimator": "unbiased"}, "is HAEPO's gradient estimator, not DPO's"),
    ({"algo": "PPO"}, r"algo must be one of \('HAEPO', 'GRPO', 'DPO'\), got 'PPO'"),
    ({"beta_kl": -1.0}, "beta_kl must be a finite number >= 0"),
    ({"weight_temperature": 0.0}, "weight_temperature must be a finite number > 0"),
    ({"dpo_beta": math.inf}, "dpo_beta must be a finite number > 0"),
    ({"clip_param": 1.5}, r"clip_param must be in \(0, 1\)"),
    ({"normalization": "minmax"}, "normalization must be one of"),
    ({"algo": "DPO", "dpo_pairs": "best"}, r"dpo_pairs must be one of \('gold', 'reward'\), got 'best'"),
    ({"algo": "HAEPO", "dpo_pairs": "reward"}, "dpo_pairs is DPO's setting, got dpo_pairs 'reward' for 'HAEPO'"),
])
def test_objective_settings_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ObjectiveSettings(**kwargs)
