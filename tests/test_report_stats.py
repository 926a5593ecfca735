"""The report's statistics (haepo_ray.report.stats) against hand computations and printed
Student-t tables, and the bootstrap interval's coverage in a simulation with per-prompt effects."""

from __future__ import annotations

import math

import numpy as np
import pytest

from haepo_ray.report.stats import (
    BOOTSTRAP, CONFIDENCE, Interval, auc, bootstrap_ci, mean_ci, t_quantile, win_rate, wins)

# t_{0.975, dof} of a printed table (three decimals): the half-width factor of a 95% interval.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 20: 2.086, 30: 2.042}


@pytest.mark.parametrize("dof", sorted(T_975))
def test_t_quantile_matches_the_printed_table(dof):
    assert t_quantile(0.975, dof) == pytest.approx(T_975[dof], abs=5e-4)


def test_t_quantile_other_levels_and_the_normal_limit():
    assert t_quantile(0.95, 1) == pytest.approx(6.314, abs=5e-4)
    assert t_quantile(0.995, 5) == pytest.approx(4.032, abs=5e-4)
    assert t_quantile(0.975, 100_000) == pytest.approx(1.960, abs=5e-4)


def test_mean_ci_of_three_seeds():
    """1, 2, 3: mean 2, s = 1, half-width t_{0.975,2} / sqrt(3) = 4.303 / 1.732 = 2.484."""
    got = mean_ci([1.0, 2.0, 3.0])
    assert (got.mean, got.n) == (2.0, 3)
    assert got.low == pytest.approx(2 - 2.4841, abs=2e-4) and got.high == pytest.approx(2 + 2.4841, abs=2e-4)


def test_mean_ci_other_confidence():
    """10, 14: mean 12, s = 2 sqrt(2), n = 2, 90%: t_{0.95,1} = 6.314, half-width 6.314 * 2 = 12.628."""
    got = mean_ci([10.0, 14.0], confidence=0.90)
    assert got.low == pytest.approx(12 - 12.628, abs=2e-3) and got.high == pytest.approx(12 + 12.628, abs=2e-3)


def test_mean_ci_leaves_out_nan_and_has_no_interval_for_one_seed():
    two = mean_ci([1.0, math.nan, 3.0])  # s = sqrt(2): half-width 12.706 * sqrt(2) / sqrt(2)
    assert (two.mean, two.n) == (2.0, 2) and two.high == pytest.approx(2 + 12.706, abs=1e-3)
    one = mean_ci([0.25])
    assert (one.mean, one.n) == (0.25, 1) and math.isnan(one.low) and math.isnan(one.high)
    none = mean_ci([math.nan])
    assert none.n == 0 and math.isnan(none.mean)
    assert isinstance(none, Interval)


def test_auc_is_the_trapezoid_over_the_span():
    """(2, 1), (4, 3), (8, 3): areas 2 * (1 + 3) / 2 = 4 and 4 * 3 = 12; span 6: 16 / 6."""
    assert auc([2, 4, 8], [1.0, 3.0, 3.0]) == pytest.approx(16 / 6)
    assert auc([1, 2], [0.5, 0.5]) == pytest.approx(0.5)  # a flat curve's mean height is its value
    assert math.isnan(auc([3], [0.7]))  # one evaluation: no area


def test_win_rate_counts_ties_half_and_skips_nan():
    """1 > 0 wins, 2 = 2 ties, 3 < 5 loses: (1 + 0.5 + 0) / 3; the NaN pair is left out."""
    assert win_rate([1.0, 2.0, 3.0, math.nan], [0.0, 2.0, 5.0, 1.0]) == pytest.approx(0.5)
    assert win_rate([1.0, 1.0], [0.0, 0.0]) == 1.0
    assert math.isnan(win_rate([math.nan], [1.0]))


def test_wins_per_pair():
    got = wins([1.0, 2.0, 3.0, math.nan], [0.0, 2.0, 5.0, 1.0])
    assert got[:3].tolist() == [1.0, 0.5, 0.0] and math.isnan(got[3])


def test_bootstrap_mean_is_the_mean_of_seed_means_and_the_interval_is_fixed_by_its_seed():
    """Seed 0's NaN unit is left out of its mean: (2 + 4) / 2 = 3, seed 1's mean 1: mean 2."""
    values = [[2.0, math.nan, 4.0], [1.0, 1.0, 1.0]]
    got = bootstrap_ci(values)
    assert (got.mean, got.n, got.how) == (2.0, 2, BOOTSTRAP)
    assert 1.0 <= got.low < got.mean < got.high <= 4.0
    more = [[0.1, 0.5, 0.2, 0.9], [0.3, 0.3, 0.8, 0.4], [0.6, 0.1, 0.7, 0.2]]
    assert bootstrap_ci(more) == bootstrap_ci(more)  # deterministic: the report is the same every time
    assert bootstrap_ci(more, seed=1) != bootstrap_ci(more)


def test_bootstrap_cuts_the_interval_to_the_quantity_range_and_checks_its_input():
    values = [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.5, 1.0], [0.0, 0.0, 0.0, 1.0]]
    free, cut = bootstrap_ci(values), bootstrap_ci(values, bounds=(0.3, 0.6))
    assert free.low < 0.3 and free.high > 0.6 and (cut.low, cut.high) == (0.3, 0.6) and cut.mean == free.mean
    one = bootstrap_ci([[0.5, 0.7]])  # one seed: no interval, as mean_ci
    assert (one.mean, one.n) == (pytest.approx(0.6), 1) and math.isnan(one.low) and math.isnan(one.high)
    assert bootstrap_ci([]).n == 0 and bootstrap_ci([[math.nan, math.nan]]).n == 0
    with pytest.raises(ValueError, match=r"all as long; got rows of \[2, 3\] values"):
        bootstrap_ci([[1.0, 2.0], [1.0, 2.0, 3.0]])


def test_bootstrap_over_prompts_and_seeds_covers_a_per_prompt_effect_and_the_seed_t_falls_short():
    """Win rates of 3 seeds on the same 32 prompts, prompt p won with probability q_p ~
    Beta(0.175, 0.325) (mean 0.35, most prompts nearly always won or lost, in every seed):
    the truth is 0.35, the win rate over the population of prompts. The seed-t interval sees
    only the seeds' spread over the same prompts; the bootstrap over prompts and seeds covers
    the truth about 95% of the time. Coverage within 3 binomial standard errors of 95% over
    RUNS simulations (the seed-t one below that band)."""
    rng = np.random.default_rng(41)
    runs, seeds, prompts, truth = 400, 3, 32, 0.35
    tolerance = 3 * math.sqrt(CONFIDENCE * (1 - CONFIDENCE) / runs)
    covered = {"bootstrap": 0, "seed t": 0, "independent prompts per seed": 0}
    for _ in range(runs):
        q = rng.beta(truth * 0.5, (1 - truth) * 0.5, prompts)
        outcomes = (rng.random((seeds, prompts)) < q).astype(float)  # 1: won, 0: lost
        intervals = {"bootstrap": bootstrap_ci(outcomes, bounds=(0, 1), replicates=300),
                     "seed t": mean_ci(outcomes.mean(axis=1)),
                     "independent prompts per seed": bootstrap_ci(outcomes, shared_units=False, replicates=300)}
        for name, got in intervals.items():
            covered[name] += got.low <= truth <= got.high
    coverage = {name: hits / runs for name, hits in covered.items()}
    assert abs(coverage["bootstrap"] - CONFIDENCE) <= tolerance, coverage
    assert coverage["seed t"] < CONFIDENCE - tolerance, coverage
    assert coverage["independent prompts per seed"] < CONFIDENCE - tolerance, coverage
