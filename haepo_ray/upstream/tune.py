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
kept all of it for every finished trial.

*The experiment's folder is copied file by file, each whole or not at all* (required,
:func:`sync_folder`). Tune writes its experiment state (every trial's state: about 80 KB per
HAEPO trial) and the trials' result files into a staging folder on the driver and copies the
whole staging folder into the experiment's folder in a background thread, every file each time
and in place. A driver killed while it copied left a cut-short ``experiment_state-*.json``
(80 MiB of 83 at 850 trials); on ``--resume`` Tune could not read it, logged an error and
started every trial again from scratch, into the same MLflow runs. Patched, for a local (or
NFS-mounted) experiment folder, a file is copied only when it changed since its last copy, into
a temporary name beside it that Tune never reads, then renamed over the old one; a file that
changed while it was copied waits for the next copy.

*A resume does not read every trial's results first* (:func:`restoring_without_analysis`;
optional: speed and memory).
``Tuner.restore`` builds an ``ExperimentAnalysis`` for ``Tuner.get_results`` before a fit: it
parses the experiment state and reads every trial's ``result.json`` into a DataFrame (10.5 s
and 760 MB at 1,000 one-iteration trials), and warns once per trial that has none (each trial
not started before the kill). A sweep fits at once, and the fit builds its own.

*A run that cannot be restored is not started again* (:class:`RestoreFailed`; required). When
``TuneController.resume`` fails (a cut-short state from before the patch above, a trainable
that no longer unpickles), Tune logs the error and starts every trial again from scratch, into
the folder and MLflow runs of the trials that had finished. Patched, the error reaches
``haepo sweep --resume``, which stops with it.

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
- ``ray.tune.registry._global_registry`` (:func:`registered_env_creator`): Ray has no public
  lookup of a registered env; RLlib consults the same registry in ``make_env``.
- ``RAY_AIR_NEW_OUTPUT=0`` (:data:`CLASSIC_OUTPUT`): Tune's newer console output prints every
  trial's whole config (hundreds of RLlib keys) at start; the classic reporter shows the sweep's
  table. ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``: Tune adds a CSV, a JSON and a TensorBoard
  logger to every run unless it is set; the sweep passes the JSON one itself.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil

from ray.tune import Callback

from haepo_ray.upstream.declared import Internal, Patch, pick

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


# Per (staging folder, experiment folder): each file's (inode, size, mtime) when it was copied.
_copied: dict[tuple[str, str], dict[str, tuple[int, ...]]] = {}


def _copy_changed_files_whole() -> None:
    import pyarrow.fs
    from ray.train._internal.storage import _FilesystemSyncer

    original = _FilesystemSyncer._sync_up_command
    if getattr(original, "copies_whole_files", False):
        return

    @functools.wraps(original)
    def sync_up_command(self, local_path, uri, exclude=None):
        if exclude or not isinstance(self.storage_filesystem, pyarrow.fs.LocalFileSystem) \
                or not os.path.isdir(local_path):
            return original(self, local_path, uri, exclude)
        copied = _copied.setdefault((local_path, uri), {})
        return sync_folder, {"source": local_path, "destination": uri, "copied": copied}

    sync_up_command.copies_whole_files = True
    _FilesystemSyncer._sync_up_command = sync_up_command


def _signature(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def sync_folder(source: str, destination: str, copied: dict[str, tuple[int, ...]]) -> int:
    """Copies into ``destination`` each file under ``source`` that changed since ``copied``
    says it was copied: into ``.<name>.tmp`` beside it, then renamed over it (a reader sees the
    old file or the new one, never part of one); a file that changes while it is copied is left
    for the next call, as are names starting with ``.`` (Tune's own temporary files). The
    trials' folders go first, the experiment state last: a state on disk never names results
    that are not. Folders are made as they appear. Returns how many files it copied."""
    count = 0
    for folder, _, names in os.walk(source, topdown=False):  # the trials' folders before the state
        relative = os.path.relpath(folder, source)
        target_folder = os.path.normpath(os.path.join(destination, relative))
        if relative + os.sep not in copied:
            os.makedirs(target_folder, exist_ok=True)
            copied[relative + os.sep] = ()
        for name in names:
            if name.startswith("."):
                continue
            path, key = os.path.join(folder, name), os.path.normpath(os.path.join(relative, name))
            before = _signature(path)
            if before is None or copied.get(key) == before:
                continue
            temporary = os.path.join(target_folder, f".{name}.tmp")
            try:
                shutil.copyfile(path, temporary)
            except FileNotFoundError:  # replaced meanwhile (an atomic save): the next call
                continue
            if _signature(path) != before:
                os.unlink(temporary)
                continue
            os.replace(temporary, os.path.join(target_folder, name))
            copied[key] = before
            count += 1
    return count


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


class RestoreFailed(BaseException):
    """Tune could not restore the run it was asked to resume (``args``: the experiment's path,
    its newest experiment-state file, the error). A ``BaseException``: ``TuneController``'s
    constructor catches every ``Exception`` of its restore, logs it and starts every trial again."""


def _fail_restores_loudly() -> None:
    from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint
    from ray.tune.execution.tune_controller import TuneController

    original = TuneController.resume
    if getattr(original, "fails_loudly", False):
        return

    @functools.wraps(original)
    def resume(self, resume_config):
        try:
            return original(self, resume_config)
        except Exception as error:
            storage = self._storage
            newest = _find_newest_experiment_checkpoint(storage.experiment_fs_path,
                                                        fs=storage.storage_filesystem)
            raise RestoreFailed(storage.experiment_fs_path, newest, error) from error

    resume.fails_loudly = True
    TuneController.resume = resume


class ReleaseFinishedTrials(Callback):
    """Drops, once a trial has ended, its deques of recent values (only a running trial's
    ``last-N-avg`` statistics read them) and its last result's copy of the config (the trial's
    own, equal, stands in); its statistics (``metric_analysis``) and last result stay. Setting
    the attributes refreshes the trial's cached JSON state."""

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        release(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
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


def variant_rng(seed: int | None):
    """The random state ``BasicVariantGenerator`` draws a search's trials with."""
    from ray.tune.search.sample import _BackwardsCompatibleNumpyRng

    return _BackwardsCompatibleNumpyRng(seed)


def registered_env_creator(env_id: str):
    """The creator of a Ray-registered env (``ray.tune.registry._global_registry``), or None."""
    from ray.tune.registry import ENV_CREATOR, _global_registry

    return _global_registry.get(ENV_CREATOR, env_id) if _global_registry.contains(ENV_CREATOR, env_id) else None


# Environment variables a sweep sets around ``tuner.fit()`` (the module docstring says why).
CLASSIC_OUTPUT = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}

_CONTROLLER = "ray.tune.execution.tune_controller:TuneController"
INTERNALS = (
    Internal(_CONTROLLER, "_maybe_reuse_cached_actor", "patched: launched actors are kept", ("self", "trial")),
    Internal(_CONTROLLER, "resume", "patched: a failed restore is raised", ("self", "resume_config")),
    Internal(_CONTROLLER, "_actor_manager", "read: the actors that are live", kind="instance"),
    Internal("ray.air.execution._internal.actor_manager:RayActorManager", "_live_actors_to_ray_actors_resources",
             "read: the actors that are live", kind="instance"),
    Internal(_CONTROLLER, "_started_actors", "read: the actors whose constructor returned", kind="instance"),
    Internal(_CONTROLLER, "_trial_to_actor", "read: a trial's actor", kind="instance"),
    Internal(_CONTROLLER, "_resetting_trials", "read: trials whose actor is being reset", kind="instance"),
    Internal(_CONTROLLER, "_storage", "read: the experiment's storage, for a failed restore's message", kind="instance"),
    Internal("ray.train._internal.storage", "_FilesystemSyncer", "patched: its sync command"),
    Internal("ray.train._internal.storage:_FilesystemSyncer", "_sync_up_command", "patched: files copied whole",
             ("self", "local_path", "uri", "exclude")),
    Internal("ray.train._internal.storage:_FilesystemSyncer", "storage_filesystem", "read: local or not", kind="instance"),
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
    Internal("ray.tune.registry", "_global_registry", "read: Ray-registered envs"),
    Internal("ray.tune.experimental.output", "RAY_AIR_NEW_OUTPUT", "set: Tune's classic output", kind="env"),
    Internal("ray.tune.utils.callback", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "set: no automatic loggers", kind="env"),
)

def _patch(name: str, key: str | None, install, *internals: str) -> Patch:
    return Patch(name, "ray", TESTED, key, install, pick(INTERNALS, *internals))


ACTORS_KEPT = _patch("keep launching actors", "actors", _keep_launching_actors,
                     "TuneController._maybe_reuse_cached_actor", "TuneController._actor_manager",
                     "RayActorManager._live_actors_to_ray_actors_resources", "TuneController._started_actors",
                     "TuneController._trial_to_actor", "TuneController._resetting_trials")
FILES_COPIED_WHOLE = _patch("copy the experiment folder's files whole", None, _copy_changed_files_whole,
                            "storage._FilesystemSyncer", "_FilesystemSyncer._sync_up_command",
                            "_FilesystemSyncer.storage_filesystem")
RESTORES_FAIL_LOUDLY = _patch("fail restores loudly", None, _fail_restores_loudly, "TuneController.resume",
                              "TuneController._storage", "experiment_state._find_newest_experiment_checkpoint")
ANALYSIS_LEFT_OUT = _patch("restore without the analysis", "analysis", lambda: None,
                           "tuner_internal.ExperimentAnalysis")
FINISHED_TRIALS_RELEASED = _patch("release finished trials", "release", lambda: None, "Trial.run_metadata",
                                  "_TrainingRunMetadata.metric_n_steps")
PATCHES = (ACTORS_KEPT, FILES_COPIED_WHOLE, RESTORES_FAIL_LOUDLY, ANALYSIS_LEFT_OUT, FINISHED_TRIALS_RELEASED)
