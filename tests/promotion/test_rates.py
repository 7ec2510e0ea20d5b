"""Departures per word at risk, and the interval a check's verdict rests on."""

from __future__ import annotations

import math

import pytest

from gateway.promotion.precision.rates import (
    Rate,
    excess_interval,
    rate_interval,
    words_needed,
)


def test_the_score_interval_of_none_ends_at_z_squared_over_the_words() -> None:
    low, high = rate_interval(0, 1000, 0.05)
    assert low == 0.0 and high == pytest.approx(1.959964**2 / 1000, rel=1e-5)
    assert words_needed(high, 0.05) == 1000
    assert rate_interval(0, 0, 0.05) == (0.0, 1.0)  # a rate per word is at most 1
    assert rate_interval(3, 2, 0.05)[1] == 1.0


def _poisson(mu: float, upto: int) -> list[float]:
    weights = [math.exp(-mu)]
    for k in range(1, upto):
        weights.append(weights[-1] * mu / k)
    return weights


@pytest.mark.parametrize(
    ("rate", "words", "floor_rate", "floor_words"),
    [
        (0.002, 5000, 0.002, 5000),  # 10 departures expected on each side
        (0.004, 5000, 0.0002, 5000),  # a candidate well above a quiet floor
        (0.001, 20000, 0.0, 20000),  # a deterministic floor (the real fleet's CPU engines)
        (0.0002, 5000, 0.012, 5000),  # a floor that strays far more than the candidate
        (0.0005, 4000, 0.0005, 60000),  # a candidate departing early: fewer words at risk
    ],
)
def test_the_excess_interval_passes_a_worse_candidate_at_most_its_share_of_the_time(
    rate: float, words: int, floor_rate: float, floor_words: int
) -> None:
    """A check wrongly passes a part whose true excess is at the limit when the interval's upper
    end falls below the true difference. Over every pair of counts, exactly weighted, that
    happens at most alpha / 2 of the time (to 0.1 point, the score interval's discreteness).

    The cases are those where it matters: a candidate that departs more often than the floor
    has fewer words at risk than the floor (its answers stop counting where they depart). Where
    the floor has far fewer, the error grows (6% at a tenth), but there the floor departs more
    and the candidate is the better of the two.
    """
    alpha = 0.05
    p1, p2 = _poisson(rate * words, 120), _poisson(floor_rate * floor_words, 120)
    truth = rate - floor_rate
    below = 0.0
    for k1, w1 in enumerate(p1):
        for k2, w2 in enumerate(p2):
            high = excess_interval(Rate(k1, words), Rate(k2, floor_words), alpha)[1]
            below += w1 * w2 * (high < truth)
    assert below <= alpha / 2 + 0.001


def test_a_rate_counts_departures_over_words() -> None:
    rate = Rate.count([(True, 12), (False, 30), (False, 30)])
    assert (rate.departures, rate.words, rate.value) == (1, 72, 1 / 72)
    assert Rate().value is None
