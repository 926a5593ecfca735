"""Schedules over env steps for ``beta_ent`` and ``beta_kl``.

A schedule is given as one of

- a number: constant, e.g. ``0.1``;
- a list of ``[env_step, value]`` pairs, starting at step 0 with increasing steps:
  piecewise-linear in between, the last value after the end (RLlib's ``lr`` format),
  e.g. ``[[0, 0.1], [100_000, 0.01]]``;
- ``{"type": "cosine", "start": v0, "end": v1, "steps": T}``: cosine decay from ``v0`` to
  ``v1`` over ``T`` env steps, then ``v1``.

Every value must be a finite number >= 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

ScheduleSpec = Union[float, int, Sequence[Sequence[float]], Mapping[str, object]]


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not (0.0 <= v < math.inf):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


@dataclass(frozen=True)
class Schedule:
    """A non-negative value as a function of the lifetime env steps."""

    points: tuple[tuple[float, float], ...] = ()
    cosine: tuple[float, float, float] | None = None  # (start, end, steps)

    def value(self, env_steps: float) -> float:
        if self.cosine is not None:
            start, end, steps = self.cosine
            frac = min(max(env_steps / steps, 0.0), 1.0)
            return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * frac))
        if env_steps <= self.points[0][0]:
            return self.points[0][1]
        for (t0, v0), (t1, v1) in zip(self.points, self.points[1:]):
            if env_steps <= t1:
                return v0 + (v1 - v0) * (env_steps - t0) / (t1 - t0)
        return self.points[-1][1]


def parse_schedule(name: str, spec: ScheduleSpec) -> Schedule:
    """Parse ``spec`` (see the module docstring) into a :class:`Schedule`.

    Raises ``ValueError`` naming ``name`` and what is wrong.
    """
    if isinstance(spec, Mapping):
        if spec.get("type") != "cosine" or set(spec) != {"type", "start", "end", "steps"}:
            raise ValueError(
                f"{name}: a schedule dict must be {{'type': 'cosine', 'start': v0, 'end': v1, "
                f"'steps': T}}, got {dict(spec)!r}"
            )
        steps = _number(f"{name}.steps", spec["steps"])
        if steps <= 0:
            raise ValueError(f"{name}.steps must be > 0, got {spec['steps']!r}")
        return Schedule(
            cosine=(_number(f"{name}.start", spec["start"]), _number(f"{name}.end", spec["end"]), steps)
        )
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        points = []
        for i, pair in enumerate(spec):
            if not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2:
                raise ValueError(f"{name}[{i}] must be an [env_step, value] pair, got {pair!r}")
            points.append((_number(f"{name}[{i}][0] (env step)", pair[0]), _number(f"{name}[{i}][1]", pair[1])))
        if not points or points[0][0] != 0:
            raise ValueError(f"{name}: a piecewise schedule must start at env step 0, got {spec!r}")
        if any(t1 <= t0 for (t0, _), (t1, _) in zip(points, points[1:])):
            raise ValueError(f"{name}: the env steps of a piecewise schedule must increase, got {spec!r}")
        return Schedule(points=tuple(points))
    return Schedule(points=((0.0, _number(name, spec)),))
