"""RLlib configs as haepo-ray builds them, for ``haepo train`` and for every sweep trial alike.

:func:`build_config` is the one route from (algorithm name, env, settings) to a validated
``AlgorithmConfig``: the algorithm's defaults, then :func:`apply_defaults` (what haepo-ray
gives every algorithm), the env, the resources, and the settings by name
(:func:`apply_settings`: the ``batch_size`` alias and RLlib's property names resolved).
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from haepo_ray.names import BATCH_SIZE_ALIAS
from haepo_ray.rl.registry import algorithm_class
from haepo_ray.upstream import rllib as rllib_internals


def apply_defaults(config: AlgorithmConfig) -> AlgorithmConfig:
    """What sweeps and ``haepo train`` give every algorithm (HAEPO has all three already): the
    paper's episode metrics (regret, success rate) where ``config`` has RLlib's default
    callbacks; where it has one agent, an independent seed per sub-env where it has RLlib's
    default env runner, and observations that are not a Box one-hot encoded and flattened
    (:mod:`~haepo_ray.rl.observations`) where it has no env-to-module connector of its own."""
    from ray.rllib.callbacks.callbacks import RLlibCallback

    from haepo_ray.rl.callbacks import EpisodeInfoMetrics
    from haepo_ray.rl.env_runner import IndependentSeedsEnvRunner
    from haepo_ray.rl.observations import flatten_non_box

    if config.callbacks_class is RLlibCallback:
        config.callbacks(EpisodeInfoMetrics)
    if not config.is_multi_agent:
        if config.env_runner_cls is None:
            config.env_runners(env_runner_cls=IndependentSeedsEnvRunner)
        if rllib_internals.connector_factories(config)[0] is None:
            config.env_runners(env_to_module_connector=flatten_non_box)
    return config


def setting_keys(config: AlgorithmConfig) -> dict[str, str]:
    """Public setting name -> key in ``config.to_dict()`` (what a trial's config holds):
    RLlib keeps some settings behind a property (``model_config`` -> ``_model_config``)."""
    keys: dict[str, str] = {}
    for key in config.to_dict():
        if key.startswith("_"):
            public = key[1:]
            if isinstance(getattr(type(config), public, None), property):
                keys[public] = key
        keys[key] = key
    return keys


def setting_hint(config: AlgorithmConfig, name: str) -> str:
    """`` (did you mean a, b?)`` with the public settings of ``config`` closest to ``name``, or ""."""
    close = difflib.get_close_matches(name, sorted(k for k in setting_keys(config) if not k.startswith("_")), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def batch_size_key(config: AlgorithmConfig) -> str:
    """What the ``batch_size`` alias means for this algorithm: M episodes for HAEPO-like
    algorithms, else RLlib's ``train_batch_size_per_learner``."""
    return "episodes_per_batch" if hasattr(config, "episodes_per_batch") else "train_batch_size_per_learner"


def config_key(config: AlgorithmConfig, name: str) -> str:
    """The key in ``config.to_dict()`` of the setting called ``name`` (alias and properties
    resolved; an unknown name maps to itself)."""
    if name == BATCH_SIZE_ALIAS:
        name = batch_size_key(config)
    return setting_keys(config).get(name, name)


def apply_settings(config: AlgorithmConfig, settings: Mapping[str, Any]) -> AlgorithmConfig:
    """Sets ``settings`` (by public name, ``batch_size`` allowed) on ``config`` and returns it.

    ``model_config`` is merged into the one set so far. Raises ``ValueError`` naming the
    keys ``config`` does not have.
    """
    keys = setting_keys(config)
    unknown = sorted(k for k in settings if k != BATCH_SIZE_ALIAS and k not in keys)
    if unknown:
        raise ValueError(f"{type(config).__name__} has no setting "
                         + ", ".join(f"{k!r}{setting_hint(config, k)}" for k in unknown))
    values = {config_key(config, name): value for name, value in settings.items()}
    model_config = values.pop("_model_config", None)
    if model_config is not None:
        if not isinstance(model_config, Mapping):
            raise ValueError(f"model_config must be a mapping, got {model_config!r}")
        user = rllib_internals.model_config(config)
        config.rl_module(model_config={**user, **model_config})
    config.update_from_dict(values)
    return config


def apply_resources(config: AlgorithmConfig, cpus: float, gpus: float) -> AlgorithmConfig:
    """A trial's ``cpus`` and ``gpus`` -> its main process (and its local learner when
    ``num_learners == 0``). Settings may still override them (``num_gpus_per_learner`` ...)."""
    config.resources(num_cpus_for_main_process=cpus)
    config.learners(num_gpus_per_learner=gpus)
    if gpus == 0:
        config.learners(num_cpus_per_learner=cpus)
    return config


def requested_resources(config: AlgorithmConfig) -> dict[str, float]:
    """What an algorithm of ``config`` asks Ray for in all (its main process, env runners and
    learners: the sum of its placement group's bundles), each resource it asks for."""
    total: dict[str, float] = {}
    for bundle in config.algo_class.default_resource_request(config).bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0) + value
    return {k: v for k, v in total.items() if v}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _schedule_of(ok: Callable[[float], bool]) -> Callable[[Any], bool]:
    """A value ``ok`` takes, or an RLlib schedule ``[[timestep, value], ...]`` of such values."""
    def check(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return bool(value) and all(isinstance(p, (list, tuple)) and len(p) == 2 and _integer(p[0], 0)
                                       and _finite(p[1]) and ok(p[1]) for p in value)
        return _finite(value) and ok(value)
    return check


# RLlib's own settings that its validate() lets through out of range: attribute ->
# (check, what it must be), named in errors as specs name them (lambda). Only those an
# algorithm's config has are checked (lambda_, clip_param ... are PPO's).
SETTING_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": (lambda v: v is None or (_integer(v, 0) and v < 2**31), "an integer in [0, 2**31), or null (unseeded)"),
    "lr": (_schedule_of(lambda v: v > 0), "a finite number > 0, or a schedule [[timestep, value], ...] of them"),
    "gamma": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "grad_clip": (lambda v: v is None or (_finite(v) and v > 0), "null or a finite number > 0"),
    "num_epochs": (lambda v: _integer(v, 1), "an integer >= 1"),
    "num_env_runners": (lambda v: _integer(v, 0), "an integer >= 0"),
    "num_envs_per_env_runner": (lambda v: _integer(v, 1), "an integer >= 1"),
    "train_batch_size_per_learner": (lambda v: v is None or _integer(v, 1), "null or an integer >= 1"),
    "minibatch_size": (lambda v: v is None or _integer(v, 1), "null or an integer >= 1"),
    "lambda_": (lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "clip_param": (lambda v: _finite(v) and v > 0, "a finite number > 0"),
    "vf_clip_param": (lambda v: (_finite(v) or v == math.inf) and v > 0, "a number > 0 (inf: no clipping)"),
    "vf_loss_coeff": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "entropy_coeff": (_schedule_of(lambda v: v >= 0), "a finite number >= 0, or a schedule of them"),
    "kl_coeff": (lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
}


def validate(config: AlgorithmConfig) -> AlgorithmConfig:
    """:data:`SETTING_RULES`, then ``config.validate()`` (without RLlib's once-per-process
    notice that the new API stack is on: haepo-ray always runs on it), its error without
    RLlib's "To suppress ..." boilerplate."""
    for name, (ok, words) in SETTING_RULES.items():
        if hasattr(config, name) and not ok(getattr(config, name)):
            raise ValueError(f"{config.algo_class.__name__}: {name.rstrip('_')} must be {words}, "
                             f"got {getattr(config, name)!r}")
    problem = unread_model_keys(config)
    if problem:
        raise ValueError(f"{config.algo_class.__name__}: model_config {problem}")
    rllib_internals.mute_new_stack_notice(config)
    try:
        config.validate()
    except Exception as err:
        raise ValueError(str(err).split("\nTo suppress")[0]) from None
    return config


def unread_model_keys(config: AlgorithmConfig) -> str | None:
    """Which keys of ``config``'s ``model_config`` its RLModule would not read, and what it reads,
    else None. RLlib's default RLModules (``Default*RLModule``) read the fields of
    ``DefaultModelConfig`` and the keys the algorithm adds itself (DQN's ``dueling`` ...), and
    ignore any other without a word (``fcnet_hidden``; an old-stack key such as ``use_attention``
    or ``post_fcnet_hiddens``); a custom RLModule's keys are its own (None)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    spec = config.rl_module_spec
    module = getattr(spec, "module_class", None) if isinstance(spec, RLModuleSpec) else None
    if module is None or not (module.__module__.startswith("ray.rllib.") and module.__name__.startswith("Default")):
        return None
    fields, own = _model_keys(type(config))
    unread = sorted(set(rllib_internals.model_config(config)) - fields - own)
    if not unread:
        return None
    return (", ".join(f"{key!r}{_model_key_hint(key, fields | own)}" for key in unread)
            + f": RLlib's {module.__name__} would not read {'them' if len(unread) > 1 else 'it'}; it reads the fields "
            + "of DefaultModelConfig (ray.rllib.core.rl_module.default_model_config)"
            + (f" and {', '.join(sorted(own))}" if own else "") + ", and ignores any other key")


@functools.cache
def _model_keys(config_class: type) -> tuple[frozenset[str], frozenset[str]]:
    """``DefaultModelConfig``'s fields, and the model-config keys ``config_class`` adds of its own
    (once per class: :func:`validate` checks every trial of a sweep)."""
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    fields = frozenset(f.name for f in dataclasses.fields(DefaultModelConfig))
    return fields, frozenset(config_class().model_config) - fields


def _model_key_hint(key: str, known: frozenset[str]) -> str:
    """What ``key`` of a ``model_config`` most likely meant, in parentheses; "" when unclear."""
    name, colon, value = key.partition(":")
    if colon and name.strip() in known:  # YAML's {a:b} is one key, "a:b"; {a: b} is a: b
        return f" (YAML reads it as one key: write {name.strip()}: {value.strip()}, with a space)"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def check_model(config: AlgorithmConfig, observation_space, action_space) -> None:
    """Raise ``ValueError`` unless ``config`` builds its RLModule for an env of these spaces as
    its env runners will (the observations as its env-to-module connector gives them): an
    observation space RLlib's default model cannot take (a 2-D Box) or a ``model_config`` it
    cannot build, said before Ray starts instead of in a traceback from the env runners."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    if config.is_multi_agent:
        return
    spaces = rllib_internals.connector_spaces(observation_space, action_space)
    model_input = config.build_env_to_module_connector(spaces=spaces).observation_space
    try:
        with rllib_internals.without_module_config_notice():
            config.get_rl_module_spec(spaces={DEFAULT_MODULE_ID: (model_input, action_space)}).build()
    except Exception as err:
        given = "" if model_input == observation_space else f" (given to the model as {model_input})"
        raise ValueError(
            f"{config.algo_class.__name__}'s model for {config.env} cannot be built: observations "
            f"{observation_space}{given}, actions {action_space}: {type(err).__name__}: {err}") from None


def build_config(
    algorithm: str,
    env: str,
    *,
    env_config: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    resources: tuple[float, float] | None = None,
    seed: int | None = None,
) -> AlgorithmConfig:
    """The (unvalidated) AlgorithmConfig of ``algorithm`` on ``env``: defaults, haepo-ray's
    defaults, ``resources`` (cpus, gpus), ``seed``, then ``settings`` by name.

    Raises :class:`haepo_ray.rl.registry.UnknownAlgorithm` or ``ValueError`` (unknown setting).
    """
    config = algorithm_class(algorithm).get_default_config()
    config.environment(env, env_config=dict(env_config or {}))
    apply_defaults(config)
    if resources is not None:
        apply_resources(config, *resources)
    if seed is not None:
        config.debugging(seed=seed)
    return apply_settings(config, settings or {})
