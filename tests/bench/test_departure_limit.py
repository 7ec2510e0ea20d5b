"""The precision check's departure limit held to the real fleet's sweep it comes from
(bench/departure_limit.py, docs/results/departure-limit.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.departure_limit import by_snr, limit
from gateway.promotion.precision.limits import MAX_DEPARTURE_RATE, MAX_TURNED_WRONG

SWEEP = json.loads(
    (Path(__file__).resolve().parents[2] / "docs/results/departure-limit.json").read_text()
)


def test_the_limit_follows_from_the_sweeps_parts() -> None:
    assert by_snr(SWEEP["parts"]) == SWEEP["by_part"]
    assert limit(SWEEP["by_part"]) == pytest.approx(SWEEP["limit_per_word"], rel=1e-12)


def test_the_checks_default_is_the_sweeps_limit() -> None:
    assert SWEEP["allowed_turned_wrong"] == MAX_TURNED_WRONG
    assert pytest.approx(SWEEP["limit_per_word"], rel=0.02) == MAX_DEPARTURE_RATE


def test_the_limit_lies_between_the_parts_the_labels_pass_and_fail() -> None:
    passing = [p for p in SWEEP["by_part"] if p["turned_wrong_share"] <= MAX_TURNED_WRONG]
    failing = [p for p in SWEEP["by_part"] if p["turned_wrong_share"] > MAX_TURNED_WRONG]
    assert passing and failing
    assert max(p["facts_departure_rate"] for p in passing) <= MAX_DEPARTURE_RATE
    assert min(p["facts_departure_rate"] for p in failing) > MAX_DEPARTURE_RATE
