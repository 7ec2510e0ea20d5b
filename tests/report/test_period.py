"""Report periods: ISO weeks, date ranges and the period before."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.report.period import date_range, last_complete_week, week


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_an_iso_week_runs_monday_to_monday_in_utc() -> None:
    span = week("2026-W48")
    assert (span.since, span.until) == (ts("2026-11-23"), ts("2026-11-30"))
    assert span.previous().label == "2026-W47"
    assert span.previous().until == span.since


def test_the_first_iso_week_can_start_in_the_previous_year() -> None:
    assert week("2026-W01").since == ts("2025-12-29")


def test_a_date_range_includes_its_last_day() -> None:
    span = date_range("2026-11-23", "2026-11-25")
    assert (span.since, span.until) == (ts("2026-11-23"), ts("2026-11-26"))
    assert span.previous().since == ts("2026-11-20")


def test_the_default_is_the_last_week_that_has_ended() -> None:
    assert last_complete_week(ts("2026-12-02T09:00")).label == "2026-W48"
    assert last_complete_week(ts("2026-11-30T00:00")).label == "2026-W48"


@pytest.mark.parametrize("text", ["2026-48", "2026-W54", "W48"])
def test_a_malformed_week_is_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError, match="W"):
        week(text)


def test_a_range_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="must be after"):
        date_range("2026-11-25", "2026-11-20")
