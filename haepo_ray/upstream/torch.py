"""Every private name of PyTorch that haepo-ray uses, each with its reason; a torch upgrade is
checked against :data:`INTERNALS`. All serve the memory simulator
(:mod:`haepo_ray.llm.capacity`), which runs a trial's step on tensors without storage and
counts what each op allocates; the loss only asks whether a tensor is one of those.

- ``torch._subclasses.fake_tensor``: ``FakeTensorMode`` / ``FakeTensor`` (shapes and dtypes,
  no storage), the simulator's tensors. The mode's converter memoises each new fake tensor
  behind a weak reference, which ``Module._apply`` (``.to()``, as peft calls it on every new
  adapter) cannot swap: :func:`fake_mode` gives a converter that keeps no memo (the memo is
  never read for these). ``unset_fake_temporarily`` (:func:`real_tensors`) lets a few
  constants be made with values where a library branches on them.
- ``torch.utils._python_dispatch.TorchDispatchMode`` and ``torch.utils._pytree.tree_flatten``:
  a mode that sees every op and its outputs, the simulator's counter.
- ``torch._C._current_graph_task_id``: -1 outside autograd's backward; the counter books a
  tensor made inside it as a backward temporary.
- ``OpOverload._overloadpacket``: the key of ``torch.utils.flop_counter.flop_registry``.
- ``torch.ops.aten._scaled_dot_product_flash_attention`` / ``_efficient_attention``: the
  kernels CUDA's ``scaled_dot_product_attention`` picks, called directly to count what they
  keep for backward when the simulation targets CUDA.
- ``torch.distributions.Distribution._validate_args``: torch's default for argument checks,
  a class attribute with a public setter and no getter; the RL sampler turns it off for a
  batch and restores it.

Two overrides, each checked against the torch versions it was tested with where it is made
(:data:`OVERRIDES`): the converter's memo (:func:`fake_mode`), and
``torch.nn.functional.scaled_dot_product_attention`` swapped for the kernels CUDA picks while a
simulation targets CUDA (:func:`attention_swapped`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from haepo_ray.upstream.declared import Internal, Patch, pick

__all__ = ["INTERNALS", "OVERRIDES", "TorchDispatchMode", "attention_swapped", "default_validate_args",
           "efficient_attention", "fake_mode", "flash_attention", "flop_key", "in_backward", "is_fake", "real_tensors",
           "tree_flatten"]

TESTED = ("2.13.0",)  # the torch versions the overrides were written and tested for


def is_fake(x: object) -> bool:
    """True for a tensor without values (``FakeTensorMode``'s)."""
    return isinstance(x, FakeTensor)


def fake_mode() -> FakeTensorMode:
    """A ``FakeTensorMode`` whose converter keeps no weak reference to the tensors it makes (the
    module docstring says why); overridden on this instance only."""
    MEMO_LEFT_OUT.apply()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    mode.fake_tensor_converter.set_tensor_memo = lambda tensor, fake: None
    return mode


def real_tensors():
    """A context in which tensors have values again, inside :func:`fake_mode` (whose
    ``allow_non_fake_inputs`` then takes them as inputs)."""
    return unset_fake_temporarily()


def in_backward() -> bool:
    """Whether autograd's backward is running (on this thread)."""
    return torch._C._current_graph_task_id() != -1


def flop_key(func):
    """An ATen op's key in ``flop_registry``."""
    return func._overloadpacket


def flash_attention(query, key, value, dropout_p: float, is_causal: bool, scale):
    """CUDA's flash attention kernel's output (the other outputs are what it keeps for backward)."""
    return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                              scale=scale)[0]


def efficient_attention(query, key, value, attn_mask, grad: bool, dropout_p: float, is_causal: bool, scale):
    """CUDA's memory-efficient attention kernel's output."""
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, grad, dropout_p,
                                                                  is_causal, scale=scale)[0]


@contextlib.contextmanager
def attention_swapped(replacement: Callable) -> Iterator[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` is ``replacement`` within (the memory
    simulator's CUDA kernels, :func:`flash_attention` and :func:`efficient_attention`)."""
    ATTENTION_SWAPPED.apply()
    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = replacement
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def default_validate_args() -> bool:
    """``torch.distributions.Distribution._validate_args``: whether distributions check their
    arguments by default."""
    return torch.distributions.Distribution._validate_args


INTERNALS = (
    Internal("torch._subclasses.fake_tensor", "FakeTensorMode", "the simulator's tensors"),
    Internal("torch._subclasses.fake_tensor", "FakeTensor", "a tensor without values"),
    Internal("torch._subclasses.fake_tensor:FakeTensorConverter", "set_tensor_memo",
             "replaced on one mode's converter: no memo", ("self", "t", "v")),
    Internal("torch._subclasses.fake_tensor", "unset_fake_temporarily", "constants with values inside fake mode",
             ()),
    Internal("torch.utils._python_dispatch", "TorchDispatchMode", "the simulator's counter"),
    Internal("torch.utils._pytree", "tree_flatten", "an op's output tensors"),
    Internal("torch", "_C", "PyTorch's C extension"),
    Internal("torch._C", "_current_graph_task_id", "inside autograd's backward or not"),
    Internal("torch._ops:OpOverload", "_overloadpacket", "the FLOP registry's key", kind="instance"),
    Internal("torch:ops.aten", "_scaled_dot_product_flash_attention", "CUDA's flash attention kernel"),
    Internal("torch:ops.aten", "_scaled_dot_product_efficient_attention", "CUDA's memory-efficient kernel"),
    Internal("torch.distributions.distribution:Distribution", "_validate_args", "torch's default argument checks"),
)

MEMO_LEFT_OUT = Patch("fake tensors converted without a memo", "torch", TESTED, None, lambda: None,
                      pick(INTERNALS, "fake_tensor.FakeTensorMode", "FakeTensorConverter.set_tensor_memo"))
ATTENTION_SWAPPED = Patch("scaled_dot_product_attention as CUDA runs it", "torch", TESTED, None, lambda: None,
                          pick(INTERNALS, "aten._scaled_dot_product_flash_attention",
                               "aten._scaled_dot_product_efficient_attention"))
OVERRIDES = (MEMO_LEFT_OUT, ATTENTION_SWAPPED)
