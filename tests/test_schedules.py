"""beta_ent / beta_kl schedules over env steps."""

from __future__ import annotations

import math

import pytest

from haepo_ray.rl.schedules import parse_schedule


def test_constant():
    s = parse_schedule("beta_ent", 0.1)
    assert s.value(0) == s.value(10**9) == 0.1


def test_piecewise_linear_interpolates_and_holds_the_last_value():
    s = parse_schedule("beta_kl", [[0, 1.0], [100, 0.0], [300, 0.5]])
    assert [s.value(t) for t in (0, 50, 100, 200, 300, 10**6)] == [1.0, 0.5, 0.0, 0.25, 0.5, 0.5]


def test_cosine_decays_from_start_to_end():
    s = parse_schedule("beta_ent", {"type": "cosine", "start": 0.2, "end": 0.0, "steps": 1000})
    assert s.value(0) == pytest.approx(0.2)
    assert s.value(500) == pytest.approx(0.1)
    assert s.value(1000) == pytest.approx(0.0) and s.value(5000) == pytest.approx(0.0)
    values = [s.value(t) for t in range(0, 1001, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(
    "spec, match",
    [
        (-0.1, "beta_ent must be a finite number >= 0"),
        (math.inf, "finite"),
        (True, "must be a number"),
        ("0.1", "must be a number"),
        ([], "must start at env step 0"),
        ([[10, 0.1]], "must start at env step 0"),
        ([[0, 0.1], [0, 0.2]], "must increase"),
        ([[0, 0.1], [5]], r"beta_ent\[1\] must be an \[env_step, value\] pair"),
        ([[0, 0.1], [5, -1.0]], r"beta_ent\[1\]\[1\]"),
        ({"type": "linear", "start": 1, "end": 0, "steps": 5}, "'type': 'cosine'"),
        ({"type": "cosine", "start": 1, "end": 0, "steps": 0}, "steps must be > 0"),
    ],
)
def test_bad_schedules_name_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_schedule("beta_ent", spec)
