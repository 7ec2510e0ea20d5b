"""The paired comparison a precision check decides with: the candidate against the noise floor on
the same prompts.

Each prompt of a suite gives two yes-or-no outcomes: whether the candidate's answer departs from
the reference's (or turns a labelled answer wrong), and whether the reference's own second answer
does. The check asks how much more often the first happens than the second, so the figure is the
difference of two proportions measured on the same prompts. Its interval is Newcombe's hybrid
score interval for paired proportions (method 10 of Newcombe, "Improved confidence intervals
for the difference between binomial proportions based on paired data", Statistics in Medicine
17, 1998): each side's Wilson score interval, joined with the correlation of the two outcomes
across prompts. It keeps its coverage at the small counts a suite gives (none to a few
departures in a few hundred prompts), where the normal approximation's interval collapses.

Holding each side's interval on its own (the candidate's upper end against the floor's lower
end) charges both sides' uncertainty in full: against a reference that departs from itself on
5 of 240 prompts, a candidate departing on 3 could not pass a 3-point limit. The paired
difference charges only what the prompts show: the two share most of their prompts' outcomes.

A check is a single fixed-size sample, looked at once, so a fixed-sample interval is the right
one; the live judge, which looks at a growing sample every day, uses confidence sequences
(gateway/promotion/judge.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist


def wilson_interval(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Return the Wilson score interval at 1 - alpha for k successes in n trials."""
    if n <= 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True, slots=True)
class Paired:
    """The outcomes of two yes-or-no measures on the same prompts: how many prompts had both,
    only the first (the candidate's), only the second (the floor's), and how many in all."""

    both: int = 0
    first_only: int = 0
    second_only: int = 0
    n: int = 0

    @classmethod
    def count(cls, outcomes: Iterable[tuple[bool, bool]]) -> Paired:
        """Count (first, second) outcomes, one pair per prompt."""
        both = first = second = n = 0
        for a, b in outcomes:
            n += 1
            both += a and b
            first += a and not b
            second += b and not a
        return cls(both, first, second, n)

    @property
    def first(self) -> int:
        """How many prompts had the first outcome."""
        return self.both + self.first_only

    @property
    def second(self) -> int:
        """How many prompts had the second outcome."""
        return self.both + self.second_only

    def excess(self) -> float | None:
        """Return how much more often the first outcome happened than the second."""
        return (self.first - self.second) / self.n if self.n else None

    def interval(self, alpha: float) -> tuple[float, float]:
        """Return the interval at 1 - alpha of the first share minus the second (module doc)."""
        n = self.n
        if n <= 0:
            return (-1.0, 1.0)
        p1, p2 = self.first / n, self.second / n
        l1, u1 = wilson_interval(self.first, n, alpha)
        l2, u2 = wilson_interval(self.second, n, alpha)
        phi = self._correlation()
        d = p1 - p2
        low = d - math.sqrt(
            max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
        )
        high = d + math.sqrt(
            max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
        )
        return (max(-1.0, low), min(1.0, high))

    def _correlation(self) -> float:
        """The correlation of the two outcomes across prompts (0 where a margin is empty)."""
        neither = self.n - self.both - self.first_only - self.second_only
        margins = self.first * (self.n - self.first) * self.second * (self.n - self.second)
        if margins == 0:
            return 0.0
        return (self.both * neither - self.first_only * self.second_only) / math.sqrt(margins)


def prompts_needed(limit: float, alpha: float) -> int:
    """Return the fewest prompts whose interval, with no departure on either side, ends at or
    below `limit`."""
    if limit >= 1:
        return 1
    n = 1
    while Paired(n=n).interval(alpha)[1] > limit:
        n *= 2
    low, high = n // 2 + 1, n
    while low < high:
        mid = (low + high) // 2
        if Paired(n=mid).interval(alpha)[1] > limit:
            low = mid + 1
        else:
            high = mid
    return high
