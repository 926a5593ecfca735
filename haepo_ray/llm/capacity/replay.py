"""Repeated model passes of a simulated step, replayed instead of run: :class:`ReplayedStats`.

A micro-batched step runs the model on equal chunks of its rows (the reference pass and the
update's first loop without gradient, its second loop with one: :func:`~haepo_ray.llm.
objectives.backward`). Passes of one kind (phase, gradient or not, the rows' shape, with or
without entropies) do the same work from the same state, so :class:`ReplayedStats`, the
simulated policy's :attr:`~haepo_ray.llm.policy.Policy.stats`, runs one pass of each kind
(gradient passes: two, since the first makes the gradients the others accumulate into; a
gradient pass while the model has none, as an update's first, runs),
records what it did, and replays the others: the same outputs, the rise of live bytes by
category at its peak, the bytes it holds for the backward pass until that has run, the
backward's rise from the moment its outputs' gradients exist, and the FLOPs of both. A pass
of a 1.5B model on fake tensors takes about a second; the update of 16 one-row micro-batches
runs 3 instead of 32. ``tests/test_llm_capacity.py`` checks that replaying gives each phase's
peak, categories and FLOPs of running every pass, to the byte.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from haepo_ray.llm.capacity.tracker import CATEGORIES, LiveBytes, Watermark
from haepo_ray.llm.objectives import TokenStats
from haepo_ray.llm.rollout import Batch

__all__ = ["ReplayedStats"]


@dataclass
class _Record:
    """What one pass of a kind did."""

    outputs: list[tuple[torch.Size, torch.dtype]]
    rise: dict[str, int]  # at the forward's peak, over the live bytes before it
    held: dict[str, int]  # live after the forward, beyond its outputs: saved for the backward
    flops: int
    backward: Watermark | None = None  # from the outputs' gradients to the next pass
    backward_rise: dict[str, int] = field(default_factory=dict)
    # the allocations made and freed in the forward, and in the backward (LiveBytes.transient_events)
    events: list[tuple[int, int | None]] = field(default_factory=list)
    backward_events: list[tuple[int, int | None]] = field(default_factory=list)
    # the storages the forward made and holds, (key in events, bytes, category) in order; None:
    # they do not add up to ``held`` (a storage made before was freed), which is then held as
    # one block per category
    survivors: list[tuple[int, int, str]] | None = None


def _sub(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {c: a[c] - b.get(c, 0) for c in CATEGORIES}


def _has_gradients(model: Any) -> bool:
    """The trainable parameters have gradients (from a pass of this update)."""
    return next(p for p in model.parameters() if p.requires_grad).grad is not None


class _Replayed(torch.autograd.Function):
    """A recorded gradient pass: its outputs, the bytes it holds, its backward's rise."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, tracker: LiveBytes, record: _Record) -> tuple[Tensor, ...]:
        ctx.tracker, ctx.record = tracker, record
        held = []
        if record.survivors is not None:  # made first, counted, their allocations placed as recorded
            bound = {}
            with tracker.quiet_events():
                for key, nbytes, category in record.survivors:
                    with tracker.category(category):
                        held.append(torch.empty(nbytes, dtype=torch.uint8))
                    bound[key] = tracker.storage_key(held[-1])
            tracker.transient(_sub(record.rise, record.held), record.events, bound)
        else:
            tracker.transient(record.rise, record.events)
            for category, nbytes in record.held.items():
                if nbytes > 0:
                    with tracker.category(category):
                        held.append(torch.empty(nbytes, dtype=torch.uint8))
        tracker.add_flops(record.flops)
        ctx.save_for_backward(*held)  # freed once the backward has run, as saved activations are
        return tuple(torch.empty(shape, dtype=dtype) for shape, dtype in record.outputs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[None, None, None]:
        ctx.tracker.transient(ctx.record.backward_rise, ctx.record.backward_events)
        ctx.tracker.add_flops(ctx.record.backward.flops)
        return None, None, None


class ReplayedStats:
    """The policy's model passes ``stats`` (:func:`~haepo_ray.llm.policy.model_passes`) for a
    simulated step (module docstring)."""

    def __init__(self, tracker: LiveBytes, stats: TokenStats) -> None:
        self.tracker, self.stats = tracker, stats
        self.calls: dict[tuple, int] = {}
        self.records: dict[tuple, _Record] = {}
        self._backward = contextlib.ExitStack()  # the watermark of a recorded pass's backward

    def close(self) -> None:
        """End the recording of a backward (at the next pass, or when the step is done)."""
        self._backward.close()

    def __call__(self, model: Any, batch: Batch, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        self.close()
        grad = torch.is_grad_enabled()
        key = (self.tracker.phase_name, grad, tuple(batch.input_ids.shape), with_entropy)
        index = self.calls[key] = self.calls.get(key, -1) + 1
        record = self.records.get(key)
        if record is not None and index > (1 if grad else 0) and (
                not grad or (record.backward is not None and _has_gradients(model))):
            return self._replay(record, model, grad, with_entropy)
        if index == (1 if grad else 0):
            return self._record(key, model, batch, with_entropy, grad)
        return self.stats(model, batch, with_entropy)  # the first gradient pass makes the gradients

    def _record(self, key: tuple, model: Any, batch: Batch, with_entropy: bool,
                grad: bool) -> tuple[Tensor, Tensor | None]:
        tracker = self.tracker
        first = len(tracker.events)
        with tracker.watermark() as mark:
            logp, entropy = self.stats(model, batch, with_entropy)
        outputs = [t for t in (logp, entropy) if t is not None]
        out_bytes = dict.fromkeys(CATEGORIES, 0)
        for t in outputs:
            nbytes, category = tracker.storage_entry(t)
            out_bytes[category] += nbytes
        record = _Record([(t.shape, t.dtype) for t in outputs], mark.rise(),
                         _sub(_sub(tracker.live, mark.start_live), out_bytes), mark.flops,
                         events=tracker.transient_events(first))
        if grad:
            self._survivors(record, first, outputs)
        self.records[key] = record
        if grad:
            def start(grad: Tensor) -> None:  # an output's gradient exists: the pass's backward begins
                if record.backward is None:
                    begin = len(tracker.events)
                    record.backward = self._backward.enter_context(tracker.watermark())

                    def end() -> None:
                        record.backward_rise.update(record.backward.rise())
                        record.backward_events[:] = tracker.transient_events(begin)

                    self._backward.callback(end)

            for t in outputs:  # (the hook holds no tensor: the pass's graph is freed as in a trial)
                t.register_hook(start)
        return logp, entropy

    def _survivors(self, record: _Record, first: int, outputs: list[Tensor]) -> None:
        """The storages a recorded gradient pass made and holds (:attr:`_Record.survivors`),
        and its events with their allocations in place, when they add up to what it holds."""
        tracker = self.tracker
        window = tracker.events[first:]
        freed = {key for key, nbytes in window if nbytes is None}
        out_keys = {tracker.storage_key(t) for t in outputs}
        live = tracker.live_keys()
        survivors = [(key, nbytes, live[key][1]) for key, nbytes in window
                     if nbytes is not None and key not in freed and key not in out_keys and key in live]
        sums = dict.fromkeys(CATEGORIES, 0)
        for _, nbytes, category in survivors:
            sums[category] += tracker.rounded(nbytes)
        if sums != record.held:
            return
        made = {key for key, nbytes in window if nbytes is not None}
        kept = {key for key, _, _ in survivors}
        record.survivors = survivors
        record.events = [(key, nbytes) for key, nbytes in window
                         if key in kept or (key in made and key in freed)]

    def _replay(self, record: _Record, model: Any, grad: bool, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        if grad:
            anchor = next(p for p in model.parameters() if p.requires_grad)
            outputs = _Replayed.apply(anchor, self.tracker, record)
        else:  # nothing is held without gradient
            self.tracker.transient(record.rise, record.events)
            self.tracker.add_flops(record.flops)
            outputs = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in record.outputs)
        return outputs[0], (outputs[1] if with_entropy else None)
