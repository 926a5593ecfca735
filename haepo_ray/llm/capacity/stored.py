"""Simulated steps kept on disk, in ``$HAEPO_CACHE/estimates`` (default
``~/.cache/haepo-ray/estimates``).

A simulation of a 0.5B-1.5B model's step takes 9-18 s of one CPU core, and without this every
``haepo sweep`` of a language-model spec (its dry run, the run, each ``--resume``), every
``haepo llm memory`` and every trial that plans its own memory would repeat it. A file is named
by a hash of everything its simulation depends on (:func:`simulation_key`): the trial's memory
key, the prompt length, the workers, the target, the model's config, the source of the
``haepo_ray`` package and the versions of torch, transformers and peft. A change of any of them
is a miss, never a stale hit. A file is written whole, under a temporary name, then renamed, with
the mode the umask gives a new file (a cache shared by a cluster's users is read by all); one
that cannot be read is simulated again; a folder that cannot be written is left as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import secrets
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haepo_ray.llm.capacity.simulate import StepEstimate

__all__ = ["FORMAT", "folder", "simulation_key", "stored_simulation"]

FORMAT = 1  # of the files; part of the key
LIBRARIES = ("torch", "transformers", "peft")


def folder() -> Path:
    """Where the simulations are kept: ``estimates`` in :func:`haepo_ray.llm.models.cache_dir`."""
    from haepo_ray.llm.models import cache_dir

    return cache_dir() / "estimates"


@functools.cache
def _source_digest() -> str:
    """A hash of every Python file of the installed ``haepo_ray`` package, by relative path."""
    import haepo_ray

    root = Path(haepo_ray.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def simulation_key(key: tuple, prompt_tokens: int, workers: int, target: str, config: Any) -> str:
    """The file name of a simulation: a hash of its arguments (``config``: the model's
    transformers config), :data:`FORMAT`, the package's source and the libraries' versions."""
    parts = {"format": FORMAT, "memory_key": list(key), "prompt_tokens": prompt_tokens, "workers": workers,
             "target": target, "config": config.to_json_string(use_diff=False), "source": _source_digest(),
             "libraries": {name: _version(name) for name in LIBRARIES}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32] + ".json"


def stored_simulation(name: str, simulate: Callable[[], StepEstimate]) -> StepEstimate:
    """The simulation stored as ``name`` (:func:`simulation_key`) in :func:`folder`, or
    ``simulate()``, then stored there."""
    from haepo_ray.llm.capacity.simulate import StepEstimate
    from haepo_ray.llm.capacity.tracker import PhasePeak

    path = folder() / name
    try:
        fields = json.loads(path.read_text())
        return StepEstimate(**fields | {"phases": {p: PhasePeak(**v) for p, v in fields["phases"].items()}})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # none yet, or not one this code wrote
        pass
    est = simulate()
    written = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")  # tempfile's would be mode 0600
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with written.open("x") as f:
            json.dump(dataclasses.asdict(est), f)
        os.replace(written, path)
    except OSError:  # a read-only home, a full disk: the next process simulates again
        with contextlib.suppress(OSError):  # not made (no folder), or made and left by a full disk
            written.unlink()
    return est
