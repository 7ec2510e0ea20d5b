"""Periods: an ISO week or a date range, in UTC, the period just before it, and `since`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from gateway.errors import InvalidRequest

ISO_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")


@dataclass(frozen=True, slots=True)
class Period:
    """A half-open span of time [since, until) in Unix seconds, with a label for people."""

    since: float
    until: float
    label: str

    @property
    def days(self) -> float:
        return (self.until - self.since) / 86400

    def previous(self) -> Period:
        """Return the period of the same length that ends where this one starts."""
        length = self.until - self.since
        since = self.since - length
        if _is_iso_week(since, length):
            label = week_label(since)
        else:
            label = f"{_day(since)} – {_day(self.since - 1)}"
        return Period(since, self.since, label)

    def as_dict(self) -> dict[str, str | float]:
        return {
            "label": self.label,
            "since": _iso(self.since),
            "until": _iso(self.until),
            "since_ts": self.since,
            "until_ts": self.until,
        }


def week(text: str) -> Period:
    """Return the ISO week named like 2026-W48, Monday 00:00 UTC to the next Monday."""
    found = ISO_WEEK.match(text)
    if found is None:
        raise ValueError(f"a week is written like 2026-W48, got {text!r}")
    year, number = int(found.group(1)), int(found.group(2))
    try:
        monday = date.fromisocalendar(year, number, 1)
    except ValueError:
        raise ValueError(f"{year} has no ISO week {number} (got {text!r})") from None
    start = datetime(monday.year, monday.month, monday.day, tzinfo=UTC).timestamp()
    return Period(start, start + 7 * 86400, text)


def last_complete_week(now: float) -> Period:
    """Return the newest ISO week that has ended by `now`."""
    today = datetime.fromtimestamp(now, UTC).date()
    this_monday = today - timedelta(days=today.weekday())
    start = this_monday - timedelta(days=7)
    return week(f"{start.isocalendar().year}-W{start.isocalendar().week:02d}")


def date_range(since: str, until: str) -> Period:
    """Return [since, until) from ISO dates or times; a plain `until` date includes that day."""
    start = _moment(since, "since")
    end = _moment(until, "until")
    if _is_date(until):
        end += 86400
    if end <= start:
        raise ValueError(f"--until ({until}) must be after --since ({since})")
    return Period(start, end, f"{_day(start)} – {_day(end - 1)}")


def week_label(ts: float) -> str:
    year, number, _ = datetime.fromtimestamp(ts, UTC).isocalendar()
    return f"{year}-W{number:02d}"


def _is_iso_week(since: float, length: float) -> bool:
    moment = datetime.fromtimestamp(since, UTC)
    midnight = moment.hour == moment.minute == moment.second == 0
    return length == 7 * 86400 and moment.weekday() == 0 and midnight


def _is_date(text: str) -> bool:
    return re.fullmatch(r"\d{4}-\d{2}-\d{2}", text) is not None


def _moment(text: str, name: str) -> float:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--{name} must be an ISO date or time such as 2026-11-23, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


# What `since` may be, as parse_since below reads it: Unix seconds, an age (DURATION: 90m, 24h,
# 7d) or an ISO 8601 date or time; empty is no bound. The admin API's description and check
# carry it, so it admits only what parse_since reads: days that exist (February 29 in leap
# years alone), hours to 23, minutes and seconds to 59, offsets within a day.
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001 to 9999
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"  # months of 31 days
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"  # of 30
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"  # February
)
_LEAP = r"(?:0[48]|[2468][048]|[13579][26])"  # years divisible by 4: their last two digits
_LEAP_DAY = rf"(?:[0-9]{{2}}{_LEAP}|{_LEAP}00)-02-29"  # and of centuries, the first two
_TIME = r"[T ](?:[01][0-9]|2[0-3])(?::[0-5][0-9](?::[0-5][0-9](?:\.[0-9]{1,6})?)?)?"
_OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):?[0-5][0-9])"
SINCE = (
    r"^(?:[0-9]{1,12}(?:\.[0-9]{1,6})?[smhd]?"  # seconds, or an age
    rf"|(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"  # a date
    rf"(?:{_TIME}{_OFFSET}?)?"  # and a time, with its offset
    r")?$"
)


def parse_since(value: str | None, now: float) -> float | None:
    """Read `since` as Unix seconds, an ISO 8601 time (UTC unless it says), or an age like 24h."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    age = DURATION.match(value)
    if age is not None:
        return now - float(age.group(1)) * UNIT_S[age.group(2)]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            f"'since' must be Unix seconds, an ISO 8601 time or an age such as 24h or 7d, "
            f"got {value!r}",
            param="since",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
