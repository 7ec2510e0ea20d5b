"""SLO attainment: one request against its targets."""

from __future__ import annotations

from gateway.policy.model import SloClass
from gateway.records.slo import meets_slo

INTERACTIVE = SloClass(ttft_ms=500, tpot_ms=50)
BATCH = SloClass(e2e_ms=60_000)


def test_a_request_within_every_target_meets_its_slo() -> None:
    assert meets_slo(INTERACTIVE, 200, ttft_ms=120, tpot_ms=20, e2e_ms=900)
    assert meets_slo(INTERACTIVE, 200, ttft_ms=500, tpot_ms=50, e2e_ms=900)  # at the target


def test_missing_any_one_target_misses() -> None:
    assert not meets_slo(INTERACTIVE, 200, ttft_ms=501, tpot_ms=20, e2e_ms=900)
    assert not meets_slo(INTERACTIVE, 200, ttft_ms=120, tpot_ms=51, e2e_ms=900)
    assert not meets_slo(BATCH, 200, ttft_ms=None, tpot_ms=None, e2e_ms=60_001)


def test_a_failed_request_misses_whatever_its_timings() -> None:
    assert not meets_slo(INTERACTIVE, 502, ttft_ms=1, tpot_ms=1, e2e_ms=1)
    assert not meets_slo(None, 429, ttft_ms=None, tpot_ms=None, e2e_ms=None)


def test_a_target_without_a_measure_does_not_count_against_it() -> None:
    # Not streamed: no time to first token, and an interactive class has no end-to-end target.
    assert meets_slo(INTERACTIVE, 200, ttft_ms=None, tpot_ms=None, e2e_ms=30_000)
    assert meets_slo(None, 200, ttft_ms=9_999, tpot_ms=None, e2e_ms=None)
