"""What made a run: the code version, the machine and the library versions, as MLflow tags.

Computed once per process (:func:`provenance`): the sweep's driver tags its parent run with
its own, each trial reports the provenance of the process that trains it with its results
(:data:`~haepo_ray.names.PROVENANCE`), and the tracking callback tags the trial's run with it.

- Code: the git commit of the checkout ``haepo_ray`` is imported from, and whether its tracked
  files differ from that commit or the package folder holds files git does not track (a new
  module a run may import) (``dirty``), and which (``changed``: notes edited beside a sweep
  are not code that changed); always the installed package version too. An install outside a
  git checkout (a wheel, a Ray runtime environment) has no commit.
- Machine: CPU count and model, total memory, and the GPUs visible to the process (CUDA, as
  PyTorch sees them: a Ray worker sees only the GPUs Ray gave it).
- Versions: Ray, RLlib (which ships inside Ray, so it is Ray's), PyTorch, MLflow, Python.
- Patches: the process's ``HAEPO_PATCHES`` setting (:mod:`haepo_ray.upstream`), which decides
  which patches of Ray run in it (a trial's actor on a cluster gets the driver's through the
  job's runtime environment).

A trial also tags the devices its parts used (:func:`device_tags`), beside the GPUs Ray gave
its process: a GPU sweep can check that no trial ran on a device Ray did not give it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from haepo_ray import names


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def code_version() -> dict[str, str]:
    """The package version, and where the package is a git checkout its commit, dirty flag and
    changed files (module docstring)."""
    tags = {names.CODE_VERSION: _version("haepo-ray")}
    package = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        # No optional locks: `git status` would otherwise refresh the index under .git/index.lock,
        # which a process killed meanwhile (a sweep's driver, SIGKILLed) leaves behind, and every
        # later git command in the checkout then fails until it is removed by hand.
        return subprocess.run(["git", "--no-optional-locks", "-C", str(package), *args], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()

    try:
        git("ls-files", "--error-unmatch", "__init__.py")  # this checkout tracks the package
        tags[names.CODE_COMMIT] = git("rev-parse", "HEAD")
        changed = git("diff", "--name-only", "HEAD").splitlines()  # tracked files, staged or not, from the root
        # and the package's files git does not track (nor ignores): a new module a run may import
        changed += git("ls-files", "--others", "--exclude-standard", "--full-name").splitlines()
        tags[names.CODE_DIRTY] = str(bool(changed)).lower()
        if changed:
            tags[names.CODE_CHANGED] = changed_files(changed)
    except (OSError, subprocess.SubprocessError):
        pass  # no git, or not a checkout of haepo-ray: the package version stands alone
    return tags


CHANGED_SHOWN = 20  # changed files a tag names; MLflow keeps 8,000 characters of a tag


def changed_files(paths: Iterable[str]) -> str:
    """``a.py, docs/b.md``: the first :data:`CHANGED_SHOWN` of ``paths``, sorted, then
    ``+N more`` (:func:`changed_paths` reads it back)."""
    paths = sorted(set(paths))
    more = [f"+{len(paths) - CHANGED_SHOWN} more"] if len(paths) > CHANGED_SHOWN else []
    return ", ".join(paths[:CHANGED_SHOWN] + more)


def changed_paths(tag: str) -> list[str]:
    """The paths a :func:`changed_files` tag names (without its ``+N more``)."""
    return [p for p in tag.split(", ") if p and not p.startswith("+")]


def machine() -> dict[str, str]:
    """CPUs (count and model), total memory in GiB, and the GPUs this process sees."""
    import psutil

    tags = {names.MACHINE_CPUS: str(os.cpu_count() or 0),
            names.MACHINE_MEMORY_GB: f"{psutil.virtual_memory().total / 2**30:.1f}",
            names.MACHINE_GPUS: _gpus()}
    model = _cpu_model()
    if model:
        tags[names.MACHINE_CPU] = model
    return tags


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _gpus() -> str:
    """``0``, or ``2 x NVIDIA H100 80GB HBM3`` (one entry per distinct model)."""
    try:
        import torch

        count = torch.cuda.device_count()
        models = [torch.cuda.get_device_name(i) for i in range(count)]
    except Exception:  # no torch, or a CUDA driver that does not answer
        return "0"
    if not count:
        return "0"
    return ", ".join(f"{models.count(m)} x {m}" for m in dict.fromkeys(models))


def library_versions() -> dict[str, str]:
    ray = _version("ray")
    return {names.VERSION_RAY: ray, names.VERSION_RLLIB: ray, names.VERSION_TORCH: _version("torch"),
            names.VERSION_MLFLOW: _version("mlflow"), names.VERSION_PYTHON: platform.python_version()}


def device_tags(**used: Iterable[object]) -> dict[str, str]:
    """Tags of the devices each part of a trial used (``learner=[device, ...]`` ->
    :data:`~haepo_ray.names.DEVICE_LEARNER`: the distinct ones, sorted, comma-separated), the GPU
    ids Ray gave this process and its ``CUDA_VISIBLE_DEVICES``."""
    import ray

    parts = {"learner": names.DEVICE_LEARNER, "env_runner": names.DEVICE_ENV_RUNNER, "policy": names.DEVICE_POLICY}
    tags = {parts[part]: ",".join(sorted({str(d) for d in devices})) for part, devices in used.items()}
    gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
    return tags | {names.DEVICE_RAY_GPU_IDS: ",".join(map(str, gpu_ids)),
                   names.DEVICE_CUDA_VISIBLE: os.environ.get("CUDA_VISIBLE_DEVICES", "unset")}


def provenance() -> dict[str, str]:
    """This process's provenance tags (computed once per process)."""
    return dict(_provenance())


def patches_setting() -> dict[str, str]:
    """The ``HAEPO_PATCHES`` setting of this process, "all" when unset."""
    from haepo_ray.upstream.declared import PATCHES_SETTING

    return {names.CODE_PATCHES: os.environ.get(PATCHES_SETTING, "all")}


@cache
def _provenance() -> dict[str, str]:
    return {**code_version(), **machine(), **library_versions(), **patches_setting()}
