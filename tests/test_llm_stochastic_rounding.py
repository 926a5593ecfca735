"""AdamW on pure bfloat16 weights with stochastic rounding (haepo_ray.llm.stochastic_rounding):
each step is torch's float32 step rounded to one of its two bfloat16 neighbours, the expected
weight is the float32 one where rounding to nearest loses the step, and the rounding depends on
the seed and the step alone (not on chunking, not on a generator's state)."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from haepo_ray.llm import stochastic_rounding
from haepo_ray.llm.policy import Policy
from haepo_ray.llm.settings import LLMTrainSettings
from haepo_ray.llm.stochastic_rounding import StochasticRoundingAdamW, random_bits, stochastic_round


def _neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``x``'s bfloat16 neighbours towards and away from zero (both ``x`` where exact)."""
    bits = x.view(torch.int32)
    towards = bits & -65536
    away = torch.where(bits & 0xFFFF == 0, towards, towards + 65536)
    return towards.view(torch.float32), away.view(torch.float32)


def _values() -> torch.Tensor:
    """float32 values of both signs over many binades, some exactly bfloat16."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4000, generator=generator) * torch.logspace(-6, 3, 4000)
    return torch.cat([x, -x, x.bfloat16().float(), torch.tensor([0.0, 1.0, -2.0])])


def test_stochastic_rounding_gives_a_neighbour_and_keeps_exact_values():
    x = _values()
    towards, away = _neighbours(x)
    for key in range(5):
        rounded = stochastic_round(x, random_bits(key, 0, x.numel(), "cpu")).float()
        assert ((rounded == towards) | (rounded == away)).all()
    exact = x.bfloat16().float()
    assert torch.equal(stochastic_round(exact, random_bits(0, 0, x.numel(), "cpu")).float(), exact)


def test_stochastic_rounding_is_unbiased():
    x = _values()[:200]
    towards, away = _neighbours(x)
    draws = torch.stack([stochastic_round(x, random_bits(key, 0, x.numel(), "cpu")).double() for key in range(4000)])
    p_away = (x.double() - towards.double()) / (away.double() - towards.double()).where(away != towards, 1.0)
    spread = (away.double() - towards.double()).abs() * (p_away * (1 - p_away)).sqrt() / math.sqrt(len(draws))
    error = (draws.mean(0) - x.double()).abs()
    assert (error <= 5 * spread + 1e-300).all()  # within 5 standard errors of the mean, every value
    assert (error[spread == 0] == 0).all()  # exact values always


def _fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser, in Python's integers."""
    h ^= h >> 16
    h = h * 0x85EBCA6B % 2 ** 32
    h ^= h >> 13
    h = h * 0xC2B2AE35 % 2 ** 32
    return h ^ (h >> 16)


def test_the_random_bits_are_murmurhash3s_finaliser_of_key_plus_index():
    """int32 tensor arithmetic (wrapping products, masked shifts) against Python's integers."""
    key, start = 0xFFFFFF00, 2 ** 31 - 100  # key + index passes 2**31 and 2**32 in the range
    bits = random_bits(key, start, 300, "cpu")
    expected = [_fmix32((key + start + i) % 2 ** 32) % 2 ** 16 for i in range(300)]
    assert bits.tolist() == expected


def test_the_random_bits_are_uniform_and_a_function_of_key_and_index():
    bits = random_bits(7, 0, 2 ** 18, "cpu")
    assert bits.dtype == torch.int32 and 0 <= int(bits.min()) and int(bits.max()) < 2 ** 16
    counts = torch.bincount(bits.long() >> 12, minlength=16).double()  # 16 bins of 4096 values
    expected = bits.numel() / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 37.7  # chi-square, 15 dof, p = 0.001
    assert torch.equal(random_bits(7, 1000, 500, "cpu"), bits[1000:1500])  # any chunk of the stream
    assert not torch.equal(random_bits(8, 0, 500, "cpu"), bits[:500])


def _parameter(values: torch.Tensor, gradient: torch.Tensor) -> torch.nn.Parameter:
    p = torch.nn.Parameter(values.clone())
    p.grad = gradient.clone()
    return p


def _lm_like(n: int = 50_000) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    weights = torch.cat([0.02 * torch.randn(n, generator=generator), torch.ones(n // 10)]).bfloat16()
    return weights, (1e-3 * torch.randn(weights.shape, generator=generator)).bfloat16()


@pytest.mark.parametrize("options", [{"lr": 1e-4}, {"lr": 1e-3, "weight_decay": 0.5, "betas": (0.8, 0.99), "eps": 1e-3}])
def test_a_step_is_torchs_float32_adamw_step_rounded_to_one_of_its_neighbours(options):
    weights, gradient = _lm_like()
    exact = _parameter(weights.float(), gradient.float())
    reference = torch.optim.AdamW([exact], foreach=False, **options)
    reference.step()
    towards, away = _neighbours(exact.detach())
    steps = []
    for seed in range(16):
        ours = _parameter(weights, gradient)
        optimizer = StochasticRoundingAdamW([ours], seed=seed, **options)
        optimizer.step()
        new = ours.detach().float()
        assert ((new == towards) | (new == away)).all()
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(optimizer.state[ours][moment], reference.state[exact][moment].bfloat16(),
                                       rtol=0, atol=0)
        steps.append(new.double() - weights.double())
    assert (towards != away).any()  # (the float32 step is not all bfloat16 values)
    # the mean step over the seeds and entries is the float32 one's, within 5 standard errors
    spacing = (away.double() - towards.double()).abs()
    error = float((torch.stack(steps).mean(0) - (exact.detach().double() - weights.double())).mean())
    assert abs(error) < 5 * float(spacing.square().sum().sqrt()) / 2 / math.sqrt(16) / weights.numel()


def test_steps_below_half_the_spacing_move_the_weights_in_expectation_where_rounding_to_nearest_loses_them():
    weights = torch.ones(20_000, dtype=torch.bfloat16)  # spacing 2**-7 above 1, 2**-8 below
    nearest, stochastic, exact = (_parameter(weights.to(dtype), torch.zeros_like(weights, dtype=dtype))
                                  for dtype in (torch.bfloat16, torch.bfloat16, torch.float32))
    optimizers = (torch.optim.AdamW([nearest], lr=1e-4), StochasticRoundingAdamW([stochastic], lr=1e-4, seed=0),
                  torch.optim.AdamW([exact], lr=1e-4))
    generator = torch.Generator().manual_seed(2)
    for _ in range(10):
        gradient = torch.rand(weights.shape, generator=generator) + 0.5  # positive: every step is -lr or so
        for p, optimizer in zip((nearest, stochastic, exact), optimizers, strict=True):
            p.grad = gradient.to(p.dtype)
            optimizer.step()
    assert torch.equal(nearest.detach(), weights)  # ten steps of about 1e-4, each lost
    moved = float(1 - exact.detach().double().mean())
    assert 9e-4 < moved < 1.1e-3
    # each weight ends at 1 or 1 - 2**-8 (a standard deviation of 2**-9 at most): the mean within 5 standard errors
    error = float(stochastic.detach().double().mean() - exact.detach().double().mean())
    assert abs(error) < 5 * 2 ** -9 / math.sqrt(weights.numel())


def test_the_rounding_depends_on_the_seed_and_the_steps_only(monkeypatch):
    weights, gradient = _lm_like()

    def run(seed: int, steps: int, optimizer_state=None) -> tuple[torch.Tensor, dict]:
        p = _parameter(weights, gradient)
        optimizer = StochasticRoundingAdamW([p], lr=1e-4, seed=seed)
        if optimizer_state is not None:
            p.data.copy_(optimizer_state[0])
            optimizer.load_state_dict(optimizer_state[1])
        for _ in range(steps):
            p.grad = gradient.clone()
            optimizer.step()
        return p.detach().clone(), copy.deepcopy(optimizer.state_dict())

    four, _ = run(0, 4)
    assert torch.equal(run(0, 4)[0], four)
    assert not torch.equal(run(1, 4)[0], four)
    assert torch.equal(run(0, 2, run(0, 2))[0], four)  # continued from a checkpoint of its state
    monkeypatch.setattr(stochastic_rounding, "CHUNK", 999)  # a parameter stepped in 61 chunks
    assert torch.equal(run(0, 4)[0], four)


def test_an_empty_parameter_is_stepped_beside_the_others():
    empty, weights = (_parameter(torch.zeros(n, dtype=torch.bfloat16), torch.ones(n, dtype=torch.bfloat16))
                      for n in (0, 5))
    StochasticRoundingAdamW([empty, weights], lr=1e-3, seed=0).step()
    assert empty.numel() == 0 and (weights.detach() < 0).all()


def test_only_bfloat16_parameters_are_taken():
    with pytest.raises(ValueError, match="rounds to bfloat16: a parameter is torch.float32"):
        StochasticRoundingAdamW([torch.nn.Parameter(torch.zeros(3))], lr=1e-3, seed=0)


def test_a_policy_with_stochastic_rounding_uses_it_and_does_not_warn_of_lost_steps(tiny_lm):
    model, _ = tiny_lm
    settings = LLMTrainSettings(algo="GRPO", model="tiny", dtype="bfloat16", lr=5e-5, rounding="stochastic")
    policy = Policy(copy.deepcopy(model).bfloat16(), settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rounding to nearest warns here (test_llm_precision.py)
        policy.start_sft()
        sft = policy.optimizer
        policy.start_rl()
    assert isinstance(policy.optimizer, StochasticRoundingAdamW)
    assert (sft.param_groups[0]["seed"], policy.optimizer.param_groups[0]["seed"]) == (0, 1)  # SFT's bits, RL's


def test_lora_adapters_on_bfloat16_weights_train_in_float32_where_rounding_is_refused(tiny_lm):
    """The premise of the settings' refusal of rounding 'stochastic' with lora_r > 0: peft keeps the
    adapters in float32, whose steps are not lost, and a pure bfloat16 LoRA run does not warn."""
    model, _ = tiny_lm
    settings = LLMTrainSettings(model="tiny", dtype="bfloat16", lora_r=2, lr=5e-5, sft_lr=5e-5)
    policy = Policy(copy.deepcopy(model).bfloat16(), settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        policy.start_sft()
    assert {p.dtype for p in policy.trainable()} == {torch.float32}
    with pytest.raises(ValueError, match="LoRA's adapters, which peft keeps in float32"):
        LLMTrainSettings(model="tiny", dtype="bfloat16", lora_r=2, rounding="stochastic")
