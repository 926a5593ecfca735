"""The fence: every private name of an upstream library that haepo-ray reads, writes, overrides or
patches lives in this package, a module per library, each name with its reason:

- :mod:`~haepo_ray.upstream.core`: Ray core (a submitted job's runtime environment);
- :mod:`~haepo_ray.upstream.tune`: Ray Tune (and the Ray Train storage under it);
- :mod:`~haepo_ray.upstream.tune_storage`: Tune's copy of the experiment folder, patched (its
  names declared in ``tune``);
- :mod:`~haepo_ray.upstream.tune_restore`: a resume of a Tune run, patched, and the experiment
  state it restores (its names declared in ``tune``);
- :mod:`~haepo_ray.upstream.rllib`: RLlib;
- :mod:`~haepo_ray.upstream.mlflow`: MLflow;
- :mod:`~haepo_ray.upstream.torch`: PyTorch (fake tensors, dispatch modes, attention kernels);
- :mod:`~haepo_ray.upstream.transformers`: transformers' ``generate`` internals;
- :mod:`~haepo_ray.upstream.trl`: TRL's GRPO step, as the memory simulator runs it.

Each module lists what it uses in ``INTERNALS`` (:class:`~haepo_ray.upstream.declared.Internal`:
a test checks each still exists with the signature expected, so an upgrade fails there before
any sweep runs), the Ray modules list their ``PATCHES`` and the torch and TRL modules their
``OVERRIDES`` (:class:`~haepo_ray.upstream.declared.Patch`: each with the versions it was tested
for and the internals it relies on, checked where it is applied; a sweep checks its own before it
writes anything, :func:`check`). ``HAEPO_PATCHES=required`` leaves out the optional patches, and
``HAEPO_PATCHES=untested`` runs them on an untested version whose internals they rely on are
unchanged. A test fails on a private upstream name anywhere else in the package or in ``bench/``
(``tests/test_upstream_fence.py``).

Importing this package imports no upstream library; :func:`internals` imports them all.
"""

from __future__ import annotations

from importlib import import_module

from haepo_ray.upstream.declared import (PATCHES_SETTING, UNTESTED, Internal, Patch, PatchSettingError,
                                         UpstreamVersionError, check_patches)

__all__ = ["LIBRARIES", "PATCHES_SETTING", "UNTESTED", "Internal", "Patch", "PatchSettingError",
           "UpstreamVersionError", "check", "internals", "patches"]

LIBRARIES = ("core", "tune", "rllib", "mlflow", "torch", "transformers", "trl")


def internals() -> list[Internal]:
    """Every private upstream name the fence uses."""
    return [i for lib in LIBRARIES for i in import_module(f"haepo_ray.upstream.{lib}").INTERNALS]


def patches(libraries: tuple[str, ...] = LIBRARIES) -> list[Patch]:
    """Every patch and override of the fence's modules ``libraries`` (all, by default)."""
    modules = [import_module(f"haepo_ray.upstream.{lib}") for lib in libraries]
    return [p for m in modules for p in (*getattr(m, "PATCHES", ()), *getattr(m, "OVERRIDES", ()))]


def check(libraries: tuple[str, ...], versions: dict[str, str] | None = None) -> list[str]:
    """Checks the patches and overrides of the fence's modules ``libraries`` that the setting
    keeps (``versions``: library -> version, in place of the installed ones); returns the
    warnings of those that run untested; raises :class:`UpstreamVersionError` (one paragraph)
    or :class:`PatchSettingError`."""
    return check_patches(patches(libraries), versions)
