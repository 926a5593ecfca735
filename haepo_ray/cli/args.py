"""Command-line options that several ``haepo`` sub-commands share, declared once, and the
check of an output folder they share."""

from __future__ import annotations

import argparse
from pathlib import Path

from haepo_ray.cli.errors import UsageError
from haepo_ray.user_paths import unwritable_folder

TRACKING_URI_HELP = ("MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                     "sqlite:///<cwd>/.haepo/mlflow.db)")
EXPERIMENT_HELP = ("experiment name: MLflow experiment and Ray results folder "
                   "(default: the spec's name, i.e. its file name)")
STORAGE_PATH_HELP = ("Ray results root (default: the spec's storage_path, else "
                     "<cwd>/.haepo/ray_results); shared storage (NFS, s3://) on a multi-node cluster")


def add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="a sweep spec, e.g. tune_configs/smoke.yaml")


def add_tracking_uri(p: argparse.ArgumentParser, help: str = TRACKING_URI_HELP) -> None:
    p.add_argument("--tracking-uri", metavar="URI", help=help)


def add_experiment(p: argparse.ArgumentParser, help: str = EXPERIMENT_HELP, *, repeat: bool = False,
                   folder: bool = False) -> None:
    """``--experiment NAME``; an empty name is a usage error (``haepo train`` took the default
    for it), and with ``folder`` (a sweep's: it names the folder of its runs) so is a name that is
    not one folder (:func:`~haepo_ray.sweep.paths.check_experiment`)."""
    p.add_argument("--experiment", metavar="NAME", help=help, action="append" if repeat else "store",
                   type=_folder_name if folder else _non_empty)


def _non_empty(name: str) -> str:
    if not name.strip():
        raise argparse.ArgumentTypeError(f"{name!r} is empty: give a name, or leave --experiment out")
    return name


def _folder_name(name: str) -> str:
    from haepo_ray.sweep.paths import check_experiment

    try:
        return check_experiment(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_storage_path(p: argparse.ArgumentParser, help: str = STORAGE_PATH_HELP) -> None:
    p.add_argument("--storage-path", metavar="PATH", help=help)


def check_out_folder(out: str | Path, option: str = "--out", *, records: tuple[str, ...] = ()) -> Path:
    """``out`` as a Path; a UsageError, before any work, when it cannot be an output folder:
    it, or the nearest of its parents that exists, is a file or not writable; it holds one of
    ``records`` (files of an earlier run that this one would overwrite), not empty. Nothing is
    created."""
    out = Path(out)
    problem = unwritable_folder(out)
    if problem:
        raise UsageError(f"{option} {out}: {problem}")
    held = [name for name in records if (out / name).is_file() and (out / name).stat().st_size]
    if held:
        raise UsageError(f"{option} {out} holds an earlier run's {' and '.join(held)}, which this run would "
                         "overwrite: give a new folder (or remove that one)")
    return out
