"""One listwise loss over the episodes of every learner (DESIGN.md, "Listwise across shards").

With several learners each one holds whole episodes of the batch, but HAEPO's softmax, the
return normalisation, the entropy and the KL couple all M episodes of the batch. They couple
them only through M scalars per episode, so each learner

1. all-gathers its episodes' scalars (L_k, L_k^ref, R_k, ...) into the list of all M
   (:func:`gather_episodes`, detached: no gradient crosses processes);
2. evaluates the loss on the gathered list and takes g_k = dLoss/dL_k for all M
   (:func:`listwise_loss`, which calls the pure loss functions unchanged);
3. back-propagates sum_k g_k L_k over its own episodes only.

The learners' gradients then sum to the gradient of the loss over the whole list. DDP
*averages* gradients over the N learners, so each learner scales its share by N: N learners
make exactly the update one learner makes on the same batch.

Pure PyTorch and ``torch.distributed``; outside a process group (one learner) the gather is
the identity. This module imports nothing from Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["LossOutput", "Shard", "all_reduce_sum", "gather_episodes", "listwise_loss"]


@dataclass(frozen=True)
class Shard:
    """This learner's episodes within the list: rows ``start .. start + size - 1`` of M."""

    start: int
    size: int  # M_i, this learner's episodes
    num_episodes: int  # M, the episodes of all learners: the list's length
    world_size: int  # N, the learners; DDP divides the summed gradients by it

    @property
    def rows(self) -> slice:
        return slice(self.start, self.start + self.size)


def _comm_device(x: Tensor) -> torch.device:
    """NCCL moves CUDA tensors only, gloo CPU tensors only."""
    return x.device if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_episodes(local: Tensor, *, distributed: bool) -> tuple[Tensor, Shard]:
    """The rows ``[M_i, C]`` of every learner as one ``[M, C]`` list (learner rank order).

    ``distributed``: whether the learners form a DDP process group (RLlib's criterion:
    ``num_learners > 1``); otherwise ``local`` is the whole list, even inside some other
    process group.

    ``local`` holds one row of per-episode scalars for each of this learner's episodes; the
    result is detached, on ``local``'s device. A collective: every learner must call it, with
    the same C. A learner handed no episodes never gets here (RLlib skips its update) and the
    others would wait for it, so the caller gives every learner at least one
    (:func:`haepo_ray.rl.algorithm.update_on_episodes`); an empty row set that does arrive is an
    error on every learner alike.
    """
    local = local.detach()
    n = dist.get_world_size() if distributed else 1
    if n == 1:
        return local, Shard(start=0, size=local.shape[0], num_episodes=local.shape[0], world_size=1)
    device = _comm_device(local)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
    dist.all_gather(sizes, torch.tensor([local.shape[0]], dtype=torch.int64, device=device))
    counts = [int(s) for s in sizes]
    if min(counts) == 0:
        raise ValueError(
            f"listwise loss: learner(s) {[r for r, c in enumerate(counts) if c == 0]} hold no "
            f"episode (episodes per learner: {counts}); every learner needs at least one whole "
            "episode, so a batch needs at least as many episodes as there are learners"
        )
    width = max(counts)
    padded = local.new_zeros((width, *local.shape[1:]), device=device)
    padded[: local.shape[0]] = local.to(device)
    rows = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(rows, padded)
    gathered = torch.cat([r[:c] for r, c in zip(rows, counts)]).to(local.device)
    rank = dist.get_rank()
    shard = Shard(start=sum(counts[:rank]), size=counts[rank], num_episodes=sum(counts), world_size=n)
    return gathered, shard


def all_reduce_sum(x: Tensor, shard: Shard) -> Tensor:
    """The sum of ``x`` over the learners of ``shard``'s list (``x`` with one), detached."""
    x = x.detach()
    if shard.world_size == 1:
        return x
    total = x.to(_comm_device(x), copy=True)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(x.device)


class LossOutput(Protocol):
    """What a loss function returns: at least the scalar ``loss``."""

    loss: Tensor


Out = TypeVar("Out", bound=LossOutput)


def listwise_loss(
    loss_fn: Callable[[Tensor], Out], traj_logp: Tensor, all_traj_logp: Tensor, shard: Shard
) -> tuple[Tensor, Out]:
    """``loss_fn`` over the whole list, as a loss that trains this learner's episodes.

    ``traj_logp`` are this learner's L_k (with gradient), ``all_traj_logp`` the L_k of all M
    episodes (from :func:`gather_episodes`), and ``loss_fn(L)`` the loss of the list as a
    function of its L (its ``.loss`` a scalar). Returns ``(surrogate, out)``: ``out`` is
    ``loss_fn`` on the whole list (its diagnostics are the list's), and ``surrogate`` has
    the value ``out.loss`` and the gradient ``N * sum_{k in shard} g_k grad L_k`` with
    g_k = dLoss/dL_k, so that DDP's mean over the N learners is the gradient of the list.
    """
    leaf = all_traj_logp.detach().requires_grad_(True)
    with torch.enable_grad():
        out = loss_fn(leaf)
        (grad,) = torch.autograd.grad(out.loss, leaf, allow_unused=True)
    g = torch.zeros_like(leaf) if grad is None else grad
    share = (g[shard.rows] * (traj_logp - traj_logp.detach())).sum()  # value 0, gradient sum g_k grad L_k
    return out.loss.detach() + shard.world_size * share, out
