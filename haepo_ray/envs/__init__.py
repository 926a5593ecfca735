"""The paper's environments as gymnasium envs, registered under ``haepo/...`` ids.

``import haepo_ray.envs`` registers them with gymnasium; :func:`register_with_ray`
also registers them with Ray Tune's env registry, which RLlib's env runners consult.
The bandit and the random walk also have numpy-vectorised versions, gymnasium's
``vector_entry_point`` (``gym.make_vec(id, num_envs=n)``); through Ray's registry an
``env_config`` holding ``num_envs`` builds them, which is how RLlib asks for a vector
entry point (``gym_env_vectorize_mode="vector_entry_point"``).
"""

from __future__ import annotations

import difflib

import gymnasium as gym

from haepo_ray.envs.bandit import GaussianBanditEnv, GaussianBanditVectorEnv
from haepo_ray.envs.chain import ChainMDPEnv
from haepo_ray.envs.newsvendor import NewsvendorEnv
from haepo_ray.envs.random_walk import RandomWalkEnv, RandomWalkVectorEnv

# id -> (env class, numpy-vectorised class or None, description)
_ENVS: dict[str, tuple[type[gym.Env], type[gym.vector.VectorEnv] | None, str]] = {
    "haepo/GaussianBandit-v0": (GaussianBanditEnv, GaussianBanditVectorEnv,
                                "K-armed Gaussian bandit, one pull per episode (num_arms=10)"),
    "haepo/RandomWalk-v0": (RandomWalkEnv, RandomWalkVectorEnv,
                            "1-D walk, reward 1 on reaching +target (target=10, horizon=500)"),
    "haepo/ChainMDP-v0": (ChainMDPEnv, None, "deterministic chain, reward 1 at the end (length=5)"),
    "haepo/Newsvendor-v0": (NewsvendorEnv, None, "single-period newsvendor, Poisson(5) demand, p=10 c=6 v=2"),
}

__all__ = [
    "ChainMDPEnv",
    "GaussianBanditEnv",
    "GaussianBanditVectorEnv",
    "NewsvendorEnv",
    "RandomWalkEnv",
    "RandomWalkVectorEnv",
    "check_env_id",
    "make_env",
    "register_with_ray",
    "registered_envs",
]


def registered_envs() -> dict[str, str]:
    """The ids haepo-ray registers, each with a one-line description."""
    return {env_id: description for env_id, (_, _, description) in _ENVS.items()}


def _entry_point(cls: type) -> str:
    return f"{cls.__module__}:{cls.__name__}"


def _register_with_gymnasium() -> None:
    for env_id, (cls, vector_cls, _) in _ENVS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=_entry_point(cls),
                         vector_entry_point=vector_cls and _entry_point(vector_cls))


def register_with_ray() -> None:
    """Register every id with Ray Tune's env registry (creator: ``cls(**env_config)``, the
    vectorised class where ``env_config`` holds ``num_envs`` and the env has one)."""
    from ray.tune.registry import register_env

    for env_id, (cls, vector_cls, _) in _ENVS.items():
        register_env(env_id, _Creator(cls, vector_cls))


class _Creator:
    """Picklable env creator for Tune's registry; ``vector_cls`` says whether it offers a
    vectorised env (RLlib's vector entry point passes ``num_envs`` in ``env_config``)."""

    def __init__(self, cls: type[gym.Env], vector_cls: type[gym.vector.VectorEnv] | None = None):
        self.cls, self.vector_cls = cls, vector_cls

    def __call__(self, env_config: dict) -> gym.Env | gym.vector.VectorEnv:
        kwargs = dict(env_config or {})
        if "num_envs" in kwargs and self.vector_cls is not None:
            return self.vector_cls(**kwargs)
        return self.cls(**kwargs)


def check_env_id(env_id: str) -> None:
    """Raise ``ValueError`` unless ``env_id`` is a gymnasium or Ray Tune env."""
    from haepo_ray.upstream.tune import registered_env_creator

    if env_id in gym.registry or registered_env_creator(env_id) is not None:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.8)
    raise ValueError(
        f"unknown env {env_id!r}" + (f" (did you mean {', '.join(close)}?)" if close else "")
        + f": not a registered gymnasium id or Ray Tune env (haepo-ray's own: {', '.join(_ENVS)})"
    )


def env_spaces(env_id: str, env_config: dict | None = None) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of the env ``env_id`` (a known id: :func:`check_env_id`)
    makes from ``env_config``; ``ValueError`` with the env's own error (an unknown or
    out-of-range argument), which would otherwise end a trial's env runners."""
    try:
        env = make_env(env_id, env_config)
        env.close()
    except Exception as err:
        raise ValueError(f"{env_id} does not take {dict(env_config or {})}: {type(err).__name__}: {err}") from None
    return env.observation_space, env.action_space


def make_env(env_id: str, env_config: dict | None = None) -> gym.Env:
    """One env as a trial would make it: Ray Tune's env registry first, then gymnasium."""
    from haepo_ray.upstream.tune import registered_env_creator

    creator = registered_env_creator(env_id)
    if creator is not None:
        return creator(dict(env_config or {}))
    return gym.make(env_id, **dict(env_config or {}))


_register_with_gymnasium()
