"""A language-model trial's config: the :class:`~haepo_ray.llm.settings.LLMTrainSettings`
fields, plus ``ray_train`` (its workers and checkpoints), ``method`` where the spec's algorithms
include one with settings of its own (the method as written; the fields hold its values) and,
in a fitted plan, ``gpu_memory`` (its estimate) and ``fit`` (the memory settings it runs with:
:mod:`haepo_ray.sweep.kinds.llm.fit`). The plan writes it (:mod:`haepo_ray.sweep.kinds.llm.plan`), the
trial reads it (:mod:`haepo_ray.sweep.kinds.llm.trainable`)."""

from __future__ import annotations

from typing import Any

from haepo_ray.names import BATCH_SIZE_ALIAS
from haepo_ray.sweep.kinds.llm.fit import CONFIG_KEY, FIT_KEY, PLANNED

__all__ = ["METHOD", "RAY_TRAIN", "RENAMES", "trial_settings"]

RAY_TRAIN = "ray_train"  # the trial config's key for the workers and checkpoints
METHOD = "method"  # the trial config's key for its method (haepo_ray.sweep.kinds.llm.plan)
RENAMES = {BATCH_SIZE_ALIAS: "batch_prompts", "algorithm": "algo"}  # spec name -> settings field


def trial_settings(config: dict[str, Any], device: str = "cpu"):
    """A trial config as :class:`~haepo_ray.llm.settings.LLMTrainSettings` (without
    ``ray_train``, ``method``, ``gpu_memory`` and ``fit``), with the settings its ``fit`` entry chose."""
    from haepo_ray.llm.settings import LLMTrainSettings

    chosen = {name: config[FIT_KEY][name] for name in PLANNED if name in config.get(FIT_KEY, {})}
    return LLMTrainSettings(**{k: v for k, v in config.items() if k not in (RAY_TRAIN, METHOD, CONFIG_KEY, FIT_KEY)}
                            | chosen | {"device": device})
