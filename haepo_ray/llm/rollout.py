"""Completions as token batches, and their log-likelihoods L_k.

A :class:`Batch` holds prompt + completion token rows: prompts left-padded to a common width
P, completions right-padded to T, so every completion starts at column P. ``completion_mask``
marks a completion's tokens up to and including its first EOS; what follows is padding (some
tokenizers pad with the EOS token itself, so the mask comes from the first EOS, never from
the pad id). Position ids come from the attention mask, so L_k does not depend on how much
padding a row carries on either side.

Decoding (``decoding``): transformers' dynamic KV cache, grown by a token per step, or its
static cache, allocated once for the prompt and every new token, which lets transformers
compile the decode step on CUDA (CUDA graphs: one launch per step instead of a few hundred
kernels). A compiled step is specialised to the cache's shape, so with a static cache prompts
are left-padded to a multiple of :data:`STATIC_PROMPT_MULTIPLE` tokens for ``generate``; the
padding no row needs is dropped from the batch again. The same tokens under greedy decoding,
the same logits within float rounding (``tests/test_llm_rollout.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from haepo_ray.loss import is_fake

__all__ = [
    "STATIC_PROMPT_MULTIPLE",
    "Batch",
    "completion_batch",
    "completion_logits",
    "concat_batches",
    "generate",
    "overrun_problem",
    "padded_prompt_width",
    "sample_completions",
    "sample_groups",
    "sampling_kwargs",
    "sequence_kl",
    "sequence_logp",
    "token_kl",
    "token_stats",
]


@dataclass(frozen=True)
class Batch:
    """N prompt + completion rows; row i answers prompt ``prompt_index[i]`` of the update."""

    input_ids: Tensor  # [N, P + T]
    attention_mask: Tensor  # [N, P + T]
    completion_mask: Tensor  # [N, T] bool: completion tokens up to and including the first EOS
    prompt_index: Tensor  # [N] long

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: Tensor | slice) -> Batch:
        return Batch(self.input_ids[index], self.attention_mask[index],
                     self.completion_mask[index], self.prompt_index[index])

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                              self.completion_mask, self.prompt_index)))


STATIC_PROMPT_MULTIPLE = 64  # decoding static: prompts are left-padded to a multiple of this many tokens


def padded_prompt_width(width: int, decoding: str = "dynamic") -> int:
    """The width that prompts of at most ``width`` tokens are padded to for ``generate``: with
    ``decoding`` static the next multiple of :data:`STATIC_PROMPT_MULTIPLE`, else ``width``."""
    return -(-width // STATIC_PROMPT_MULTIPLE) * STATIC_PROMPT_MULTIPLE if decoding == "static" else width


def _encode_prompts(tokenizer: Any, prompts: Sequence[str], decoding: str = "dynamic") -> tuple[Tensor, Tensor]:
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if any(not r for r in rows):
        raise ValueError("a prompt encodes to no tokens")
    width = padded_prompt_width(max(map(len, rows)), decoding)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _until_first_eos(completion_ids: Tensor, eos_token_id: int | Sequence[int]) -> Tensor:
    eos = torch.isin(completion_ids, torch.as_tensor(eos_token_id, device=completion_ids.device))
    before = eos.long().cumsum(dim=1) - eos.long()  # EOS tokens strictly before each column
    return before == 0


def _batch(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor,
           prompt_index: Tensor) -> Batch:
    return Batch(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, completion_mask.long()], dim=1),
        completion_mask=completion_mask,
        prompt_index=prompt_index,
    )


def _eos_ids(tokenizer: Any, model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    return ids or [tokenizer.eos_token_id]


def sampling_kwargs(*, eos_token_id: list[int], pad_token_id: int, max_new_tokens: int, min_new_tokens: int = 1,
                    temperature: float = 1.0, greedy: bool = False, decoding: str = "dynamic") -> dict[str, Any]:
    """transformers' ``generate`` options of a trial's sampling (pure sampling: no top-k/top-p)
    with ``decoding``'s KV cache."""
    sampling = {} if greedy else {"temperature": temperature, "top_k": 0, "top_p": 1.0}
    cache = {"cache_implementation": "static"} if decoding == "static" else {}
    return {"do_sample": not greedy, "max_new_tokens": max_new_tokens, "min_new_tokens": min_new_tokens,
            "pad_token_id": pad_token_id, "eos_token_id": eos_token_id, **sampling, **cache}


def _context(config: Any) -> int | None:
    """The context in tokens of a model of transformers ``config`` (``max_position_embeddings``), None where
    it has none."""
    return getattr(config, "max_position_embeddings", None)


def context_problem(config: Any, max_new_tokens: int, prompt_tokens: int | None = None) -> str | None:
    """Why ``max_new_tokens`` after a prompt of ``prompt_tokens`` (None: of any length, one token
    at least) overrun the context of a model of transformers ``config`` (its
    ``max_position_embeddings``: rotary positions past it were never trained, learned ones do not
    exist), else None."""
    context = _context(config)
    if context is None or (prompt_tokens or 1) + max_new_tokens <= context:
        return None
    given = f"max_new_tokens {max_new_tokens} overruns" if prompt_tokens is None else \
        f"a prompt of {prompt_tokens} tokens and max_new_tokens {max_new_tokens} overrun"
    return (f"{given} the {config.model_type} model's context of {context} tokens (max_position_embeddings, prompt "
            "included): give fewer max_new_tokens" + ("" if prompt_tokens is None else ", or shorter prompts"))


def overrun_problem(tokenizer: Any, config: Any, *, prompts: Iterable[str], max_new_tokens: int,
                    decoding: str = "dynamic", given: Iterable[tuple[str, str]] = ()) -> str | None:
    """Why ``max_new_tokens`` sampled after the longest of ``prompts`` (padded as ``generate`` pads
    it), or the longest ``given`` (prompt, completion) row with its EOS, would overrun the context
    of a model of transformers ``config`` (:func:`context_problem`), else None."""
    @functools.cache  # a DPO gold row's prompt is among the prompts
    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    longest = max(map(tokens, prompts), default=0)
    if longest and (problem := context_problem(config, max_new_tokens, padded_prompt_width(longest, decoding))):
        return f"{problem} (the run's longest prompt)"
    row = max((tokens(p) + tokens(c) + 1 for p, c in given), default=0)
    if (context := _context(config)) is not None and row > context:
        return (f"a prompt and its given completion (SFT's or DPO's gold summary) of {row} tokens with EOS overrun the "
                f"{config.model_type} model's context of {context} tokens (max_position_embeddings): give shorter "
                "prompts (max_source_words)")
    return None


@torch.no_grad()
def sample_completions(model: Any, ids: Tensor, mask: Tensor, **sampling: Any) -> Tensor:
    """Completion token ids [N, T] after the left-padded prompt rows ``ids``, with transformers'
    ``generate`` and its KV cache; ``sampling`` as :func:`sampling_kwargs` takes them. ValueError
    when the prompts and ``max_new_tokens`` overrun the model's context (:func:`context_problem`)."""
    if problem := context_problem(model.config, sampling["max_new_tokens"], ids.shape[1]):
        raise ValueError(problem)
    out = model.generate(input_ids=ids, attention_mask=mask, **sampling_kwargs(**sampling))
    return out[:, ids.shape[1]:]


@torch.no_grad()
def generate(
    model: Any, tokenizer: Any, prompts: Sequence[str], *, group_size: int, max_new_tokens: int,
    min_new_tokens: int = 1, temperature: float = 1.0, greedy: bool = False, decoding: str = "dynamic",
) -> tuple[Batch, list[str]]:
    """``group_size`` sampled completions per prompt (:func:`sample_completions`, with
    ``decoding``'s KV cache) and their texts."""
    device = next(model.parameters()).device
    ids, mask = _encode_prompts(tokenizer, prompts, decoding)
    ids, mask = ids.repeat_interleave(group_size, 0).to(device), mask.repeat_interleave(group_size, 0).to(device)
    eos = _eos_ids(tokenizer, model)
    completion_ids = sample_completions(
        model, ids, mask, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens, temperature=temperature, greedy=greedy, decoding=decoding)
    first = int(mask.any(0).long().argmax())  # the padding no row needs (decoding static's) goes
    ids, mask = ids[:, first:], mask[:, first:]
    completion_mask = _until_first_eos(completion_ids, eos)
    texts = tokenizer.batch_decode(completion_ids.masked_fill(~completion_mask, tokenizer.pad_token_id),
                                   skip_special_tokens=True)
    prompt_index = torch.arange(len(prompts), device=device).repeat_interleave(group_size)
    return _batch(ids, mask, completion_ids, completion_mask, prompt_index), [t.strip() for t in texts]


def sample_groups(
    model: Any, tokenizer: Any, prompts: Sequence[str], seeds: Sequence[int], positions: Sequence[int], *,
    group_size: int, max_new_tokens: int, min_new_tokens: int = 1, temperature: float = 1.0, together: bool = False,
    decoding: str = "dynamic",
) -> tuple[Batch, list[str]]:
    """:func:`generate` one prompt at a time, each from its own seed: a prompt's completions do
    not depend on the other prompts nor on the global RNG (so not on which worker draws them,
    :mod:`haepo_ray.llm.distributed`). Rows of prompt i have ``prompt_index`` ``positions[i]``.
    ``together``: every prompt in one call from the first seed (``generation`` batch): fewer
    calls, completions that depend on the other prompts of the call."""
    device = next(model.parameters()).device
    calls = [(prompts, seeds[0], positions)] if together else [([p], s, [i]) for p, s, i in
                                                               zip(prompts, seeds, positions, strict=True)]
    batches, texts = [], []
    for call_prompts, seed, call_positions in calls:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            batch, call_texts = generate(model, tokenizer, call_prompts, group_size=group_size,
                                         max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                                         temperature=temperature, decoding=decoding)
        index = torch.tensor(list(call_positions), device=device).repeat_interleave(group_size)
        batches.append(Batch(batch.input_ids, batch.attention_mask, batch.completion_mask, index))
        texts += call_texts
    return concat_batches(batches, tokenizer.pad_token_id), texts


def completion_batch(tokenizer: Any, prompts: Sequence[str], completions: Sequence[str]) -> Batch:
    """Given texts as completions of the prompts (row i answers prompt i), each closed by EOS."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    ids, mask = _encode_prompts(tokenizer, prompts)
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    completion_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    completion_mask = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
    return _batch(ids, mask, completion_ids, completion_mask, torch.arange(len(prompts)))


def _pad(batch: Batch, prompt_width: int, completion_width: int, pad_id: int) -> Batch:
    left = prompt_width - batch.prompt_width
    right = completion_width - batch.completion_mask.shape[1]
    pad = torch.nn.functional.pad
    return Batch(
        input_ids=pad(batch.input_ids, (left, right), value=pad_id),
        attention_mask=pad(batch.attention_mask, (left, right), value=0),
        completion_mask=pad(batch.completion_mask, (0, right), value=False),
        prompt_index=batch.prompt_index,
    )


def concat_batches(batches: Sequence[Batch], pad_id: int) -> Batch:
    """The rows of all ``batches``, padded to a common prompt and completion width."""
    p = max(b.prompt_width for b in batches)
    t = max(b.completion_mask.shape[1] for b in batches)
    padded = [_pad(b, p, t, pad_id) for b in batches]
    return Batch(*(torch.cat([getattr(b, f) for b in padded]) for f in
                   ("input_ids", "attention_mask", "completion_mask", "prompt_index")))


def token_stats(model: Any, batch: Batch, with_entropy: bool = False, *, logits: str = "gather",
                logits_chunk: int = 256) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t | x, y_<t) of each completion token, [N, T] (0 off the mask), and optionally
    the policy's entropy at each completion position (0 off the mask).

    Only the T + 1 last positions go through the LM head, which bounds the [N, T, V] logits.
    ``logits`` (:data:`~haepo_ray.llm.settings.SWITCHES`), the same values three ways:
    ``gather`` the chosen token's logit less log-softmax's normaliser; ``full`` the log-softmax
    over the vocabulary, kept for the backward; ``chunked`` the LM head on ``logits_chunk``
    tokens at a time, each chunk's logits recomputed in the backward (for models whose logits
    are the LM head of the decoder's output: Llama, Qwen2).
    """
    width = batch.completion_mask.shape[1]
    targets = batch.input_ids[:, -width:]
    if logits == "chunked":
        hidden = model.get_decoder()(**_inputs(batch)).last_hidden_state[:, -width - 1:-1]
        logp, entropy = _chunked_stats(model.get_output_embeddings(), hidden, targets, with_entropy, logits_chunk)
    else:
        scores = completion_logits(model, batch)
        logp, entropy = (_full_stats if logits == "full" else _gather_stats)(scores, targets, with_entropy)
    mask = batch.completion_mask
    logp = torch.where(mask, logp, torch.zeros_like(logp))
    return logp, (None if entropy is None else torch.where(mask, entropy, torch.zeros_like(entropy)))


def _inputs(batch: Batch) -> dict[str, Any]:
    """A model pass's inputs: position ids from the attention mask, no KV cache."""
    position_ids = (batch.attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "position_ids": position_ids,
            "use_cache": False}


def completion_logits(model: Any, batch: Batch) -> Tensor:
    """The logits that predict each completion token, [N, T, V], in the model's dtype: position
    P - 1 + t predicts completion token t (only these go through the LM head)."""
    width = batch.completion_mask.shape[1]
    return model(**_inputs(batch), logits_to_keep=width + 1).logits[:, :-1]


def token_kl(logits: Tensor, ref_logits: Tensor, completion_mask: Tensor) -> Tensor:
    """KL(pi(. | x, y_<t) || pi_ref(. | x, y_<t)) = sum_v pi_v (log pi_v - log pi_ref_v) over the
    vocabulary at each completion position, [N, T] (0 off the mask), from the two policies'
    :func:`completion_logits` of the same batch, in float32 or wider; never negative (rounding
    below 0 is cut)."""
    log_p, log_ref = torch.log_softmax(_float(logits), -1), torch.log_softmax(_float(ref_logits), -1)
    kl = (log_p.exp() * (log_p - log_ref)).sum(-1).clamp(min=0)
    return torch.where(completion_mask, kl, torch.zeros_like(kl))


def _float(logits: Tensor) -> Tensor:
    return logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 -> fp32


def _gather_stats(logits: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    logits = _float(logits)
    log_norm = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    if not with_entropy:
        return logp, None
    # H = log Z - sum_v p_v z_v
    return logp, log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def _full_stats(logits: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    log_probs = torch.log_softmax(_float(logits), dim=-1)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, (-(log_probs.exp() * log_probs).sum(-1) if with_entropy else None)


def _chunked_stats(head: Any, hidden: Tensor, targets: Tensor, with_entropy: bool,
                   size: int) -> tuple[Tensor, Tensor | None]:
    """:func:`_gather_stats` of ``head(hidden)``, ``size`` tokens at a time under activation
    checkpointing: a chunk's logits live only while it is computed (forward and backward)."""
    from torch.utils.checkpoint import checkpoint

    def chunk(h: Tensor, t: Tensor) -> tuple[Tensor, ...]:
        return tuple(x for x in _gather_stats(head(h), t, with_entropy) if x is not None)

    flat, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    pieces = [checkpoint(chunk, flat[i:i + size], flat_targets[i:i + size], use_reentrant=False)
              for i in range(0, len(flat), size)]
    logp = torch.cat([p[0] for p in pieces]).view(targets.shape)
    return logp, (torch.cat([p[1] for p in pieces]).view(targets.shape) if with_entropy else None)


def sequence_logp(token_logp: Tensor, completion_mask: Tensor) -> Tensor:
    """L_k = sum_t log pi(y_t | x, y_<t) over each completion's tokens, shape [N]."""
    # Eq. "Trajectory Log-Likelihood" (Sec. 3.1), a completion being the trajectory
    lengths = completion_mask.sum(dim=1)
    if not is_fake(lengths) and (lengths == 0).any():
        empty = (lengths == 0).nonzero().flatten()[:5].tolist()
        raise ValueError(f"completions {empty} (first 5) have no tokens: L_k needs at least one")
    return (token_logp * completion_mask).sum(dim=1)


def sequence_kl(token_logp: Tensor, ref_token_logp: Tensor, completion_mask: Tensor) -> Tensor:
    """L_k - L_k^ref per completion, shape [N]: summed over its tokens, the per-token estimate
    log pi - log pi_ref of KL(pi || pi_ref), unbiased for completions sampled from pi."""
    return sequence_logp(token_logp, completion_mask) - sequence_logp(ref_token_logp, completion_mask)
