"""HAEPO, GRPO and DPO on groups of LM completions, and the exact micro-batched backward.

Each prompt's completions form one group; the update's loss is the mean of the group losses.

- HAEPO: :func:`haepo_ray.loss.haepo_loss` on each group's L_k (unchanged), optionally on
  length-normalised L_k / n_k and with a temperature tau (L_k / tau) against Plackett-Luce
  weight collapse: on SmolLM2 the L_k of 24-32-token completions differ by 10-30 nats, so the
  plain sum (the paper's, the default) gives one-hot weights. The effective number of
  trajectories 1 / sum_k w_k^2 is returned every update to show it.
- GRPO: :func:`haepo_ray.baselines.losses.grpo_loss` with tokens as steps and the group as
  the batch: token-level clipped ratio, k3 KL to the reference, the policy's token entropy.
  One optimisation step per batch, so the behaviour policy is the current one (ratio 1).
- DPO: :func:`haepo_ray.baselines.losses.dpo_loss` on [gold, sample_1..sample_M] with returns
  [1, 0, .., 0]: exactly the M pairs "gold preferred to sample j"; the reference is the SFT
  checkpoint.

Micro-batched backward (:func:`backward`). A loss that depends on the model only through
per-token log-probs (and entropies) can be back-propagated without holding a whole group's
activations: compute those quantities without gradient, evaluate the loss on detached leaves
to get g = dLoss/d(token quantity), then re-run the model one micro-batch of completions at a
time and back-propagate sum g * quantity. For HAEPO g is c_k = dLoss/dL_k on every token of
completion k, i.e. back-propagating sum_k c_k L_k; the gradient is exact (it is the chain
rule), at the price of one extra forward pass without gradient. GRPO and DPO get the same
treatment through the same function: activation memory is then bounded by the micro-batch for
all three, and what differs is what each loss keeps per token (GRPO's entropy needs the
softmax over the vocabulary in the graph; HAEPO and DPO only the chosen tokens' log-probs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from haepo_ray.baselines.losses import dpo_loss, grpo_loss
from haepo_ray.llm.rollout import Batch, sequence_logp, token_stats
from haepo_ray.loss import NORMALIZATIONS, Normalization, haepo_loss

__all__ = ["ALGORITHMS", "ObjectiveSettings", "backward", "effective_num_trajectories", "group_loss"]

Algorithm = Literal["HAEPO", "GRPO", "DPO"]
ALGORITHMS: tuple[str, ...] = ("HAEPO", "GRPO", "DPO")
# (token_logp, token_entropy or None) -> scalar loss
TokenLoss = Callable[[Tensor, Tensor | None], Tensor]


@dataclass(frozen=True)
class ObjectiveSettings:
    """The losses' settings; betas as in the paper (1e-2), GRPO's clip and DPO's beta as usual."""

    algo: Algorithm = "HAEPO"
    beta_ent: float = 1e-2
    beta_kl: float = 1e-2
    normalization: Normalization = "zscore"
    length_normalize: bool = False
    weight_temperature: float = 1.0
    clip_param: float = 0.2
    dpo_beta: float = 0.1

    def __post_init__(self) -> None:
        if self.algo not in ALGORITHMS:
            raise ValueError(f"algo must be one of {ALGORITHMS}, got {self.algo!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        for name in ("beta_ent", "beta_kl"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        for name in ("weight_temperature", "dpo_beta"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        if not 0 < self.clip_param < 1:
            raise ValueError(f"clip_param must be in (0, 1), got {self.clip_param!r}")


def _haepo_traj_logp(token_logp: Tensor, mask: Tensor, settings: ObjectiveSettings) -> Tensor:
    traj_logp = sequence_logp(token_logp, mask)
    if settings.length_normalize:
        traj_logp = traj_logp / mask.sum(dim=1)
    return traj_logp / settings.weight_temperature


def _groups(prompt_index: Tensor) -> list[Tensor]:
    return [(prompt_index == g).nonzero().flatten() for g in prompt_index.unique(sorted=True)]


def group_loss(
    settings: ObjectiveSettings, batch: Batch, returns: Tensor, ref_token_logp: Tensor
) -> TokenLoss:
    """The update's loss as a function of the policy's token log-probs (and entropies).

    ``returns`` are the rewards R_k, ``ref_token_logp`` the reference policy's token
    log-probs, both per row of ``batch``; the loss is the mean over prompts of each group's loss.
    """
    mask = batch.completion_mask
    groups = _groups(batch.prompt_index)

    def loss(token_logp: Tensor, token_entropy: Tensor | None) -> Tensor:
        per_group = []
        if settings.algo == "HAEPO":
            traj = _haepo_traj_logp(token_logp, mask, settings)
            ref = _haepo_traj_logp(ref_token_logp, mask, settings)
            for g in groups:
                per_group.append(haepo_loss(traj[g], ref[g], returns[g], beta_ent=settings.beta_ent,
                                            beta_kl=settings.beta_kl, normalization=settings.normalization).loss)
        elif settings.algo == "DPO":
            traj, ref = sequence_logp(token_logp, mask), sequence_logp(ref_token_logp, mask)
            for g in groups:
                per_group.append(dpo_loss(traj[g], ref[g], returns[g], beta=settings.dpo_beta).loss)
        else:
            assert token_entropy is not None, "GRPO needs the token entropies"
            for g in groups:
                m = mask[g]
                steps = m.nonzero()[:, 0]  # each step's completion within the group
                logp = token_logp[g][m]
                per_group.append(grpo_loss(
                    logp, logp.detach(), ref_token_logp[g][m], token_entropy[g][m], steps, returns[g],
                    clip_param=settings.clip_param, beta_kl=settings.beta_kl, beta_ent=settings.beta_ent,
                    normalization=settings.normalization,
                ).loss)
        return torch.stack(per_group).mean()

    return loss


def _micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def backward(
    model: Any, batch: Batch, loss_fn: TokenLoss, *, micro_batch_size: int, with_entropy: bool = False
) -> tuple[Tensor, Tensor]:
    """Back-propagate ``loss_fn`` of the model's token stats on ``batch`` into the parameters.

    ``micro_batch_size`` >= len(batch) (or 0) runs the whole batch in one graph; smaller runs
    the exact micro-batched backward of the module docstring. Returns the detached loss and
    the detached token log-probs [N, T].
    """
    n = len(batch)
    if micro_batch_size <= 0 or micro_batch_size >= n:
        logp, entropy = token_stats(model, batch, with_entropy)
        loss = loss_fn(logp, entropy)
        loss.backward()
        return loss.detach(), logp.detach()
    chunks = _micro_batches(n, micro_batch_size)
    with torch.no_grad():
        stats = [token_stats(model, batch.rows(c), with_entropy) for c in chunks]
    logp = torch.cat([s[0] for s in stats]).requires_grad_(True)
    entropy = torch.cat([s[1] for s in stats]).requires_grad_(True) if with_entropy else None
    loss = loss_fn(logp, entropy)
    leaves = [logp] if entropy is None else [logp, entropy]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)]
    for c in chunks:
        mb_logp, mb_entropy = token_stats(model, batch.rows(c), with_entropy)
        surrogate = (grads[0][c] * mb_logp).sum()
        if mb_entropy is not None:
            surrogate = surrogate + (grads[1][c] * mb_entropy).sum()
        surrogate.backward()
    return loss.detach(), logp.detach()


def effective_num_trajectories(settings: ObjectiveSettings, batch: Batch, token_logp: Tensor) -> float:
    """Mean over prompts of 1 / sum_k w_k^2 of HAEPO's weights w: M when uniform, 1 when one-hot."""
    traj_logp = _haepo_traj_logp(token_logp, batch.completion_mask, settings)
    values = [torch.exp(-torch.logsumexp(2 * torch.log_softmax(traj_logp[g], 0), 0))
              for g in _groups(batch.prompt_index)]
    return float(torch.stack(values).mean())
