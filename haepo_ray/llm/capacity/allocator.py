"""PyTorch's CUDA caching allocator, modelled: the bytes it reserves for a sequence of allocations.

What fails on a GPU is *reserved* memory (the segments the allocator took from ``cudaMalloc``
and keeps), not the peak of allocated bytes. :class:`CachingAllocator` replays a simulated
step's allocation and free events (:attr:`~haepo_ray.llm.capacity.tracker.LiveBytes.events`)
through the rules of ``c10/cuda/CUDACachingAllocator.cpp`` with its default configuration
(``PYTORCH_CUDA_ALLOC_CONF`` unset; PyTorch's docs, "CUDA memory management"):

- a request is rounded up to a multiple of 512 bytes (``kMinBlockSize``; ``round_size``);
- requests of at most 1 MiB (``kSmallSize``) come from the small pool, larger ones from the
  large pool (``get_pool``);
- a request is served by the smallest free cached block of its pool that is big enough (best
  fit: ``get_free_block``, a ``lower_bound`` on (size, address));
- with none, a new segment is reserved (``get_allocation_size``): 2 MiB (``kSmallBuffer``) for
  a small request, 20 MiB (``kLargeBuffer``) for a request under 10 MiB (``kMinLargeAlloc``),
  else the request rounded up to 2 MiB (``kRoundLarge``);
- the block found is split when what remains is at least 512 bytes (small pool) or more than
  1 MiB (large pool), else handed out whole (``should_split``); the allocated-bytes statistic
  counts the whole block;
- a freed block stays reserved and merges with free neighbours of its segment
  (``free_block``, ``try_merge_blocks``).

Not modelled: streams other than the default (every event is on one stream), releasing cached
segments when ``cudaMalloc`` fails (the replay assumes a GPU with room: its reserved is what
the step reaches when nothing forces a release), ``max_split_size_mb``,
``roundup_power2_divisions``, ``expandable_segments`` (all off by default) and
``torch.cuda.empty_cache`` (the trial does not call it).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["K_LARGE_BUFFER", "K_MIN_BLOCK_SIZE", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE", "K_SMALL_BUFFER",
           "K_SMALL_SIZE", "CachingAllocator", "replay", "round_size", "segment_size"]

MIB = 2**20
K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB  # largest "small" allocation
K_SMALL_BUFFER = 2 * MIB  # small-pool segments
K_LARGE_BUFFER = 20 * MIB  # large-pool segments for requests under K_MIN_LARGE_ALLOC
K_MIN_LARGE_ALLOC = 10 * MIB  # requests from here get a segment of their own size
K_ROUND_LARGE = 2 * MIB  # ... rounded up to this


def round_size(nbytes: int) -> int:
    """A request's block size (``round_size``)."""
    return max(K_MIN_BLOCK_SIZE, -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def segment_size(size: int) -> int:
    """The segment reserved for a rounded request that no cached block serves (``get_allocation_size``)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)

    def key(self) -> tuple[int, int, int]:  # the pools' order: size, then address
        return (self.size, self.segment, self.offset)


class CachingAllocator:
    """The allocator's blocks and segments (module docstring); ``malloc(key, nbytes)``, ``free(key)``."""

    def __init__(self) -> None:
        self._pools: dict[bool, list[tuple[tuple[int, int, int], _Block]]] = {True: [], False: []}
        self._live: dict[object, _Block] = {}
        self._segments = itertools.count()
        self.segments: list[int] = []  # sizes of the segments reserved, in order
        self.reserved = 0
        self.allocated = 0  # bytes of the blocks handed out
        self.peak_allocated = 0

    def _insert(self, block: _Block) -> None:
        bisect.insort(self._pools[block.small], (block.key(), block), key=lambda e: e[0])

    def _remove(self, block: _Block) -> None:
        pool = self._pools[block.small]
        i = bisect.bisect_left(pool, block.key(), key=lambda e: e[0])
        assert pool[i][1] is block
        del pool[i]

    def malloc(self, key: object, nbytes: int) -> None:
        if key in self._live:
            raise ValueError(f"allocation {key!r} is live")
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1, -1), key=lambda e: e[0])
        if i < len(pool):  # the best fit
            block = pool[i][1]
            del pool[i]
        else:
            seg = segment_size(size)
            self.segments.append(seg)
            self.reserved += seg
            block = _Block(next(self._segments), 0, seg, small)
        remaining = block.size - size
        if remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE:
            rest = _Block(block.segment, block.offset + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest)
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: object) -> None:
        block = self._live.pop(key)
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._remove(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert(block)


def replay(events: Iterable[tuple[object, int | None]]) -> CachingAllocator:
    """The allocator after ``events``: ``(key, nbytes)`` allocates, ``(key, None)`` frees."""
    allocator = CachingAllocator()
    for key, nbytes in events:
        if nbytes is None:
            allocator.free(key)
        else:
            allocator.malloc(key, nbytes)
    return allocator
