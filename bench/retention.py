"""A day's retention at production size: on PostgreSQL, dropping its partitions against deleting
its rows in batches as retention did before day partitions; on SQLite, its batches.

    python -m bench.records --requests 10000000 --shadows 2000000 --database URL --week 2026-W48
    python -m bench.retention --database URL --week 2026-W48 --out R.json

On SQLite, the week's first day is deleted in batches. On PostgreSQL, on a week that
`bench.records` wrote (partitioned by day, migration 0019 on):

1. drop: a retention round (`drop_days`) whose window ends with the week's first day drops
   that day's request and shadow record partitions.
2. batches: the second day's request and shadow records are deleted as every round did before
   day partitions, in batches of 1,000 through the `ts` index (`delete_batch`, with the pause
   between batches), from the day's partitions, then VACUUM of them, the work the deletes
   leave to autovacuum.
3. with `--migrations`: the downgrade to the revision before day partitions (the rows move
   back into one table each) and the upgrade back (the migration on a filled database).

Meanwhile a thread writes request records as the record writer does (a batch of 10 every
0.5 s: 20 requests a second) and times each batch, so the table shows what each way of
retention costs the writes going on beside it: its p50, p99 and slowest batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from gateway.db import partitions
from gateway.db.connection import alembic_config, connect, upgrade
from gateway.db.retention import BATCH_ROWS, DAY_S, Windows, delete_batch, drop_days
from gateway.db.schema import RequestRecord, request_records, shadow_records
from gateway.records.batching import Statement, insert_batch
from gateway.report.period import week

TABLES = (request_records, shadow_records)
WINDOW_DAYS = 30.0
WRITES_EVERY_S = 0.5
WRITE_ROWS = 10
PAUSE_S = 0.05  # between two batches, as Pruner pauses in `gateway serve`


def _date(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).date().isoformat()


def _rows(db: sa.Engine, since: float, until: float) -> dict[str, int]:
    with db.connect() as conn:
        return {
            t.name: int(
                conn.execute(
                    sa.select(sa.func.count()).where(t.c.ts >= since, t.c.ts < until)
                ).scalar()
                or 0
            )
            for t in TABLES
        }


def _sizes_mb(db: sa.Engine) -> dict[str, float]:
    with db.connect() as conn:
        sizes = {}
        for t in TABLES:
            found = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                    " WHERE c.oid = CAST(:t AS regclass) OR c.oid IN"
                    " (SELECT inhrelid FROM pg_inherits WHERE inhparent = CAST(:t AS regclass))"
                ),
                {"t": t.name},
            ).scalar()
            sizes[t.name] = round(int(found or 0) / 2**20, 1)
        return sizes


@contextmanager
def writes(db: sa.Engine, ts: float) -> Iterator[list[float]]:
    """Write request records as the record writer does while the block runs; yield the list
    of each batch's seconds, filled as they go."""
    statement = Statement.insert(request_records, db)
    stopping = threading.Event()
    seconds: list[float] = []

    def record() -> RequestRecord:
        return RequestRecord(
            decision_id=uuid.uuid4().hex, ts=ts, endpoint="chat", route="bench", pool="gpu",
            backend="gpu-0", model="m", tenant=None, slo_class=None, stream=False,
            prompt_tokens=10, prompt_tokens_estimated=10, max_tokens=20, completion_tokens=20,
            queue_ms=0.0, ttft_ms=None, tpot_ms=None, e2e_ms=12.0, gateway_ms=0.2, attempts=1,
            fallback=False, status=200, error=None,
        )  # fmt: skip

    def run() -> None:
        while not stopping.wait(WRITES_EVERY_S):
            values = statement.values([record() for _ in range(WRITE_ROWS)])
            started = time.perf_counter()
            insert_batch(db, statement.sql, values)
            seconds.append(time.perf_counter() - started)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seconds
    finally:
        stopping.set()
        thread.join()


def _latency(seconds: list[float]) -> dict[str, Any]:
    if not seconds:
        return {"batches": 0}
    ordered = sorted(seconds)
    return {
        "batches": len(ordered),
        "p50_ms": round(1000 * statistics.median(ordered), 2),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        "max_ms": round(1000 * ordered[-1], 2),
    }


def timed(db: sa.Engine, during: float, work: Callable[[], Any]) -> dict[str, Any]:
    """Run `work` while records are written at `during`; return its seconds, its result and
    the writes' latency."""
    with writes(db, during) as seconds:
        started = time.perf_counter()
        result = work()
        took = time.perf_counter() - started
    return {"seconds": round(took, 2), "result": result, "writes": _latency(seconds)}


def delete_in_batches(
    db: sa.Engine, tables: dict[str, str], cutoff: float, limit: float = float("inf")
) -> dict[str, Any]:
    """Delete the rows before `cutoff` of the tables (each under the name it is reported by) in
    batches, pausing between them as `gateway serve`'s rounds do, up to about `limit` rows of
    each; count rows, batches, the seconds spent deleting and the rows deleted a second."""
    done: dict[str, Any] = {}
    for name, stored in tables.items():
        table = sa.table(stored, sa.column("id"), sa.column("ts"))
        rows = batches = 0
        deleting = 0.0
        while True:
            started = time.perf_counter()
            n = delete_batch(db, table, cutoff, BATCH_ROWS)
            deleting += time.perf_counter() - started
            rows, batches = rows + n, batches + 1
            if n < BATCH_ROWS or rows >= limit:
                break
            time.sleep(PAUSE_S)
        done[name] = {
            "rows": rows,
            "batches": batches,
            "deleting_s": round(deleting, 2),
            "rows_per_s": round(rows / deleting) if deleting else None,
        }
    return done


def vacuum(db: sa.Engine, tables: Iterable[str]) -> None:
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in tables:
            conn.execute(sa.text(f"VACUUM {table}"))


def run(url: str, week_label: str, *, rows: float, migrations: bool) -> dict[str, Any]:
    period = week(week_label)
    first, second = period.since, period.since + DAY_S
    db = connect(url)
    writing_at = time.time()  # today's rows, which neither way of retention touches
    result: dict[str, Any] = {"week": week_label, "database": db.dialect.name}
    result["idle"] = timed(db, writing_at, lambda: time.sleep(20))
    whole = {t.name: t.name for t in TABLES}
    if db.dialect.name != "postgresql":  # one table each: a day goes in batches
        day = _rows(db, first, first + DAY_S)
        deleted = timed(db, writing_at, lambda: delete_in_batches(db, whole, first + DAY_S))
        result["batches"] = {"day": _date(first), "rows": day, **deleted}
        db.dispose()
        return result

    result["sizes_mb_before"] = _sizes_mb(db)
    day = _rows(db, first, first + DAY_S)
    now = first + DAY_S + WINDOW_DAYS * DAY_S
    dropped = timed(db, writing_at, lambda: drop_days(db, Windows(WINDOW_DAYS, WINDOW_DAYS), now))
    result["drop"] = {"day": _date(first), "rows": day, **dropped}

    # The second day in batches, from its partitions: the same statement, through the same
    # indexes as a whole table's, only a day deep (which flatters the batches a little).
    day = _rows(db, second, second + DAY_S)
    of_day = {t.name: partitions.day_name(t.name, second) for t in TABLES}
    deleted = timed(db, writing_at, lambda: delete_in_batches(db, of_day, second + DAY_S, rows))
    result["batches"] = {"day": _date(second), "rows": day, **deleted}
    if rows == float("inf"):
        result["vacuum"] = timed(db, writing_at, lambda: vacuum(db, of_day.values()))
    result["sizes_mb_after"] = _sizes_mb(db)
    db.dispose()
    if not migrations:
        return result

    config = alembic_config(url)
    (partitioning,) = (
        r
        for r in ScriptDirectory.from_config(config).walk_revisions()
        if r.path.endswith("_day_partitions.py")
    )
    started = time.perf_counter()
    command.downgrade(config, str(partitioning.down_revision))
    result["downgrade_s"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    upgrade(url)
    result["upgrade_s"] = round(time.perf_counter() - started, 1)
    db = connect(url)
    result["rows_moved_by_upgrade"] = _rows(db, 0, float("inf"))
    db.dispose()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--database", required=True, help="database URL holding the week")
    parser.add_argument("--week", required=True, help="the ISO week bench.records wrote")
    parser.add_argument("--out", help="write the result as JSON here too")
    parser.add_argument(
        "--rows",
        type=float,
        default=float("inf"),
        help="on PostgreSQL, delete about this many rows of each table's day in batches (its "
        "rate times the day's rows is the day's time), and leave VACUUM out",
    )
    parser.add_argument(
        "--migrations", action="store_true", help="then time 0019's downgrade and upgrade"
    )
    args = parser.parse_args(argv)
    result = run(args.database, args.week, rows=args.rows, migrations=args.migrations)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
