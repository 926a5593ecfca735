"""Every private RLlib attribute HAEPO's env runner uses, each in one place with its reason.

RLlib 2.60's ``SingleAgentEnvRunner`` has no public hook for a sampling loop of one's own,
for seeding sub-envs or for feeding its metrics, so the runner reaches into it here and
nowhere else; an RLlib upgrade is checked against this module. Besides the accessors
below, :class:`haepo_ray.env_runner.HAEPOEnvRunner` overrides two private methods:

- ``SingleAgentEnvRunner._sample``: RLlib's public ``sample()`` wraps it with its timers,
  metrics and weight-sync bookkeeping; overriding it swaps only the loop (the lean path).
- ``SingleAgentEnvRunner._increase_sampled_metrics``: the round sampler subtracts the
  steps of parked envs, which RLlib's loop counts as env steps.
"""

from __future__ import annotations

from typing import Any



def seeds(runner) -> list[int] | int | None:
    """``SingleAgentEnvRunner._seed``: what RLlib passes to its env's first ``reset``.
    HAEPO replaces it (independent seeds) and clears it once used (RLlib would re-seed
    the envs at every ``sample(num_episodes=...)`` call and replay the same episodes)."""
    return runner._seed


def set_seeds(runner, value: list[int] | int | None) -> None:
    """Sets ``SingleAgentEnvRunner._seed`` (see :func:`seeds`)."""
    runner._seed = value


def device(runner) -> Any:
    """``SingleAgentEnvRunner._device``: the module's device (CPU or GPU); the lean path
    puts observations there, as RLlib's ``NumpyToTensor`` connector does."""
    return runner._device


def forward_pass(module, explore: bool):
    """``RLModule._forward_exploration`` / ``_forward_inference``: the override points
    behind the public ``forward_exploration`` / ``forward_inference``, which switch the
    module to eval mode and back at every call (two walks over all its submodules, more
    than the forward pass of a small MLP); the lean path switches once per batch."""
    return module._forward_exploration if explore else module._forward_inference


def callback_objects(runner) -> list:
    """``SingleAgentEnvRunner._callbacks``: the callback objects; the lean path checks
    them for per-step hooks and calls their ``on_episode_end``."""
    return runner._callbacks


def weights_seq_no(runner) -> int:
    """``SingleAgentEnvRunner._weights_seq_no``: the version of the weights, which RLlib
    writes per step into each episode (``WEIGHTS_SEQ_NO``)."""
    return runner._weights_seq_no


def record_sampled(runner, episodes: list, num_steps: int) -> None:
    """Feeds RLlib's metrics as its own loop does: ``_done_episodes_for_metrics`` (from
    which ``get_metrics()`` computes the episode returns and lengths), Ray's Prometheus
    env-step counter (``_log_env_steps``, ``_metrics_num_env_steps_sampled``) and the
    per-call counters (``_increase_sampled_metrics``)."""
    runner._done_episodes_for_metrics.extend(episodes)
    runner._log_env_steps(metric=runner._metrics_num_env_steps_sampled, num_steps=num_steps)
    runner._increase_sampled_metrics(num_steps, len(episodes))


def custom_connectors(config) -> bool:
    """``AlgorithmConfig._env_to_module_connector`` / ``_module_to_env_connector``: set
    when the user adds connector pieces, which the lean path would skip."""
    return config._env_to_module_connector is not None or config._module_to_env_connector is not None


def set_episode_times(episode, start: float, end: float) -> None:
    """``SingleAgentEpisode._start_time`` / ``_last_step_time``: RLlib's episode duration
    metric reads them; an episode built in one piece has no step times of its own."""
    episode._start_time, episode._last_step_time = start, end


def registered_env_creator(env_id: str):
    """``ray.tune.registry._global_registry``: the creator of a Ray-registered env, or
    None (Ray has no public lookup); RLlib consults the same registry in ``make_env``."""
    from ray.tune.registry import ENV_CREATOR, _global_registry

    return _global_registry.get(ENV_CREATOR, env_id) if _global_registry.contains(ENV_CREATOR, env_id) else None
