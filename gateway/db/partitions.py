"""Day partitions: on PostgreSQL, request and shadow records are stored a UTC day per table.

    request_records ─┬─ request_records_p20261207   ts in [2026-12-07, 2026-12-08)
                     ├─ request_records_p20261208   ...
                     └─ request_records_default     any ts without a day of its own

Retention then drops a day past the window as a whole table (`drop_before`), which costs the
same at 20 requests a second as at 1,000, instead of deleting its rows one by one. The days
are made ahead (today and the next AHEAD_DAYS) by migration 0019, by `gateway serve` at start
and by every retention round; the default partition takes a row whose day was never made (the
job off or behind for days), so an insert never fails, and retention deletes those rows in
batches. Request minutes are not partitioned: their rows grow with the keys a minute sees, not
with the traffic (docs/operations.md), so their daily deletes stay small.

Every replica runs this. A table's days are made and dropped in one transaction under a
transaction-level advisory lock taken without waiting: a replica that finds it held leaves the
work to the one holding it. DDL on a partition takes an exclusive lock on the table, which waits
for readers (a weekly report) and makes the record writers wait behind it, so it gives up after
LOCK_TIMEOUT and the next round tries again.

SQLite keeps one table each; nothing here runs on it.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import UTC, datetime

import sqlalchemy as sa

from gateway.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

PARTITIONED = ("request_records", "shadow_records")
AHEAD_DAYS = 2
DAY_S = 86400.0
LOCK_TIMEOUT = "1s"
# The first key of the advisory locks (the second is the table's oid): "day partitions".
LOCK_SPACE = 4619
_DAY = re.compile(r"^(?P<table>[a-z_]+)_p(?P<day>\d{8})$")


def day_of(ts: float) -> float:
    """Return the start of the UTC day of `ts`, Unix seconds."""
    return math.floor(ts / DAY_S) * DAY_S


def day_name(table: str, day: float) -> str:
    """Return the name of `table`'s partition for the UTC day starting at `day`."""
    return f"{table}_p{datetime.fromtimestamp(day, UTC):%Y%m%d}"


def default_name(table: str) -> str:
    """Return the name of `table`'s default partition."""
    return f"{table}_default"


def is_partition(name: str) -> bool:
    """Say whether a table name is one of a partitioned table's day or default partitions."""
    day = _DAY.match(name)
    if day is not None:
        return day["table"] in PARTITIONED
    return any(name == default_name(table) for table in PARTITIONED)


def days(conn: sa.Connection, table: str) -> dict[float, str]:
    """Return `table`'s day partitions by the start of their day."""
    names = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = CAST(:table AS regclass)"
        ),
        {"table": table},
    ).scalars()
    found = {}
    for name in names:
        match = _DAY.match(name)
        if match is not None and match["table"] == table:
            when = datetime.strptime(match["day"], "%Y%m%d").replace(tzinfo=UTC)
            found[when.timestamp()] = name
    return found


def make_days(conn: sa.Connection, table: str, first: float, last: float) -> list[str]:
    """Make `table`'s partitions for the days from `first` to `last` (day starts) that are
    missing; return their names. Rows of those days in the default partition move into them."""
    made = []
    have = days(conn, table)
    day = day_of(first)
    while day <= last:
        if day not in have:
            _make_day(conn, table, day)
            made.append(day_name(table, day))
        day += DAY_S
    return made


def _make_day(conn: sa.Connection, table: str, day: float) -> None:
    name, default = day_name(table, day), default_name(table)
    bounds = f"FOR VALUES FROM ({day:.0f}) TO ({day + DAY_S:.0f})"
    stray = conn.execute(
        sa.text(f"SELECT 1 FROM {default} WHERE ts >= :lo AND ts < :hi LIMIT 1"),
        {"lo": day, "hi": day + DAY_S},
    ).first()
    if stray is None:
        conn.execute(sa.text(f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} {bounds}"))
        return
    # A day that went to the default partition (its partition was not made in time): its
    # rows move into the new partition, which the default must no longer hold once attached.
    conn.execute(sa.text(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)"))
    conn.execute(
        sa.text(
            f"WITH moved AS (DELETE FROM {default} WHERE ts >= :lo AND ts < :hi RETURNING *)"
            f" INSERT INTO {name} SELECT * FROM moved"
        ),
        {"lo": day, "hi": day + DAY_S},
    )
    conn.execute(sa.text(f"ALTER TABLE {table} ATTACH PARTITION {name} {bounds}"))


def drop_before(conn: sa.Connection, table: str, cutoff: float) -> list[str]:
    """Drop `table`'s day partitions that end at or before `cutoff`; return their names."""
    dropped = []
    for day, name in sorted(days(conn, table).items()):
        if day + DAY_S <= cutoff:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))
            dropped.append(name)
    return dropped


def maintain(db: sa.Engine, now: float, cutoffs: dict[str, float]) -> dict[str, list[str]]:
    """Make every partitioned table's days from today to AHEAD_DAYS ahead, and drop the days
    past the table's cutoff (if it has one); return the days dropped per table.

    A table another replica is maintaining, or whose lock does not come within LOCK_TIMEOUT,
    is left to that replica or to the next round.
    """
    dropped: dict[str, list[str]] = {}
    for table in PARTITIONED:
        try:
            with db.begin() as conn:
                conn.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                held = conn.execute(
                    sa.text(
                        "SELECT pg_try_advisory_xact_lock(:space, CAST(CAST(:table AS regclass)"
                        " AS oid)::int)"
                    ),
                    {"space": LOCK_SPACE, "table": table},
                ).scalar()
                if not held:
                    continue
                today = day_of(now)
                made = make_days(conn, table, today, today + AHEAD_DAYS * DAY_S)
                gone = drop_before(conn, table, cutoffs[table]) if table in cutoffs else []
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise DatabaseUnavailable(
                    f"cannot maintain the day partitions of {table} ({type(exc).__name__})"
                ) from exc
            log.warning(
                "partitions of %s: the table stayed locked for %s (a long read?); "
                "trying again next round",
                table,
                LOCK_TIMEOUT,
            )
            continue
        except sa.exc.SQLAlchemyError as exc:
            raise DatabaseUnavailable(
                f"cannot maintain the day partitions of {table} ({type(exc).__name__})"
            ) from exc
        if made:
            log.info("partitions of %s: made %s", table, ", ".join(made))
        if gone:
            log.info("partitions of %s: dropped %s", table, ", ".join(gone))
        dropped[table] = gone
    return dropped
