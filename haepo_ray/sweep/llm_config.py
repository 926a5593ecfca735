"""A language-model trial's config: the :class:`~haepo_ray.llm.settings.LLMTrainSettings`
fields, plus ``ray_train`` (its workers and checkpoints) and, in a fitted plan, ``gpu_memory``
(its estimate, :mod:`haepo_ray.sweep.llm_fit`). The plan writes it
(:mod:`haepo_ray.sweep.llm_plan`), the trial reads it (:mod:`haepo_ray.sweep.llm_trainable`)."""

from __future__ import annotations

from typing import Any

from haepo_ray.sweep.llm_fit import CONFIG_KEY

__all__ = ["RAY_TRAIN", "trial_settings"]

RAY_TRAIN = "ray_train"  # the trial config's key for the workers and checkpoints


def trial_settings(config: dict[str, Any], device: str = "cpu"):
    """A trial config as :class:`~haepo_ray.llm.settings.LLMTrainSettings` (without
    ``ray_train`` and ``gpu_memory``)."""
    from haepo_ray.llm.settings import LLMTrainSettings

    return LLMTrainSettings(**{k: v for k, v in config.items() if k not in (RAY_TRAIN, CONFIG_KEY)}
                            | {"device": device})
