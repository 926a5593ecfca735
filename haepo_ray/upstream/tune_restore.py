"""A resume of a Tune run, patched where Ray Tune 2.60 lost trials' work or restarted them (the
private names are declared in :mod:`haepo_ray.upstream.tune`'s ``INTERNALS``), and the experiment
state it restores, read (:func:`newest_state_file`, :func:`state_trials`).

*A trial restores from a checkpoint that exists* (required:
:data:`~haepo_ray.upstream.tune.CHECKPOINTS_THAT_EXIST`,
:func:`restore_from_checkpoint_that_exists`). A state on storage can still name a checkpoint that
is gone (the driver killed between the deletion and the state's copy, or a checkpoint deleted by
hand); Tune then restored the trial from it, which failed (``Could not recover from checkpoint as
it does not exist on storage anymore``), and every retry failed the same. Patched, before each
restore a trial whose newest checkpoint is gone drops it and restores from its newest checkpoint
Tune tracked that exists, or starts from scratch if none does (its MLflow run drops the steps it
reports again: :mod:`haepo_ray.tracking.logged`). A checkpoint folder on local storage is renamed
to a hidden name before it is deleted, so a kill mid-deletion leaves none cut short under its own
name.

*A run that cannot be restored is not started again* (required:
:data:`~haepo_ray.upstream.tune.RESTORES_FAIL_LOUDLY`, :class:`RestoreFailed`). When
``TuneController.resume`` fails (a state cut short before :mod:`~haepo_ray.upstream.tune_storage`
copied files whole, a trainable that no longer unpickles), Tune logs the error and starts every
trial again from scratch, into the folder and MLflow runs of the trials that had finished. Patched,
the error reaches ``haepo sweep --resume``, which stops with it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from typing import NamedTuple

logger = logging.getLogger(__name__)


class RestoreFailed(BaseException):
    """Tune could not restore the run it was asked to resume (``args``: the experiment's path,
    its newest experiment-state file, the error). A ``BaseException``: ``TuneController``'s
    constructor catches every ``Exception`` of its restore, logs it and starts every trial again."""


def fail_restores_loudly() -> None:
    """Installs :data:`~haepo_ray.upstream.tune.RESTORES_FAIL_LOUDLY`; idempotent."""
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


def restore_from_checkpoints_that_exist() -> None:
    """Installs :data:`~haepo_ray.upstream.tune.CHECKPOINTS_THAT_EXIST`; idempotent."""
    import pyarrow.fs
    import ray.train._internal.checkpoint_manager as checkpoint_manager
    from ray.tune.execution.tune_controller import TuneController

    original = TuneController._schedule_trial_restore
    if getattr(original, "checks_checkpoints", False):
        return

    @functools.wraps(original)
    def schedule_trial_restore(self, trial) -> bool:
        restore_from_checkpoint_that_exists(trial)
        return original(self, trial)

    delete = checkpoint_manager._delete_fs_path

    @functools.wraps(delete)
    def delete_fs_path(fs, fs_path) -> None:
        if isinstance(fs, pyarrow.fs.LocalFileSystem) and os.path.isdir(fs_path):
            hidden = os.path.join(os.path.dirname(fs_path), f".{os.path.basename(fs_path)}.deleting")
            shutil.rmtree(hidden, ignore_errors=True)  # one a kill left
            os.rename(fs_path, hidden)  # gone from its name at once, never cut short under it
            fs_path = hidden
        delete(fs, fs_path)

    schedule_trial_restore.checks_checkpoints = True
    TuneController._schedule_trial_restore = schedule_trial_restore
    checkpoint_manager._delete_fs_path = delete_fs_path


def checkpoint_exists(checkpoint) -> bool:
    """Whether a ``ray.tune.Checkpoint``'s folder is on its storage."""
    import pyarrow.fs

    return checkpoint.filesystem.get_file_info(checkpoint.path).type != pyarrow.fs.FileType.NotFound


def restore_from_checkpoint_that_exists(trial) -> None:
    """If the newest checkpoint Tune tracks for ``trial`` is not on storage, forgets it and
    every other one that is not: the trial then restores from its newest checkpoint that
    exists, or starts from scratch. Logs a warning naming them."""
    manager = trial.run_metadata.checkpoint_manager
    latest = manager.latest_checkpoint_result
    if latest is None or checkpoint_exists(latest.checkpoint):
        return
    kept = [r for r in manager._checkpoint_results if r is not latest and checkpoint_exists(r.checkpoint)]
    newest = max(reversed(kept), key=lambda r: r.metrics.get("training_iteration", -1), default=None)
    manager._checkpoint_results = kept
    manager._latest_checkpoint_result = newest
    trial.run_metadata.invalidate_cache()
    trial.invalidate_json_state()
    logger.warning("trial %s: its newest checkpoint, %s, is not on storage (a driver killed after Tune deleted "
                   "it, ray-project/ray#27790, or deleted by hand); it restarts %s", trial.trial_id,
                   latest.checkpoint.path, f"from {newest.checkpoint.path}" if newest else "from scratch")


class StateTrial(NamedTuple):
    """A trial as an experiment-state file records it."""

    trial_id: str
    experiment_folder: str  # its experiment's folder on its storage
    experiment_name: str  # that folder's name
    checkpoint: str | None  # its newest checkpoint's folder on its storage


def newest_state_file(run_dir: str) -> str | None:
    """The experiment-state file of the run folder ``run_dir`` (a path or URI) that a resume
    restores (its newest), or None: Tune saved none (its restore would fail)."""
    import pyarrow.fs
    from ray.tune.execution.experiment_state import _find_newest_experiment_checkpoint

    fs, path = pyarrow.fs.FileSystem.from_uri(run_dir)
    return _find_newest_experiment_checkpoint(path, fs=fs)


def state_trials(run_dir: str, state_file: str) -> list[StateTrial] | None:
    """The trials the experiment-state file ``state_file`` of the run folder ``run_dir`` (a path
    or URI; the file as :func:`newest_state_file` names it) holds; None when it does not parse
    (the resume's restore then says why)."""
    import pyarrow.fs
    from ray.tune.experiment import Trial

    fs, _ = pyarrow.fs.FileSystem.from_uri(run_dir)
    trials = []
    try:
        with fs.open_input_stream(state_file) as f:
            state = json.loads(f.readall())
        for trial_state, metadata in state["trial_data"]:
            trial = Trial.from_json_state(trial_state, stub=True)
            trial.restore_run_metadata(metadata)
            storage, checkpoint = trial.storage, trial.checkpoint
            trials.append(StateTrial(trial.trial_id, storage.experiment_fs_path, storage.experiment_dir_name,
                                     checkpoint.path if checkpoint else None))
    except Exception:  # noqa: BLE001 - cut short, or not Tune's: Tune's own restore says what
        return None
    return trials
