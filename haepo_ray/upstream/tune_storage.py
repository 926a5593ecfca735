"""The experiment folder, copied file by file, each whole or not at all: the required patch
:data:`~haepo_ray.upstream.tune.FILES_COPIED_WHOLE` of Ray Tune 2.60's syncer and controller (its
private names are declared in :mod:`haepo_ray.upstream.tune`'s ``INTERNALS``).

Tune writes its experiment state (every trial's state: about 80 KB per
HAEPO trial) and the trials' result files into a staging folder on the driver and copies the
whole staging folder into the experiment's folder in a background thread, every file each time
and in place. A driver killed while it copied left a cut-short ``experiment_state-*.json``
(80 MiB of 83 at 850 trials); on ``--resume`` Tune could not read it, logged an error and
started every trial again from scratch, into the same MLflow runs. Patched, for a local (or
NFS-mounted) experiment folder, a file is copied only when it changed since its last copy, into
a temporary name beside it that Tune never reads, then renamed over the old one; a file that
changed while it was copied waits for the next copy. Tune wrote its state into the staging
folder in place too, so a copy could take a half-written one whose size and time did not change
while it was copied: patched, it writes ``.experiment_state-*.json.tmp`` and renames it. And
with ``keep_checkpoints`` Tune deletes a trial's older checkpoint as soon as it registers a new
one, and forces a copy of the state that names the new one at its next step, counted as done
once launched (ray-project/ray#27790): a copy that left the state behind (changed while copied)
counted too, and a kill before the next copy left a state on storage that named a deleted
checkpoint. Patched, such a copy is reported as not done, so Tune forces the next one.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import shutil
import threading


# Per (staging folder, experiment folder): each file's (inode, size, mtime) when it was copied.
_copied: dict[tuple[str, str], dict[str, tuple[int, ...]]] = {}
# The (staging folder, experiment folder) pairs whose last copy left the experiment state behind.
_states_behind: set[tuple[str, str]] = set()
# The controller writing its state in this thread (its state file then has a temporary name).
_writing = threading.local()


def copy_changed_files_whole() -> None:
    """Installs the patch (:data:`~haepo_ray.upstream.tune.FILES_COPIED_WHOLE`); idempotent."""
    import pyarrow.fs
    from ray.train._internal.storage import _FilesystemSyncer
    from ray.tune.execution.tune_controller import TuneController

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

    original_sync_up = _FilesystemSyncer.sync_up

    @functools.wraps(original_sync_up)
    def sync_up(self, local_dir, remote_dir, exclude=None) -> bool:
        # Launching waited for the last copy: a state it left behind is not on storage yet.
        launched = original_sync_up(self, local_dir, remote_dir, exclude)
        return launched and (local_dir, remote_dir) not in _states_behind

    state_name = TuneController.experiment_state_file_name
    original_save = TuneController.save_to_dir

    @property
    def experiment_state_file_name(self) -> str:
        name = state_name.fget(self)
        return f".{name}.tmp" if getattr(_writing, "controller", None) is self else name

    @functools.wraps(original_save)
    def save_to_dir(self) -> None:
        _writing.controller = self
        try:
            original_save(self)
        finally:
            _writing.controller = None
        folder, name = self._storage.experiment_driver_staging_path, self.experiment_state_file_name
        os.replace(os.path.join(folder, f".{name}.tmp"), os.path.join(folder, name))

    sync_up_command.copies_whole_files = True
    _FilesystemSyncer._sync_up_command = sync_up_command
    _FilesystemSyncer.sync_up = sync_up
    TuneController.experiment_state_file_name = experiment_state_file_name
    TuneController.save_to_dir = save_to_dir


def _signature(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _is_state(relative: str, name: str) -> bool:
    """Whether ``name`` in the staging folder's ``relative`` folder is an experiment state."""
    from ray.tune.execution.tune_controller import TuneController

    return relative == "." and fnmatch.fnmatch(name, TuneController.CKPT_FILE_TMPL.format("*"))


def sync_folder(source: str, destination: str, copied: dict[str, tuple[int, ...]]) -> int:
    """Copies into ``destination`` each file under ``source`` that changed since ``copied``
    says it was copied: into ``.<name>.tmp`` beside it, then renamed over it (a reader sees the
    old file or the new one, never part of one); a file that changes while it is copied is left
    for the next call (the experiment state, which Tune replaces whole, keeps the whole earlier
    version copied), as are names starting with ``.`` (Tune's own temporary files). The
    trials' folders go first, the experiment state last: a state on disk never names results
    that are not. Folders are made as they appear. Returns how many files it copied; an
    experiment state left behind (or a call cut short) is recorded in :data:`_states_behind`."""
    count, behind, done = 0, False, False
    try:
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
                state = _is_state(relative, name)
                if not _copy_whole(path, os.path.join(target_folder, name), before, replaced_whole=state):
                    behind = behind or state
                    continue
                copied[key] = before
                count += 1
        done = True
    finally:
        (_states_behind.add if behind or not done else _states_behind.discard)((source, destination))
    return count


def _copy_whole(path: str, target: str, before: tuple[int, ...], replaced_whole: bool = False) -> bool:
    """Copies ``path`` (whose signature was ``before``) over ``target`` through a temporary
    beside it; False when it changed meanwhile, and the copy is dropped, unless the file was
    replaced by a new one and ``replaced_whole`` says its writer replaces it whole (the staged
    experiment state): then the copy, of one whole earlier version, is kept."""
    temporary = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp")
    try:
        shutil.copyfile(path, temporary)
    except FileNotFoundError:  # replaced meanwhile (an atomic save): the next call
        return False
    after = _signature(path)
    if after != before:
        if replaced_whole and after is not None and after[0] != before[0]:
            os.replace(temporary, target)
        else:
            os.unlink(temporary)
        return False
    os.replace(temporary, target)
    return True
