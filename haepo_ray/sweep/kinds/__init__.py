"""The kinds of trial a sweep runs, one package each, and a spec read as its kind.

:data:`KINDS` lists them, one line each; the first whose ``spec.claims`` accepts a spec's data
reads it. A kind is a package with

- ``spec.py``: ``claims(data) -> bool`` and ``SPEC``, its subclass of
  :class:`~haepo_ray.sweep.spec.SweepSpec` (its own keys, their checks; no Ray);
- ``plan.py``: ``PLAN``, its :class:`~haepo_ray.sweep.plan_base.Plan` subclass (the trainable
  and the rest beside it).

:func:`load_spec` and :func:`parse_spec` import the kinds' ``spec`` modules only, so reading a
spec loads no Ray; :func:`resolve_plan` imports the spec's kind's ``plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from haepo_ray.sweep.plan_base import Plan
from haepo_ray.sweep.spec import SpecError, SweepSpec
from haepo_ray.sweep.spec_errors import format_validation_error
from haepo_ray.sweep.spec_yaml import load_yaml
from haepo_ray.user_paths import read_text

__all__ = ["KINDS", "load_plan", "load_spec", "parse_plan", "parse_spec", "resolve_plan"]

KINDS: tuple[str, ...] = (
    "haepo_ray.sweep.kinds.llm",  # language-model trials: a spec with llm
    "haepo_ray.sweep.kinds.rl",  # RL trials: RLlib algorithms on envs, every other spec
)


def _spec_module(data: Mapping[str, Any], source: str) -> ModuleType:
    """The ``spec`` module of the first kind that claims ``data``."""
    for kind in KINDS:
        module = import_module(f"{kind}.spec")
        if module.claims(data):
            return module
    raise SpecError(f"{source}: no kind of trial takes this spec; kinds: {', '.join(KINDS)}")


def parse_spec(data: Any, source: str = "<spec>") -> SweepSpec:
    """Validates the structure of a spec's data against its kind's schema; raises
    :class:`~haepo_ray.sweep.spec.SpecError`."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{source}: a spec is a YAML mapping (key: value), got {type(data).__name__}")
    schema = _spec_module(data, source).SPEC
    try:
        spec = schema.model_validate(dict(data))
    except ValidationError as err:
        raise SpecError(format_validation_error(err, source, schema)) from None
    spec.source = source
    if spec.name is None and source not in ("<spec>", ""):
        spec.name = Path(source).stem
    return spec


def load_spec(path: str | Path) -> SweepSpec:
    """Reads a sweep spec and validates its structure; raises :class:`SpecError` naming the
    file, the key and what is allowed. :func:`resolve_plan` checks the names it holds
    (algorithms, envs, settings)."""
    path = Path(path)
    try:
        text = read_text(path, "the spec")
    except ValueError as err:
        raise SpecError(str(err)) from None
    return parse_spec(load_yaml(text, str(path)), str(path))


def resolve_plan(spec: SweepSpec) -> Plan:
    """The spec's plan, resolved by its kind; raises :class:`SpecError`."""
    kind = next(kind for kind in KINDS if isinstance(spec, import_module(f"{kind}.spec").SPEC))
    return import_module(f"{kind}.plan").PLAN.resolve(spec)


def load_plan(path: str | Path) -> Plan:
    """Reads, validates and resolves a sweep spec; raises SpecError."""
    return resolve_plan(load_spec(path))


def parse_plan(data: Any, source: str = "<spec>") -> Plan:
    """:func:`parse_spec`, then :func:`resolve_plan`."""
    return resolve_plan(parse_spec(data, source))
