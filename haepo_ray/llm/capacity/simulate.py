"""One language-model trial's steps on fake tensors: peak memory and FLOPs per phase.

:func:`simulate` builds the model from its config under ``FakeTensorMode`` (shapes, dtypes,
no storage: no weights, no download, no GPU) and runs the trial's phases
(:func:`~haepo_ray.llm.capacity.steps.run_steps`: the trial's own ``Policy``, ``group_loss``,
``backward`` and optimiser), counted by :class:`~haepo_ray.llm.capacity.tracker.LiveBytes`.
Input checks that need values (NaN, empty completions, the groups' layout) are skipped on
fake tensors (:func:`haepo_ray.loss.is_fake`) and run in every real trial.

Generation. Transformers' ``generate`` stops on EOS, a choice made from values, so it cannot
run on fake tensors; :func:`_generate` runs the same forward passes and KV cache for a group
whose every completion runs to ``max_new_tokens``, n tokens after a prompt of P: the prefill,
the first decode step (context P + 1) and the last (context P + n - 1, on a cache grown to
P + n - 2). Memory grows with the context (the cache, the attention row), so the last step's
peak is every decode step's bound; a step's FLOPs are affine in its context, so the n - 1
decode steps make (n - 1)(first + last) / 2. The rows are one ``generate`` call's
(:func:`~haepo_ray.llm.capacity.steps.generation_rows`: one prompt's group, or every prompt's
with ``generation`` batch); generation's peak is one call's, its FLOPs every call's of an update.
With ``decoding`` static the cache is transformers' ``StaticCache``, allocated at the first
step for the padded prompt (:func:`~haepo_ray.llm.rollout.padded_prompt_width`) and every new
token, and every decode step attends over all of it: the first decode step's peak and FLOPs are
every step's. (CUDA graphs keep a decode step's intermediates in a pool of their own, which the
estimate does not count; ``bench/gpu_check.py`` measures what that adds.)

``target="cuda"`` counts as CUDA's caching allocator does (512-byte blocks), runs attention
through the kernel CUDA's ``scaled_dot_product_attention`` picks on an A100/H100 for these
inputs (memory-efficient attention: the batch's padding mask rules out flash attention) and
AdamW as torch runs it on CUDA where ``adamw`` is auto (the multi-tensor "foreach" step, whose
square root of the second moment is a temporary the size of the trainable weights); ``target="cpu"``
counts bytes exactly and keeps PyTorch's CPU kernels and AdamW's per-parameter step: the form the
real step is measured against on this machine (:mod:`haepo_ray.llm.capacity.measure`).
Precision ``mixed`` runs under the CPU's autocast on either target (the fake tensors are CPU
tensors): where CUDA's autocast casts an op differently, a ``cuda`` estimate follows the CPU's.
float16's loss scaling is off (it needs values, to find an inf; its tensors are scalars, and it
unscales the gradients in place).

Reserved memory. The tracker's allocation and free events are replayed through a model of
CUDA's caching allocator (:mod:`~haepo_ray.llm.capacity.allocator`): ``allocator_reserved``
is the most the allocator reserves over the whole step (SFT step and RL update),
``allocator_allocated`` the most it hands out (blocks, as ``torch.cuda.max_memory_allocated``
counts them). What is not in the step's tensors (the CUDA context, cuBLAS's workspaces, NCCL's
buffers, the all-reduce's flat gradient) is added by :func:`~haepo_ray.llm.capacity.estimate.estimate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from haepo_ray.llm.capacity.allocator import replay as replay_allocator
from haepo_ray.llm.capacity.replay import ReplayedStats
from haepo_ray.llm.capacity.steps import (
    PHASES,
    RL_PHASES,
    Shapes,
    generation_calls,
    generation_rows,
    group_sampling,
    run_steps,
)
from haepo_ray.llm.capacity.tracker import LiveBytes, PhasePeak, PhasePeaks
from haepo_ray.llm.policy import model_passes
from haepo_ray.llm.rollout import padded_prompt_width, sampling_kwargs
from haepo_ray.llm.settings import LLMTrainSettings, torch_dtype
from haepo_ray.upstream.torch import attention_swapped, efficient_attention, fake_mode, flash_attention
from haepo_ray.upstream.transformers import logits_processors

__all__ = ["RESERVED_PARTS", "TARGETS", "StepEstimate", "cuda_attention", "quiet", "simulate"]

TARGETS = {"cuda": 512, "cpu": 1}  # target -> allocation block in bytes
# the parts of StepEstimate.reserved_bytes
RESERVED_PARTS = ("allocator_reserved", "cublas_workspace_bytes", "allreduce_reserved_bytes", "cuda_context_bytes",
                  "nccl_buffer_bytes")


@dataclass(frozen=True)
class StepEstimate(PhasePeaks):
    """Peak live bytes and FLOPs per phase of one trial's steps (:data:`~.steps.PHASES`)."""

    algo: str
    target: str
    parameters: int  # the model's (without adapters)
    weight_bytes: int  # of those parameters
    trainable: int  # parameters the RL optimiser updates
    phases: dict[str, PhasePeak]
    trainable_bytes: int = 0  # of their gradients (the gradients' dtype is the parameters')
    allocator_reserved: int = 0  # the caching allocator's replayed peak reserved (module docstring)
    allocator_allocated: int = 0  # ... and peak allocated, in whole blocks
    # added by estimate(): one worker's memory outside the step's tensors
    workers: int = 1
    cuda_context_bytes: int = 0  # the CUDA context (not in PyTorch's reserved)
    cublas_workspace_bytes: int = 0  # cuBLAS's workspaces (through the caching allocator)
    allreduce_buffer_bytes: int = 0  # the flat gradient all-reduced when workers > 1
    allreduce_reserved_bytes: int = 0  # the segment that buffer needs (an upper bound: it may reuse a cached one)
    nccl_buffer_bytes: int = 0  # NCCL's communication buffers when workers > 1 (not in PyTorch's reserved)

    @property
    def allocated_bytes(self) -> int:
        """The most bytes allocated: the step's peak, cuBLAS's workspaces and the all-reduce's
        buffer (counted on top of the peak: an upper bound, since the buffer lives between the
        backward and the optimiser step)."""
        return self.peak_bytes + self.cublas_workspace_bytes + self.allreduce_buffer_bytes

    @property
    def torch_reserved_bytes(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` would report: the replayed allocator's
        reserve, cuBLAS's workspaces, the all-reduce buffer's segment."""
        return self.allocator_reserved + self.cublas_workspace_bytes + self.allreduce_reserved_bytes

    @property
    def reserved_bytes(self) -> int:
        """The GPU memory one worker takes: PyTorch's reserved, the CUDA context, NCCL's buffers."""
        return self.torch_reserved_bytes + self.cuda_context_bytes + self.nccl_buffer_bytes

    @property
    def update_flops(self) -> int:
        """FLOPs of one RL update (generation of every prompt, reference pass, update)."""
        return sum(self.phases[p].flops for p in RL_PHASES)

    def to_dict(self) -> dict[str, Any]:
        return {"algo": self.algo, "target": self.target, "parameters": self.parameters,
                "weight_bytes": self.weight_bytes, "trainable": self.trainable, "peak_phase": self.peak_phase, "peak_bytes": self.peak_bytes,
                "update_flops": self.update_flops, "allocated_bytes": self.allocated_bytes,
                "reserved_bytes": self.reserved_bytes, "torch_reserved_bytes": self.torch_reserved_bytes,
                "reserved": {name: getattr(self, name) for name in RESERVED_PARTS}, "workers": self.workers,
                "trainable_bytes": self.trainable_bytes, "allocator_allocated": self.allocator_allocated,
                "phases": {name: dataclasses.asdict(p) for name, p in self.phases.items()}}


def _cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``scaled_dot_product_attention`` as CUDA runs it (sm80+): flash attention without a mask
    in half precision, else memory-efficient attention on an additive mask (a bool mask is
    converted, as PyTorch does)."""
    if enable_gqa:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] <= 256:
        return flash_attention(query, key, value, dropout_p, is_causal, scale)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attn_mask, float("-inf"))
    if attn_mask is not None:
        attn_mask = attn_mask.expand(*query.shape[:-2], query.shape[-2], key.shape[-2])
    return efficient_attention(query, key, value, attn_mask, grad, dropout_p, is_causal, scale)


@contextlib.contextmanager
def cuda_attention(target: str) -> Iterator[None]:
    """``scaled_dot_product_attention`` as CUDA runs it (the kernel it picks and what that keeps
    for backward) while ``target`` is ``"cuda"``."""
    if target != "cuda":
        yield
        return
    with attention_swapped(_cuda_sdpa):
        yield


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Without two library warnings that a simulation raises and that say nothing of it: peft
    compares the embeddings' data pointers after merging an adapter (fake tensors have none;
    the tied embeddings stay tied), and transformers deprecates the name peft asks for
    gradient checkpointing by."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor", category=UserWarning)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def _tracked_cache(model: Any, tracker: LiveBytes, static_length: int | None = None) -> Any:
    """A ``DynamicCache``, or a ``StaticCache`` of ``static_length`` positions, whose tensors
    count as ``kv_cache``."""
    from transformers import DynamicCache, StaticCache

    base = DynamicCache if static_length is None else StaticCache

    class TrackedCache(base):
        def update(self, *args: Any, **kwargs: Any) -> Any:
            with tracker.category("kv_cache"):
                return super().update(*args, **kwargs)

    if static_length is None:
        return TrackedCache(config=model.config)
    return TrackedCache(config=model.config, max_cache_len=static_length)


def _cache_argument(model: Any) -> str:
    """The forward's name for the KV cache: ``past_key_values`` up to transformers 5.17 (the GPU
    image's), ``cache`` by 5.24 (the lock's); one passed by the other name is silently ignored."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def _generate(model: Any, settings: LLMTrainSettings, prompt_tokens: int, tracker: LiveBytes) -> None:
    """One ``generate`` call's sampling with the KV cache, as the module docstring says: each step
    as transformers' ``_sample`` takes it (float32 logits, processors, softmax, multinomial), its
    loop variables alive from one step until the next reassigns them."""
    rows, n = generation_rows(settings), settings.max_new_tokens
    sampling = group_sampling(model, settings)
    static = settings.decoding == "static"
    padding = padded_prompt_width(prompt_tokens, settings.decoding) - prompt_tokens  # masked, as in a trial
    prompt_tokens += padding
    cache = _tracked_cache(model, tracker, prompt_tokens + n if static else None)
    loop = SimpleNamespace(input_ids=torch.zeros(rows, prompt_tokens, dtype=torch.long))  # the rows so far
    processors = logits_processors(model, sampling_kwargs(**sampling), loop.input_ids)
    unfinished = torch.ones(rows, dtype=torch.long)
    cache_kwargs = {_cache_argument(model): cache}

    def step(ids: torch.Tensor) -> None:
        mask = torch.ones(loop.input_ids.shape, dtype=torch.long)
        mask[:, :padding] = 0
        logits = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **cache_kwargs).logits
        loop.next_token_logits = logits[:, -1].to(copy=True, dtype=torch.float32)
        loop.next_token_scores = processors(loop.input_ids, loop.next_token_logits)
        loop.probs = torch.softmax(loop.next_token_scores, dim=-1)
        next_tokens = torch.multinomial(loop.probs, num_samples=1).squeeze(1)
        loop.next_tokens = next_tokens * unfinished + sampling["pad_token_id"] * (1 - unfinished)
        loop.input_ids = torch.cat([loop.input_ids, loop.next_tokens[:, None]], dim=-1)

    step(loop.input_ids)  # the prefill
    if n == 1:
        return
    with tracker.watermark() as first:
        step(loop.next_tokens[:, None])
    if static:  # every decode step as the first: the same cache, attended whole
        tracker.add_flops((n - 2) * first.flops)
        return
    if n == 2:
        return
    with tracker.category("kv_cache"):  # the cache before the last step: P + n - 2 positions
        for layer in cache.layers:
            layer.keys = layer.keys.new_zeros(*layer.keys.shape[:-2], prompt_tokens + n - 2, layer.keys.shape[-1])
            layer.values = layer.values.new_zeros(*layer.values.shape[:-2], prompt_tokens + n - 2,
                                                  layer.values.shape[-1])
    loop.input_ids = loop.input_ids.new_zeros(rows, prompt_tokens + n - 1)
    with tracker.watermark() as last:
        step(loop.next_tokens[:, None])
    tracker.add_flops((n - 1) * (first.flops + last.flops) // 2 - first.flops - last.flops)


def simulate(settings: LLMTrainSettings, config: Any, shapes: Shapes, *, target: str = "cuda",
             replay: bool = True) -> StepEstimate:
    """Peak memory and FLOPs of each phase of a trial with ``settings`` on the model ``config``
    (a transformers config), prompts and completions as ``shapes`` say, on ``target``
    (``"cuda"`` or ``"cpu"``); module docstring. ``replay``: repeated micro-batch passes are
    replayed (:mod:`~haepo_ray.llm.capacity.replay`), not run."""
    from transformers import AutoModelForCausalLM

    if target not in TARGETS:
        raise ValueError(f"target must be one of {sorted(TARGETS)}, got {target!r}")
    settings = dataclasses.replace(settings, device="cpu")
    tracker = LiveBytes(TARGETS[target])
    with quiet(), fake_mode(), cuda_attention(target), tracker:
        with tracker.category("parameters"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(settings.weights_dtype)).eval()
        parameters = sum(p.numel() for p in model.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        stats = ReplayedStats(tracker, model_passes(settings)) if replay else None
        policy = run_steps(model, settings, shapes, tracker,
                           lambda m: _generate(m, settings, shapes.prompt_tokens, tracker), stats,
                           foreach=True if target == "cuda" else None, loss_scaling=False)
        if replay:
            stats.close()
        trainable = sum(p.numel() for p in policy.trainable())
        grad_size = max((p.element_size() for p in policy.trainable()), default=0)  # torch.cat's promoted dtype
    allocator = replay_allocator(tracker.events)
    peaks = dict(tracker.peaks)
    generation = peaks["generation"]  # one generate call was run
    peaks["generation"] = dataclasses.replace(generation, flops=generation.flops * generation_calls(settings))
    return StepEstimate(settings.algo, target, parameters, weight_bytes, trainable, {p: peaks[p] for p in PHASES},
                        trainable_bytes=trainable * grad_size, allocator_reserved=allocator.reserved,
                        allocator_allocated=allocator.peak_allocated)
