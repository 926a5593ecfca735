"""TRL's own GRPO step (haepo_ray.llm.capacity.trl_grpo) on the simulator against the same step
measured by PyTorch's profiler on the CPU, on the tiny model."""

from __future__ import annotations

import pytest
import torch

from haepo_ray.llm.capacity.steps import Shapes
from haepo_ray.llm.capacity.trl_grpo import grpo_args, measure_trl, simulate_trl

SHAPES = Shapes(prompt_tokens=12, completion_tokens=6)
CASES = {  # name -> (beta, GRPOConfig overrides); each on 2 micro-batches of 2 rows, a group of 4
    "beta 0": (0.0, {}),
    "reference and old policy": (0.04, {"num_iterations": 2}),
    "checkpointing": (0.0, {"gradient_checkpointing": True}),
}
# Simulated (target="cpu") against measured, each phase's peak, over CASES: the worst deviation
# measured 2026-11-26 (trl 1.16.0, torch 2.13.0+cpu) is -0.063% (forward_backward, checkpointing),
# of what a phase adds to the bytes it began with -0.086%. The issue asks for 10%.
TOLERANCE = 0.10


def _args(**overrides):
    return grpo_args(**{"per_device_train_batch_size": 2, "num_generations": 4, "gradient_accumulation_steps": 2,
                        "max_completion_length": SHAPES.completion_tokens, "bf16": False,
                        "gradient_checkpointing": False, **overrides})


@pytest.fixture(scope="module")
def tiny_config():
    from haepo_ray.llm.capacity.model_configs import tiny_config

    return tiny_config(vocab_size=4096)  # a vocabulary ~64x the hidden size, as real LMs' (SmolLM2: 85x)


@pytest.fixture(scope="module")
def steps(tiny_config):
    """(simulated, measured) TRL step of a case, each run once for the module's tests."""
    runs = {}

    def run(case: str):
        if case not in runs:
            beta, overrides = CASES[case]
            args = _args(**overrides)
            runs[case] = (simulate_trl(args, tiny_config, SHAPES, dtype=torch.float32, beta=beta, target="cpu"),
                          measure_trl(args, tiny_config, SHAPES, dtype=torch.float32, beta=beta))
        return runs[case]

    return run


@pytest.mark.parametrize("case", CASES)
def test_the_simulated_trl_step_matches_the_measured_one(steps, case):
    simulated, measured = steps(case)
    assert set(simulated.phases) == set(measured)
    for phase, sim in simulated.phases.items():
        real = measured[phase]
        assert sim.start_bytes == real.start_bytes, phase
        assert sim.peak_bytes == pytest.approx(real.peak_bytes, rel=TOLERANCE), phase
        own, real_own = sim.peak_bytes - sim.start_bytes, real.peak_bytes - real.start_bytes
        assert real_own > 0 and own == pytest.approx(real_own, rel=TOLERANCE), phase


def test_the_reference_and_the_old_policy_are_counted_only_when_trl_runs_them(steps, tiny_config):
    from transformers import AutoModelForCausalLM

    weights = sum(p.numel() * p.element_size() for p in AutoModelForCausalLM.from_config(tiny_config).parameters())
    plain, _ = steps("beta 0")
    both, _ = steps("reference and old policy")
    assert set(plain.phases) == {"forward_backward", "optimizer"}
    assert set(both.phases) == {"old_policy", "reference", "forward_backward", "optimizer"}
    assert plain.phases["forward_backward"].categories["parameters"] == weights
    assert both.phases["forward_backward"].categories["parameters"] == 2 * weights  # TRL's second copy


def test_the_cuda_target_folds_trl_tiles_in_place(tiny_config):
    """On CUDA TRL's Triton kernels fold each logits tile in place: no fp32 copies of the tile
    in the backward, which its torch folds (the CPU's) make."""
    args = _args()
    cpu = simulate_trl(args, tiny_config, SHAPES, dtype=torch.float32, beta=0.0, target="cpu")
    cuda = simulate_trl(args, tiny_config, SHAPES, dtype=torch.float32, beta=0.0, target="cuda")
    tile = 2 * (SHAPES.prompt_tokens + SHAPES.completion_tokens - 1) * tiny_config.vocab_size * 4  # fp32 [2(P+T-1), V]
    temporaries = [step.phases["forward_backward"].categories["temporaries"] for step in (cpu, cuda)]
    assert temporaries[0] - temporaries[1] >= tile
