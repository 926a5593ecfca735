"""A trial's estimate: the simulation of one of its workers, cached by what changes memory.

A trial on W Ray Train workers runs a whole copy of the model on each, and each worker takes
1/W of an update's prompts and of an SFT step's rows (:mod:`haepo_ray.llm.distributed`):
:func:`estimate` simulates worker 0 (the largest share). Only :data:`MEMORY_FIELDS` of the
settings change what is simulated; trials that differ in seed, learning rate or betas share
one simulation (:func:`estimate` is cached in the process).

Lengths: prompts of ``prompt_tokens`` (default :data:`PROMPT_TOKENS`: ACLSum's prompts at
``max_source_words`` 300 reach 435 tokens with SmolLM2's tokenizer), completions and gold
summaries of ``max_new_tokens`` (ACLSum's gold summaries reach 48 tokens, the default).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

from haepo_ray.llm.capacity.model_configs import model_config
from haepo_ray.llm.settings import LLMTrainSettings

if TYPE_CHECKING:
    from haepo_ray.llm.capacity.simulate import StepEstimate

__all__ = ["MEMORY_FIELDS", "PROMPT_TOKENS", "estimate", "memory_key"]

PROMPT_TOKENS = 512
MEMORY_FIELDS: tuple[str, ...] = (
    "model", "algo", "dtype", "batch_prompts", "group_size", "sft_batch", "max_new_tokens", "micro_batch_size",
    "gradient_checkpointing", "lora_r", "lora_target_modules",
)


def memory_key(settings: LLMTrainSettings) -> tuple:
    """The values of :data:`MEMORY_FIELDS`: trials with the same key have the same estimate."""
    return tuple(getattr(settings, name) for name in MEMORY_FIELDS)


def estimate(settings: LLMTrainSettings, *, prompt_tokens: int = PROMPT_TOKENS, workers: int = 1,
             target: str = "cuda") -> StepEstimate:
    """The simulated steps of worker 0 of a trial with ``settings`` on ``workers`` workers.
    ValueError for an unknown model or a batch that does not split over the workers."""
    if workers < 1 or settings.batch_prompts % workers:
        raise ValueError(f"batch_prompts ({settings.batch_prompts}) must be a multiple of the workers ({workers})")
    return _cached(memory_key(settings), prompt_tokens, workers, target)


@functools.lru_cache(maxsize=128)
def _cached(key: tuple, prompt_tokens: int, workers: int, target: str) -> StepEstimate:
    from haepo_ray.llm.capacity.simulate import simulate
    from haepo_ray.llm.capacity.steps import Shapes

    settings = LLMTrainSettings(**dict(zip(MEMORY_FIELDS, key, strict=True)))
    worker = dataclasses.replace(settings, batch_prompts=settings.batch_prompts // workers,
                                 sft_batch=math.ceil(settings.sft_batch / workers))
    shapes = Shapes(prompt_tokens, settings.max_new_tokens)
    return simulate(worker, model_config(settings.model), shapes, target=target)
