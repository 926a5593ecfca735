"""LoRA through ``peft``: the adapter a run trains (:func:`with_adapter`), and why the targets a
run names cannot be adapted (:func:`adapter_problem`), said before a run writes anything
(:class:`~haepo_ray.llm.policy.Policy`) and before a sweep launches a trial
(:mod:`haepo_ray.sweep.kinds.llm.model`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from haepo_ray.llm.settings import LLMTrainSettings

__all__ = ["adapter_problem", "with_adapter"]


def with_adapter(model: Any, settings: LLMTrainSettings) -> Any:
    """``model`` with a fresh LoRA adapter of the settings' rank, alpha and targets (no dropout, no bias)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha,
                        target_modules=list(settings.lora_target_modules), lora_dropout=0.0, bias="none")
    return get_peft_model(model, config)


def adapter_problem(config: Any, targets: Sequence[str]) -> str | None:
    """Why LoRA cannot adapt each of ``targets`` in a model of transformers ``config``, as peft
    decides for each target alone on an empty (meta-device) model: it names no module (peft, given
    several, adapts the others without a word) or only modules LoRA cannot adapt; None when each
    adapts some layer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def empty_model() -> Any:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)

    modules = dict(empty_model().named_modules())
    why = []
    for target in targets:
        kinds = sorted({type(m).__name__ for name, m in modules.items()
                        if name == target or name.endswith(f".{target}")})  # peft's rule for a list
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # peft's tied-embedding advice, for a model never trained
                get_peft_model(empty_model(), LoraConfig(r=1, target_modules=[target]))
        except ValueError:  # none found, or one that is not a layer LoRA adapts
            why.append(f"{target!r} names {', '.join(kinds)}, which LoRA cannot adapt" if kinds
                       else f"{target!r} names no module")
    if not why:
        return None
    layers = sorted({name.rsplit(".", 1)[-1] for name, m in modules.items() if isinstance(m, torch.nn.Linear)})
    return (f"lora_target_modules {list(targets)}: in the {config.model_type} model, {'; '.join(why)} "
            f"(its linear layers are named {', '.join(layers)})")
