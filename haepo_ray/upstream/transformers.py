"""Every private name of transformers 5 that haepo-ray uses, each with its reason; a transformers
upgrade is checked against :data:`INTERNALS`.

The memory simulator (:mod:`haepo_ray.llm.capacity.simulate`) cannot run ``generate`` on fake
tensors (it stops on EOS, a choice made from values), so it runs generation's steps itself and
needs the logits processors ``generate`` would make, since each processor's tensors count:
:func:`logits_processors` calls ``generate``'s own private builders as ``generate`` calls them.
"""

from __future__ import annotations

from typing import Any

from haepo_ray.upstream.declared import Internal
from haepo_ray.upstream.torch import real_tensors

__all__ = ["INTERNALS", "logits_processors"]


def logits_processors(model: Any, sampling: dict[str, Any], prompt_ids: Any) -> Any:
    """The ``LogitsProcessorList`` that ``model.generate(prompt_ids, **sampling)`` makes."""
    from transformers import LogitsProcessorList

    config, model_kwargs = model._prepare_generation_config(None, **sampling)
    with real_tensors():  # it branches on its token tensors' values (several EOS ids: Llama 3.2)
        model._prepare_special_tokens(config, True, device=prompt_ids.device, batch_size=len(prompt_ids))
    # min_new_tokens becomes a min_length (and max_new_tokens a max_length) as in generate
    config = model._prepare_generated_length(
        generation_config=config, has_default_max_length=model.generation_config.max_length is None,
        has_default_min_length=model.generation_config.min_length is None, model_input_name="input_ids",
        input_ids_length=prompt_ids.shape[1], inputs_tensor=prompt_ids)
    # (encoder_input_ids only serve encoder processors, which a decoder-only trial has not; they
    # are checked by value)
    return model._get_logits_processor(generation_config=config, input_ids_seq_length=prompt_ids.shape[1],
                                       encoder_input_ids=None, logits_processor=LogitsProcessorList(),
                                       device=prompt_ids.device, model_kwargs=model_kwargs)


_MIXIN = "transformers.generation.utils:GenerationMixin"
INTERNALS = (
    Internal(_MIXIN, "_prepare_generation_config", "generate's config from its kwargs",
             ("self", "generation_config", "kwargs")),
    Internal(_MIXIN, "_prepare_special_tokens", "its special tokens as tensors",
             ("self", "generation_config", "kwargs_has_attention_mask", "device", "batch_size")),
    Internal(_MIXIN, "_prepare_generated_length", "max_new_tokens / min_new_tokens as lengths",
             ("self", "generation_config", "has_default_max_length", "has_default_min_length", "model_input_name",
              "input_ids_length", "inputs_tensor")),
    Internal(_MIXIN, "_get_logits_processor", "the processors it makes",
             ("self", "generation_config", "input_ids_seq_length", "encoder_input_ids", "prefix_allowed_tokens_fn",
              "logits_processor", "device", "model_kwargs", "negative_prompt_ids", "negative_prompt_attention_mask")),
)
