"""The lean path: complete episodes from a vector env, one batched forward pass per step.

RLlib's sampling loop runs its env-to-module and module-to-env connector pipelines, and
times each piece, at every env step; on CartPole that is most of the sampling time. For
the common case (one agent, a stateless RLModule, RLlib's default connectors and
:func:`~haepo_ray.rl.observations.flatten_non_box`, a Box or Discrete action space, callbacks
without per-step hooks, a vector env with gymnasium's NEXT_STEP autoreset) HAEPO's runner
samples here instead:

- :func:`flattener`: observations that are not a Box flattened as ``flatten_non_box``'s
  ``FlattenObservations`` flattens them in RLlib's loop (the same function, a batch at once),
  for the module and for the episodes;
- :class:`BatchedPolicy`: one forward pass over all sub-envs per step, observations
  converted as RLlib's ``NumpyToTensor`` does (float64 to float32, other dtypes such as
  uint8 images kept, on the module's device, CPU or GPU), actions drawn and scored as
  RLlib's ``GetActions`` and ``NormalizeAndClipActions`` do;
- :func:`run_episodes`: the vector env stepped as one batch (gymnasium's numpy-vectorised
  envs step all sub-envs in one call), each step's arrays kept once, and each finished
  episode cut out of them at the end.

Which episodes form the batch: the first n to start (ties in sub-env order), never
depending on their own length, so the batch is unbiased; a sub-env that is not needed any
more keeps stepping with the others (a vector env steps all of them) but is not recorded
and its steps are not counted. Episodes never carry over from one call to the next: every
call resets the envs, so every episode is sampled by the weights of that call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

from haepo_ray.rl.observations import flatten_non_box
from haepo_ray.upstream import rllib as rllib_internals
from haepo_ray.upstream.torch import default_validate_args

PER_STEP_HOOKS = ("on_episode_created", "on_episode_start", "on_episode_step")


def config_blocker(config, callbacks: list) -> str | None:
    """Why the config rules the lean path out (before env and module exist), or None."""
    env_to_module, module_to_env = rllib_internals.connector_factories(config)
    if env_to_module not in (None, flatten_non_box) or module_to_env is not None:
        return "custom connectors"
    if any(getattr(config, f"callbacks_{hook}") is not None for hook in PER_STEP_HOOKS) or any(
        getattr(type(cb), hook) is not getattr(RLlibCallback, hook) for cb in callbacks for hook in PER_STEP_HOOKS
    ):
        return "callbacks with per-step hooks"
    return None


def env_blocker(vector_env: gym.vector.VectorEnv, module, config) -> str | None:
    """Why this env or module rules the lean path out, or None."""
    if module is None or module.is_stateful():
        return "no module, or a stateful one"
    if (not isinstance(vector_env.single_observation_space, gym.spaces.Box)
            and rllib_internals.connector_factories(config)[0] is not flatten_non_box):
        return "observation space is not a Box, and no connector flattens it"
    if not isinstance(vector_env.single_action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        return "action space is neither Box nor Discrete"
    if vector_env.metadata.get("autoreset_mode") != gym.vector.AutoresetMode.NEXT_STEP:
        return "vector env without NEXT_STEP autoreset"
    return None


def flattener(space: gym.Space) -> Callable[[Any], np.ndarray] | None:
    """For observations that are not a Box (:func:`~haepo_ray.rl.observations.flatten_non_box`
    flattens them for the model): a vector env's batch of them as RLlib's ``FlattenObservations``
    makes each (discrete parts one-hot, float32), one row per sub-env; None for a Box."""
    return None if isinstance(space, gym.spaces.Box) else rllib_internals.observation_flattener(space)


def to_tensor(obs: np.ndarray, device) -> torch.Tensor:
    """``obs`` as RLlib's ``convert_to_torch_tensor`` makes it for the module (floating
    point to float32 except float16, other dtypes such as uint8 images kept), without its
    walk over nested structures: an observation batch of a Box space is one array."""
    tensor = torch.from_numpy(obs)
    if tensor.is_floating_point() and tensor.dtype != torch.float16:
        tensor = tensor.float()
    return tensor.to(device)


@dataclass
class PolicyStep:
    """One forward pass over all sub-envs: the recorded actions, what the env gets, their
    log-probabilities and the distribution inputs, as numpy arrays (one row per sub-env)."""

    actions: np.ndarray
    env_actions: np.ndarray
    logp: np.ndarray
    dist_inputs: np.ndarray


class BatchedPolicy:
    """The RLModule as one batched call per step, drawing actions as RLlib's loop does.

    Use it inside :meth:`sampling` (the module in eval mode, as RLlib's ``forward_*``
    put it at every call, and without argument checks of torch's distributions, which
    cost more than the MLP's forward pass and leave the values unchanged).
    """

    def __init__(self, module, *, explore: bool, device, action_space: gym.Space,
                 normalize_actions: bool, clip_actions: bool):
        self.module, self.explore, self.device = module, explore, device
        self.forward = rllib_internals.forward_pass(module, explore)
        self.dist_cls = (module.get_exploration_action_dist_cls() if explore
                         else module.get_inference_action_dist_cls())
        # RLlib's NormalizeAndClipActions, which changes Box actions only
        if normalize_actions and isinstance(action_space, gym.spaces.Box):
            self.to_env = lambda actions: unsquash_action(actions, action_space)
        elif clip_actions and isinstance(action_space, gym.spaces.Box):
            self.to_env = lambda actions: clip_action(actions, action_space)
        else:
            self.to_env = lambda actions: actions

    @contextlib.contextmanager
    def sampling(self):
        """For one batch: eval mode, no gradients, no distribution argument checks; the
        module's mode and torch's default (a class attribute, no public getter) restored."""
        was_training, validate = self.module.training, default_validate_args()
        self.module.eval()
        torch.distributions.Distribution.set_default_validate_args(False)
        try:
            with torch.no_grad():
                yield self
        finally:
            torch.distributions.Distribution.set_default_validate_args(validate)
            self.module.train(was_training)

    def __call__(self, obs: np.ndarray, t: int) -> PolicyStep:
        batch = {Columns.OBS: to_tensor(obs, self.device)}
        out = self.forward(batch, t=t) if self.explore else self.forward(batch)
        dist_inputs = out[Columns.ACTION_DIST_INPUTS]
        dist = self.dist_cls.from_logits(dist_inputs)
        if not self.explore:
            dist = dist.to_deterministic()
        actions = dist.sample()
        logp = dist.logp(actions)
        actions = actions.cpu().numpy()
        return PolicyStep(actions, self.to_env(actions), logp.cpu().numpy(), dist_inputs.cpu().numpy())


@dataclass
class Trajectory:
    """One complete episode of T steps as arrays over its steps (observations T + 1)."""

    env_index: int
    observations: np.ndarray
    infos: list[dict]
    actions: np.ndarray
    rewards: np.ndarray  # float64, as RLlib's loop stores rewards of single envs
    logp: np.ndarray
    dist_inputs: np.ndarray
    terminated: bool
    truncated: bool
    start_time: float


def info_row(info: dict, i: int) -> dict:
    """Sub-env ``i``'s entries of a vector env's info (gymnasium: a dict of arrays, each
    with a ``_key`` mask saying which sub-envs have it)."""
    if not info:
        return {}
    row = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is None or mask[i]:
            row[key] = info_row(value, i) if isinstance(value, dict) else value[i]
    return row


class StepLog:
    """What each step of a call returned, as arrays over sub-envs, kept once per step;
    episodes are cut out of it when the call ends."""

    def __init__(self, obs: np.ndarray, reset_info: dict):
        # observations[s] / infos[s]: before step s (infos[0] is the reset's, infos[s] the
        # info step s - 1 returned, an autoreset's info where a sub-env restarted)
        self.observations, self.infos = [obs], [reset_info]
        self.outputs: list[PolicyStep] = []
        self.rewards: list[np.ndarray] = []
        self.flags: list[tuple[np.ndarray, np.ndarray]] = []

    def append(self, out: PolicyStep, result: tuple) -> None:
        obs, reward, terminated, truncated, info = result
        self.outputs.append(out)
        self.observations.append(obs)
        self.infos.append(info)
        self.rewards.append(reward)
        self.flags.append((terminated, truncated))

    def cut(self, spans: list[tuple[int, int, int, float]]) -> list[Trajectory]:
        """For each ``(i, a, b, start_time)``: sub-env ``i``'s episode from its first
        observation ``observations[a]`` through step ``b``, the step that ended it.
        Each column is stacked once (steps x sub-envs) and each episode is a copy of a slice."""
        observations = np.stack(self.observations)
        actions = np.stack([out.actions for out in self.outputs])
        logp = np.stack([out.logp for out in self.outputs])
        dist_inputs = np.stack([out.dist_inputs for out in self.outputs])
        rewards = np.stack(self.rewards).astype(np.float64)
        return [
            Trajectory(
                env_index=i,
                observations=observations[a:b + 2, i].copy(),
                infos=[info_row(self.infos[s], i) for s in range(a, b + 2)],
                actions=actions[a:b + 1, i].copy(),
                rewards=rewards[a:b + 1, i].copy(),
                logp=logp[a:b + 1, i].copy(),
                dist_inputs=dist_inputs[a:b + 1, i].copy(),
                terminated=bool(self.flags[b][0][i]),
                truncated=bool(self.flags[b][1][i]),
                start_time=start_time,
            )
            for i, a, b, start_time in spans
        ]


def run_episodes(
    vector_env: gym.vector.VectorEnv,
    policy: Callable[[np.ndarray, int], PolicyStep],
    num_episodes: int,
    *,
    seed: list[int] | int | None = None,
    t0: int = 0,
    flatten: Callable[[Any], np.ndarray] | None = None,
) -> list[Trajectory]:
    """The first ``num_episodes`` episodes to start on ``vector_env`` (reset first, with
    ``seed``), complete, in the order they started. ``vector_env`` autoresets NEXT_STEP:
    the step after a sub-env's episode ends returns the next episode's first observation.
    ``t0``: env steps sampled before this call (the module's exploration timestep);
    ``flatten``: observations as the policy and the episodes take them (:func:`flattener`)."""
    n = vector_env.num_envs
    obs, reset_info = vector_env.reset(seed=seed)
    if flatten is not None:
        obs = flatten(obs)
    log = StepLog(obs, reset_info)
    # episode k runs on sub-env env_of[k], from observations[first[k]] through step
    # last[k]; recording[i] is the episode sub-env i records, or -1.
    env_of: list[int] = []
    first: list[int] = []
    start_time: list[float] = []
    last: dict[int, int] = {}
    recording = np.full(n, -1)

    def start(i: int, step: int) -> None:
        recording[i] = len(env_of)
        env_of.append(i)
        first.append(step)
        start_time.append(time.perf_counter())

    for i in range(min(n, num_episodes)):
        start(i, 0)
    resetting = np.zeros(n, bool)  # sub-envs whose next step is an autoreset
    out, recorded, step = None, 0, 0
    while len(last) < num_episodes:
        acting = (recording >= 0) & ~resetting
        # Where every recorded sub-env autoresets no action is used: skip the forward pass
        # and repeat the last actions (the log's rows of that step belong to no episode).
        if out is None or acting.any():
            out = policy(obs, t0 + recorded)
        result = vector_env.step(out.env_actions)
        if flatten is not None:
            result = (flatten(result[0]), *result[1:])
        log.append(out, result)
        obs, done = result[0], result[2] | result[3]
        recorded += int(acting.sum())
        for i in np.flatnonzero(done & acting):
            last[int(recording[i])] = step
            recording[i] = -1
            if len(env_of) < num_episodes:
                start(int(i), step + 2)  # its first observation comes with the next step
        resetting = done
        step += 1
    return log.cut([(env_of[k], first[k], last[k], start_time[k]) for k in range(num_episodes)])
