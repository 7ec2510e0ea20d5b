"""Report periods: ISO weeks, date ranges and the period before."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.report.period import SINCE, date_range, last_complete_week, parse_since, week


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


@settings(max_examples=500, deadline=None)
@given(st.from_regex(SINCE, fullmatch=True))
def test_every_since_the_admin_api_describes_is_read(since: str) -> None:
    parse_since(since, 1e9)  # the description admits it, so reading it must not refuse it


@pytest.mark.parametrize(
    "since",
    ["2026-02-29", "1900-02-29", "2026-04-31", "2026-13-01", "0000-01-01", "2026-01-01T24:00",
     "2026-01-01T10:60", "2026-01-01T10:00+24:00", "2026-01-01Z", "soon"],
)  # fmt: skip
def test_the_since_the_admin_api_describes_is_no_day_that_does_not_exist(since: str) -> None:
    assert re.fullmatch(SINCE, since) is None
