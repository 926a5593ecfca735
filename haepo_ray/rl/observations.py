"""Observations RLlib's default model cannot take, one-hot encoded and flattened on their way in.

RLlib's new API stack builds a default encoder for Box observations only (an MLP for one
dimension, a CNN for three); its old stack one-hot encoded the rest itself. haepo-ray's
configs start with :func:`flatten_non_box` as their env-to-module connector (HAEPO, DPO and
GRPO in their configs; other algorithms in :func:`haepo_ray.rl.configs.apply_defaults`): where
a single-agent env's observations are not a Box (Discrete, MultiDiscrete, MultiBinary, Tuple,
Dict: FrozenLake, Taxi, Blackjack), it adds RLlib's ``FlattenObservations``, so the model gets
one flat Box with the discrete parts one-hot. Box observations reach the model as the env
gives them. HAEPO's lean sampling path flattens the others itself, as this connector would
(:func:`haepo_ray.rl.sampling.lean.flattener`). A config's own ``env_to_module_connector``
replaces this one.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from ray.rllib.connectors.env_to_module import FlattenObservations

from haepo_ray.upstream import rllib as rllib_internals


def flatten_non_box(env: Any = None, spaces: dict | None = None, device: Any = None) -> list:
    """RLlib's env-to-module connector factory: ``[FlattenObservations()]`` where the single
    env's observation space (from ``env``, else ``spaces``) is not a Box, else no piece (also
    for a multi-agent env, which is not a gymnasium env)."""
    if env is not None:
        if not isinstance(env, (gym.Env, gym.vector.VectorEnv)):
            return []
        space = getattr(env, "single_observation_space", env.observation_space)
    else:
        single = rllib_internals.single_env_spaces(spaces)
        if single is None:
            return []
        space = single[0]
    return [] if isinstance(space, gym.spaces.Box) else [FlattenObservations()]
