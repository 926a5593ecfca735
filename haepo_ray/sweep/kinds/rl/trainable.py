"""The Tune trainable of a sweep: an RLlib Algorithm, reusable for the next trial, whose every
result carries the sweep's metric.

*Reuse.* RLlib's Algorithm does not implement ``reset_config``, so with it Tune starts a new
actor (a new Python process that imports Ray, RLlib and PyTorch: seconds) for every trial. For
sweeps of many short trials that start-up dominates. :class:`SweepTrainable`'s
``reset_config`` stops the algorithm and builds the next trial's in the same process;
``TuneConfig(reuse_actors=True)`` then keeps actors alive across trials (spec key
``reuse_actors``). In between, the process gives the finished trial's memory back
(:mod:`haepo_ray.sweep.trial_process`): a stopped algorithm leaves its learner in reference
cycles, and without it a reused process grew by 1.3 MB per CartPole trial.

*The metric in every result.* RLlib reports episode metrics (``env_runners/episode_return_mean``
...) only for iterations that end an episode, e.g. not for PPO with timestep batches shorter
than an episode: before the first episode the key is absent, and Tune ends the *whole sweep*
on a result without its metric; later it is NaN, which schedulers cannot rank. So a missing
or NaN metric carries its last value forward (NaN before the first), as RLlib's old API stack
did with its smoothing window; the result names it under
:data:`~haepo_ray.names.CARRIED_OVER`, and MLflow tracking does not log carried values (nor
RLlib's evaluation results in an iteration that did not evaluate: :mod:`haepo_ray.rl.evaluation`).

*Devices.* Every result carries, as run tags (:data:`~haepo_ray.names.RUN_TAGS`), the devices
that the learners' and env runners' modules hold their parameters on, and the GPUs Ray gave
the trial (:func:`~haepo_ray.provenance.device_tags`): a learner on the CPU where the trial
asked for a GPU shows.

Checkpoints are the algorithm's own (``Algorithm.from_checkpoint`` loads them), plus
:data:`CARRIED_FILE` with the carried value, so that a trial restored from a checkpoint
(a retry, a resumed sweep, a PBT exploit) carries on the value it had, not NaN.
"""

from __future__ import annotations

import json
import math
import os
from functools import cache
from typing import Any

from ray import tune
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.tune.result import RESULT_DUPLICATE

from haepo_ray.upstream import rllib as rllib_internals
from haepo_ray.upstream import tune as tune_internals
from haepo_ray.names import CARRIED_OVER, PROVENANCE, RUN_TAGS
from haepo_ray.provenance import device_tags, provenance
from haepo_ray.rl.evaluation import mark_stale_evaluation
from haepo_ray.sweep.trial_process import freeze_survivors, release_memory

CARRIED_FILE = "haepo_carried_metric.json"  # in the checkpoint: {"value": the carried metric}


class SweepTrainable(tune.Trainable):
    """Runs ``algo_cls`` inside this Tune actor, reporting ``metric`` every iteration (both set
    by :func:`sweep_trainable`)."""

    algo_cls: type | None = None
    metric: str | None = None  # the sweep's metric, a "/"-nested result key

    def setup(self, config: dict[str, Any]) -> None:
        self.algo = self._build(config)
        self._devices = _devices(self.algo)

    def _build(self, config: dict[str, Any]):
        self._last_metric = math.nan
        # The trial's storage: the algorithm shares this trial's folder (no stray ~/ray_results).
        # No utilisation monitor in the inner algorithm: only Trainable.train() reports its
        # data (this trainable's own monitor fills perf/ in the results), and stopping it
        # joins its thread, up to 0.7 s per trial.
        rllib_internals.CONNECTORS_WITHOUT_SOURCE.apply()  # any algorithm's connectors (RLlib's PPO's too) build cheaper
        return self.algo_cls(config={**config, "log_sys_usage": False}, storage=tune_internals.trial_storage(self))

    def step(self) -> dict[str, Any]:
        # Algorithm.step() reads its own iteration counter (evaluation intervals).
        rllib_internals.set_iteration(self.algo, self.iteration)
        return self.algo.step()

    def train(self) -> dict[str, Any]:
        # After Tune's own keys (training_iteration, time_total_s, ...) are in the result.
        result = super().train()
        result[PROVENANCE] = provenance()  # what trains this trial (MLflow tags its run)
        result[RUN_TAGS] = self._devices
        return self._with_metric(mark_stale_evaluation(result, self.algo.config))

    def _with_metric(self, result: dict[str, Any]) -> dict[str, Any]:
        if self.metric is None or RESULT_DUPLICATE in result:
            return result
        *path, leaf = self.metric.split("/")
        node = result
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return result  # the metric's path holds a value, not a dict: Tune will say so
        value = node.get(leaf, math.nan)
        if not _is_nan(value):
            self._last_metric = value
        else:
            node[leaf] = self._last_metric
            result[CARRIED_OVER] = [*result.get(CARRIED_OVER, ()), self.metric]
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        rllib_internals.set_iteration(self.algo, self.iteration)
        self.algo.save_checkpoint(checkpoint_dir)
        with open(os.path.join(checkpoint_dir, CARRIED_FILE), "w") as f:
            json.dump({"value": self._last_metric}, f)  # NaN as JSON's NaN

    def load_checkpoint(self, checkpoint: str | dict) -> None:
        self.algo.load_checkpoint(checkpoint)
        path = os.path.join(checkpoint, CARRIED_FILE) if isinstance(checkpoint, str) else ""
        if os.path.isfile(path):  # checkpoints of older versions lack it
            with open(path) as f:
                self._last_metric = json.load(f)["value"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.algo.stop()
        self.algo = None  # collected with the rest of the trial's garbage before the next is built
        freeze_survivors()
        release_memory()
        self.algo = self._build(new_config)
        self._devices = _devices(self.algo)
        return True

    def cleanup(self) -> None:
        algo = getattr(self, "algo", None)
        if algo is not None:
            algo.stop()

    @classmethod
    def default_resource_request(cls, config):
        return cls.algo_cls.default_resource_request(config)


def _devices(algo) -> dict[str, str]:
    """:func:`~haepo_ray.provenance.device_tags` of ``algo``'s learners and env runners (those
    that hold a module)."""

    def parameters_devices(module) -> list[str]:  # an RLModule, a MultiRLModule of them, or None
        parts = [] if module is None else module.values() if isinstance(module, MultiRLModule) else [module]
        return [str(p.device) for part in parts for p in part.parameters()]

    learners = [r.get() for r in algo.learner_group.foreach_learner(lambda learner: parameters_devices(learner.module))]
    runners = algo.env_runner_group.foreach_env_runner(lambda runner: parameters_devices(runner.module))
    return device_tags(learner=[d for ds in learners for d in ds], env_runner=[d for ds in runners for d in ds])


def _is_nan(value: Any) -> bool:
    try:
        return math.isnan(value)
    except TypeError:  # not a number: Tune and its searchers will say what they expect
        return False


@cache
def sweep_trainable(algorithm: str, metric: str | None) -> type[SweepTrainable]:
    """The sweep trainable for an RLlib algorithm (:func:`haepo_ray.rl.registry.algorithm_class`),
    named like it."""
    from haepo_ray.rl.registry import algorithm_class

    algo_cls = algorithm_class(algorithm)
    return type(algorithm, (SweepTrainable,), {
        "algo_cls": algo_cls,
        "metric": metric,
        "__module__": __name__,
        "__qualname__": algorithm,
        "__doc__": f"{algorithm} as a sweep trial (see haepo_ray.sweep.kinds.rl.trainable).",
    })
