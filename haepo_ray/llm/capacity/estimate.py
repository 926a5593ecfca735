"""A trial's estimate: the simulation of one of its workers, cached by what changes memory.

A trial on W Ray Train workers runs a whole copy of the model on each, and each worker takes
1/W of an update's prompts and of an SFT step's rows (:mod:`haepo_ray.llm.distributed`):
:func:`estimate` simulates worker 0 (the largest share). Only :data:`MEMORY_FIELDS` of the
settings change what is simulated; trials that differ in seed, learning rate or betas share
one simulation (:func:`estimate` is cached in the process, and on disk: :mod:`~.stored`).

Lengths: prompts of ``prompt_tokens`` (default :data:`PROMPT_TOKENS`: ACLSum's prompts at
``max_source_words`` 300 reach 435 tokens with SmolLM2's tokenizer), completions and gold
summaries of ``max_new_tokens`` (ACLSum's gold summaries reach 48 tokens, the default).

Reserved memory (``target="cuda"``). Beside the step's tensors and the caching allocator's
reserve of them (:mod:`~haepo_ray.llm.capacity.allocator`), a worker's GPU holds, each part a
field of the estimate with its source here:

- the CUDA context, :data:`CUDA_CONTEXT_BYTES`; not in PyTorch's reserved bytes;
- cuBLAS's workspaces, :data:`CUBLAS_WORKSPACE_BYTES` for each of :data:`CUBLAS_HANDLES`;
  PyTorch takes them from its caching allocator, each a segment of its own, never freed;
- with W > 1 workers, the flat gradient that :meth:`~haepo_ray.llm.distributed.World.sum_gradients`
  all-reduces (the trainable parameters in their gradients' dtype; counted on top of the
  allocated peak, and as a segment of its own on top of the reserve: upper bounds), and NCCL's
  buffers, :data:`NCCL_BUFFSIZE` for each of :data:`NCCL_CHANNELS` channels and each of the
  ring's 2 peers; not in PyTorch's reserved bytes.

The CUDA context is measured on an H100 by ``bench/gpu_check.py``, which also checks the
allocator's part; the other constants are figures from the sources named.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from haepo_ray.llm.capacity.model_configs import model_config
from haepo_ray.llm.settings import MEMORY_FIELDS, LLMTrainSettings

if TYPE_CHECKING:
    from haepo_ray.llm.capacity.simulate import StepEstimate

__all__ = ["CUBLAS_HANDLES", "CUBLAS_WORKSPACE_BYTES", "CUDA_CONTEXT_BYTES", "MEMORY_FIELDS", "NCCL_BUFFSIZE",
           "NCCL_CHANNELS", "PROMPT_TOKENS", "estimate", "key_settings", "memory_key"]

MIB = 2**20
# The CUDA context of a PyTorch process (driver state, loaded kernels, libraries' own buffers),
# with lazy module loading (PyTorch's default): measured by bench/gpu_check.py as the device's
# used memory beyond PyTorch's reserve after a Qwen2.5-1.5B step, 772.8 to 774.8 MiB over 13
# steps on an H100 80GB HBM3 (torch 2.11+cu130, driver 580.159; 2026-11-26), rounded up to the
# MiB. Smaller figures are reported for other GPUs (~300-430 MiB: pytorch/pytorch#107667,
# #109888; unslothai/unsloth-zoo#1053); the largest measured is taken.
CUDA_CONTEXT_BYTES = 775 * MIB
# PyTorch's cuBLAS workspace per (handle, stream) when CUBLAS_WORKSPACE_CONFIG is unset
# (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize): ":4096:8", 8 x 4096 KiB
# = 32 MiB on sm90 (H100, H200); 2 x 4096 KiB + 8 x 16 KiB on older GPUs. The larger is taken.
# It comes from the caching allocator (getNewWorkspace), and cuBLASLt shares it
# (TORCH_CUBLASLT_UNIFIED_WORKSPACE, on by default).
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 8
# cuBLAS handles are per thread (a thread-local pool): the forward passes run on the main
# thread, the backward passes on the autograd engine's thread for the device.
CUBLAS_HANDLES = 2
# NCCL's buffer per channel and peer for the Simple protocol: NCCL_BUFFSIZE, default 4194304
# (NCCL's environment-variable documentation; NVIDIA/nccl#391: "the default NCCL_BUFFSIZE is
# 4MB"); each channel has its own (NVIDIA/nccl#1450).
NCCL_BUFFSIZE = 4 * MIB
# Channels NCCL opens between two H100s of one node (NVIDIA/nccl#1685: 32 per pair). NCCL's
# other protocols (LL, LL128) and its own state add more (NVIDIA/nccl#864 saw ~1.6 GB for one
# communicator after an all-reduce): a lower bound.
NCCL_CHANNELS = 32
NCCL_RING_PEERS = 2  # a ring's previous and next worker

PROMPT_TOKENS = 512


def memory_key(settings: LLMTrainSettings) -> tuple:
    """The values of :data:`MEMORY_FIELDS`: trials with the same key have the same estimate."""
    return tuple(getattr(settings, name) for name in MEMORY_FIELDS)


def key_settings(values: Mapping[str, Any]) -> LLMTrainSettings:
    """Settings of :data:`MEMORY_FIELDS` ``values``, the others their defaults but beta_kl 0
    where ``reference`` is none (which needs it; beta_kl changes no memory)."""
    values = {name: values[name] for name in MEMORY_FIELDS}
    return LLMTrainSettings(**values, **({"beta_kl": 0.0} if values["reference"] == "none" else {}))


def estimate(settings: LLMTrainSettings, *, prompt_tokens: int = PROMPT_TOKENS, workers: int = 1,
             target: str = "cuda") -> StepEstimate:
    """The simulated steps of worker 0 of a trial with ``settings`` on ``workers`` workers.
    ValueError for an unknown model, a batch that does not split over the workers, or prompts
    and completions that overrun the model's context."""
    if workers < 1 or settings.batch_prompts % workers:
        raise ValueError(f"batch_prompts ({settings.batch_prompts}) must be a multiple of the workers ({workers})")
    return _cached(memory_key(settings), prompt_tokens, workers, target)


@functools.lru_cache(maxsize=128)
def _cached(key: tuple, prompt_tokens: int, workers: int, target: str) -> StepEstimate:
    from haepo_ray.llm.capacity.simulate import simulate
    from haepo_ray.llm.capacity.steps import Shapes
    from haepo_ray.llm.capacity.stored import simulation_key, stored_simulation
    from haepo_ray.llm.rollout import context_problem

    settings = key_settings(dict(zip(MEMORY_FIELDS, key, strict=True)))
    worker = dataclasses.replace(settings, batch_prompts=settings.batch_prompts // workers,
                                 sft_batch=math.ceil(settings.sft_batch / workers))
    shapes = Shapes(prompt_tokens, settings.max_new_tokens)
    config = model_config(settings.model)
    if problem := context_problem(config, settings.max_new_tokens, prompt_tokens):
        raise ValueError(problem)  # a step no trial can take
    est = stored_simulation(simulation_key(key, prompt_tokens, workers, target, config),
                            lambda: simulate(worker, config, shapes, target=target))
    return with_overheads(est, workers)


def with_overheads(est: StepEstimate, workers: int) -> StepEstimate:
    """``est`` (one worker's simulated step) with what a worker of ``workers`` holds beside its
    tensors (module docstring); on the CPU target only the all-reduce's buffer."""
    from haepo_ray.llm.capacity.allocator import round_size, segment_size

    cuda = est.target == "cuda"
    multi = workers > 1
    flat = est.trainable_bytes if multi else 0
    return dataclasses.replace(
        est, workers=workers, cuda_context_bytes=CUDA_CONTEXT_BYTES if cuda else 0,
        cublas_workspace_bytes=CUBLAS_HANDLES * CUBLAS_WORKSPACE_BYTES if cuda else 0,
        allreduce_buffer_bytes=flat, allreduce_reserved_bytes=segment_size(round_size(flat)) if flat else 0,
        nccl_buffer_bytes=NCCL_BUFFSIZE * NCCL_CHANNELS * NCCL_RING_PEERS if cuda and multi else 0)
