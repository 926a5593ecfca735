"""GPUs by name: memory, peak dense bf16 FLOP/s and memory bandwidth (the vendors' data
sheets), and the time a simulated step would take on one (:func:`phase_seconds`).

The time model is a roofline with a stated efficiency: a phase takes its FLOPs at
``efficiency`` x the peak FLOP/s; generation takes at least the time to read every weight
once per new token (decoding one token at a time is bound by memory bandwidth, not FLOPs).
Neither counts kernel-launch and Python overheads, which dominate transformers' ``generate``
for small batches: a lower bound, not a prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from haepo_ray.llm.settings import LLMTrainSettings

if TYPE_CHECKING:
    from haepo_ray.llm.capacity.simulate import StepEstimate

__all__ = ["ACCELERATORS", "DEFAULT_ACCELERATOR", "EFFICIENCY", "RAY_ACCELERATOR_TYPES", "Accelerator",
           "phase_seconds", "run_seconds"]

EFFICIENCY = 0.4  # model FLOP utilisation assumed for training and prefill passes


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_gib: float  # as the device reports its total (nvidia-smi)
    bf16_flops: float  # dense peak, FLOP/s
    bandwidth: float  # bytes/s


ACCELERATORS: dict[str, Accelerator] = {
    "a100-40gb": Accelerator("A100 40GB", 40.0, 312e12, 1.555e12),
    "a100-80gb": Accelerator("A100 80GB", 80.0, 312e12, 2.039e12),
    "h100-80gb": Accelerator("H100 80GB SXM", 79.6, 989e12, 3.35e12),
    "h200": Accelerator("H200 141GB", 139.8, 989e12, 4.8e12),
    "l4": Accelerator("L4", 22.5, 121e12, 0.3e12),
}
DEFAULT_ACCELERATOR = "a100-40gb"  # the paper's
# Ray's accelerator_type resource (ray.util.accelerators) -> the table's name
RAY_ACCELERATOR_TYPES = {"A100-40G": "a100-40gb", "A100-80G": "a100-80gb", "H100": "h100-80gb", "H200": "h200",
                         "L4": "l4"}


def phase_seconds(estimate: StepEstimate, settings: LLMTrainSettings, accelerator: Accelerator,
                  efficiency: float = EFFICIENCY) -> dict[str, float]:
    """Each phase's time on ``accelerator`` (module docstring); ``settings`` those simulated."""
    from haepo_ray.llm.capacity.steps import generation_calls

    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    seconds = {name: p.flops / (accelerator.bf16_flops * efficiency) for name, p in estimate.phases.items()}
    decode_bytes = generation_calls(settings) * settings.max_new_tokens * estimate.weight_bytes
    seconds["generation"] = max(seconds["generation"], decode_bytes / accelerator.bandwidth)
    return seconds


def run_seconds(seconds: dict[str, float], settings: LLMTrainSettings) -> float:
    """A run's time: its SFT steps and RL updates at these phases' times."""
    update = sum(t for name, t in seconds.items() if name != "sft")
    return math.ceil(settings.sft_examples / settings.sft_batch) * seconds["sft"] + settings.rl_updates * update
