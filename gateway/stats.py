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
