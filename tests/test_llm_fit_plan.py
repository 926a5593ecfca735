"""Trials planned to fit their GPU (``llm.fit: auto``, haepo_ray.sweep.kinds.llm.fit.plan_fit): the
plan's settings keep the trial's gradients, fit, and are the fastest fitting combination the
search simulated; a trial that nothing fits, or ``llm.fit: refuse``, is refused.

The tiny HAEPO trial at prompts of 256 tokens and completions of 64 (reserved beyond the CUDA
context, GiB, by micro-batch size 0/1/2/3 without and with checkpointing: 0.131/0.098/0.104/0.111
and 0.104/0.094/0.098/0.100; cuBLAS's 64 MiB in each)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from ray.tune.search.variant_generator import generate_variants

from haepo_ray.llm.capacity.estimate import CUDA_CONTEXT_BYTES
from haepo_ray.llm.objectives import OBJECTIVES, backward, group_loss
from haepo_ray.llm.policy import Policy
from haepo_ray.llm.rollout import token_stats
from haepo_ray.sweep.cluster import Cluster
from haepo_ray.sweep.kinds.llm.config import trial_settings
from haepo_ray.sweep.kinds.llm.fit import CONFIG_KEY, FIT_KEY, _with, check_own_fit, micro_batch_sizes
from haepo_ray.sweep.kinds import parse_plan
from haepo_ray.sweep.spec import SpecError
from helpers import RETURNS, group_batch

CONTEXT = CUDA_CONTEXT_BYTES / 2**30
ONLY_BOTH = round(CONTEXT + 0.095, 3)  # GiB: only micro-batches of 1 with checkpointing fit
SOME = round(CONTEXT + 0.1, 3)  # several combinations fit, with either checkpointing


def _spec(**llm) -> dict:
    return {
        "name": "fit", "algorithm": "HAEPO",
        "llm": {"model": "tiny", "num_workers": 0, "use_gpu": True, "gpu_reserve_gb": 0, "prompt_tokens": 256,
                **llm},
        "settings": {"dtype": "float64", "sft_examples": 2, "sft_batch": 1, "rl_updates": 1, "batch_size": 2,
                     "group_size": 3, "max_new_tokens": 64, "micro_batch_size": 0, "lr": 1e-2, "sft_lr": 1e-2},
        "search_space": {"seed": {"grid": [0]}},
    }


def _fitted(limit: float, **llm):
    plan = parse_plan(_spec(gpu_memory_gb=limit, **llm), "fit.yaml").fitted(Cluster.unknown())
    return plan, plan._key({"seed": 0})


def _config(plan) -> dict:
    (_, resolved), = generate_variants({"config": plan.param_space})
    return resolved["config"]


def _gradients(model, tokenizer, settings) -> torch.Tensor:
    """The parameter gradients of one RL update of ``settings``'s policy, as Policy.update takes them."""
    policy = Policy(copy.deepcopy(model), settings)
    policy.start_sft()
    policy.start_rl()
    batch = group_batch(tokenizer)
    with torch.no_grad():
        ref = token_stats(model, batch)[0] * 1.1
    loss_fn = group_loss(settings.objective(), batch, RETURNS[settings.algo], ref, group_rows=3)
    backward(policy.model, batch, loss_fn, micro_batch_size=settings.micro_batch_size,
             with_entropy=OBJECTIVES[settings.algo].with_entropy, stats=policy.stats)
    return torch.cat([p.grad.flatten() for p in policy.model.parameters()])


def test_a_planned_trial_has_the_gradients_of_the_trial_as_given(tiny_lm):
    plan, _ = _fitted(ONLY_BOTH)
    config = _config(plan)
    planned = trial_settings(config)
    assert (planned.micro_batch_size, planned.gradient_checkpointing) == (1, True)
    given = plan.trial_config({"seed": 0})
    assert (given.micro_batch_size, given.gradient_checkpointing) == (0, False)
    # MLflow logs the choice and its estimate as fit/* params
    assert config[FIT_KEY] | {"estimated_seconds": 0} == {
        "mode": "auto", "accelerator": "a100-40gb", "micro_batch_size": 1, "gradient_checkpointing": True,
        "planned": True, "estimated_seconds": 0, "simulated": len(plan.fit.plans[plan._key({"seed": 0})].considered)}
    assert config[CONFIG_KEY]["estimated_reserved_gib"] == round(plan.estimate_of({"seed": 0}).reserved_gib, 3)
    model, tokenizer = tiny_lm
    grads = [_gradients(model, tokenizer, s) for s in (given, planned)]
    assert grads[0].abs().max() > 1e-4
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=0)


@pytest.mark.parametrize("limit", [ONLY_BOTH, SOME])
def test_the_plan_fits_and_no_fitting_combination_is_estimated_faster(limit):
    plan, key = _fitted(limit)
    search = plan.fit.plans[key]
    chosen = search.chosen
    assert not plan.fit.fits(key) and plan.fit.runs(key) == chosen.key
    assert plan.estimate_of({"seed": 0}).reserved_gib <= limit
    fitting = [c for c in search.considered if c.estimate.reserved_gib <= limit]
    assert all(c.estimate.seconds >= chosen.estimate.seconds for c in fitting)
    # each combination of the grid not simulated was pruned: the same micro-batch with checkpointing did not fit
    simulated = {(c.micro_batch_size, c.gradient_checkpointing): c for c in search.considered}
    for size in micro_batch_sizes(key, workers=0):
        assert (size, True) in simulated
        if (size, False) not in simulated:
            assert simulated[size, True].estimate.reserved_gib > limit
            if _with(key, size, False) != key:  # (the trial as given was simulated to be refused)
                assert _with(key, size, False) not in plan.fit.estimates
    if limit == SOME:  # a real choice: several fit, with either checkpointing, at different times
        assert {c.gradient_checkpointing for c in fitting} == {False, True}
        assert len({c.estimate.seconds for c in fitting}) > 1


def test_a_trial_that_nothing_fits_is_refused_with_its_smallest_peak_and_what_dominates_it():
    with pytest.raises(SpecError) as err:
        _fitted(0.5)
    plan = parse_plan(_spec(gpu_memory_gb=0.5), "fit.yaml")
    key = plan._key({"seed": 0})
    message = str(err.value)
    match = re.fullmatch(r"fit\.yaml: trial 0 \(HAEPO, seed 0\): no micro_batch_size or gradient_checkpointing fits "
                         r"\((\d+) simulated\); the smallest, micro_batch_size 1, gradient_checkpointing true: estimated "
                         r"reserved ([\d.]+) GiB \(allocated peak [\d.]+ GiB in (\w+)\) \+ 0 GiB reserve > 0\.5 GiB "
                         r"\(llm\.gpu_memory_gb\); (\w+) ([\d.e-]+) GiB of it: try (.+)", message)
    assert match, message
    from haepo_ray.sweep.kinds.llm.fit import estimate_keys

    smallest = _with(key, 1, True)
    grid = [_with(key, s, c) for s in micro_batch_sizes(key, workers=0) for c in (False, True)]
    estimates = estimate_keys(grid, prompt_tokens=256, workers=0)
    assert min(e.reserved_gib for e in estimates.values()) == estimates[smallest].reserved_gib
    assert int(match[1]) == len(micro_batch_sizes(key, workers=0))  # checkpointing on; off pruned
    est = estimates[smallest]
    assert float(match[2]) == float(f"{est.reserved_gib:.3g}") and match[3] == est.phase
    assert match[4] == max(est.categories, key=est.categories.get)
    assert float(match[5]) == float(f"{est.categories[match[4]]:.3g}")
    assert "micro_batch_size" not in match[6] and "gradient_checkpointing" not in match[6]


def test_fit_refuse_refuses_a_trial_over_its_gpu_as_before():
    with pytest.raises(SpecError, match=r"^fit\.yaml: trial 0 \(HAEPO, seed 0\): estimated reserved [\d.]+ GiB .* "
                                        rf"> {re.escape(f'{SOME:g}')} GiB \(llm\.gpu_memory_gb\); \w+ [\d.]+ GiB of it: try "):
        _fitted(SOME, fit="refuse")
    with pytest.raises(SpecError, match=r"llm\.fit"):
        parse_plan(_spec(gpu_memory_gb=SOME, fit="shrink"), "fit.yaml")


def test_a_trial_whose_memory_settings_optuna_suggests_plans_itself():
    spec = _spec(gpu_memory_gb=ONLY_BOTH)
    spec["search"] = {"algorithm": "optuna", "num_samples": 1}
    spec["search_space"] = {"group_size": {"choice": [3]}}
    del spec["settings"]["group_size"]
    plan = parse_plan(spec, "fit.yaml").fitted(Cluster.unknown())
    space = plan.param_space
    assert space[FIT_KEY] == {"mode": "auto", "accelerator": "a100-40gb"}
    config = check_own_fit({**plan.base_config, CONFIG_KEY: space[CONFIG_KEY], FIT_KEY: space[FIT_KEY],
                            "group_size": 3}, workers=0)
    settings = trial_settings(config)
    assert (settings.micro_batch_size, settings.gradient_checkpointing) == (1, True)
    assert config[FIT_KEY]["planned"] and config[CONFIG_KEY]["estimated_reserved_gib"] <= ONLY_BOTH
