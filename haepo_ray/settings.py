"""RLlib configs as haepo-ray builds them: its defaults for any algorithm, then a flat dict of
settings (CLI ``--set`` values, sweep specs)."""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig


def apply_defaults(config: AlgorithmConfig) -> AlgorithmConfig:
    """What sweeps and ``haepo train`` give every algorithm (HAEPO has both already): the
    paper's episode metrics (regret, success rate) where ``config`` has RLlib's default
    callbacks, and an independent seed per sub-env where it has RLlib's default env runner."""
    from ray.rllib.callbacks.callbacks import RLlibCallback

    from haepo_ray.callbacks import EpisodeInfoMetrics
    from haepo_ray.env_runner import IndependentSeedsEnvRunner

    if config.callbacks_class is RLlibCallback:
        config.callbacks(EpisodeInfoMetrics)
    if config.env_runner_cls is None and not config.is_multi_agent:
        config.env_runners(env_runner_cls=IndependentSeedsEnvRunner)
    return config


def apply_settings(config: AlgorithmConfig, settings: dict[str, Any]) -> AlgorithmConfig:
    """Set ``settings`` on ``config`` and return it.

    Keys are ``AlgorithmConfig`` attributes (``lr``, ``beta_ent``, ``num_env_runners``, ...);
    ``model_config`` is merged into the RLModule's model config. Raises ``ValueError``
    naming the keys ``config`` does not have.
    """
    settings = dict(settings)
    unknown = sorted(k for k in settings if not hasattr(config, k))
    if unknown:
        raise ValueError(f"{type(config).__name__} has no setting(s) {unknown}")
    model_config = settings.pop("model_config", None)
    if model_config is not None:
        if not isinstance(model_config, dict):
            raise ValueError(f"model_config must be a mapping, got {model_config!r}")
        config.rl_module(model_config={**config.model_config, **model_config})
    config.update_from_dict(settings)
    return config
