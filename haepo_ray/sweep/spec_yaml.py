"""A spec's YAML text, read: PyYAML's safe loader, which also reads ``1e-3`` as a float
(YAML 1.1 wants ``1.0e-3``) and refuses a key given twice in one mapping (PyYAML would keep the
last value without a word); text that is not YAML is a :class:`~haepo_ray.sweep.spec.SpecError`."""

from __future__ import annotations

import io
import re
from typing import Any

import yaml

from haepo_ray.sweep.spec import SpecError

__all__ = ["load_yaml"]


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3``) and refuses a
    key given twice in one mapping (a key merged in with ``<<`` may be given again: YAML's override)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in lines:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found key {key!r} again (first on line {lines[key]}): YAML would keep only the "
                    "last value; give it once", key_node.start_mark)
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


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
    stream = io.StringIO(text)
    stream.name = source  # PyYAML's marks name it: in "SOURCE", line N
    try:
        return yaml.load(stream, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise SpecError(f"{source}: not valid YAML: {err}") from None
