"""What a trial's process gives back when its trial ends, so that a process Tune reuses for
trial after trial (``reuse_actors``) does not grow (BENCHMARKS.md, "A reused trial process").

A finished trial leaves garbage the process keeps: reference cycles (a stopped RLlib
algorithm's learner, with its module, optimiser and metrics) that wait for Python's full
collection, which runs rarely in a process that imported Ray, RLlib and PyTorch (its cost grows
with every object alive), and freed memory that glibc keeps for the process's next allocations,
of which little serves the next trial's.
"""

from __future__ import annotations

import gc

_frozen = False


def release_memory() -> None:
    """Return a finished trial's memory to the OS: collect its garbage, then ask glibc to give
    back every free page of its heaps (``malloc_trim(0)``; without glibc, only the collection),
    and PyTorch's CUDA caching allocator its cached blocks, which would hold GPU memory beyond
    the share the next trial's estimate asked for (``gpus_per_worker: auto``)."""
    import ctypes

    import torch

    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def freeze_survivors() -> None:
    """Once per process, after a collection: moves every object alive now (the imports, Ray's
    worker) out of the collector's scans for good (``gc.freeze``), so that each later full
    collection scans only what trials made (a reused RL actor's reset, collection included, takes
    about 21 ms: BENCHMARKS.md). Call it between trials, when no trial's objects are alive: what
    is frozen is never collected."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True
