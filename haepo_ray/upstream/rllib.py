"""Every private name of RLlib 2.60 that haepo-ray uses, each in one place with its reason; an
RLlib upgrade is checked here (:data:`INTERNALS`, :data:`PATCHES`).

Sampling. ``SingleAgentEnvRunner`` has no public hook for a sampling loop of one's own, for
seeding sub-envs or for feeding its metrics, so HAEPO's env runner reaches into it through
the accessors below and :class:`SamplingHooks`, which gives its two private override points
public names:

- ``SingleAgentEnvRunner._sample``: RLlib's public ``sample()`` wraps it with its timers,
  metrics and weight-sync bookkeeping; overriding it swaps only the loop (the lean path).
- ``SingleAgentEnvRunner._increase_sampled_metrics``: the round sampler subtracts the
  steps of parked envs, which RLlib's loop counts as env steps.

Each runner built checks these overrides (:data:`SAMPLING_HOOKS`) against the Ray versions they
were tested with, as a sweep checks its patches, also when HAEPO is built as a library.

Configs, learners, algorithms. ``AlgorithmConfig._value_error`` raises a validation error
the way RLlib's own checks do (``experimental(_validate_config=False)`` turns them into
warnings); ``AlgorithmConfig._model_config`` is the model config set so far, behind a
property; ``Learner._learner_connector`` is the learner's connector pipeline, to which HAEPO
prepends its episode-return piece; ``Checkpointable._check_component`` decides whether a
``get_state`` call asks for a component; ``Algorithm._iteration`` is the counter
``Algorithm.step()`` reads (evaluation intervals), which a Tune trial that wraps an algorithm
keeps equal to its own.

*Connectors are built without reading source files* (:data:`CONNECTORS_WITHOUT_SOURCE`,
optional: speed). ``ConnectorV2.__init__`` records its subclass's constructor arguments (for
checkpoints) from ``inspect.stack()[1].frame``. ``inspect.stack()`` builds a ``FrameInfo`` for
every frame of the call stack with its source context: for a frame of Ray's Cython core
(``python/ray/_raylet.pyx``, no such file) ``inspect.getmodule`` scans all of ``sys.modules``
each time. A Tune actor's stack has such frames, and an algorithm builds about a dozen
connectors, so the scans were most of a reused trial actor's reset: 99-104 ms against 20-23 ms
with :func:`caller_frames` (one-iteration HAEPO trials on the bandit, ``bench/trial_reset.py``).
Installed by the sweep's trainable (:mod:`haepo_ray.sweep.kinds.rl.trainable`), not by building
``HAEPO`` as a library.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from haepo_ray.upstream.declared import Internal, Patch, pick

TESTED = ("2.60.0",)  # the Ray versions the patches were written and tested for


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


def connector_factories(config) -> tuple[Callable | None, Callable | None]:
    """``AlgorithmConfig._env_to_module_connector`` / ``_module_to_env_connector``: the
    functions that make a config's own connector pieces (None: none), which the lean path
    would skip."""
    return config._env_to_module_connector, config._module_to_env_connector


def single_env_spaces(spaces: dict | None) -> tuple | None:
    """``spaces[INPUT_ENV_SINGLE_SPACES]``: one env's (observation, action) spaces in the
    ``spaces`` an env-to-module connector factory is given (None where it holds none); the
    key is a constant of ``ray.rllib.env``, which RLlib's API reference does not list."""
    from ray.rllib.env import INPUT_ENV_SINGLE_SPACES

    return (spaces or {}).get(INPUT_ENV_SINGLE_SPACES)


def observation_flattener(space) -> Callable[[Any], Any]:
    """What RLlib's ``FlattenObservations`` does to each observation of ``space``, for a vector
    env's batch (one row per sub-env): ``ray.rllib.utils.numpy.flatten_inputs_to_1d_tensor``,
    the function that connector calls, which RLlib's API reference lists for torch and tf only."""
    from ray.rllib.utils.numpy import flatten_inputs_to_1d_tensor
    from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space

    struct = get_base_struct_from_space(space)
    return lambda batch: flatten_inputs_to_1d_tensor(batch, struct, batch_axis=True)


def connector_spaces(observation_space, action_space) -> dict:
    """The ``spaces`` of ``AlgorithmConfig.build_env_to_module_connector`` for an env of these
    spaces (RLlib's own env runners pass the same two keys of ``ray.rllib.env``)."""
    from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES

    spaces = (observation_space, action_space)
    return {INPUT_ENV_SPACES: spaces, INPUT_ENV_SINGLE_SPACES: spaces}


def set_episode_times(episode, start: float, end: float) -> None:
    """``SingleAgentEpisode._start_time`` / ``_last_step_time``: RLlib's episode duration
    metric reads them; an episode built in one piece has no step times of its own."""
    episode._start_time, episode._last_step_time = start, end


class SamplingHooks(SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` with its private override points under public names: a
    subclass overrides :meth:`sample_loop` (RLlib's ``_sample``) and :meth:`count_sampled`
    (``_increase_sampled_metrics``), and calls ``super()``'s for RLlib's own. Each runner built
    checks the overrides against the Ray versions they were tested with (:data:`SAMPLING_HOOKS`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        SAMPLING_HOOKS.apply()
        super().__init__(*args, **kwargs)

    def _sample(self, **kwargs: Any):
        return self.sample_loop(**kwargs)

    def sample_loop(self, **kwargs: Any):
        """RLlib's sampling loop, under ``sample()``'s timers and bookkeeping."""
        return super()._sample(**kwargs)

    def _increase_sampled_metrics(self, num_steps: int, num_episodes_completed: int) -> int:
        return self.count_sampled(num_steps, num_episodes_completed)

    def count_sampled(self, num_steps: int, num_episodes_completed: int) -> int:
        """RLlib's per-call counters of sampled steps and episodes."""
        return super()._increase_sampled_metrics(num_steps, num_episodes_completed)


def mute_new_stack_notice(config) -> None:
    """Mark as logged the warning ``AlgorithmConfig.validate`` prints once per process and
    algorithm that the new API stack is on by default (its ``log_once`` key), which every
    haepo-ray config is: a dry run or a trial prints nothing the user did not cause."""
    from ray.util.debug import log_once

    log_once(f"{config.algo_class.__name__}_on_new_api_stack")


@contextlib.contextmanager
def without_module_config_notice() -> Iterator[None]:
    """RLModules built in here without the warning, logged by ``ray._common.deprecation``'s
    logger at every build of a default module, that ``RLModule(config=...)`` is deprecated:
    RLlib 2.60 passes that config itself, so the warning is nothing the user can act on."""
    from ray._common import deprecation

    def other(record: logging.LogRecord) -> bool:
        return "RLModule(config=" not in record.getMessage()

    deprecation.logger.addFilter(other)
    try:
        yield
    finally:
        deprecation.logger.removeFilter(other)


def config_error(config, message: str) -> None:
    """``AlgorithmConfig._value_error``: a validation error as RLlib's own checks raise it."""
    config._value_error(message)


def model_config(config) -> dict:
    """``AlgorithmConfig._model_config``: the model config set so far (a dict; {} if unset or
    an object)."""
    value = config._model_config
    return value if isinstance(value, dict) else {}


def learner_connector(learner):
    """``Learner._learner_connector``: the learner's connector pipeline (after ``build``)."""
    return learner._learner_connector


def wants_component(checkpointable, name: str, components, not_components) -> bool:
    """``Checkpointable._check_component``: whether a ``get_state(components, not_components)``
    call asks for ``name``."""
    return checkpointable._check_component(name, components, not_components)


def set_iteration(algorithm, iteration: int) -> None:
    """Sets ``Algorithm._iteration``, the counter ``Algorithm.step()`` reads."""
    algorithm._iteration = iteration


def local_learner(group):
    """``LearnerGroup._learner``: the learner of a group without remote learners
    (``num_learners=0``), None otherwise; ``bench/cartpole_vs_ppo.py`` times its gradient steps."""
    return getattr(group, "_learner", None)


_ppo_sampling: dict[str, Callable] = {}


def time_ppo_sampling(wrap: Callable[[Callable], Callable]) -> None:
    """PPO's training step calls ``wrap(synchronous_parallel_sample)`` in place of RLlib's
    function (a name its module imports, which no PPO config can swap); ``bench/cartpole_vs_ppo.py``
    times PPO's sampling so. A second call wraps RLlib's own function again, not the last wrapper."""
    from ray.rllib.algorithms.ppo import ppo

    PPO_SAMPLING_TIMED.apply()
    original = _ppo_sampling.setdefault("original", ppo.synchronous_parallel_sample)
    ppo.synchronous_parallel_sample = wrap(original)


def caller_frames(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` without reading source files: the same frames, from the caller
    outward, each with ``co_filename`` as its file and no code context (``context`` is
    accepted and ignored)."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
        frame = frame.f_back
    return frames


class InspectWithoutSource(types.ModuleType):
    """The ``inspect`` module as ``connector_v2`` sees it: :func:`caller_frames` as ``stack``."""

    stack = staticmethod(caller_frames)

    def __getattr__(self, name: str):
        return getattr(inspect, name)


def _build_connectors_without_source() -> None:
    from ray.rllib.connectors import connector_v2

    if not isinstance(connector_v2.inspect, InspectWithoutSource):
        connector_v2.inspect = InspectWithoutSource("inspect")



_RUNNER = "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner"
_CONFIG = "ray.rllib.algorithms.algorithm_config:AlgorithmConfig"
INTERNALS = (
    Internal(_RUNNER, "_seed", "read and written: the seed of the envs' first reset", kind="instance"),
    Internal(_RUNNER, "_device", "read: the module's device", kind="instance"),
    Internal(_RUNNER, "_callbacks", "read: the callback objects", kind="instance"),
    Internal(_RUNNER, "_weights_seq_no", "read: the weights' version", kind="instance"),
    Internal(_RUNNER, "_done_episodes_for_metrics", "extended: episodes for get_metrics()", kind="instance"),
    Internal(_RUNNER, "_log_env_steps", "called: Ray's env-step counter", ("self", "metric", "num_steps")),
    Internal(_RUNNER, "_metrics_num_env_steps_sampled", "read: that counter", kind="instance"),
    Internal(_RUNNER, "_increase_sampled_metrics", "overridden and called: the per-call counters",
             ("self", "num_steps", "num_episodes_completed")),
    Internal(_RUNNER, "_sample", "overridden and called: the sampling loop",
             ("self", "num_timesteps", "num_episodes", "explore", "random_actions", "force_reset")),
    Internal("ray.rllib.core.rl_module.rl_module:RLModule", "_forward_exploration", "read: the exploration pass",
             ("self", "batch", "kwargs")),
    Internal("ray.rllib.core.rl_module.rl_module:RLModule", "_forward_inference", "read: the inference pass",
             ("self", "batch", "kwargs")),
    Internal(_CONFIG, "_env_to_module_connector", "read: the config's own connector pieces", kind="instance"),
    Internal(_CONFIG, "_module_to_env_connector", "read: the config's own connector pieces", kind="instance"),
    Internal("ray._common.deprecation", "logger", "filtered: RLlib's own RLModule(config=...) warning"),
    Internal("ray.rllib.env", "INPUT_ENV_SINGLE_SPACES", "read: one env's spaces in a connector factory's spaces"),
    Internal("ray.rllib.env", "INPUT_ENV_SPACES", "read: the vector env's spaces there"),
    Internal("ray.rllib.utils.numpy", "flatten_inputs_to_1d_tensor", "called: FlattenObservations' flattening",
             ("inputs", "spaces_struct", "time_axis", "batch_axis")),
    Internal(_CONFIG, "_value_error", "called: a validation error", ("self", "errmsg")),
    Internal(_CONFIG, "_model_config", "read: the model config so far", kind="instance"),
    Internal("ray.rllib.env.single_agent_episode:SingleAgentEpisode", "_start_time", "written: the episode's start",
             kind="instance"),
    Internal("ray.rllib.env.single_agent_episode:SingleAgentEpisode", "_last_step_time", "written: its last step",
             kind="instance"),
    Internal("ray.rllib.core.learner.learner:Learner", "_learner_connector", "read: the connector pipeline",
             kind="instance"),
    Internal("ray.rllib.utils.checkpoints:Checkpointable", "_check_component", "called: a state's components",
             ("self", "name", "components", "not_components")),
    Internal("ray.rllib.algorithms.algorithm:Algorithm", "_iteration", "written: the step counter", kind="instance"),
    Internal("ray.rllib.connectors.connector_v2", "inspect", "swapped: connectors built without source reads"),
    Internal("ray.util.debug", "log_once", "called: RLlib's new-stack notice marked logged", ("key",)),
    Internal("ray.rllib.core.learner.learner_group:LearnerGroup", "_learner", "read: the local learner (bench)",
             kind="instance"),
    Internal("ray.rllib.algorithms.ppo.ppo", "synchronous_parallel_sample", "swapped: PPO's sampling timed (bench)"),
)

CONNECTORS_WITHOUT_SOURCE = Patch("connectors built without reading source files", "ray", TESTED, "connectors",
                                  _build_connectors_without_source, pick(INTERNALS, "connector_v2.inspect"))
# An override, not a patch: HAEPO's env runner subclasses SamplingHooks (also when HAEPO is built as a library).
SAMPLING_HOOKS = Patch("SamplingHooks: the env runner's sampling loop and counters overridden", "ray", TESTED,
                       None, lambda: None,
                       pick(INTERNALS, "SingleAgentEnvRunner._sample",
                            "SingleAgentEnvRunner._increase_sampled_metrics"))
PATCHES = (CONNECTORS_WITHOUT_SOURCE, SAMPLING_HOOKS)
# Applied by bench/ only, so not among the patches a sweep checks first.
PPO_SAMPLING_TIMED = Patch("PPO's sampling timed (bench/cartpole_vs_ppo.py)", "ray", TESTED, None, lambda: None,
                           pick(INTERNALS, "ppo.synchronous_parallel_sample"))
