"""Every private name of Ray Tune 2.60 (and of the Ray Train storage under it) that haepo-ray
uses, each with its reason; a Ray upgrade is checked here (:data:`INTERNALS`, :data:`PATCHES`).
The patches serve sweeps of many trials, or their resume, on the driver, where Tune's
controller runs; :func:`apply` installs them, from the sweep runner only.

*Launched actors are kept* (optional: speed). ``TuneController._maybe_reuse_cached_actor``
hands a pending trial a cached actor (one whose trial ended) and removes the actor that was
being started for that trial. When trials are shorter than an actor's start (a one-iteration
trial: 0.1 s; a start: seconds of importing Ray, RLlib and PyTorch), every actor Tune launches
is killed while it imports: 1,000 one-iteration trials on 8 slots ran on 3 actors; at N = 300
the patch let 8 actors run them and cut the sweep's CPU to 0.81x (BENCHMARKS.md, "Sweeps of
thousands of trials"). Patched, a trial whose own actor is already launching keeps it, and the cached
actor goes to a pending trial whose actor still waits for resources (dropping that request
costs nothing): launched actors join the sweep instead of being thrown away.

*A finished trial's running statistics are let go* (:class:`ReleaseFinishedTrials`, a
callback; optional: memory). For every numeric result key Tune keeps deques of the last 5 and 10 values
(``run_metadata.metric_n_steps``: 175 KB for a one-iteration HAEPO trial) and a copy of the
trial's config in its last result (58 KB), besides a cached JSON of both (105 KB); the driver
kept all of it for every finished trial (a failed one keeps it: a resume runs it again).

*The experiment's folder is copied file by file, each whole or not at all* (required,
:mod:`~haepo_ray.upstream.tune_storage`, which says why and how).

*A resume restores from checkpoints that exist, and a run that cannot be restored is not started
again* (both required, :mod:`~haepo_ray.upstream.tune_restore`, which says why and how).

*A trial process the memory monitor killed fails its trial, not the sweep*
(:func:`_fail_trials_killed_for_memory`; required). When a node runs low on memory, Ray's memory
monitor kills a worker process, and the task running in it raises ``OutOfMemoryError``, which is
neither a ``RayActorError`` nor a ``RayTaskError``: ``RayActorManager._actor_task_failed`` raised
``RuntimeError: Caught unexpected exception`` for it, and ``tuner.fit()`` ended the whole sweep
(an 18-trial language-model sweep, after 14 trials: REPRODUCTION.md). Patched, it is what it
is, the death of the trial's actor: the trial fails with the monitor's message, and Tune retries
it as ``max_failures`` says while the other trials go on.

*A resume does not read every trial's results first* (:func:`restoring_without_analysis`;
optional: speed and memory).
``Tuner.restore`` builds an ``ExperimentAnalysis`` for ``Tuner.get_results`` before a fit: it
parses the experiment state and reads every trial's ``result.json`` into a DataFrame (10.5 s
and 760 MB at 1,000 one-iteration trials), and warns once per trial that has none (each trial
not started before the kill). A sweep fits at once, and the fit builds its own.

Read, not patched:

- ``Trial.__unresolved_config``, ``Trial._state_json``, ``_TrainingRunMetadata._cached_json``
  (:func:`trial_caches`): what ``bench/trial_memory.py`` weighs of a finished trial.
- ``Tuner._local_tuner`` (:func:`set_restored_callbacks`): ``tuner.pkl`` holds the first run's
  callbacks (unstarted copies), and Ray 2.60 has no public way to give a restored ``Tuner``
  this run's.
- ``Trainable._storage`` (:func:`trial_storage`): the trial's storage context, which an RLlib
  ``Algorithm`` built inside the trial shares (no stray ``~/ray_results``).
- ``ray.tune.search.sample._BackwardsCompatibleNumpyRng`` (:func:`variant_rng`): the random
  state ``BasicVariantGenerator`` draws a grid/random search's trials with; ``--dry-run``
  reproduces them.
- ``ray.tune.registry._global_registry`` (:func:`registered_env_creator`,
  :func:`registered_trainable`): Ray has no public lookup of a registered env; RLlib consults
  the same registry in ``make_env``. Tune's public ``get_trainable_cls`` imports every RLlib
  algorithm to look a name up, and DreamerV3's import makes a debugging env whose float64 box
  gymnasium warns about four times, on any RLlib algorithm's run.
- ``RAY_AIR_NEW_OUTPUT=0`` (:data:`CLASSIC_OUTPUT`): Tune's newer console output prints every
  trial's whole config (hundreds of RLlib keys) at start; the classic reporter shows the sweep's
  table. ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``: Tune adds a CSV, a JSON and a TensorBoard
  logger to every run unless it is set; the sweep passes the JSON one itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from ray.tune import Callback

from haepo_ray.upstream import tune_restore, tune_storage
from haepo_ray.upstream.declared import Internal, Patch, pick

logger = logging.getLogger(__name__)

TESTED = ("2.60.0",)  # the Ray versions the patches were written and tested for


def launching(controller, actor) -> bool:
    """``actor`` has its resources and its process (Ray's actor manager holds it live) and
    its constructor has not returned (Tune has not started it)."""
    return (actor in controller._actor_manager._live_actors_to_ray_actors_resources
            and actor not in controller._started_actors)


def apply() -> list[str]:
    """Installs the wanted :data:`PATCHES` in this process, where Tune's controller runs
    (idempotent), each checked against its tested versions; returns the names installed."""
    return [patch.name for patch in PATCHES if patch.apply()]


def _keep_launching_actors() -> None:
    from ray.tune.execution.tune_controller import TuneController

    original = TuneController._maybe_reuse_cached_actor
    if getattr(original, "keeps_launching_actors", False):
        return

    @functools.wraps(original)
    def maybe_reuse_cached_actor(self, trial) -> bool:
        actor = self._trial_to_actor.get(trial)
        if actor is not None and trial not in self._resetting_trials and launching(self, actor):
            return False
        return original(self, trial)

    maybe_reuse_cached_actor.keeps_launching_actors = True
    TuneController._maybe_reuse_cached_actor = maybe_reuse_cached_actor


@contextlib.contextmanager
def restoring_without_analysis():
    """Within it, ``Tuner.restore`` leaves its ``ExperimentAnalysis`` out (as it does when
    building one fails), unless ``HAEPO_PATCHES=required``."""
    from ray.tune.impl import tuner_internal

    if not ANALYSIS_LEFT_OUT.apply():
        yield
        return

    original = tuner_internal.ExperimentAnalysis

    def not_built(*args, **kwargs):
        raise RuntimeError("left out: the sweep fits at once")

    tuner_internal.ExperimentAnalysis = not_built
    try:
        yield
    finally:
        tuner_internal.ExperimentAnalysis = original


def _fail_trials_killed_for_memory() -> None:
    from ray.air.execution._internal.actor_manager import RayActorManager
    from ray.exceptions import OutOfMemoryError, RayActorError

    original = RayActorManager._actor_task_failed
    if getattr(original, "fails_trials_killed_for_memory", False):
        return

    @functools.wraps(original)
    def actor_task_failed(self, tracked_actor_task, exception: Exception) -> None:
        if isinstance(exception, OutOfMemoryError):  # the monitor killed the actor's process
            exception = RayActorError(error_msg=str(exception))
        original(self, tracked_actor_task, exception)

    actor_task_failed.fails_trials_killed_for_memory = True
    RayActorManager._actor_task_failed = actor_task_failed


class ReleaseFinishedTrials(Callback):
    """Drops, once a trial has ended, its deques of recent values (only a running trial's
    ``last-N-avg`` statistics read them) and its last result's copy of the config (the trial's
    own, equal, stands in); its statistics (``metric_analysis``) and last result stay. Setting
    the attributes refreshes the trial's cached JSON state. A trial that failed keeps them:
    ``--resume`` runs it again (``resume_errored``), and Tune's statistics of its next result
    read them (a ``KeyError`` that ended the resumed sweep)."""

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        release(trial)


def sweep_callbacks() -> list[Callback]:
    """The callbacks of the wanted optional patches: :class:`ReleaseFinishedTrials`."""
    return [ReleaseFinishedTrials()] if FINISHED_TRIALS_RELEASED.apply() else []


def release(trial) -> None:
    """See :class:`ReleaseFinishedTrials`."""
    metadata = trial.run_metadata
    metadata.metric_n_steps = {}
    last = metadata.last_result
    if isinstance(last, dict) and "config" in last and last["config"] == trial.config:
        metadata.last_result = {**last, "config": trial.config}


def trial_caches(trial) -> dict[str, object]:
    """What a Tune ``Trial`` holds beside its state, as ``bench/trial_memory.py`` weighs it: its
    unresolved config (``Trial.__unresolved_config``) and the cached JSON of its state
    (``Trial._state_json``) and of its run metadata (``_TrainingRunMetadata._cached_json``)."""
    return {"unresolved config": vars(trial).get("_Trial__unresolved_config"),
            "cached JSON: trial state": trial._state_json,
            "cached JSON: run metadata": trial.run_metadata._cached_json}


def set_restored_callbacks(tuner, callbacks: list) -> None:
    """Gives a ``Tuner.restore``-d tuner this run's ``callbacks`` (``Tuner._local_tuner``)."""
    tuner._local_tuner.get_run_config().callbacks = callbacks


def trial_storage(trainable):
    """``Trainable._storage``: the trial's ``StorageContext``."""
    return trainable._storage


def variant_rng(seed):
    """The random state ``BasicVariantGenerator`` draws a search's trials with, from a seed or
    a numpy generator (None: numpy's global state, as Tune's own draws without a seed)."""
    from ray.tune.search.sample import _BackwardsCompatibleNumpyRng

    return _BackwardsCompatibleNumpyRng(seed)


def registered_env_creator(env_id: str):
    """The creator of a Ray-registered env, or None."""
    from ray.tune.registry import ENV_CREATOR

    return _registered(ENV_CREATOR, env_id)


def registered_trainable(name: str) -> type | None:
    """The trainable registered with Ray Tune as ``name``, or None; RLlib's algorithms are there
    only once something has asked Tune for one."""
    from ray.tune.registry import TRAINABLE_CLASS

    return _registered(TRAINABLE_CLASS, name)


def _registered(category: str, key: str):
    """What Ray Tune's registry (``ray.tune.registry._global_registry``) holds as ``key`` of
    ``category``, or None."""
    from ray.tune.registry import _global_registry

    return _global_registry.get(category, key) if _global_registry.contains(category, key) else None


# Environment variables a sweep sets around ``tuner.fit()`` (the module docstring says why).
CLASSIC_OUTPUT = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}

_CONTROLLER = "ray.tune.execution.tune_controller:TuneController"
INTERNALS = (
    Internal(_CONTROLLER, "_maybe_reuse_cached_actor", "patched: launched actors are kept", ("self", "trial")),
    Internal(_CONTROLLER, "resume", "patched: a failed restore is raised", ("self", "resume_config")),
    Internal(_CONTROLLER, "_schedule_trial_restore", "patched: restored from a checkpoint that exists",
             ("self", "trial")),
    Internal(_CONTROLLER, "save_to_dir", "patched: the state staged whole", ("self",)),
    Internal(_CONTROLLER, "experiment_state_file_name", "patched: a temporary name while it is written"),
    Internal(_CONTROLLER, "CKPT_FILE_TMPL", "read: which staged file is the experiment state"),
    Internal(_CONTROLLER, "_actor_manager", "read: the actors that are live", kind="instance"),
    Internal("ray.air.execution._internal.actor_manager:RayActorManager", "_actor_task_failed",
             "patched: a process killed for memory fails its trial", ("self", "tracked_actor_task", "exception")),
    Internal("ray.air.execution._internal.actor_manager:RayActorManager", "_live_actors_to_ray_actors_resources",
             "read: the actors that are live", kind="instance"),
    Internal(_CONTROLLER, "_started_actors", "read: the actors whose constructor returned", kind="instance"),
    Internal(_CONTROLLER, "_trial_to_actor", "read: a trial's actor", kind="instance"),
    Internal(_CONTROLLER, "_resetting_trials", "read: trials whose actor is being reset", kind="instance"),
    Internal(_CONTROLLER, "_storage", "read: the experiment's storage (a failed restore's message, the staged state)",
             kind="instance"),
    Internal("ray.train._internal.storage", "_FilesystemSyncer", "patched: its sync command"),
    Internal("ray.train._internal.storage:_FilesystemSyncer", "_sync_up_command", "patched: files copied whole",
             ("self", "local_path", "uri", "exclude")),
    Internal("ray.train._internal.storage:_FilesystemSyncer", "storage_filesystem", "read: local or not", kind="instance"),
    Internal("ray.train._internal.storage:_FilesystemSyncer", "sync_up", "patched: a state left behind is not synced",
             ("self", "local_dir", "remote_dir", "exclude")),
    Internal("ray.train._internal.checkpoint_manager", "_delete_fs_path", "patched: renamed, then deleted",
             ("fs", "fs_path")),
    Internal("ray.train._internal.checkpoint_manager:_CheckpointManager", "_checkpoint_results",
             "written: the checkpoints that are gone forgotten", kind="instance"),
    Internal("ray.train._internal.checkpoint_manager:_CheckpointManager", "_latest_checkpoint_result",
             "written: the newest checkpoint that exists", kind="instance"),
    Internal("ray.tune.experiment:Trial", "from_json_state", "called: a state file's trials",
             ("json_state", "stub")),
    Internal("ray.tune.execution.experiment_state", "_find_newest_experiment_checkpoint",
             "read: the state file a failed restore names", ("experiment_path", "fs")),
    Internal("ray.tune.impl.tuner_internal", "ExperimentAnalysis", "swapped during a restore: not built"),
    Internal("ray.tune.experiment.trial:Trial", "run_metadata", "written: a finished trial's deques let go", kind="instance"),
    Internal("ray.tune.trainable.metadata:_TrainingRunMetadata", "metric_n_steps", "written: let go", kind="instance"),
    Internal("ray.tune.experiment.trial:Trial", "_Trial__unresolved_config", "read: weighed (bench)", kind="instance"),
    Internal("ray.tune.experiment.trial:Trial", "_state_json", "read: weighed (bench)", kind="instance"),
    Internal("ray.tune.trainable.metadata:_TrainingRunMetadata", "_cached_json", "read: weighed (bench)",
             kind="instance"),
    Internal("ray.tune:Tuner", "_local_tuner", "read: a restored tuner's run config", kind="instance"),
    Internal("ray.tune:Trainable", "_storage", "read: the trial's storage context", kind="instance"),
    Internal("ray.tune.search.sample", "_BackwardsCompatibleNumpyRng", "called: the search's random state",
             ("generator_or_seed",)),
    Internal("ray.tune.registry", "_global_registry", "read: Ray-registered envs and trainables"),
    Internal("ray.tune.experimental.output", "RAY_AIR_NEW_OUTPUT", "set: Tune's classic output", kind="env"),
    Internal("ray.tune.utils.callback", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "set: no automatic loggers", kind="env"),
)

def _patch(name: str, key: str | None, install, *internals: str) -> Patch:
    return Patch(name, "ray", TESTED, key, install, pick(INTERNALS, *internals))


ACTORS_KEPT = _patch("keep launching actors", "actors", _keep_launching_actors,
                     "TuneController._maybe_reuse_cached_actor", "TuneController._actor_manager",
                     "RayActorManager._live_actors_to_ray_actors_resources", "TuneController._started_actors",
                     "TuneController._trial_to_actor", "TuneController._resetting_trials")
FILES_COPIED_WHOLE = _patch("copy the experiment folder's files whole", None, tune_storage.copy_changed_files_whole,
                            "storage._FilesystemSyncer", "_FilesystemSyncer._sync_up_command",
                            "_FilesystemSyncer.storage_filesystem", "_FilesystemSyncer.sync_up",
                            "TuneController.save_to_dir", "TuneController.experiment_state_file_name",
                            "TuneController.CKPT_FILE_TMPL", "TuneController._storage",
                            "checkpoint_manager._delete_fs_path")
RESTORES_FAIL_LOUDLY = _patch("fail restores loudly", None, tune_restore.fail_restores_loudly,
                              "TuneController.resume", "TuneController._storage",
                              "experiment_state._find_newest_experiment_checkpoint", "Trial.from_json_state")
CHECKPOINTS_THAT_EXIST = _patch("restore from a checkpoint that exists", None,
                                tune_restore.restore_from_checkpoints_that_exist,
                                "TuneController._schedule_trial_restore", "_CheckpointManager._checkpoint_results",
                                "_CheckpointManager._latest_checkpoint_result")
KILLED_FOR_MEMORY = _patch("fail a trial whose process was killed for memory", None, _fail_trials_killed_for_memory,
                           "RayActorManager._actor_task_failed")
ANALYSIS_LEFT_OUT = _patch("restore without the analysis", "analysis", lambda: None,
                           "tuner_internal.ExperimentAnalysis")
FINISHED_TRIALS_RELEASED = _patch("release finished trials", "release", lambda: None, "Trial.run_metadata",
                                  "_TrainingRunMetadata.metric_n_steps")
PATCHES = (ACTORS_KEPT, FILES_COPIED_WHOLE, RESTORES_FAIL_LOUDLY, CHECKPOINTS_THAT_EXIST, KILLED_FOR_MEMORY,
           ANALYSIS_LEFT_OUT, FINISHED_TRIALS_RELEASED)
