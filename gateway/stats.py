"""Statistics of measurements: percentiles, and the share, mean and total of a column over rows.

One definition for every reader of records: the shadow summary, the weekly report, the routing
replay, the precision check and the benchmarks. A row is a mapping of column to value; a None
value (or a column the row lacks) was not measured and counts for nothing, so a column with no
measured value has no statistic (None), not 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the q-th percentile (0..100) by linear interpolation, or None without values.

    The interpolation is numpy's default (and the one most monitoring tools use): the rank
    (n - 1) · q / 100, between the two order statistics around it.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def measured(rows: Iterable[Row], column: str) -> list[Any]:
    """Return a column's measured (not None) values."""
    return [value for r in rows if (value := r.get(column)) is not None]


def share(rows: Iterable[Row], column: str) -> float | None:
    """Return the share of measured values that are true."""
    values = measured(rows, column)
    return None if not values else sum(bool(v) for v in values) / len(values)


def mean(rows: Iterable[Row], column: str) -> float | None:
    """Return the mean of a column's measured values."""
    values = measured(rows, column)
    return None if not values else math.fsum(values) / len(values)


def total(rows: Iterable[Row], column: str) -> float | None:
    """Return the sum of a column's measured values."""
    values = measured(rows, column)
    return None if not values else math.fsum(values)


# A latency sketch: an exact count of values per logarithmic bucket, so sketches of any minutes,
# routes or replicas merge by adding counts. Bucket i holds (γ^(i-1), γ^i] and reads as
# 2γ^i / (γ + 1), within (γ - 1) / (γ + 1) of every value it holds: 0.99 % at γ = 1.02, over
# about 1,400 buckets from a microsecond to a day in milliseconds. Values up to SKETCH_MIN share
# a bucket that reads as 0 (durations are kept to the microsecond).
SKETCH_GAMMA = 1.02
SKETCH_RELATIVE_ERROR = (SKETCH_GAMMA - 1) / (SKETCH_GAMMA + 1)
SKETCH_MIN = 1e-3
_LOG_GAMMA = math.log(SKETCH_GAMMA)
_ZERO_BUCKET = math.ceil(math.log(SKETCH_MIN) / _LOG_GAMMA) - 1


def sketch_bucket(value: float) -> int:
    """Return the sketch bucket a value falls in."""
    if value <= SKETCH_MIN:
        return _ZERO_BUCKET
    return math.ceil(math.log(value) / _LOG_GAMMA)


def sketch_value(bucket: int) -> float:
    """Return the value a sketch bucket reads as."""
    if bucket <= _ZERO_BUCKET:
        return 0.0
    return 2 * SKETCH_GAMMA**bucket / (SKETCH_GAMMA + 1)


def sketch_percentile(counts: Mapping[int, int], q: float) -> float | None:
    """Return the q-th percentile (0..100) of a sketch as `percentile` interpolates it, within
    SKETCH_RELATIVE_ERROR of the exact one; None when it holds no value."""
    n = sum(counts.values())
    if not n:
        return None
    rank = (n - 1) * q / 100
    low = math.floor(rank)
    wanted = (low, min(low + 1, n - 1))
    found: list[float] = []
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        while len(found) < 2 and wanted[len(found)] < seen:
            found.append(sketch_value(bucket))
        if len(found) == 2:
            break
    return found[0] + (found[1] - found[0]) * (rank - low)
