"""Statistics of measurements: percentiles and column statistics over rows."""

from __future__ import annotations

import pytest

from gateway.stats import mean, percentile, share, total


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([10.0, 20.0], 95) == pytest.approx(19.5)


def test_a_column_statistic_counts_measured_values_only() -> None:
    rows = [{"x": 1.0, "ok": True}, {"x": None, "ok": None}, {"x": 3.0, "ok": False}]
    assert (share(rows, "ok"), mean(rows, "x"), total(rows, "x")) == (0.5, 2.0, 4.0)
    unmeasured = [{"x": None, "ok": None}]
    assert (share(unmeasured, "ok"), mean(unmeasured, "x"), total(unmeasured, "x")) == (
        None,
        None,
        None,
    )
