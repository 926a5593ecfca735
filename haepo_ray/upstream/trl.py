"""Every private name of TRL (and the one of PyTorch it needs) that haepo-ray uses, each with its
reason; a TRL upgrade is checked against :data:`INTERNALS`. All serve the simulation of TRL's
own GRPO step (:mod:`haepo_ray.llm.capacity.trl_grpo`):

- ``GRPOTrainer._get_per_token_logps_and_entropies``: TRL's per-token log-probs (the fused LM
  head), called for the old policy's and the reference's passes as TRL calls it when it scores
  a generation batch (``_generate_and_score_completions``, which also generates and rewards);
- ``trl.kernels.chunked_logprob._forward_tile`` / ``_backward_tile``: the torch folds of its
  chunked log-prob function, which run where Triton does not; on CUDA, Triton kernels fold
  each logits tile in place instead, allocating nothing (:func:`triton_folds`);
- ``torch.ops.aten._local_scalar_dense``: a tensor's value as a Python number (``.item()``,
  ``bool()``), which fake tensors have not; TRL's loss takes its logged metrics so
  (:class:`MetricValues`).

The tile swap is checked against the TRL versions it was tested with where it is made
(:data:`TILES_FOLDED_IN_PLACE`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from haepo_ray.upstream.declared import Internal, Patch, pick
from haepo_ray.upstream.torch import TorchDispatchMode

__all__ = ["INTERNALS", "OVERRIDES", "MetricValues", "per_token_logps", "triton_folds"]

TESTED = ("1.16.0",)  # the TRL versions the tile swap was written and tested for


def per_token_logps(trainer: Any, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    logits_to_keep: int, batch_size: int) -> torch.Tensor:
    """TRL's per-token log-probs of the last ``logits_to_keep`` tokens, ``batch_size`` rows a pass."""
    return trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                      batch_size=batch_size)[0]


@contextlib.contextmanager
def triton_folds() -> Iterator[None]:
    """TRL's chunked log-prob function folding its tiles as its Triton kernels do on CUDA: in
    place, with no tensor of their own (the torch folds make fp32 copies of each tile)."""
    from trl.kernels import chunked_logprob

    TILES_FOLDED_IN_PLACE.apply()
    saved = chunked_logprob._forward_tile, chunked_logprob._backward_tile
    chunked_logprob._forward_tile = chunked_logprob._backward_tile = lambda *args, **kwargs: None
    try:
        yield
    finally:
        chunked_logprob._forward_tile, chunked_logprob._backward_tile = saved


class MetricValues(TorchDispatchMode):
    """Fake tensors' values where TRL's loss reads them for its logged metrics: every scalar is 0
    (so ``isnan(x).all()`` is false), and a boolean mask selects every element (TRL's ``nanmin``
    drops NaNs, which fake tensors have not). Neither decides the step's tensors' shapes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            return False if args[0].dtype == torch.bool else 0
        if func is torch.ops.aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            if len(args[1]) != 1 or args[1][0].dim() != 1:
                raise NotImplementedError("only a 1-D boolean mask is given its values")
            return func(args[0], [torch.arange(len(args[1][0]))])
        return func(*args, **kwargs)


INTERNALS = (
    Internal("trl.trainer.grpo_trainer:GRPOTrainer", "_get_per_token_logps_and_entropies",
             "TRL's per-token log-probs",
             ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
              "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
              "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids",
              "image_position_ids")),
    Internal("trl.kernels.chunked_logprob", "_forward_tile", "its forward fold without Triton",
             ("tile", "tile_stride", "targets", "running_max", "sum_exp", "x_sum_exp", "sq_sum_exp", "z_sum",
              "max_before_target", "target_logit", "vocab_start", "n_cols", "logit_scale", "softcap", "inv_t",
              "HAS_SOFTCAP", "HAS_ENTROPY", "HAS_LOG_SUM_SQ_PROBS", "HAS_MEAN_LOGITS", "HAS_IS_TOP1", "BLOCK_SIZE")),
    Internal("trl.kernels.chunked_logprob", "_backward_tile", "its backward fold without Triton",
             ("tile", "tile_stride", "targets", "log_z", "entropy", "grad_logprobs", "grad_entropy", "vocab_start",
              "n_cols", "logit_scale", "softcap", "inv_t", "HAS_SOFTCAP", "HAS_LOGPROB_GRAD", "HAS_ENTROPY_GRAD",
              "BLOCK_SIZE")),
    Internal("torch:ops.aten", "_local_scalar_dense", "a tensor's value as a number"),
)

TILES_FOLDED_IN_PLACE = Patch("TRL's chunked log-prob tiles folded in place", "trl", TESTED, None, lambda: None,
                              pick(INTERNALS, "chunked_logprob._forward_tile", "chunked_logprob._backward_tile"))
OVERRIDES = (TILES_FOLDED_IN_PLACE,)
