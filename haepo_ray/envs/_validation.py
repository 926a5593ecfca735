"""Constructor-argument checks shared by the environments."""

from __future__ import annotations

import math
from numbers import Integral, Real


def check_int(env: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{env}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(env: str, name: str, value: object, *, minimum: float = -math.inf, strict: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, Real) and math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        what = "a finite number" + ("" if minimum == -math.inf else f" {bound}")
        raise ValueError(f"{env}: {name} must be {what}, got {value!r}")
    return float(value)
