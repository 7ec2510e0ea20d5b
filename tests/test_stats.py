"""Statistics of measurements: percentiles and column statistics over rows."""

from __future__ import annotations

import random

import pytest

from gateway.stats import (
    SKETCH_MIN,
    SKETCH_RELATIVE_ERROR,
    mean,
    percentile,
    share,
    sketch_bucket,
    sketch_percentile,
    total,
)


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


def test_a_sketch_percentile_is_within_its_stated_error_of_the_exact_one() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(5, 1.5) for _ in range(5000)] + [0.0, 0.0004]
    counts: dict[int, int] = {}
    for v in values:
        counts[sketch_bucket(v)] = counts.get(sketch_bucket(v), 0) + 1
    for q in (0, 1, 50, 95, 99, 99.9, 100):
        exact = percentile(values, q)
        assert exact is not None
        estimate = sketch_percentile(counts, q)
        assert estimate == pytest.approx(exact, rel=SKETCH_RELATIVE_ERROR, abs=SKETCH_MIN)
    assert sketch_percentile({}, 50) is None


def test_sketches_merge_by_adding_counts() -> None:
    a, b = [1.0, 2.0, 300.0], [4.5, 5000.0]
    merged: dict[int, int] = {}
    for v in a + b:
        merged[sketch_bucket(v)] = merged.get(sketch_bucket(v), 0) + 1
    assert sketch_percentile(merged, 50) == pytest.approx(4.5, rel=SKETCH_RELATIVE_ERROR)
