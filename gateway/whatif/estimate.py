"""The period's figures from its sampled windows: a stratified cluster sample's ratio estimate.

Each window (gateway/whatif/windows.py) is a cluster of the period's requests, replayed whole at
full load; a figure of the period is a ratio of two totals over its requests (SLO met per
request, energy per request, cost per thousand tokens). Stratum h has `M_h` windows in the
period and `m_h` were drawn at random, so each window drawn stands for `M_h / m_h` of them, and
the estimate is the ratio of the two weighted totals (the combined ratio estimator). Its
variance is the linearized one (Cochran, Sampling Techniques, 6.11): from the spread, between
the windows of each stratum, of `y - R x`, finite-population corrected. The interval is
Student's t at the windows' degrees of freedom (windows less strata), not the normal's: a
week's sample has tens of windows, not thousands.

What the interval covers is the sampling of windows, and with it the replay's own chance within
them; it does not cover what a window's warm-up fails to restore, which the warm-up is sized to
make small (tests/whatif/test_sample.py compares the estimate with full replays).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t, two-sided 95 %, for 1..30 degrees of freedom; beyond, 1.96 + 2.46 / df (within
# 0.001 of the tables at 40, 60 and 120).
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_975(df: int) -> float:
    """Return Student's t quantile for a two-sided 95 % interval at `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    return T_975[df - 1] if df <= len(T_975) else 1.96 + 2.46 / df


@dataclass(frozen=True, slots=True)
class Cluster:
    """One window's totals of a ratio's numerator and denominator, and its stratum."""

    stratum: int
    y: float
    x: float


@dataclass(frozen=True, slots=True)
class Estimate:
    """A ratio estimated for the period, with its 95 % interval and its standard error."""

    estimate: float
    low: float
    high: float
    standard_error: float

    def rounded(self, digits: int) -> dict[str, float]:
        return {
            "estimate": round(self.estimate, digits),
            "low": round(self.low, digits),
            "high": round(self.high, digits),
        }


def ratio_estimate(
    clusters: Sequence[Cluster], cells: Sequence[int], *, bounds: tuple[float, float] | None = None
) -> Estimate | None:
    """Return the period's ratio Y / X estimated from the windows drawn (`cells[h]` windows in
    stratum h), or None when the windows hold none of X; `bounds` clip the interval (a share
    lies in [0, 1])."""
    by_stratum: dict[int, list[Cluster]] = defaultdict(list)
    for cluster in clusters:
        by_stratum[cluster.stratum].append(cluster)
    y_total = x_total = 0.0
    for h, drawn in by_stratum.items():
        weight = cells[h] / len(drawn)
        y_total += weight * sum(c.y for c in drawn)
        x_total += weight * sum(c.x for c in drawn)
    if x_total <= 0:
        return None
    ratio = y_total / x_total
    variance = 0.0
    df = 0
    for h, drawn in by_stratum.items():
        m, size = len(drawn), cells[h]
        if m < 2 or m >= size:
            continue  # read whole (no sampling error), or one window: no spread to read
        d = [c.y - ratio * c.x for c in drawn]
        mean = sum(d) / m
        spread = sum((v - mean) ** 2 for v in d) / (m - 1)
        variance += size**2 * (1 - m / size) * spread / m
        df += m - 1
    error = math.sqrt(variance) / x_total
    half = t_975(df) * error if df else 0.0
    low, high = ratio - half, ratio + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Estimate(ratio, low, high, error)
