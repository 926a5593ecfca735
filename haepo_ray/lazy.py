"""Names a package exports but imports on first use, so that importing it stays cheap (no RLlib,
no Ray Tune): ``__getattr__ = lazy_exports(__name__, {"HAEPO": "haepo_ray.rl.algorithm"})``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name of ``where`` (name -> module) is imported
    from its module on first use and kept in the package; any other name is an AttributeError."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
