"""A language-model sweep's model, checked before launch, with or without GPUs: its
architecture can be found (:func:`~haepo_ray.llm.capacity.model_configs.model_config`, offline
for the bundled ones), and LoRA adapts each of the trials' ``lora_target_modules`` in it
(:func:`~haepo_ray.llm.policy.adapter_problem`), where a trial would otherwise fail at launch or
adapt fewer modules than it names."""

from __future__ import annotations

from collections.abc import Iterable

from haepo_ray.llm.settings import LLMTrainSettings

__all__ = ["model_problems"]


def model_problems(model: str, trials: Iterable[LLMTrainSettings], *, lora_from: str) -> list[str]:
    """What is wrong with ``model`` for these trials' settings: ``llm.model: why`` when its
    architecture cannot be found, else ``{lora_from}.lora_target_modules [...]: why`` once for
    each set of targets of a trial with LoRA that the model does not take."""
    from haepo_ray.llm.capacity.model_configs import model_config
    from haepo_ray.llm.policy import adapter_problem

    try:
        config = model_config(model)
    except ValueError as err:
        return [f"llm.model: {err}"]
    targets = dict.fromkeys(tuple(s.lora_target_modules) for s in trials if s.lora_r > 0)
    return [f"{lora_from}.{problem}" for t in targets if (problem := adapter_problem(config, t))]
