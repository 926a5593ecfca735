"""The reserved-memory estimate: the caching allocator's model on hand-worked event sequences
(each expected figure worked out from the rules in haepo_ray/llm/capacity/allocator.py's
docstring), and a worker's parts beside its tensors."""

from __future__ import annotations

import dataclasses

import pytest

from haepo_ray.llm.capacity.allocator import replay
from haepo_ray.llm.capacity.estimate import (
    CUBLAS_HANDLES,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    NCCL_BUFFSIZE,
    NCCL_CHANNELS,
    estimate,
)
from haepo_ray.llm.settings import LLMTrainSettings

KIB, MIB = 2**10, 2**20


def _run(*steps):
    """("a", key, bytes) allocates, ("f", key) frees."""
    return replay((s[1], s[2] if s[0] == "a" else None) for s in steps)


def test_a_freed_small_block_is_reused_for_the_next_small_request():
    # 600 KiB <= 1 MiB: a 2 MiB small segment, split; freed, it merges back to 2 MiB and holds 700 KiB
    a = _run(("a", 1, 600 * KIB), ("f", 1), ("a", 2, 700 * KIB))
    assert (a.segments, a.reserved, a.allocated) == ([2 * MIB], 2 * MIB, 700 * KIB)


def test_small_requests_share_a_segment_and_are_rounded_to_512_bytes():
    # 100 B -> 512 B, 1000 B -> 1024 B, both from one 2 MiB segment
    a = _run(("a", 1, 100), ("a", 2, 1000))
    assert (a.segments, a.allocated) == ([2 * MIB], 512 + 1024)


def test_a_request_under_10_mib_takes_a_20_mib_segment_and_splits_it():
    a = _run(("a", 1, 5 * MIB))
    assert (a.segments, a.reserved, a.allocated) == ([20 * MIB], 20 * MIB, 5 * MIB)  # 15 MiB split off
    # 5 + 5 MiB split off one 20 MiB segment; 9 MiB from the last 10 MiB leaves 1 MiB, not more:
    # not split, the whole 10 MiB block is handed out
    a = _run(("a", 1, 5 * MIB), ("a", 2, 5 * MIB), ("a", 3, 9 * MIB))
    assert (a.segments, a.reserved, a.allocated) == ([20 * MIB], 20 * MIB, 20 * MIB)


def test_a_request_of_10_mib_or_more_gets_its_size_rounded_to_2_mib():
    assert _run(("a", 1, 30 * MIB)).segments == [30 * MIB]
    assert _run(("a", 1, 31 * MIB)).segments == [32 * MIB]


def test_a_freed_large_block_serves_a_smaller_large_request():
    # two 12 MiB segments; one freed serves 10 MiB (remainder 2 MiB > 1 MiB: split)
    a = _run(("a", 1, 12 * MIB), ("a", 2, 12 * MIB), ("f", 1), ("a", 3, 10 * MIB))
    assert (a.segments, a.reserved, a.allocated) == ([12 * MIB, 12 * MIB], 24 * MIB, 22 * MIB)


def test_a_large_block_is_not_split_for_a_remainder_of_1_mib_or_less():
    # 11.5 MiB from a free 12 MiB block: remainder 0.5 MiB <= 1 MiB, the whole block is handed out
    a = _run(("a", 1, 12 * MIB), ("f", 1), ("a", 2, 23 * MIB // 2))
    assert (a.reserved, a.allocated) == (12 * MIB, 12 * MIB)


def test_the_smallest_free_block_that_fits_is_used():
    # free 16 and 12 MiB blocks: 11 MiB takes the 12 (best fit), 15 MiB then the 16: no new segment.
    # First fit (the 16 for 11 MiB) would need a new 16 MiB segment for 15 MiB.
    a = _run(("a", 1, 16 * MIB), ("a", 2, 12 * MIB), ("f", 1), ("f", 2), ("a", 3, 11 * MIB), ("a", 4, 15 * MIB))
    assert (a.segments, a.reserved) == ([16 * MIB, 12 * MIB], 28 * MIB)


def test_freed_neighbours_merge_into_one_block():
    # two 5 MiB blocks of one 20 MiB segment, both freed: one 20 MiB block again, which holds 18 MiB
    a = _run(("a", 1, 5 * MIB), ("a", 2, 5 * MIB), ("f", 1), ("f", 2), ("a", 3, 18 * MIB))
    assert (a.segments, a.reserved) == ([20 * MIB], 20 * MIB)


def test_small_and_large_pools_do_not_share_blocks():
    # a free 12 MiB large block does not serve 100 B: a 2 MiB small segment is reserved
    a = _run(("a", 1, 12 * MIB), ("f", 1), ("a", 2, 100))
    assert a.segments == [12 * MIB, 2 * MIB]


SETTINGS = dict(model="tiny", algo="GRPO", group_size=2, max_new_tokens=8, micro_batch_size=1)


def test_a_second_worker_adds_the_all_reduce_buffer_and_nccls_buffers():
    one = estimate(LLMTrainSettings(**SETTINGS, batch_prompts=2, sft_batch=2), prompt_tokens=32)
    two = estimate(LLMTrainSettings(**SETTINGS, batch_prompts=4, sft_batch=4), prompt_tokens=32, workers=2)
    # the same share of prompts per worker: the same step; the flat gradient is the trainable
    # parameters in the gradients' dtype (the tiny model's float32)
    assert two.phases == one.phases and two.allocator_reserved == one.allocator_reserved
    assert one.allreduce_buffer_bytes == one.nccl_buffer_bytes == 0
    assert two.allreduce_buffer_bytes == two.trainable * 4 > 0
    assert two.allocated_bytes - one.allocated_bytes == two.allreduce_buffer_bytes
    # the buffer's 460 KiB would take a 2 MiB small segment
    assert two.allreduce_reserved_bytes == 2 * MIB
    assert two.nccl_buffer_bytes == NCCL_BUFFSIZE * NCCL_CHANNELS * 2
    assert two.reserved_bytes - one.reserved_bytes == two.allreduce_reserved_bytes + two.nccl_buffer_bytes


def test_the_reserved_estimate_adds_its_parts():
    est = estimate(LLMTrainSettings(**SETTINGS, batch_prompts=2, sft_batch=2), prompt_tokens=32)
    assert est.cuda_context_bytes == CUDA_CONTEXT_BYTES
    assert est.cublas_workspace_bytes == CUBLAS_HANDLES * CUBLAS_WORKSPACE_BYTES
    assert est.torch_reserved_bytes == est.allocator_reserved + est.cublas_workspace_bytes
    assert est.reserved_bytes == est.torch_reserved_bytes + CUDA_CONTEXT_BYTES
    # the replayed allocator holds at least what was live at the peak, in whole segments
    assert est.peak_bytes <= est.allocator_allocated <= est.allocator_reserved
    assert est.allocator_reserved % (2 * MIB) == 0
    cpu = estimate(LLMTrainSettings(**SETTINGS, batch_prompts=2, sft_batch=2), prompt_tokens=32, target="cpu")
    assert cpu.cuda_context_bytes == cpu.cublas_workspace_bytes == 0
    assert dataclasses.asdict(est).keys() >= {"allocator_reserved", "nccl_buffer_bytes"}


@pytest.mark.parametrize("replayed", [False, True])
def test_a_replayed_pass_repeats_the_allocations_of_the_recorded_one(replayed):
    """Micro-batches replayed (not run) give the allocator the allocations of running them, in
    their order: the same reserve and allocated peak. (Prompts of 256 tokens: a pass's saved
    activations, held as one block, would need a large segment; 30 MiB reserved against 10.)"""
    from haepo_ray.llm.capacity.model_configs import model_config
    from haepo_ray.llm.capacity.simulate import simulate
    from haepo_ray.llm.capacity.steps import Shapes

    settings = LLMTrainSettings(**SETTINGS, batch_prompts=2, sft_batch=2)
    run = simulate(settings, model_config("tiny"), Shapes(256, 8), replay=False)
    other = simulate(settings, model_config("tiny"), Shapes(256, 8), replay=replayed)
    assert (other.allocator_reserved, other.allocator_allocated) == (run.allocator_reserved, run.allocator_allocated)
