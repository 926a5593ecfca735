"""Which settings a run reads (``READ_WHEN``): each algorithm's claim checked against its loss."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from haepo_ray.llm.objectives import group_loss, rows_per_prompt
from haepo_ray.llm.rollout import token_stats
from haepo_ray.llm.settings import ALGORITHMS, DPO_PAIRS, READ_WHEN, LLMTrainSettings, ObjectiveSettings, unread
from helpers import RETURNS
from helpers import group_batch as _batch

# Two values of each setting whose reading depends on the algorithm; each pair changes the loss
# or its gradient wherever the setting is read (clip_param: a ratio of 0.5-0.9 clips at 0.05).
VALUES = {"beta_ent": (0.0, 0.5), "beta_kl": (0.0, 0.5), "normalization": ("zscore", "sum"),
          "length_normalize": (False, True), "weight_temperature": (1.0, 3.0), "estimator": ("weights", "unbiased"),
          "clip_param": (0.05, 0.5), "dpo_beta": (0.1, 0.7), "dpo_pairs": ("gold", "reward")}


def test_every_setting_an_algorithm_decides_has_a_proof_here():
    # num_iterations is the policy's loop, not the loss's: > 1 is refused outside GRPO (the settings' own check)
    assert {name for name, (by, _, _) in READ_WHEN.items() if "algo" in by} == {*VALUES, "num_iterations"}


@pytest.fixture(scope="module")
def stats(tiny_lm):
    model, tokenizer = tiny_lm
    batch = _batch(tokenizer)
    with torch.no_grad():
        logp, entropy = token_stats(model, batch, True)
    return batch, logp, entropy


def _loss_and_gradient(settings: LLMTrainSettings, stats) -> tuple[torch.Tensor, torch.Tensor]:
    batch, logp, entropy = stats
    # as rl_update: an old policy of its own only with num_iterations > 1 (its later steps'), else the policy's
    old = logp * 0.7 if settings.num_iterations > 1 else None
    leaf = logp.clone().requires_grad_(True)
    loss = group_loss(settings.objective(), batch, RETURNS[settings.algo], logp * 1.1, group_rows=3,
                      old_token_logp=old)(leaf, entropy)
    return loss.detach(), torch.autograd.grad(loss, leaf)[0]


@pytest.mark.parametrize("name", sorted(VALUES))
@pytest.mark.parametrize(("algo", "num_iterations"), [("HAEPO", 1), ("GRPO", 1), ("GRPO", 2), ("DPO", 1)])
def test_a_loss_reads_a_setting_exactly_where_read_when_says(stats, name, algo, num_iterations):
    runs = []
    for value in VALUES[name]:
        try:
            runs.append(LLMTrainSettings(model="tiny", algo=algo, num_iterations=num_iterations, **{name: value}))
        except ValueError:  # the settings refuse this value for the algorithm: never read
            assert name in unread(runs[:1], [name])
            return
    (loss_a, grad_a), (loss_b, grad_b) = (_loss_and_gradient(s, stats) for s in runs)
    changed = not (torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b))
    assert changed == (name not in unread(runs[:1], [name])), (name, algo, num_iterations, changed)


def test_unread_names_what_decides_it():
    assert unread([LLMTrainSettings(lora_r=0)], ["lora_alpha", "lora_target_modules", "lr"]) == {
        "lora_alpha": READ_WHEN["lora_alpha"][2], "lora_target_modules": READ_WHEN["lora_target_modules"][2]}
    assert unread([LLMTrainSettings(lora_r=4)], ["lora_alpha", "lora_target_modules"]) == {}
    assert list(unread([LLMTrainSettings()], ["logits_chunk"])) == ["logits_chunk"]
    assert unread([LLMTrainSettings(logits="chunked")], ["logits_chunk"]) == {}
    for algo in ALGORITHMS:  # with num_iterations 1, the default
        assert "clip_param" in unread([LLMTrainSettings(algo=algo)], ["clip_param"])
    assert unread([LLMTrainSettings(algo="GRPO", num_iterations=2)], ["clip_param"]) == {}
    # a sweep's trials: refused when none reads it
    grpo = [LLMTrainSettings(algo="GRPO", num_iterations=n) for n in (1, 2)]
    assert unread(grpo[:1], ["clip_param"]) != {} and unread(grpo, ["clip_param"]) == {}


def _objectives():
    """Every valid loss setting that decides what a group of one completion learns."""
    from haepo_ray.loss import ESTIMATORS, NORMALIZATIONS

    for algo, normalization, estimator, pairs in itertools.product(ALGORITHMS, NORMALIZATIONS, ESTIMATORS, DPO_PAIRS):
        try:
            yield ObjectiveSettings(algo=algo, normalization=normalization, estimator=estimator, dpo_pairs=pairs)
        except ValueError:  # e.g. the unbiased estimator for GRPO
            continue


@pytest.mark.parametrize("objective", list(_objectives()), ids=lambda o: f"{o.algo}-{o.normalization}-{o.estimator}-"
                                                                          f"{o.dpo_pairs}")
def test_a_group_of_one_is_refused_exactly_where_the_reward_cannot_reach_the_gradient(stats, objective):
    """Six prompts of one completion each: two sets of positive rewards give the same gradient
    exactly where the settings refuse group_size 1. DPO's gold pairs (the gold summary, then the
    sample) take the returns the loop fixes, whatever the reward, at any group size: accepted."""
    batch, logp, entropy = stats
    rows = rows_per_prompt(objective, 1)
    batch = dataclasses.replace(batch, prompt_index=torch.arange(6) // rows)
    gradients = []
    for rewards in ([0.3, 0.9, 0.1, 0.5, 0.2, 0.7], [0.8, 0.1, 0.4, 0.6, 0.9, 0.2]):
        returns = torch.tensor([1.0, 0.0] * 3 if rows == 2 else rewards, dtype=torch.float64)  # haepo_ray.llm.train
        leaf = logp.clone().requires_grad_(True)
        loss = group_loss(objective, batch, returns, logp * 1.1, group_rows=rows)(leaf, entropy)
        gradients.append(torch.autograd.grad(loss, leaf)[0])
    try:
        LLMTrainSettings(model="tiny", group_size=1, **dataclasses.asdict(objective))
    except ValueError as err:
        assert str(err).startswith("group_size 1: ") and str(err).endswith("use group_size >= 2")
        assert torch.equal(*gradients) and rows == 1
        return
    assert not torch.equal(*gradients) or (rows == 2 and gradients[0].abs().max() > 0)
