"""A language-model sweep's model, checked before launch, with or without GPUs: its
architecture can be found (:func:`~haepo_ray.llm.capacity.model_configs.model_config`, offline
for the bundled ones), LoRA adapts each of the trials' ``lora_target_modules`` in it
(:func:`~haepo_ray.llm.lora.adapter_problem`), and no trial's ``max_new_tokens`` alone
overruns its context (:func:`~haepo_ray.llm.rollout.context_problem`), where a trial would
otherwise fail at launch, adapt fewer modules than it names, or sample past its positions."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from haepo_ray.llm.settings import LLMTrainSettings

__all__ = ["model_problems"]


def model_problems(model: str, trials: Iterable[LLMTrainSettings], *, searched: Collection[str],
                   prompt_tokens: int | None = None) -> list[str]:
    """What is wrong with ``model`` for these trials' settings: ``llm.model: why`` when its
    architecture cannot be found, else ``{where}.lora_target_modules [...]: why`` once for each set
    of targets of a trial with LoRA that the model does not take, and ``{where}.max_new_tokens``
    for each value that overruns its context, after prompts of ``prompt_tokens`` where given (the
    memory estimates' ``llm.prompt_tokens``), ``where`` being ``search_space`` for a setting in
    ``searched``, else ``settings``."""
    from haepo_ray.llm.capacity.model_configs import model_config
    from haepo_ray.llm.lora import adapter_problem
    from haepo_ray.llm.rollout import context_problem

    try:
        config = model_config(model)
    except ValueError as err:
        return [f"llm.model: {err}"]
    trials = list(trials)

    def where(name: str) -> str:
        return "search_space" if name in searched else "settings"

    targets = dict.fromkeys(tuple(s.lora_target_modules) for s in trials if s.lora_r > 0)
    lengths = dict.fromkeys(s.max_new_tokens for s in trials)
    return ([f"{where('lora_target_modules')}.{problem}" for t in targets if (problem := adapter_problem(config, t))]
            + [f"{where('max_new_tokens')}.{problem}" if prompt_tokens is None
               else f"llm.prompt_tokens and {where('max_new_tokens')}.max_new_tokens: {problem}"
               for n in lengths if (problem := context_problem(config, n, prompt_tokens))])
