"""HAEPO, GRPO and DPO on groups of LM completions, and the exact micro-batched backward.

Each prompt's completions form one group; the update's loss is the mean of the group losses.

- HAEPO: :func:`haepo_ray.loss.haepo_loss` on each group's L_k (unchanged), optionally on
  length-normalised L_k / n_k and with a temperature tau (L_k / tau) against Plackett-Luce
  weight collapse: on SmolLM2 the L_k of 24-32-token completions differ by 10-30 nats, so the
  plain sum (the paper's, the default) gives one-hot weights. The effective number of
  trajectories 1 / sum_k w_k^2 is returned every update to show it. ``estimator`` ``unbiased``:
  the appendix's estimator, whose score-function term takes log p of the group's completions,
  the plain sums of their token log-probs (not the rescaled L_k of the weights).
- GRPO: :func:`haepo_ray.baseline_losses.grpo_loss` with tokens as steps and the group as
  the batch: token-level clipped ratio, k3 KL to the reference, the policy's token entropy,
  the advantage (R_k - mean R) / (std R + 1e-4) with the group's sample std, as TRL's.
  By default one optimisation step per batch, so the behaviour policy is the current one
  (ratio 1); with ``num_iterations`` > 1 the ratio is to the old policy's log-probs.
- DPO: :func:`haepo_ray.baseline_losses.dpo_loss` on [gold, sample_1..sample_M] with returns
  [1, 0, .., 0]: exactly the M pairs "gold preferred to sample j"; the reference is the SFT
  checkpoint. With ``dpo_pairs`` reward, on the group's samples only: one pair, the sample of
  the highest reward preferred to that of the lowest (none when all rewards are equal), so DPO
  learns from the same reward as HAEPO and GRPO.

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

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from haepo_ray.baseline_losses import dpo_loss, grpo_token_loss
from haepo_ray.llm.rollout import Batch, concat_batches, sequence_logp, token_stats
from haepo_ray.llm.settings import ObjectiveSettings
from haepo_ray.loss import haepo_loss, is_fake

__all__ = ["OBJECTIVES", "Objective", "TokenLoss", "TokenStats", "backward", "chunks", "effective_num_trajectories",
           "group_loss", "objective_of", "rows_per_prompt", "training_batch"]

# (token_logp, token_entropy or None) -> scalar loss
TokenLoss = Callable[[Tensor, Tensor | None], Tensor]
# (model, batch, with_entropy) -> token log-probs, entropies: rollout.token_stats, or the simulator's
TokenStats = Callable[[Any, Batch, bool], tuple[Tensor, Tensor | None]]


def _haepo_traj_logp(token_logp: Tensor, mask: Tensor, settings: ObjectiveSettings) -> Tensor:
    traj_logp = sequence_logp(token_logp, mask)
    if settings.length_normalize:
        traj_logp = traj_logp / mask.sum(dim=1)
    return traj_logp / settings.weight_temperature


class Objective:
    """One algorithm's loss on an update's groups of completions; :data:`OBJECTIVES` holds one
    per algorithm, as the RL side picks a learner class per algorithm."""

    with_entropy: bool = False  # needs the policy's token entropies
    with_gold: bool = False  # each group starts with its prompt's gold summary, preferred to the samples

    def group_losses(self, s: ObjectiveSettings, token_logp: Tensor, token_entropy: Tensor | None,
                     ref_token_logp: Tensor, old_token_logp: Tensor, mask: Tensor, returns: Tensor,
                     groups: list[slice]) -> list[Tensor]:
        """The loss of each group (rows ``groups[i]``) from per-row token quantities [N, T]
        (``old_token_logp``: the behaviour policy's, GRPO's ratio's)."""
        raise NotImplementedError


class HAEPOObjective(Objective):
    """:func:`haepo_ray.loss.haepo_loss` on each group's L_k (length-normalised, tempered)."""

    def group_losses(self, s, token_logp, token_entropy, ref_token_logp, old_token_logp, mask, returns, groups):
        traj = _haepo_traj_logp(token_logp, mask, s)
        ref = _haepo_traj_logp(ref_token_logp, mask, s)
        # log pi(y_k | x), the sampling distribution's: the unbiased estimator's grad log p
        sample = sequence_logp(token_logp, mask) if s.estimator == "unbiased" else traj
        return [haepo_loss(traj[g], ref[g], returns[g], beta_ent=s.beta_ent, beta_kl=s.beta_kl,
                           normalization=s.normalization, estimator=s.estimator, sample_logp=sample[g]).loss
                for g in groups]


class GRPOObjective(Objective):
    """:func:`haepo_ray.baseline_losses.grpo_token_loss` with tokens as steps, the group as the
    batch and the old policy (by default the current one) as the behaviour policy."""

    with_entropy = True

    def group_losses(self, s, token_logp, token_entropy, ref_token_logp, old_token_logp, mask, returns, groups):
        return [grpo_token_loss(token_logp[g], old_token_logp[g], ref_token_logp[g], token_entropy[g], mask[g],
                                returns[g], clip_param=s.clip_param, beta_kl=s.beta_kl, beta_ent=s.beta_ent,
                                normalization=s.normalization).loss for g in groups]


class DPOObjective(Objective):
    """:func:`haepo_ray.baseline_losses.dpo_loss` on [gold, sample_1..sample_M], gold preferred."""

    with_gold = True

    def group_losses(self, s, token_logp, token_entropy, ref_token_logp, old_token_logp, mask, returns, groups):
        traj, ref = sequence_logp(token_logp, mask), sequence_logp(ref_token_logp, mask)
        return [dpo_loss(traj[g], ref[g], returns[g], beta=s.dpo_beta).loss for g in groups]


class DPORewardPairsObjective(Objective):
    """:func:`haepo_ray.baseline_losses.dpo_loss` on each group's best and worst sample by reward,
    the best preferred (the first of equal ones; no pair when every reward is equal)."""

    def group_losses(self, s, token_logp, token_entropy, ref_token_logp, old_token_logp, mask, returns, groups):
        traj, ref = sequence_logp(token_logp, mask), sequence_logp(ref_token_logp, mask)
        losses = []
        for g in groups:
            pair = torch.stack([returns[g].argmax(), returns[g].argmin()])
            losses.append(dpo_loss(traj[g][pair], ref[g][pair], returns[g][pair], beta=s.dpo_beta).loss)
        return losses


OBJECTIVES: dict[str, Objective] = {"HAEPO": HAEPOObjective(), "GRPO": GRPOObjective(), "DPO": DPOObjective()}
DPO_REWARD_PAIRS = DPORewardPairsObjective()


def objective_of(settings: ObjectiveSettings) -> Objective:
    """The loss of ``settings``: its algorithm's in :data:`OBJECTIVES`, DPO's on reward pairs
    with ``dpo_pairs`` reward."""
    return DPO_REWARD_PAIRS if settings.algo == "DPO" and settings.dpo_pairs == "reward" else OBJECTIVES[settings.algo]


def rows_per_prompt(settings: ObjectiveSettings, group_size: int) -> int:
    """Rows of one prompt in an update's batch: its samples, after its gold summary for DPO's gold pairs."""
    return group_size + objective_of(settings).with_gold


def training_batch(settings: ObjectiveSettings, samples: Batch, rewards: Tensor, gold: Batch | None,
                   pad_id: int) -> tuple[Batch, Tensor, Tensor]:
    """The rows ``settings``' objective trains on, their returns, and which rows are samples.

    ``samples``: each prompt's completions, consecutive, ``rewards`` theirs. Without gold: the samples
    and their rewards. With gold (``gold``: the prompts' gold summaries in their order, required where the
    objective is DPO's on gold pairs): per prompt its gold row (its prompt's index), return 1, then its samples,
    return 0 (:func:`rows_per_prompt`)."""
    if objective_of(settings).with_gold != (gold is not None):
        raise ValueError(f"{settings.algo}: gold rows are {'required' if gold is None else 'not used'}")
    if gold is None:
        return samples, rewards, torch.ones(len(samples), dtype=torch.bool, device=rewards.device)
    if not len(gold) or len(samples) % len(gold):
        raise ValueError(f"{len(samples)} samples do not split into groups for {len(gold)} gold rows")
    group_size = len(samples) // len(gold)
    gold = dataclasses.replace(gold, prompt_index=samples.prompt_index[::group_size])
    # [gold_1..gold_P, samples of prompt 1, ..] -> [gold_1, samples of prompt 1, gold_2, ..]
    prompt = torch.arange(len(gold))[:, None]
    order = torch.cat([prompt, len(gold) + prompt * group_size + torch.arange(group_size)], dim=1).flatten()
    batch = concat_batches([gold, samples], pad_id).rows(order.to(rewards.device))
    sample_rows = torch.arange(len(batch), device=rewards.device) % (group_size + 1) != 0
    return batch, (~sample_rows).to(rewards.dtype), sample_rows


def _groups(batch: Batch, group_rows: int) -> list[slice]:
    """The update's groups: ``group_rows`` consecutive rows answer one prompt (static slices,
    so the loss has no data-dependent shapes)."""
    n = len(batch)
    if group_rows < 1 or n % group_rows:
        raise ValueError(f"{n} rows do not split into groups of {group_rows}")
    index = batch.prompt_index
    if not is_fake(index) and not (index.view(-1, group_rows) == index[::group_rows, None]).all():
        raise ValueError(f"rows must come in consecutive groups of {group_rows} per prompt, got prompt_index {index.tolist()}")
    return [slice(i, i + group_rows) for i in range(0, n, group_rows)]


def group_loss(
    settings: ObjectiveSettings, batch: Batch, returns: Tensor, ref_token_logp: Tensor | None, *, group_rows: int,
    old_token_logp: Tensor | None = None,
) -> TokenLoss:
    """The update's loss as a function of the policy's token log-probs (and entropies).

    ``returns`` are the rewards R_k, ``ref_token_logp`` the reference policy's token
    log-probs (None: the policy's own, detached: no reference), ``old_token_logp`` the
    behaviour policy's (None: the policy's own, detached), all per row of ``batch``, whose
    rows come in groups of ``group_rows`` per prompt; the loss is the mean over prompts of
    each group's loss (:data:`OBJECTIVES`).
    """
    objective, mask, groups = objective_of(settings), batch.completion_mask, _groups(batch, group_rows)

    def loss(token_logp: Tensor, token_entropy: Tensor | None) -> Tensor:
        if objective.with_entropy and token_entropy is None:
            raise ValueError(f"{settings.algo} needs the token entropies")
        own = token_logp.detach()
        ref = own if ref_token_logp is None else ref_token_logp
        old = own if old_token_logp is None else old_token_logp
        return torch.stack(objective.group_losses(settings, token_logp, token_entropy, ref, old, mask,
                                                  returns, groups)).mean()

    return loss


def chunks(n: int, size: int) -> list[slice]:
    """Slices of ``size`` rows covering ``n`` rows (one slice of all when ``size`` <= 0)."""
    size = size if size > 0 else n
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def backward(
    model: Any, batch: Batch, loss_fn: TokenLoss, *, micro_batch_size: int, with_entropy: bool = False,
    stats: TokenStats = token_stats, scale: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Back-propagate ``loss_fn`` of the model's token ``stats`` on ``batch`` into the parameters.

    ``micro_batch_size`` >= len(batch) (or 0) runs the whole batch in one graph; smaller runs
    the exact micro-batched backward of the module docstring. ``scale`` (a loss scaler's) makes
    the loss that is back-propagated. Returns the detached loss (unscaled) and the detached
    token log-probs [N, T].
    """
    n = len(batch)
    scale = scale or (lambda loss: loss)
    if micro_batch_size <= 0 or micro_batch_size >= n:
        logp, entropy = stats(model, batch, with_entropy)
        loss = loss_fn(logp, entropy)
        scale(loss).backward()
        return loss.detach(), logp.detach()
    slices = chunks(n, micro_batch_size)
    with torch.no_grad():
        per_chunk = [stats(model, batch.rows(c), with_entropy) for c in slices]
    logp = torch.cat([s[0] for s in per_chunk]).requires_grad_(True)
    entropy = torch.cat([s[1] for s in per_chunk]).requires_grad_(True) if with_entropy else None
    loss = loss_fn(logp, entropy)
    leaves = [logp] if entropy is None else [logp, entropy]
    grads = torch.autograd.grad(scale(loss), leaves, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)]
    for c in slices:
        mb_logp, mb_entropy = stats(model, batch.rows(c), with_entropy)
        surrogate = (grads[0][c] * mb_logp).sum()
        if mb_entropy is not None:
            surrogate = surrogate + (grads[1][c] * mb_entropy).sum()
        surrogate.backward()
    return loss.detach(), logp.detach()


def effective_num_trajectories(settings: ObjectiveSettings, batch: Batch, token_logp: Tensor, *,
                               group_rows: int) -> float:
    """Mean over prompts of 1 / sum_k w_k^2 of HAEPO's weights w: M when uniform, 1 when one-hot."""
    traj_logp = _haepo_traj_logp(token_logp, batch.completion_mask, settings)
    values = [torch.exp(-torch.logsumexp(2 * torch.log_softmax(traj_logp[g], 0), 0))
              for g in _groups(batch, group_rows)]
    return float(torch.stack(values).mean())
