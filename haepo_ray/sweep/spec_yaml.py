"""A spec's YAML text, read: PyYAML's safe loader, which also reads ``1e-3`` as a float
(YAML 1.1 wants ``1.0e-3``); text that is not YAML is a :class:`~haepo_ray.sweep.spec.SpecError`."""

from __future__ import annotations

import re
from typing import Any

import yaml

from haepo_ray.sweep.spec import SpecError

__all__ = ["load_yaml"]


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str, source: str = "<spec>") -> Any:
    """``text`` (from ``source``, which the error names) as YAML data."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise SpecError(f"{source}: not valid YAML: {err}") from None
