"""Constructor-argument checks shared by the environments; each raises ``ValueError``."""

from __future__ import annotations

import math
from numbers import Integral, Real


def _bound(op: str, minimum: float, minimum_name: str | None) -> str:
    return f" {op} {minimum_name} ({minimum})" if minimum_name else f" {op} {minimum}"


def check_int(env: str, name: str, value: object, minimum: int, *, minimum_name: str | None = None) -> int:
    """Return ``value`` as an int; raise unless it is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(
            f"{env}: {name} must be an integer{_bound('>=', minimum, minimum_name)}, got {value!r}"
        )
    return int(value)


def check_float(
    env: str,
    name: str,
    value: object,
    *,
    minimum: float = -math.inf,
    strict: bool = False,
    minimum_name: str | None = None,
) -> float:
    """Return ``value`` as a float; raise unless it is a finite real (not a bool) >= ``minimum``.

    ``strict`` makes the bound ``> minimum``; ``minimum_name`` names it in the message.
    """
    ok = not isinstance(value, bool) and isinstance(value, Real) and math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = "" if minimum == -math.inf else _bound(">" if strict else ">=", minimum, minimum_name)
        raise ValueError(f"{env}: {name} must be a finite number{bound}, got {value!r}")
    return float(value)
