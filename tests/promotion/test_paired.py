"""The precision check's paired interval: its coverage counted exactly, and its known values."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from gateway.promotion.precision.paired import Paired, prompts_needed, wilson_interval

Z = NormalDist().inv_cdf(0.975)


def test_wilson_matches_its_closed_form_at_the_edges() -> None:
    assert wilson_interval(0, 240, 0.05) == (0.0, pytest.approx(Z * Z / (240 + Z * Z)))
    low, high = wilson_interval(240, 240, 0.05)
    assert (low, high) == (pytest.approx(240 / (240 + Z * Z)), 1.0)
    # Wilson's own example: 3 in 240 lies within about 0.43% to 3.6%.
    assert wilson_interval(3, 240, 0.05) == pytest.approx((0.00426, 0.0361), abs=5e-5)


def coverage(n: int, p_both: float, p_first: float, p_second: float) -> float:
    """The exact chance that the interval covers the true difference, over every table of n."""
    truth = p_first - p_second
    p_neither = 1 - p_both - p_first - p_second
    covered = 0.0
    log = math.lgamma
    for a in range(n + 1):
        for b in range(n + 1 - a):
            for c in range(n + 1 - a - b):
                d = n - a - b - c
                weight = log(n + 1) - log(a + 1) - log(b + 1) - log(c + 1) - log(d + 1)
                terms = ((a, p_both), (b, p_first), (c, p_second), (d, p_neither))
                if any(k and not p for k, p in terms):
                    continue
                weight += sum(k * math.log(p) for k, p in terms if k)
                low, high = Paired(a, b, c, n).interval(0.05)
                if low <= truth <= high:
                    covered += math.exp(weight)
    return covered


@pytest.mark.parametrize(
    ("p_both", "p_first", "p_second"),
    [
        (0.0, 0.02, 0.02),  # a rare, independent departure on each side
        (0.01, 0.01, 0.03),  # a candidate straying less often than its floor
        (0.02, 0.05, 0.0),  # a candidate that departs where the floor never does
        (0.10, 0.02, 0.02),  # unstable prompts both stray on
    ],
)
def test_the_paired_interval_covers_the_true_difference_about_95_percent_of_the_time(
    p_both: float, p_first: float, p_second: float
) -> None:
    # Newcombe's method 10 keeps its coverage near the nominal level at the small counts a
    # suite gives, where a normal approximation's interval collapses to a point.
    assert coverage(40, p_both, p_first, p_second) >= 0.93


def test_the_difference_of_identical_outcomes_is_zero_and_of_disjoint_ones_is_not() -> None:
    same = Paired(both=10, n=240)
    low, high = same.interval(0.05)
    assert same.excess() == 0.0 and -0.015 < low < 0 < high < 0.015
    apart = Paired(first_only=10, second_only=10, n=240)
    low, high = apart.interval(0.05)
    assert apart.excess() == 0.0 and low < -0.03 and high > 0.03


def test_counting_pairs_of_outcomes() -> None:
    counted = Paired.count([(True, True), (True, False), (False, True), (False, False)] * 3)
    assert counted == Paired(both=3, first_only=3, second_only=3, n=12)
    assert (counted.first, counted.second, counted.excess()) == (6, 6, 0.0)


def test_prompts_needed_is_the_fewest_that_show_the_limit() -> None:
    needed = prompts_needed(0.03, 0.05)
    assert Paired(n=needed).interval(0.05)[1] <= 0.03 < Paired(n=needed - 1).interval(0.05)[1]
    assert needed == math.ceil(Z * Z / 0.03 - Z * Z)  # 0 in n ends at z^2 / (n + z^2)
