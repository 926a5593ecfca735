"""Live tensor bytes by category, each phase's peak and FLOPs: :class:`LiveBytes`.

A ``TorchDispatchMode`` over ``FakeTensorMode``: every storage an op returns is counted from
the op until the storage is freed (a weak reference's callback), in the category of the
moment it was made: ``activations`` in a forward pass, ``temporaries`` in a backward pass,
``optimizer`` in an optimiser's step (AdamW's moments and its temporaries), or whatever
:meth:`LiveBytes.category` says (``parameters`` when a model is built, copied or given an
adapter; ``kv_cache`` for generation's cache). A gradient moves to ``gradients`` when it is
accumulated into a parameter. Bytes are rounded up to ``block`` per
storage: 512 as in CUDA's caching allocator, 1 for the CPU allocator. FLOPs are counted with
the formulas of ``torch.utils.flop_counter`` (matrix products and attention kernels).

A kernel's own temporaries (made and freed inside one op) do not show on fake tensors; those
of :data:`KERNEL_TEMPORARIES` are counted for the op's moment, as ATen allocates them on CPU
and CUDA alike. What it cannot see: other kernels' own temporaries, memory an accelerator
library takes for itself (cuBLAS workspaces, the CUDA context). The caching allocator's
reserve and fragmentation are not counted here: :attr:`LiveBytes.events` records every
storage's allocation and free, in order (a kernel's temporaries and a replayed pass's as the
allocations they stand for), for :mod:`~haepo_ray.llm.capacity.allocator` to replay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

from haepo_ray.upstream.torch import TorchDispatchMode, flop_key, in_backward, tree_flatten

__all__ = ["CATEGORIES", "KERNEL_TEMPORARIES", "LiveBytes", "PhasePeak", "PhasePeaks", "Watermark"]

CATEGORIES: tuple[str, ...] = ("parameters", "buffers", "gradients", "optimizer", "kv_cache", "activations",
                               "temporaries")


def _logsumexp_temporaries(args: tuple, out: torch.Tensor) -> list[int]:
    # ATen's logsumexp_out_impl: maxes = amax(self, dims, keepdim=True) (the output's size),
    # then sum((self - maxes).exp_()): one temporary of the input's size.
    return [out.numel() * out.element_size(), args[0].numel() * args[0].element_size()]


def _multinomial_temporaries(args: tuple, out: torch.Tensor) -> list[int]:
    # ATen's multinomial without replacement or of one sample: q = empty_like(self).exponential_(),
    # then argmax(self / q) (the division into q).
    return [args[0].numel() * args[0].element_size()]


# op -> the bytes its kernel allocates and frees inside the op, from (args, output)
KERNEL_TEMPORARIES = {torch.ops.aten.logsumexp.default: _logsumexp_temporaries,
                      torch.ops.aten.multinomial.default: _multinomial_temporaries}


@dataclass(frozen=True)
class PhasePeak:
    """A phase's peak of live bytes, what was live at that moment by category, the live bytes
    when it began, and its FLOPs."""

    peak_bytes: int
    categories: dict[str, int]
    start_bytes: int
    flops: int


class PhasePeaks:
    """A step's ``phases`` (name -> :class:`PhasePeak`) and the one with the most bytes live."""

    phases: dict[str, PhasePeak]

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: self.phases[p].peak_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.phases[self.peak_phase].peak_bytes


@dataclass(eq=False)  # each one is its own: identity, not values
class Watermark:
    """The most bytes live since it was set, what was live then by category, and the FLOPs since."""

    start_bytes: int
    start_live: dict[str, int]
    peak_bytes: int
    at_peak: dict[str, int]
    flops: int = 0

    def rise(self) -> dict[str, int]:
        """What the peak added to the live bytes of the start, by category."""
        return {c: self.at_peak[c] - self.start_live[c] for c in CATEGORIES}


class LiveBytes(TorchDispatchMode):
    """Counts live storages; ``with tracker, tracker.phase("reference"): ...`` records a peak."""

    def __init__(self, block: int = 1) -> None:
        super().__init__()
        self.block = block
        self.live = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peaks: dict[str, PhasePeak] = {}
        self.phase_name: str | None = None  # the phase being recorded
        self._storages = WeakIdKeyDictionary()  # storage -> [nbytes, category]
        self._forced: str | None = None
        self._marks: list[Watermark] = []
        self._hooked = WeakIdKeyDictionary()  # parameters whose gradient is counted
        # (key, nbytes) an allocation of a storage's bytes, (key, None) its free, in order
        self.events: list[tuple[int, int | None]] = []
        self._keys = itertools.count()
        self._quiet = False  # storages made now: their allocation events come from a replayed list

    # ------------------------------------------------------------------ bookkeeping

    def rounded(self, nbytes: int) -> int:
        """``nbytes`` rounded up to whole blocks of ``block`` bytes: what an allocation of it takes."""
        return math.ceil(nbytes / self.block) * self.block

    def _add(self, storage: torch.UntypedStorage, category: str) -> None:
        if storage in self._storages or storage.nbytes() == 0:
            return
        entry = [self.rounded(storage.nbytes()), category, next(self._keys)]
        if not self._quiet:
            self.events.append((entry[2], storage.nbytes()))
        self._storages[storage] = entry
        weakref.finalize(storage, self._free, entry)
        self.live[category] += entry[0]
        self.total += entry[0]
        self._rise()

    def _rise(self) -> None:
        for mark in self._marks:
            if self.total > mark.peak_bytes:
                mark.peak_bytes, mark.at_peak = self.total, dict(self.live)

    def transient(self, change: dict[str, int], events: list[tuple[int, int | None]] | None = None,
                  bound: dict[int, int] | None = None) -> None:
        """A change of the counted bytes by category that lasts a moment (made and freed inside
        one op, or a replayed pass's rise, where a category may fall as another grows): it
        counts towards the peaks of that moment. ``events``: the allocations and frees that
        made it (:meth:`transient_events`; default: one allocation of its rise, freed); ``bound``:
        keys of ``events`` that are live storages' (made in :meth:`quiet_events`), whose
        allocations are placed here and whose frees come when the storages die."""
        if events is None:
            rise = sum(n for n in change.values() if n > 0)
            events = [(0, rise), (0, None)] if rise else []
        self._emit(events, bound or {})
        sizes = {c: n for c, n in change.items() if n}
        for c, n in sizes.items():
            self.live[c] += n
            self.total += n
        self._rise()
        for c, n in sizes.items():
            self.live[c] -= n
            self.total -= n

    def transient_events(self, start: int) -> list[tuple[int, int | None]]:
        """The allocations made and freed in :attr:`events` from index ``start`` on, in order
        (with keys local to the list): what a replayed pass repeats."""
        window = self.events[start:]
        freed = {key for key, nbytes in window if nbytes is None}
        made = {key for key, nbytes in window if nbytes is not None}
        return [(key, nbytes) for key, nbytes in window if key in freed and key in made]

    def _emit(self, events: list[tuple[int, int | None]], bound: dict[int, int]) -> None:
        keys: dict[int, int] = {}
        for key, nbytes in events:
            if key in bound:
                self.events.append((bound[key], nbytes))
            elif nbytes is None:
                self.events.append((keys.pop(key), None))
            else:
                keys[key] = next(self._keys)
                self.events.append((keys[key], nbytes))

    @contextlib.contextmanager
    def quiet_events(self) -> Iterator[None]:
        """Storages made inside are counted but their allocations are not recorded in
        :attr:`events` (a replayed pass places them with :meth:`transient`'s ``bound``)."""
        previous, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = previous

    def storage_key(self, tensor: torch.Tensor) -> int:
        """The key of ``tensor``'s storage in :attr:`events`."""
        return self._storages[tensor.untyped_storage()][2]

    def live_keys(self) -> dict[int, tuple[int, str]]:
        """Each live storage's key: (its raw bytes as recorded, its category)."""
        return {entry[2]: (storage.nbytes(), entry[1]) for storage, entry in self._storages.items()}

    def add_flops(self, flops: int) -> None:
        """FLOPs of work that was not run (a replayed or extrapolated pass)."""
        for mark in self._marks:
            mark.flops += flops

    def _free(self, entry: list) -> None:
        self.events.append((entry[2], None))
        self.live[entry[1]] -= entry[0]
        self.total -= entry[0]

    def _move(self, storage: torch.UntypedStorage, category: str) -> None:
        entry = self._storages.get(storage)
        if entry is None:
            self._add(storage, category)
        elif entry[1] != category:
            self.live[entry[1]] -= entry[0]
            self.live[category] += entry[0]
            entry[1] = category

    def storage_entry(self, tensor: torch.Tensor) -> tuple[int, str]:
        """The bytes counted for ``tensor``'s storage, and their category."""
        nbytes, category, _ = self._storages[tensor.untyped_storage()]
        return nbytes, category

    def track(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Count ``tensors`` made outside the tracker (a model's parameters, an optimiser's state)."""
        for t in tensors:
            self._move(t.untyped_storage(), category)

    def track_module(self, module: torch.nn.Module) -> None:
        """Its parameters and buffers; each trainable parameter's gradient counts as ``gradients``."""
        self.track(module.parameters(), "parameters")
        self.track(module.buffers(), "buffers")
        for p in module.parameters():
            if p.requires_grad and p not in self._hooked:
                p.register_post_accumulate_grad_hook(lambda q: self._move(q.grad.untyped_storage(), "gradients"))
                self._hooked[p] = True

    # ------------------------------------------------------------------ contexts

    @contextlib.contextmanager
    def category(self, name: str) -> Iterator[None]:
        """Storages made inside count as ``name`` (e.g. ``parameters`` while a model is copied)."""
        previous, self._forced = self._forced, name
        try:
            yield
        finally:
            self._forced = previous

    @contextlib.contextmanager
    def watermark(self) -> Iterator[Watermark]:
        """The peak and FLOPs of what runs inside."""
        mark = Watermark(self.total, dict(self.live), self.total, dict(self.live))
        self._marks.append(mark)
        try:
            yield mark
        finally:
            self._marks.remove(mark)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the peak of live bytes and the FLOPs inside as phase ``name`` (a phase entered
        twice keeps the larger peak and adds its FLOPs)."""
        self.phase_name = name
        try:
            with self.watermark() as mark:
                yield
        finally:
            self.phase_name = None
        old = self.peaks.get(name)
        flops = mark.flops + (old.flops if old else 0)
        if old is None or mark.peak_bytes > old.peak_bytes:
            self.peaks[name] = PhasePeak(mark.peak_bytes, mark.at_peak, mark.start_bytes, flops)
        else:
            self.peaks[name] = dataclasses.replace(old, flops=flops)

    def __enter__(self) -> LiveBytes:
        def pre(*_: object) -> None:
            self._in_optimizer = True

        def post(*_: object) -> None:
            self._in_optimizer = False

        self._in_optimizer = False
        self._hooks = (register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()
        super().__exit__(*exc)

    def _current_category(self) -> str:
        if self._forced is not None:
            return self._forced
        if self._in_optimizer:
            return "optimizer"
        if in_backward():
            return "temporaries"
        return "activations"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._marks:
            count = flop_registry.get(flop_key(func))
            if count is not None:
                self.add_flops(count(*args, **kwargs, out_val=out))
        category = self._current_category()
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t.untyped_storage(), category)
        temporaries = KERNEL_TEMPORARIES.get(func)
        if temporaries is not None:
            sizes = temporaries(args, out)
            events = [(i, n) for i, n in enumerate(sizes)] + [(i, None) for i in range(len(sizes))]
            self.transient({category: sum(self.rounded(n) for n in sizes)}, events)
        return out
