"""Where a sweep's runs go (``<root>`` = ``--storage-path``, else the spec's ``storage_path``,
else ``<cwd>/.haepo/ray_results``): each run of a spec is a Tune experiment in
``<root>/<experiment>/<YYYYmmdd-HHMMSS-xxxxxx>`` (``<experiment>`` = ``--experiment``, else the
spec's ``name``; ``xxxxxx``: random hex)."""

from __future__ import annotations

import glob
import secrets
import time
from pathlib import Path

from haepo_ray.sweep.spec import SweepSpec
from haepo_ray.uris import is_uri
from haepo_ray.user_paths import unwritable_folder

__all__ = ["DEFAULT_STORAGE", "check_experiment", "check_root", "experiment_root", "latest_run_dir", "new_run_dir"]

DEFAULT_STORAGE = Path(".haepo") / "ray_results"


def check_experiment(name: str) -> str:
    """``name``, once it can be a sweep's experiment, the one folder of its runs under the
    root; ``ValueError`` for an empty name, a path (``a/b`` puts its runs inside experiment
    ``a``'s folder, among ``a``'s runs; ``../x`` leaves the root), ``.`` or ``..``."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"experiment {name!r}: it names one folder of the sweep's runs, so it is not empty, has "
                         "no / or \\ and is not . or ..")
    return name


def experiment_root(spec: SweepSpec, experiment: str | None = None, storage_path: str | None = None) -> str:
    """``<root>/<experiment>``: a local path made absolute, or a URI (``s3://...``) as given;
    ``ValueError`` for an experiment that is not one folder (:func:`check_experiment`)."""
    root = storage_path or spec.storage_path or str(Path.cwd() / DEFAULT_STORAGE)
    if not is_uri(root):
        root = str(Path(root).expanduser().resolve())
    return f"{root.rstrip('/')}/{check_experiment(experiment or spec.experiment)}"


def check_root(root: str) -> None:
    """``ValueError`` when a run cannot be written under ``root`` (:func:`experiment_root`), a
    local folder (a URI's storage is Ray's to check)."""
    problem = None if is_uri(root) else unwritable_folder(root)
    if problem:
        raise ValueError(f"the sweep's results folder {root}: {problem}: give another --storage-path (or the "
                         "spec's storage_path)")


def new_run_dir(root: str) -> tuple[str, str]:
    """(name, folder) of a new run of the experiment under ``root``: its start time and random
    hex, ``YYYYmmdd-HHMMSS-xxxxxx``. A run of the experiment already started in this second
    makes it wait for the next: ``--resume`` takes the newest by name.

    The run's name is Tune's experiment name, and Tune stages a run's files on its driver in
    ``<Ray session>/artifacts/<start second>/<experiment name>``: two sweeps of two specs
    started in the same second on one Ray shared that folder when the name was the start time
    alone, and each copied the other's experiment state into its own run (a ``--resume`` then
    restored the other sweep's trials)."""
    start = time.strftime("%Y%m%d-%H%M%S")
    while glob.glob(f"{glob.escape(root)}/{start}*"):
        time.sleep(1.0)
        start = time.strftime("%Y%m%d-%H%M%S")
    name = f"{start}-{secrets.token_hex(3)}"
    return name, f"{root}/{name}"


def latest_run_dir(root: str) -> str | None:
    """The newest sweep run under ``root`` that Tune can restore."""
    from ray import tune

    if is_uri(root):
        import pyarrow.fs

        fs, path = pyarrow.fs.FileSystem.from_uri(root)
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
        scheme = root.split("://", 1)[0]
        names = sorted((i.base_name for i in infos if i.type == pyarrow.fs.FileType.Directory), reverse=True)
        candidates = [f"{scheme}://{path.rstrip('/')}/{n}" for n in names]
    else:
        base = Path(root)
        names = sorted((p.name for p in base.iterdir() if p.is_dir()), reverse=True) if base.is_dir() else []
        candidates = [str(base / n) for n in names]
    for path in candidates:
        if tune.Tuner.can_restore(path):
            return path
    return None
