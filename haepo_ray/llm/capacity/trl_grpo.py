"""TRL's own GRPO training step, simulated and measured: the anchor for this project's GRPO.

:func:`run_trl_step` runs one optimiser step of ``trl.GRPOTrainer`` (the installed TRL) through
TRL's and the HF Trainer's own code, on a model built from a transformers config: TRL's fused
LM head (``add_fused_lm_head``: per-token log-probs and entropies in vocabulary tiles, no
full logits), its old-policy pass (when ``num_iterations`` > 1) and reference pass (when
``beta`` != 0) over the generation batch as TRL scores one, then the trainer's micro-batches
(``compute_loss``, the accelerator's backward), gradient clipping and the optimiser the HF
Trainer builds (``create_optimizer``: fused AdamW by default). It is the script that
:func:`simulate_trl` (fake tensors, :class:`~haepo_ray.llm.capacity.tracker.LiveBytes`) and
:func:`measure_trl` (real tensors under PyTorch's profiler) both run, as
:func:`~haepo_ray.llm.capacity.steps.run_steps` is for this project's step.

What it does not run, and how it stands in:

- generation: the batch is given (token ids 0, prompts of P, completions of T, all masks ones:
  every completion full length), rewards distinct per row, advantages normalised per group as
  TRL's default ``scale_rewards="group"``; the figures cover the training step only;
- the trainer is built around the tiny model (:func:`trl_trainer`: TRL wants a model, a
  tokenizer, a dataset and a reward function), then given the step's model. Its reference is
  built from the same config and dtype, as TRL loads a second copy of the policy's weights
  (TRL would load it from the Hub by the model's name);
- the micro-batches: the first two of the optimiser step run; later ones repeat the second's
  memory (the same tensors live: the gradients and the held batch);
- AdamW's moments exist before the step (one step on zero gradients first), as from a run's
  second step on.

``target="cuda"`` counts 512-byte blocks, runs attention as CUDA's kernels do
(:mod:`~haepo_ray.llm.capacity.simulate`) and TRL's tiles folded in place as its Triton kernels
do (:func:`~haepo_ray.upstream.trl.triton_folds`). Two differences from TRL on CUDA remain:
without Triton, TRL scores every position of a row and drops the prompt's afterwards (on CUDA
it first selects the completion's T positions), so the hidden states it passes to the LM head
are ``P + T - 1`` rows per sequence instead of ``T`` (a copy of ``[rows, P + T - 1, hidden]``
and its gradient in the head's fp32 accumulator: tens to hundreds of MiB here); and autocast
(``bf16`` with float32 weights) runs with PyTorch's CPU op lists, not CUDA's.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from haepo_ray.llm.capacity.allocator import replay as replay_allocator
from haepo_ray.llm.capacity.measure import MeasuredPhase, PhaseMarks, phase_peaks
from haepo_ray.llm.capacity.simulate import TARGETS, cuda_attention, quiet
from haepo_ray.llm.capacity.steps import Recorder, Shapes, warm
from haepo_ray.llm.capacity.tracker import LiveBytes, PhasePeak, PhasePeaks
from haepo_ray.upstream.torch import fake_mode
from haepo_ray.upstream.trl import MetricValues, per_token_logps, triton_folds

__all__ = ["TRL_PHASES", "TRLStep", "grpo_args", "measure_trl", "run_trl_step", "simulate_trl", "trl_trainer"]

TRL_PHASES: tuple[str, ...] = ("old_policy", "reference", "forward_backward", "optimizer")


@dataclass(frozen=True)
class TRLStep(PhasePeaks):
    """Each phase's peak of TRL's simulated step (phases it does not run are absent) and the
    caching allocator's replayed peak reserved bytes."""

    phases: dict[str, PhasePeak]
    allocator_reserved: int


def grpo_args(**overrides: Any) -> Any:
    """TRL's ``GRPOConfig``: its defaults and ``overrides``, on this machine's CPU, writing and
    reporting nothing."""
    from trl import GRPOConfig

    return GRPOConfig(**{"output_dir": tempfile.gettempdir(), "report_to": [], "use_cpu": True,
                         "save_strategy": "no", **overrides})


def trl_trainer(args: Any) -> Any:
    """A ``GRPOTrainer`` with ``args`` around the tiny model, a one-prompt dataset and a constant
    reward. ``args.beta`` must be 0 (TRL would load a reference by the model's name): the
    step's ``beta`` is :func:`run_trl_step`'s, which gives the trainer its reference."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from haepo_ray.llm.models import tiny_model

    if args.cast_lm_head_to_fp32 or args.beta:
        raise ValueError("cast_lm_head_to_fp32 is not simulated; beta is the step's, not the trainer's")
    model, tokenizer = tiny_model(["a short summary"], seed=0)
    prompts = Dataset.from_dict({"prompt": ["a short"] * args.generation_batch_size})
    return GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                       args=args, train_dataset=prompts, processing_class=tokenizer)


def run_trl_step(trainer: Any, build: Callable[[], Any], shapes: Shapes, beta: float, recorder: Recorder) -> None:
    """One optimiser step of TRL's GRPO (module docstring) on ``build()``'s model (and a second
    one as the reference when ``beta`` != 0), prompts and completions as ``shapes`` say."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import add_fused_lm_head

    args = trainer.args
    head = {"temperature": trainer.temperature, "cast_lm_head_to_fp32": args.cast_lm_head_to_fp32}
    with recorder.category("parameters"):
        model = build()
        add_fused_lm_head(model, outputs=("log_probs", "entropy"), **head)
        reference = None
        if beta:
            reference = build().eval()
            add_fused_lm_head(reference, **head)
    recorder.track_module(model)
    if reference is not None:
        recorder.track_module(reference)
    trainer.model = trainer.model_wrapped = model
    trainer.ref_model, trainer.beta = reference, beta
    trainer.optimizer = None
    optimizer = trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # as the training loop sets it
    if args.activation_checkpointing:  # as Trainer.train does
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=args.activation_checkpointing_kwargs)
    model.train()
    warm(list(model.parameters()), optimizer, recorder)

    rows, micro, group = args.generation_batch_size, args.per_device_train_batch_size, args.num_generations
    batch = {"prompt_ids": torch.zeros(rows, shapes.prompt_tokens, dtype=torch.long),
             "prompt_mask": torch.ones(rows, shapes.prompt_tokens, dtype=torch.long),
             "completion_ids": torch.zeros(rows, shapes.completion_tokens, dtype=torch.long),
             "completion_mask": torch.ones(rows, shapes.completion_tokens, dtype=torch.long)}
    rewards = torch.arange(rows, dtype=torch.float32).view(-1, group)
    batch["advantages"] = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    scored = (input_ids, attention_mask, shapes.completion_tokens, micro)  # as TRL scores a generation batch
    with torch.no_grad(), disable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs):
        if args.gradient_accumulation_steps % (args.steps_per_generation * trainer.num_iterations):
            with recorder.phase("old_policy"):
                batch["old_per_token_logps"] = per_token_logps(trainer, model, *scored)
        if reference is not None:
            with recorder.phase("reference"):
                batch["ref_per_token_logps"] = per_token_logps(trainer, reference, *scored)
    del input_ids, attention_mask, scored
    items = batch["completion_mask"].sum()

    with recorder.phase("forward_backward"):
        for k in range(min(2, args.gradient_accumulation_steps)):
            inputs = {name: t[k * micro:(k + 1) * micro] for name, t in batch.items()}
            inputs["num_items_in_batch"] = items
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, inputs, num_items_in_batch=items)
            trainer.accelerator.backward(loss)
            del loss, inputs
    with recorder.phase("optimizer"):
        trainer.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        model.zero_grad()


def _builder(config: Any, dtype: torch.dtype) -> Callable[[], Any]:
    from transformers import AutoModelForCausalLM

    return lambda: AutoModelForCausalLM.from_config(config, dtype=dtype)


def simulate_trl(args: Any, config: Any, shapes: Shapes, *, dtype: torch.dtype, beta: float,
                 target: str = "cuda") -> TRLStep:
    """TRL's GRPO step with ``args`` and ``beta`` on fake tensors of the model
    ``config`` in ``dtype``, counted for ``target`` (module docstring)."""
    trainer = trl_trainer(args)
    tracker = LiveBytes(TARGETS[target])
    folds = triton_folds() if target == "cuda" else contextlib.nullcontext()
    with quiet(), fake_mode(), cuda_attention(target), folds, tracker, MetricValues():
        run_trl_step(trainer, _builder(config, dtype), shapes, beta, tracker)
    return TRLStep(dict(tracker.peaks), replay_allocator(tracker.events).reserved)


def measure_trl(args: Any, config: Any, shapes: Shapes, *, dtype: torch.dtype,
                beta: float) -> dict[str, MeasuredPhase]:
    """Each phase's peak of the same step on real tensors on this CPU, measured by PyTorch's
    profiler as :func:`~haepo_ray.llm.capacity.measure.measure` measures this project's step."""
    from torch.profiler import ProfilerActivity, profile

    trainer = trl_trainer(args)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_trl_step(trainer, _builder(config, dtype), shapes, beta, PhaseMarks())
    return phase_peaks(prof.profiler.kineto_results.events())
