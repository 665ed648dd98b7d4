"""The claims' one rule: paired differences over seeds, their mean and 95% Student-t interval, and
the verdict it gives (holds, reversed, not resolved)."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from fedapp.report.verdict import (
    HOLDS,
    NOT_RESOLVED,
    REVERSED,
    cost_verdict,
    describe,
    paired_verdict,
    t_quantile_975,
)


@pytest.mark.parametrize("df", [1, 2, 4, 9, 29, 30, 31, 45, 100, 1000])
def test_the_t_quantile_is_students(df):
    assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4)


def test_the_interval_is_the_mean_plus_minus_t_times_the_standard_error():
    a = {0: 0.80, 1: 0.82, 2: 0.77, 3: 0.79, 4: 0.81}
    b = {0: 0.78, 1: 0.80, 2: 0.76, 3: 0.78, 4: 0.78}
    result = paired_verdict(a, b)
    differences = [a[s] - b[s] for s in range(5)]
    low, high = stats.t.interval(0.95, 4, loc=sum(differences) / 5, scale=stats.sem(differences))
    assert result.interval == pytest.approx((low, high), abs=1e-4)
    assert result.seeds == (0, 1, 2, 3, 4) and result.above == 5
    assert result.verdict == HOLDS


def test_above_in_every_seed_is_not_enough_when_the_interval_reaches_zero():
    # Three seeds, all above, but spread: "above in every seed" is a sign test at p = 0.125.
    result = paired_verdict({0: 0.701, 1: 0.75, 2: 0.70}, {0: 0.70, 1: 0.70, 2: 0.699})
    assert result.above == 3 and result.interval[0] < 0 < result.interval[1]
    assert result.verdict == NOT_RESOLVED
    assert result.half_width > abs(result.mean)  # the smallest difference these seeds could resolve


def test_an_interval_below_zero_is_reversed_and_one_seed_resolves_nothing():
    assert paired_verdict({0: 0.5, 1: 0.6, 2: 0.55}, {0: 0.6, 1: 0.7, 2: 0.66}).verdict == REVERSED
    single = paired_verdict({0: 0.9}, {0: 0.1})
    assert single.verdict == NOT_RESOLVED and math.isinf(single.half_width)
    assert describe(single) == "+0.8000 (one seed)"


def test_only_seeds_both_settings_ran_are_paired():
    result = paired_verdict({0: 0.5, 1: 0.6, 7: 0.9}, {1: 0.5, 0: 0.4, 3: 0.1})
    assert result.seeds == (0, 1) and result.differences == pytest.approx((0.1, 0.1))


def test_a_cost_pairs_log_ratios_and_leaves_out_a_target_not_reached():
    # a costs half of b in every seed: log 2 each time; seed 3's b never reached the target.
    result = cost_verdict({0: 10.0, 1: 20.0, 2: 5.0, 3: 4.0}, {0: 20.0, 1: 40.0, 2: 10.0, 3: None})
    assert result.differences == pytest.approx((math.log(2),) * 3)
    assert result.unpaired == 1 and result.std == 0.0 and result.verdict == HOLDS


def test_the_description_prints_true_minus_signs():
    result = paired_verdict({0: 0.1, 1: 0.2}, {0: 0.3, 1: 0.3})
    assert describe(result).startswith("−0.1500 [")
