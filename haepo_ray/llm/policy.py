"""The model a run trains, its frozen reference and its optimiser, and the steps that use them.

:class:`~haepo_ray.llm.train.LLMRun` and the memory simulator (:mod:`haepo_ray.llm.capacity`)
run the same steps through a :class:`Policy`: one SFT step (:meth:`Policy.sft_step`) and the
RL update (:meth:`Policy.rl_update`: the reference pass :meth:`Policy.reference_logp`, then
:meth:`Policy.update`).

Memory savers, each a setting of :class:`~haepo_ray.llm.settings.LLMTrainSettings`:

- ``lora_r > 0``: LoRA adapters (:mod:`~haepo_ray.llm.lora`) on ``lora_target_modules``; only adapter
  parameters train. SFT trains an adapter that is then merged into the base weights (the SFT
  checkpoint), and RL trains a fresh adapter; the reference policy is the same model with its
  adapter disabled, so no second copy of the weights is held.
- ``gradient_checkpointing``: each decoder layer's activations are recomputed in the backward
  pass (transformers' activation checkpointing, non-reentrant). Transformers checkpoints a
  layer only in training mode; the run keeps its model in eval mode (no dropout: the
  micro-batched backward re-runs the same forward), so only the decoder layers' own flag is
  set to training, never their sub-modules', and only during the passes with gradient.
- ``micro_batch_size`` (:func:`~haepo_ray.llm.objectives.backward`) and ``dtype``.

Implementation switches (:data:`~haepo_ray.llm.settings.SWITCHES`), to walk from this step to
other tools' (TRL's ``GRPOTrainer``); those marked = give the same loss and gradients:

- ``reference``: ``auto`` as above; ``copy`` a frozen copy even with LoRA (=); ``none`` no
  reference pass, the loss taking the policy's own detached log-probs as the reference's (its
  KL term 0; only where beta_kl is 0 and not DPO: then =).
- ``logits`` (=): how the passes get token log-probs (:func:`~haepo_ray.llm.rollout.token_stats`).
- ``precision``: ``pure`` as above; ``mixed`` float32 weights, gradients and AdamW state (the
  model is loaded in :attr:`~haepo_ray.llm.settings.LLMTrainSettings.weights_dtype`), every
  model pass and generation under ``torch.autocast`` to ``dtype`` (:meth:`Policy.autocast`);
  with float16, dynamic loss scaling (:attr:`Policy.scaler`).
- ``adamw`` (=): AdamW's multi-tensor (``foreach``) or per-parameter step; ``auto`` lets torch
  choose (:attr:`Policy.foreach`).
- ``rounding`` (pure bfloat16): ``nearest`` torch's AdamW, which loses a step below half a
  weight's spacing (:mod:`~haepo_ray.llm.precision`); ``stochastic`` the same step in float32,
  rounded so that it is taken in expectation (:mod:`~haepo_ray.llm.stochastic_rounding`).
- ``num_iterations`` (GRPO): with n > 1, :meth:`Policy.rl_update` computes the old policy's
  log-probs (without gradient, in the ``reference`` phase) and takes n optimiser steps on the
  batch, the ratio of GRPO's loss being to the old policy.
- ``generation``: one ``generate`` call per prompt or one per update (the trial's sampling,
  :func:`~haepo_ray.llm.rollout.sample_groups`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import Tensor

from haepo_ray.llm.distributed import World
from haepo_ray.llm.lora import adapter_problem, with_adapter
from haepo_ray.llm.objectives import TokenLoss, TokenStats, backward, chunks, group_loss, objective_of
from haepo_ray.llm.precision import lost_steps_problem
from haepo_ray.llm.rollout import Batch, completion_logits, context_problem, token_kl, token_stats
from haepo_ray.llm.settings import LLMTrainSettings, torch_dtype
from haepo_ray.llm.stochastic_rounding import StochasticRoundingAdamW

__all__ = ["Phase", "Policy", "denormals", "model_passes", "no_phase"]

Phase = Callable[[str], contextlib.AbstractContextManager[None]]  # phase name -> context
T = TypeVar("T")


def no_phase(name: str) -> contextlib.AbstractContextManager[None]:
    """A :data:`Phase` that records nothing."""
    return contextlib.nullcontext()


def _checkpoint_layers(model: Any) -> None:
    # transformers 5.17 (the GPU image's) has only gradient_checkpointing_enable, 5.24 (the lock's)
    # deprecates it for activation_checkpointing_enable; both are non-reentrant by default
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


@contextlib.contextmanager
def _layers_training(model: Any, on: bool) -> Iterator[None]:
    """The decoder layers' own training flag set while passes with gradient run (their sub-modules
    stay in eval mode). Only then: transformers 5.17 drops the KV cache in a checkpointed layer
    in training mode, and its generation then attends to the newest token alone."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)] if on else []
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def autocast(settings: LLMTrainSettings) -> contextlib.AbstractContextManager[None]:
    """``torch.autocast`` to ``dtype`` with precision ``mixed``; nothing with ``pure``."""
    if settings.precision == "pure":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(settings.device).type, dtype=torch_dtype(settings.dtype))


@contextlib.contextmanager
def denormals(settings: LLMTrainSettings) -> Iterator[None]:
    """Subnormal floats flushed to zero on this thread while inside, with ``flush_denormal``.

    HAEPO's one-hot weights scale the gradient of a group's other completions by their weights
    (1e-20 and less), and times the softmax's small probabilities the logits' gradient is
    subnormal; on x86 every operation on a subnormal takes a microcode assist (the LM head's
    backward matrix product ran 175 times slower on subnormal input: BENCHMARKS.md, "Subnormal
    floats"). A value below 1.2e-38 (float32's and bfloat16's smallest normal) moves no weight
    measurably: AdamW's step is about g / (sqrt(v) + 1e-8). torch sets the flag (FTZ and DAZ) of
    the calling thread only, so further intra-op threads keep subnormals; torch has no getter,
    and the flag is cleared on the way out (the CPU's default).
    """
    if not settings.flush_denormal:
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def model_passes(settings: LLMTrainSettings) -> TokenStats:
    """The policy's model passes (:attr:`Policy.stats`): :func:`~haepo_ray.llm.rollout.token_stats`
    with the settings' ``logits`` and ``logits_chunk``, under :func:`autocast`."""
    stats = functools.partial(token_stats, logits=settings.logits, logits_chunk=settings.logits_chunk)

    def passes(model: Any, batch: Batch, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        with autocast(settings):
            return stats(model, batch, with_entropy)

    return passes


def _frozen_copy(model: Any) -> Any:
    """A copy of ``model`` that does not train, its tensors cloned by torch (``deepcopy`` of a
    fake tensor, as in the memory simulator, copies bytes that do not exist)."""
    memo: dict[int, Any] = {}
    for t in model.parameters():
        memo[id(t)] = torch.nn.Parameter(t.detach().clone(), requires_grad=False)
    for t in model.buffers():
        memo[id(t)] = t.detach().clone()
    return copy.deepcopy(model, memo)


class Policy:
    """The trained model and what each phase of a run needs from it (module docstring)."""

    def __init__(self, model: Any, settings: LLMTrainSettings, world: World = World()) -> None:
        """ValueError when LoRA cannot adapt one of the settings' targets (:func:`adapter_problem`),
        which peft, given several, would skip without a word, or when ``max_new_tokens`` alone
        overruns the model's context (:func:`~haepo_ray.llm.rollout.context_problem`)."""
        self.settings, self.world = settings, world
        if self.lora and (problem := adapter_problem(model.config, settings.lora_target_modules)):
            raise ValueError(problem)
        if problem := context_problem(model.config, settings.max_new_tokens):
            raise ValueError(problem)
        self.model = model
        if settings.gradient_checkpointing:
            _checkpoint_layers(model)
        self.reference: Any = None  # a frozen copy; None with LoRA (the adapter is disabled instead) or none
        self.optimizer: torch.optim.Optimizer | None = None
        self.stats: TokenStats = model_passes(settings)  # every model pass of a step (the simulator replays repeats)
        # AdamW's implementation where adamw is "auto": None lets torch choose by device (CUDA:
        # multi-tensor "foreach", CPU: one parameter at a time); the simulator of a CUDA step, on
        # CPU tensors, sets True.
        self.foreach: bool | None = None
        # Dynamic loss scaling (torch.amp.GradScaler) with float16 mixed precision: unscaled, a
        # gradient below float16's least subnormal (6e-8) is 0 in the passes (6.8-13.6% of SmolLM2-
        # 135M's nonzero gradient entries in one ACLSum batch of SFT, HAEPO, GRPO and DPO:
        # BENCHMARKS.md), and AdamW, which scales each entry alone, never moves those weights. Each
        # optimiser gets a fresh scaler (:meth:`start_sft`, :meth:`start_rl`); the simulator's fake
        # tensors have no values to find an inf in, and it turns scaling off (its tensors are scalars).
        self.loss_scaling = settings.loss_scaling
        self.scaler: torch.amp.GradScaler | None = None
        self.overflows = 0  # gradients computed again at half the scale (:meth:`_step`)

    @property
    def lora(self) -> bool:
        return self.settings.lora_r > 0

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The context of a model pass outside :attr:`stats` (generation): :func:`autocast`."""
        return autocast(self.settings)

    def _optimizer(self, lr: float, stream: int) -> torch.optim.Optimizer:
        """AdamW on the trainable parameters (stochastically rounded with ``rounding`` stochastic, its
        random bits from the run's seed and ``stream``: 0 SFT, 1 RL), and a fresh :attr:`scaler` for
        it; a warning where ``lr`` cannot move many bfloat16 weights rounded to nearest
        (:func:`~haepo_ray.llm.precision.lost_steps_problem`)."""
        self.scaler = torch.amp.GradScaler(torch.device(self.settings.device).type, enabled=self.loss_scaling)
        if self.settings.rounding == "stochastic":
            return StochasticRoundingAdamW(self.trainable(), lr=lr, seed=2 * self.settings.seed + stream)
        if problem := lost_steps_problem(self.trainable(), lr):
            warnings.warn(problem, stacklevel=3)
        foreach = {"foreach": True, "per_parameter": False}.get(self.settings.adamw, self.foreach)
        return torch.optim.AdamW(self.trainable(), lr=lr, foreach=foreach)

    def _step(self, gradients: Callable[[], T], phase: Phase = no_phase) -> T:
        """``gradients()`` (the scaled gradients, summed over the workers), then the optimiser step
        on them unscaled; returns what ``gradients`` did. Where a gradient is inf or NaN the scaler
        takes no step and halves the scale, and the gradients are computed again (:attr:`overflows`
        counts it): torch's recipe skips the step, which here would lose an update's samples and
        give the methods of a sweep different numbers of steps. Every worker sees the same summed
        gradients, so all compute again together. Still not finite at a scale of 1: a
        FloatingPointError, before any step."""
        while True:
            out = gradients()
            scale = self.scaler.get_scale()
            with phase("optimizer"):
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.get_scale() >= scale:  # a scale falls only where a gradient is inf or NaN
                return out
            self.overflows += 1
            if scale <= 1:
                raise FloatingPointError(f"float16 gradients are inf or NaN at a loss scale of {scale:g}, the least "
                                         "(DeepSpeed's min_loss_scale): a NaN in the loss or the weights, or gradients "
                                         "beyond float16's range: train in bfloat16 or float32")

    def start_sft(self) -> None:
        """The SFT optimiser (of a fresh adapter with LoRA)."""
        if self.lora:
            self.model = with_adapter(self.model, self.settings)
        self.optimizer = self._optimizer(self.settings.sft_lr, stream=0)

    def start_rl(self) -> None:
        """Freeze the model as it is (the SFT checkpoint) as the reference (``reference``); make
        the RL optimiser."""
        if self.lora and hasattr(self.model, "merge_and_unload"):  # SFT's adapter becomes part of the base weights
            self.model = self.model.merge_and_unload()
        reference = self.settings.reference
        if reference == "copy" or (reference == "auto" and not self.lora):
            self.reference = _frozen_copy(self.model)
        if self.lora:
            self.model = with_adapter(self.model, self.settings)
        self.optimizer = self._optimizer(self.settings.lr, stream=1)

    def load_start(self, model_state: dict[str, Any]) -> None:
        """An SFT start's weights (a model's state after :meth:`start_rl`) into this policy,
        after its own :meth:`start_rl`: the model's and a frozen reference's (with LoRA a copy of
        the model with its fresh adapter merged in, which changes no weight: its B is 0)."""
        self.model.load_state_dict(model_state)
        if self.reference is not None and self.lora:
            self.reference = _frozen_copy(self.model).merge_and_unload()
        elif self.reference is not None:
            self.reference.load_state_dict(model_state)

    def sft_step(self, batch: Batch | None, tokens: int) -> Tensor:
        """One supervised step: the NLL of ``batch``'s completion tokens over the ``tokens`` of
        all workers (this worker's share of the token mean); ``None``: this worker has no rows."""
        def gradients() -> Tensor:
            loss = torch.zeros((), device=self.settings.device)
            with _layers_training(self.model, self.settings.gradient_checkpointing):
                if batch is not None:
                    loss = -self.stats(self.model, batch, False)[0].sum() / tokens
                scaled = self.scaler.scale(loss)  # also without rows: every worker's scaler as the others'
                if batch is not None:
                    scaled.backward()
            self.world.sum_gradients(self.trainable())
            return loss.detach()

        return self._step(gradients)

    @contextlib.contextmanager
    def _reference_model(self) -> Iterator[Any]:
        if self.reference is None:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.reference

    @torch.no_grad()
    def reference_logp(self, batch: Batch) -> Tensor | None:
        """The reference policy's token log-probs of ``batch``, ``micro_batch_size`` rows at a
        time; None with ``reference`` none (the policy is its own reference)."""
        if self.settings.reference == "none":
            return None
        with self._reference_model() as reference:
            return self._logp(reference, batch)

    @torch.no_grad()
    def logp(self, batch: Batch) -> Tensor:
        """The trained policy's token log-probs of ``batch``, without gradient, as :meth:`reference_logp`."""
        return self._logp(self.model, batch)

    @torch.no_grad()
    def exact_kl(self, batch: Batch) -> Tensor:
        """Per completion of ``batch``, [N]: the sum over its positions of the exact per-token
        KL(pi || pi_ref) over the vocabulary (:func:`~haepo_ray.llm.rollout.token_kl`), the
        KL of the two policies' completion distributions when the completions are the policy's
        own samples; ``micro_batch_size`` rows at a time, under :func:`autocast`. 0 with
        ``reference`` none (the policy is its own reference)."""
        if self.settings.reference == "none":
            return torch.zeros(len(batch), device=batch.input_ids.device)
        out = []
        for c in chunks(len(batch), self.settings.micro_batch_size):
            rows = batch.rows(c)
            with self.autocast():
                logits = completion_logits(self.model, rows)
                with self._reference_model() as reference:
                    ref_logits = completion_logits(reference, rows)
            out.append(token_kl(logits, ref_logits, rows.completion_mask).sum(1))
        return torch.cat(out)

    def _logp(self, model: Any, batch: Batch) -> Tensor:
        return torch.cat([self.stats(model, batch.rows(c), False)[0]
                          for c in chunks(len(batch), self.settings.micro_batch_size)])

    def gradients(self, batch: Batch, loss_fn: TokenLoss) -> tuple[Tensor, Tensor]:
        """Back-propagate ``loss_fn`` into the trainable parameters' gradients (times the loss
        scale, :attr:`scaler`), summed over the workers: (loss, token log-probs), detached."""
        with _layers_training(self.model, self.settings.gradient_checkpointing):
            loss, logp = backward(self.model, batch, loss_fn, micro_batch_size=self.settings.micro_batch_size,
                                  with_entropy=objective_of(self.settings.objective()).with_entropy, stats=self.stats,
                                  scale=self.scaler.scale)
        self.world.sum_gradients(self.trainable())
        return loss, logp

    def update(self, batch: Batch, loss_fn: TokenLoss, *, phase: Phase = no_phase) -> tuple[Tensor, Tensor]:
        """:meth:`gradients`, then the optimiser step (:meth:`_step`): (loss, token log-probs), detached."""
        def gradients() -> tuple[Tensor, Tensor]:
            with phase("forward_backward"):
                return self.gradients(batch, loss_fn)

        return self._step(gradients, phase)

    def rl_update(self, batch: Batch, returns: Tensor, *, group_rows: int, share: float = 1.0,
                  phase: Phase = no_phase) -> tuple[Tensor, Tensor, Tensor | None]:
        """One RL update of ``batch`` (``group_rows`` rows per prompt, rewards ``returns``; this
        worker's ``share`` of the update's prompts weighs its loss): the reference pass (and the
        old policy's, with ``num_iterations`` > 1), then ``num_iterations`` x :meth:`update`.
        Returns the first step's (loss, token log-probs) and the reference's log-probs (or None)."""
        with phase("reference"):
            ref_logp = self.reference_logp(batch)
            old_logp = self.logp(batch) if self.settings.num_iterations > 1 else None
        loss_fn = group_loss(self.settings.objective(), batch, returns, ref_logp, group_rows=group_rows,
                             old_token_logp=old_logp)
        steps = [self.update(batch, lambda lp, ent: share * loss_fn(lp, ent), phase=phase)
                 for _ in range(self.settings.num_iterations)]
        return *steps[0], ref_logp

    def state_dict(self) -> dict[str, Any]:
        """Policy, optimiser, loss scaler and (without LoRA) reference: what a checkpoint restores."""
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scaler": self.scaler.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (or a final checkpoint's policy alone) into an RL-ready policy."""
        self.model.load_state_dict(state["model"])
        if "optimizer" in state:
            if self.reference is not None:
                self.reference.load_state_dict(state["reference"])
            self.optimizer.load_state_dict(state["optimizer"])
            if state.get("scaler"):  # a disabled scaler's is empty
                self.scaler.load_state_dict(state["scaler"])
