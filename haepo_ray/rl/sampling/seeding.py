"""Independent random streams per sub-env, seeded once, and their checkpoint.

RLlib 2.60 seeds env runner w with ``seed + w`` and its vector env gives sub-env i
``seed + w + i``: runner 2's env i replays runner 1's env i + 1 (duplicate episodes in one
batch), and trials with seeds s and s + 1 share most of their env streams. Here every
random stream gets its own seed from ``numpy.random.SeedSequence([seed, w, evaluation])``:
one per sub-env of a ``SyncVectorEnv``, one for a vectorised env (one generator for all
its sub-envs). The envs are seeded at the first reset only; later resets continue their
streams, and :func:`rng_state` / :func:`restore_rng_state` carry them (with PyTorch's
sampler) through a checkpoint.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch


def env_generators(vector_env: gym.vector.VectorEnv) -> list[np.random.Generator] | None:
    """The random generators behind ``vector_env``'s sub-envs: one per sub-env of a
    ``SyncVectorEnv``, the single one of a vectorised env, None for an ``AsyncVectorEnv``
    (its sub-envs live in other processes)."""
    if isinstance(vector_env, gym.vector.AsyncVectorEnv):
        return None
    if isinstance(vector_env, gym.vector.SyncVectorEnv):
        return [env.unwrapped.np_random for env in vector_env.envs]
    return [vector_env.np_random]


def independent_seeds(
    vector_env: gym.vector.VectorEnv, seed: int, worker_index: int, evaluation: bool
) -> list[int] | int:
    """What ``vector_env.reset(seed=...)`` takes to seed every stream independently: a list
    (one seed per sub-env) for Sync and Async vector envs, one int for a vectorised env."""
    per_sub_env = isinstance(vector_env, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))
    count = vector_env.num_envs if per_sub_env else 1
    state = np.random.SeedSequence([seed, worker_index, int(evaluation)]).generate_state(count)
    return [int(s) for s in state] if per_sub_env else int(state[0])


def rng_state(vector_env: gym.vector.VectorEnv, seeded: bool, worker_index: int | None) -> dict[str, Any] | None:
    """PyTorch's and the envs' random states (None where the envs' are out of reach)."""
    generators = env_generators(vector_env)
    if generators is None:
        return None
    return {
        "torch": torch.get_rng_state().numpy(),
        "envs": [g.bit_generator.state for g in generators],
        "seeded": seeded,
        "worker_index": worker_index,
    }


def restore_rng_state(vector_env: gym.vector.VectorEnv, state: dict[str, Any] | None, worker_index: int | None) -> bool:
    """Takes back the random streams of :func:`rng_state`; True if the envs' streams were
    restored (they are then already seeded).

    Only the runner the state came from takes it (two runners with one stream would sample
    identical episodes), and only into envs of the same layout.
    """
    generators = env_generators(vector_env)
    if (state is None or state["worker_index"] != worker_index or generators is None
            or len(generators) != len(state["envs"])):
        return False
    torch.set_rng_state(torch.as_tensor(state["torch"]))
    if not state["seeded"]:
        return False
    for generator, env_state in zip(generators, state["envs"]):
        generator.bit_generator.state = env_state
    return True
