"""The workers of one training run, as one: sharding, summed gradients, reduced metrics.

A run on W workers (Ray Train's ``TorchTrainer``; ``torch.distributed`` is set up by it) must
train what one worker trains on the same prompts. Three rules make that exact:

- *Whole groups on one worker.* Each prompt's completions stay on one worker, so each
  Plackett-Luce list (HAEPO), group (GRPO) and gold-vs-samples set (DPO) is whole; worker r
  takes the update's prompts r, r + W, ... (:meth:`World.shard`).
- *Shares, summed.* Each worker scales its loss by its share of the update (its prompts / all
  prompts; in SFT its tokens / all tokens) and the gradients are summed over workers
  (:meth:`World.sum_gradients`): the sum of shares x local means is the global mean.
- *Samples that do not depend on the layout.* A prompt's completions are drawn with a seed of
  (run seed, update, the prompt's position in the update) (:func:`sample_seed`), so they are
  the same whichever worker samples them.

One worker (``World()``, no process group) runs the same code with every reduction a no-op.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

__all__ = ["World", "sample_seed"]

T = TypeVar("T")


def sample_seed(seed: int, update: int, position: int) -> int:
    """The sampling seed of the prompt at ``position`` of RL update ``update`` of a run."""
    digest = hashlib.blake2b(f"{seed}/{update}/{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


@dataclass(frozen=True)
class World:
    """Rank and size of ``torch.distributed``'s default group (``World()``: one worker)."""

    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> World:
        """The process group Ray Train (or ``torchrun``) set up, or one worker."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return cls(torch.distributed.get_rank(), torch.distributed.get_world_size())
        return cls()

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the output files and checkpoints."""
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[tuple[int, T]]:
        """(position, item) of this worker's items: positions rank, rank + size, ..."""
        return [(i, items[i]) for i in range(self.rank, len(items), self.size)]

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum each parameter's gradient over the workers (a missing gradient counts as 0)."""
        if self.size == 1:
            return
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def sum(self, values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
        """Element-wise sums over the workers."""
        return self._reduce(values, torch.distributed.ReduceOp.SUM if self.size > 1 else None, device)

    def max(self, values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
        """Element-wise maxima over the workers."""
        return self._reduce(values, torch.distributed.ReduceOp.MAX if self.size > 1 else None, device)

    def _reduce(self, values: Sequence[float], op, device) -> list[float]:
        if self.size == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t, op=op)
        return t.tolist()

    def barrier(self) -> None:
        if self.size > 1:
            torch.distributed.barrier()
