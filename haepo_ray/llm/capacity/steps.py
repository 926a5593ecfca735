"""The phases of one language-model trial, in order, through the trial's own code.

:func:`run_steps` is the script that the simulator (:mod:`~haepo_ray.llm.capacity.simulate`,
on fake tensors) and the measurement (:mod:`~haepo_ray.llm.capacity.measure`, on real ones)
both run, so what is simulated is what is measured: a :class:`~haepo_ray.llm.policy.Policy`
of the model with the trial's settings, then

- ``sft``: one supervised step of ``sft_batch`` rows (:meth:`Policy.sft_step`);
- ``generation``: one ``generate`` call of the trial (:func:`generation_rows` rows: one
  prompt's group, or with ``generation`` batch every prompt's), by the caller's ``generate``;
- ``reference``, ``forward_backward``, ``optimizer``: the RL update of ``batch_prompts``
  prompts (DPO: the gold summary and ``group_size`` samples per prompt) through
  :meth:`Policy.rl_update` (the reference pass, :func:`~haepo_ray.llm.objectives.group_loss`
  and ``num_iterations`` x :meth:`Policy.update`).

Both optimisers are in their steady state: AdamW's moments exist before the step, as from a
run's second step on (:func:`warm`). Every prompt is ``prompt_tokens`` long, every completion
and gold summary ``completion_tokens`` (the worst case: every completion runs to
``max_new_tokens``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from haepo_ray.llm.objectives import TokenStats, objective_of, rows_per_prompt
from haepo_ray.llm.policy import Policy
from haepo_ray.llm.rollout import Batch
from haepo_ray.llm.settings import LLMTrainSettings

__all__ = ["PHASES", "RL_PHASES", "Recorder", "Shapes", "generation_calls", "generation_rows", "group_sampling",
           "run_steps", "token_batch", "warm"]

PHASES: tuple[str, ...] = ("sft", "generation", "reference", "forward_backward", "optimizer")
RL_PHASES: tuple[str, ...] = PHASES[1:]  # one RL update


class Recorder(Protocol):
    """What :func:`run_steps` tells its observer: phases, what is being made, the modules."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]: ...

    def category(self, name: str) -> contextlib.AbstractContextManager[None]: ...

    def track_module(self, module: Any) -> None: ...


@dataclass(frozen=True)
class Shapes:
    """Token lengths of the simulated or measured step."""

    prompt_tokens: int
    completion_tokens: int

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.completion_tokens < 1:
            raise ValueError(f"prompt and completion lengths must be >= 1 token, got {self.prompt_tokens}, "
                             f"{self.completion_tokens}")


def token_batch(rows: int, group_rows: int, shapes: Shapes) -> Batch:
    """``rows`` full-length rows in groups of ``group_rows`` per prompt (token ids 0)."""
    width = shapes.prompt_tokens + shapes.completion_tokens
    return Batch(input_ids=torch.zeros(rows, width, dtype=torch.long),
                 attention_mask=torch.ones(rows, width, dtype=torch.long),
                 completion_mask=torch.ones(rows, shapes.completion_tokens, dtype=torch.bool),
                 prompt_index=torch.arange(rows // group_rows).repeat_interleave(group_rows))


def generation_rows(settings: LLMTrainSettings) -> int:
    """Rows of one of a trial's ``generate`` calls: a prompt's group, or every prompt's (``generation`` batch)."""
    return settings.group_size * (settings.batch_prompts if settings.generation == "batch" else 1)


def generation_calls(settings: LLMTrainSettings) -> int:
    """``generate`` calls of one update: one per prompt, or one (``generation`` batch)."""
    return 1 if settings.generation == "batch" else settings.batch_prompts


def group_sampling(model: Any, settings: LLMTrainSettings) -> dict[str, Any]:
    """:func:`~haepo_ray.llm.rollout.sampling_kwargs`' arguments for one group of a trial."""
    eos = model.config.eos_token_id
    return {"eos_token_id": [eos] if isinstance(eos, int) else list(eos), "pad_token_id": model.config.pad_token_id or 0,
            "max_new_tokens": settings.max_new_tokens, "min_new_tokens": settings.min_new_tokens,
            "temperature": settings.temperature, "decoding": settings.decoding}


def warm(parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, recorder: Recorder) -> None:
    """One optimiser step on zero gradients: AdamW's moments exist, as in the steady state."""
    with recorder.category("optimizer"):
        for p in parameters:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def run_steps(model: Any, settings: LLMTrainSettings, shapes: Shapes, recorder: Recorder,
              generate: Callable[[Any], None], stats: TokenStats | None = None,
              foreach: bool | None = None, loss_scaling: bool = True) -> Policy:
    """Run the phases of the module docstring on ``model`` (on the CPU); ``generate(model)``
    runs one ``generate`` call, ``stats`` the policy's model passes (default its own,
    :func:`~haepo_ray.llm.policy.model_passes`), ``foreach`` is AdamW's implementation where
    ``adamw`` is auto (:attr:`Policy.foreach`); ``loss_scaling`` False turns float16's off
    (:attr:`Policy.loss_scaling`). Returns the policy after the RL update."""
    with recorder.category("parameters"):
        policy = Policy(model, settings)
        policy.stats = stats or policy.stats
        policy.foreach = foreach
        policy.loss_scaling = policy.loss_scaling and loss_scaling
        policy.start_sft()
    recorder.track_module(policy.model)
    warm(policy.trainable(), policy.optimizer, recorder)
    with recorder.phase("sft"):
        rows = settings.sft_batch
        policy.sft_step(token_batch(rows, 1, shapes), rows * shapes.completion_tokens)

    with recorder.category("parameters"):
        policy.start_rl()
    recorder.track_module(policy.model)
    warm(policy.trainable(), policy.optimizer, recorder)
    with recorder.phase("generation"), policy.autocast():
        generate(policy.model)
    group_rows = rows_per_prompt(settings.objective(), settings.group_size)
    batch = token_batch(settings.batch_prompts * group_rows, group_rows, shapes)
    # Rewards as a trial has them: distinct per sample; DPO's gold (each group's first row) preferred.
    row = torch.arange(len(batch))
    returns = (row % group_rows == 0).float() if objective_of(settings.objective()).with_gold else row.float()
    policy.rl_update(batch, returns, group_rows=group_rows, phase=recorder.phase)
    return policy
