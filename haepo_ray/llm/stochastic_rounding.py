"""AdamW for pure bfloat16 weights that takes steps smaller than their spacing, in expectation.

torch's AdamW on a bfloat16 weight rounds its new value to the nearest bfloat16, so a step
below half the weight's spacing is lost (:mod:`~haepo_ray.llm.precision`: 92% of SmolLM2-135M's
weights at lr 5e-5). :class:`StochasticRoundingAdamW` computes torch's AdamW step in float32 from
the bfloat16 weight, gradient and moments, then rounds the new weight to one of its two bfloat16
neighbours, the upper with probability (x - lower) / (upper - lower) (:func:`stochastic_round`):
the expected new weight is the float32 step's, as with float32 master weights, at 2 bytes a
weight instead of 4 (Zamirai et al. 2020, "Revisiting BFloat16 Training"). The moments are
stored in bfloat16 (nearest), as torch's AdamW stores them for bfloat16 weights.

The random bits are a hash of (seed, step, the parameter's index, the entry's index), not a
generator's: integer arithmetic, the same bits on the CPU and on CUDA; the same rounding on every
worker of a run (all hold the same summed gradients) and after a checkpoint (the seed and steps
are in the optimiser's state); the memory simulator's fake tensors run it too. A parameter is stepped
:data:`CHUNK` entries at a time, so the float32 temporaries stay small.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["CHUNK", "StochasticRoundingAdamW", "random_bits", "stochastic_round"]

CHUNK = 2 ** 20  # entries of a parameter stepped at a time
_MASK32 = 0xFFFFFFFF
_LOW16 = 0xFFFF
_KEEP_BFLOAT16 = -65536  # int32 0xFFFF0000: a float32's sign, exponent and 7 bits of mantissa


def _fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser (a mix in which each input bit changes about half the output
    bits) of ``h`` in [0, 2**32)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def _int32(h: int) -> int:
    """The int32 whose bits are those of ``h`` mod 2**32."""
    h &= _MASK32
    return h - 2 ** 32 if h >= 2 ** 31 else h


def _key(*parts: int) -> int:
    """A stream's key in [0, 2**32) from the integers ``parts``."""
    key = 0
    for part in parts:
        key = _fmix32((key * 0x9E3779B1 + part) & _MASK32)
    return key


def random_bits(key: int, start: int, n: int, device: torch.device | str) -> Tensor:
    """16 random bits per entry ``start`` .. ``start + n - 1`` of the stream ``key`` (in [0, 2**32)), as
    int32 in [0, 2**16): the low bits of :func:`_fmix32` (key + index), computed in int32, whose
    products wrap mod 2**32 (a shift right is masked to be logical)."""
    h = torch.arange(n, dtype=torch.int32, device=device).add_(_int32(key + start))
    h ^= (h >> 16).bitwise_and_(0xFFFF)
    h *= _int32(0x85EBCA6B)
    h ^= (h >> 13).bitwise_and_(0x7FFFF)
    h *= _int32(0xC2B2AE35)
    h ^= (h >> 16).bitwise_and_(0xFFFF)
    return h.bitwise_and_(_LOW16)


def stochastic_round(x: Tensor, bits: Tensor) -> Tensor:
    """float32 ``x`` rounded to bfloat16 with the random ``bits`` (int32 in [0, 2**16), one per
    entry): away from zero where the 16 low bits of ``x``'s mantissa plus ``bits`` carry, else
    towards zero, so E[result] = x for uniform ``bits``. Exactly representable values stay."""
    return (x.view(torch.int32) + bits).bitwise_and_(_KEEP_BFLOAT16).view(torch.float32).to(torch.bfloat16)


class StochasticRoundingAdamW(torch.optim.Optimizer):
    """torch's AdamW (its defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01, no amsgrad)
    on bfloat16 parameters, computed in float32 and rounded stochastically (module docstring).
    ``seed`` picks the rounding's random bits."""

    def __init__(self, params: Iterable[Tensor], *, lr: float, seed: int, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "seed": seed})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.bfloat16:
                    raise ValueError(f"StochasticRoundingAdamW rounds to bfloat16: a parameter is {p.dtype}")

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g_index, group in enumerate(self.param_groups):
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p_index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0  # a number, not a tensor: the simulator's fake tensors have no item()
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"]
                key = _key(group["seed"], step, g_index, p_index)
                chunks = zip(*(t.view(-1).split(CHUNK) for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])),
                             strict=True)
                for index, (w, g, m, v) in enumerate(chunks):
                    new = _adamw(w.float(), g.float(), m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps, decay=decay,
                                 step=step)
                    w.copy_(stochastic_round(new, random_bits(key, index * CHUNK, w.numel(), w.device)))
        return loss


def _adamw(w: Tensor, g: Tensor, m: Tensor, v: Tensor, *, lr: float, beta1: float, beta2: float, eps: float,
           decay: float, step: int) -> Tensor:
    """torch's single-tensor AdamW step (``torch.optim.adamw._single_tensor_adamw``, its order of
    operations) on float32 ``w`` and ``g``, the moments ``m`` and ``v`` updated in place in their
    dtype; returns the new float32 weight."""
    w.mul_(1 - lr * decay)
    m32 = m.float().lerp_(g, 1 - beta1)
    v32 = v.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
    m.copy_(m32)
    v.copy_(v32)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = math.sqrt(1 - beta2 ** step)
    denom = v32.sqrt_().div_(bias_correction2_sqrt).add_(eps)
    return w.addcdiv_(m32, denom, value=-lr / bias_correction1)
