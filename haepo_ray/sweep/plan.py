"""A sweep spec resolved to the :class:`~haepo_ray.sweep.plan_base.Plan` of its kind of trial.

:data:`KINDS` lists the kinds; the first whose ``handles`` accepts the spec resolves it. Adding a
kind of trial: a module with a :class:`~haepo_ray.sweep.plan_base.Plan` subclass (and its
trainable), listed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from haepo_ray.sweep.llm_plan import LLMPlan
from haepo_ray.sweep.plan_base import Plan
from haepo_ray.sweep.rl_plan import RLPlan
from haepo_ray.sweep.spec import SweepSpec, load_spec, parse_spec

__all__ = ["KINDS", "Plan", "load_plan", "parse_plan", "resolve_plan"]

KINDS: tuple[type[Plan], ...] = (LLMPlan, RLPlan)


def resolve_plan(spec: SweepSpec) -> Plan:
    """The spec's plan, from the first of :data:`KINDS` that handles it; raises
    :class:`~haepo_ray.sweep.spec.SpecError`."""
    kind = next(k for k in KINDS if k.handles(spec))
    return kind.resolve(spec)


def load_plan(path: str | Path) -> Plan:
    """Reads, validates and resolves a sweep spec; raises SpecError."""
    return resolve_plan(load_spec(path))


def parse_plan(data: Any, source: str = "<spec>") -> Plan:
    """:func:`~haepo_ray.sweep.spec.parse_spec`, then :func:`resolve_plan`."""
    return resolve_plan(parse_spec(data, source))
