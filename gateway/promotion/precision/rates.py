"""Departures per word: the rate a precision check judges answers of free length by.

A part's numerics move one token at a time, and once an answer leaves the reference's it goes
its own way: the rest of it is a fluent continuation from another word, and it departs in
meaning. So the chance that an answer departs grows with its length (an int8 part that departs
on 0.4% of 20-word answers departs on about 4% of 200-word ones), and a share of departing
answers says as much about the suite's lengths as about the part. The rate per word at risk
does not: each pair contributes the words both answers share up to and including the first
that differs (all of them when none does: gateway/promotion/departures.py, `words_at_risk`),
and a departure where it departs. It is the
maximum-likelihood rate of a part that follows the reference until it departs.

A check compares the candidate's rate with the noise floor's (the reference's second answers)
on the same prompts. The interval of the difference joins each side's score interval for a
Poisson rate (MOVER, Zou and Donner, "Construction of confidence limits about effect measures:
a general approach", Statistics in Medicine 27, 2008; for two proportions it is Newcombe's
method 10, gateway/promotion/precision/paired.py). The two sides are taken as independent: on
the same prompts they are positively correlated, which only narrows the true interval, so the
one given is conservative.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist


def rate_interval(count: int, exposure: int, alpha: float) -> tuple[float, float]:
    """Return the score interval at 1 - alpha of a Poisson rate: `count` events in `exposure`.

    A pair departs at most once and puts at least one word at risk, so a rate per word is at
    most 1: the interval is cut there, and with no exposure it is all of [0, 1].
    """
    if exposure <= 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    centre = count + z * z / 2
    half = z * math.sqrt(count + z * z / 4)
    return (max(0.0, centre - half) / exposure, min(1.0, (centre + half) / exposure))


@dataclass(frozen=True, slots=True)
class Rate:
    """Departures counted over words at risk."""

    departures: int = 0
    words: int = 0

    @classmethod
    def count(cls, pairs: Iterable[tuple[bool, int]]) -> Rate:
        """Count (departs, words at risk), one per pair."""
        departures = words = 0
        for departs, at_risk in pairs:
            departures += departs
            words += at_risk
        return cls(departures, words)

    @property
    def value(self) -> float | None:
        """Departures per word at risk (None with no words)."""
        return self.departures / self.words if self.words else None

    def interval(self, alpha: float) -> tuple[float, float]:
        """Return this rate's score interval at 1 - alpha."""
        return rate_interval(self.departures, self.words, alpha)


def excess_interval(candidate: Rate, floor: Rate, alpha: float) -> tuple[float, float]:
    """Return the interval at 1 - alpha of the candidate's rate minus the floor's (module doc)."""
    if candidate.words <= 0 or floor.words <= 0:
        return (-1.0, 1.0)
    r1, r2 = candidate.departures / candidate.words, floor.departures / floor.words
    l1, u1 = candidate.interval(alpha)
    l2, u2 = floor.interval(alpha)
    d = r1 - r2
    return (d - math.hypot(r1 - l1, u2 - r2), d + math.hypot(u1 - r1, r2 - l2))


def words_needed(limit: float, alpha: float) -> int:
    """Return the fewest words at risk whose interval, with no departure on either side, ends at
    or below `limit`."""
    z = NormalDist().inv_cdf(1 - alpha / 2)
    # With none on either side the upper end is hypot(z^2 / w, 0): z^2 / w.
    return math.ceil(z * z / limit)
