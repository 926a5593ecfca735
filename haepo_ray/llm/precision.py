"""The AdamW steps that pure bfloat16 weights cannot take.

A bfloat16 weight w with 2**(e-1) <= |w| < 2**e has neighbours 2**(e-8) apart (8 significant
bits), so an update smaller than half that, 2**(e-9), rounds back to w. AdamW's step is about
``lr`` per entry (exactly ``lr`` at its first step: the bias-corrected m / sqrt(v) is the sign of
the gradient), so with ``lr`` below |w| / 512 to |w| / 256 the weight never moves. SmolLM2-135M
at the default lr 5e-5: 92% of its weights are such (91.95% predicted here, 92.37% unchanged
after one GRPO update; ``bench/llm_precision.py``). Precision ``mixed`` keeps float32 weights;
rounding ``stochastic`` (:mod:`~haepo_ray.llm.stochastic_rounding`) takes such steps in expectation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from haepo_ray.loss import is_fake

__all__ = ["frozen_share", "lost_steps_problem"]

WARN_SHARE = 0.01  # of the trainable weights
_CHUNK = 2 ** 22  # entries compared at a time: no temporary the size of a whole (embedding) matrix


def frozen_share(parameters: Iterable[torch.Tensor], lr: float) -> float:
    """The share of the entries of bfloat16 ``parameters`` that a step of ``lr`` leaves unchanged:
    those whose exponent e (module docstring) exceeds log2(lr) + 9, i.e. |w| >= 2**(e_min - 1)."""
    least = 2.0 ** math.floor(math.log2(lr) + 9)  # 2**(e_min - 1), e_min the least integer > log2(lr) + 9
    frozen, total = [], 0
    for p in parameters:
        frozen += [(chunk.abs() >= least).sum() for chunk in p.detach().reshape(-1).split(_CHUNK)]
        total += p.numel()
    return int(sum(frozen)) / total if total else 0.0


def lost_steps_problem(parameters: list[torch.Tensor], lr: float) -> str | None:
    """What is wrong with training bfloat16 ``parameters`` at ``lr`` where more than
    :data:`WARN_SHARE` of them cannot move; None where they can, or have no values (fake)."""
    if not parameters or parameters[0].dtype != torch.bfloat16 or is_fake(parameters[0]):
        return None
    share = frozen_share(parameters, lr)
    if share <= WARN_SHARE:
        return None
    return (f"pure bfloat16: an AdamW step of lr {lr:g} is less than half the bfloat16 spacing of {share:.1%} of the "
            f"trainable weights, which it leaves unchanged: use rounding 'stochastic', precision 'mixed' (float32 "
            "weights) or a larger lr")
