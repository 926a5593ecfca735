"""bench/reproduction_figures.py's interval of a fraction of seeds (CartPole's seeds solved)."""

from __future__ import annotations

from statistics import NormalDist

import pytest
from helpers import bench_module


@pytest.mark.parametrize(("solved", "n"), [(1, 5), (3, 5), (4, 15), (7, 15), (2, 40)])
def test_the_wilson_interval_is_where_the_score_test_meets_its_critical_value(solved, n):
    """Each end p of the interval solves (p_hat - p)^2 = z^2 p (1 - p) / n, the Wilson score
    test at 95%, and the two ends lie either side of p_hat."""
    low, high = bench_module("reproduction_figures").wilson_ci(solved, n)
    z, p_hat = NormalDist().inv_cdf(0.975), solved / n
    assert low < p_hat < high
    for end in (low, high):
        assert (p_hat - end) ** 2 == pytest.approx(z * z * end * (1 - end) / n, rel=1e-9)


def test_no_seed_or_every_seed_solved_still_has_an_interval_inside_0_and_1():
    wilson_ci = bench_module("reproduction_figures").wilson_ci
    z2 = NormalDist().inv_cdf(0.975) ** 2
    assert wilson_ci(0, 5) == pytest.approx((0.0, z2 / (5 + z2)))
    assert wilson_ci(5, 5) == pytest.approx((5 / (5 + z2), 1.0))
    assert wilson_ci(1, 5) == pytest.approx((0.0362, 0.6245), abs=1e-4)
