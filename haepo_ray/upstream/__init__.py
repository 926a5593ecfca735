"""The fence: every private name of an upstream library that haepo-ray reads, writes, overrides or
patches lives in this package, one module per library, each name with its reason:

- :mod:`~haepo_ray.upstream.tune`: Ray Tune (and the Ray Train storage under it);
- :mod:`~haepo_ray.upstream.rllib`: RLlib;
- :mod:`~haepo_ray.upstream.mlflow`: MLflow;
- :mod:`~haepo_ray.upstream.torch`: PyTorch (fake tensors, dispatch modes, attention kernels);
- :mod:`~haepo_ray.upstream.transformers`: transformers' ``generate`` internals;
- :mod:`~haepo_ray.upstream.trl`: TRL's GRPO step, as the memory simulator runs it.

Each module lists what it uses in ``INTERNALS`` (:class:`~haepo_ray.upstream.declared.Internal`:
a test checks each still exists with the signature expected, so an upgrade fails there before
any sweep runs), and the Ray modules list their ``PATCHES``
(:class:`~haepo_ray.upstream.declared.Patch`: each checked against the versions it was tested
for when applied; ``HAEPO_PATCHES=required`` leaves out the optional ones). A test fails on a
private upstream name anywhere else in the package (``tests/test_upstream_fence.py``).

Importing this package imports no upstream library; :func:`internals` imports them all.
"""

from __future__ import annotations

from importlib import import_module

from haepo_ray.upstream.declared import PATCHES_SETTING, Internal, Patch, UpstreamVersionError

__all__ = ["LIBRARIES", "PATCHES_SETTING", "Internal", "Patch", "UpstreamVersionError", "internals", "patches"]

LIBRARIES = ("tune", "rllib", "mlflow", "torch", "transformers", "trl")


def internals() -> list[Internal]:
    """Every private upstream name the fence uses."""
    return [i for lib in LIBRARIES for i in import_module(f"haepo_ray.upstream.{lib}").INTERNALS]


def patches() -> list[Patch]:
    """Every patch the fence can install."""
    return [p for lib in LIBRARIES for p in getattr(import_module(f"haepo_ray.upstream.{lib}"), "PATCHES", ())]
