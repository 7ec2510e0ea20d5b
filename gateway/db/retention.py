"""Retention: drop or delete records past their window, on an interval.

Request records, and their minutes (request_minutes), parking events and backend energy (which
the weekly report reads beside them), are kept GATEWAY_RETENTION_DAYS (30), shadow records,
their minutes (shadow_minutes) and shadow drop counts GATEWAY_SHADOW_RETENTION_DAYS (30); 0
keeps a table forever. The shadow window defaults to the request window for two reasons. The
weekly report of the last full week, written on any day of the week after it, reads back to the
start of its comparison week: 21 days, which also covers the judge's window at the default
`min_window_days` (twice 7 days, from the end of the week); 30 days leaves more than a week to
spare for a late or repeated report. And the report and the judge take the primary's measured
energy and cost from its request record, so a shadow record kept longer than its request would
lose them.

On PostgreSQL, request and shadow records are stored a UTC day per partition
(gateway/db/partitions.py): a day goes whole once all of it is past the window (`drop_days`),
so a record is kept up to a day longer than its window; only the rows of the default partition
(a day whose partition was not made in time) are deleted row by row. Everything else, and
everything on SQLite, is deleted in batches (`prune`).

`gateway serve` runs each round in a process of its own (gateway.periodic.helper_process), below
the serving process's priority, so deleting takes none of the serving process's interpreter lock
or time; the serving process only starts the round, waits for its counts and, at shutdown, has
it end after the batch it is on. On SQLite a day at 16.5 requests a second is minutes of deleting
(docs/operations.md, "Retention while serving").

Each batch deletes at most `batch_rows` rows in its own transaction, so no lock is held long on
PostgreSQL and SQLite's record writer gets the database between two batches. Every replica of
`gateway serve` runs the job, and that is harmless: a batch deletes only rows already past the
window, so the outcome does not depend on which replica deletes them; a row another replica
deleted first is simply not found, and on PostgreSQL a batch skips the rows another replica's
batch holds (SKIP LOCKED), so replicas share the work instead of waiting for each other; and
one replica at a time makes and drops a table's days, the others leaving it to that one.

Cost models (one stored per retraining, every 10 s at most under heavy traffic) are kept as long
as request records: a model older than the request window explains no request kept. Of those
older, the newest good one stays too, as the model in force at the window's edge, which the
weekly report of a week starting there reads.

Stored shadow texts are not handled here: the shadow writer erases them every minute once their
`text_expires_at` has passed (gateway/shadow/records.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import sqlalchemy as sa

from gateway.db import partitions
from gateway.db.connection import connect, reachable_apart
from gateway.db.schema import (
    backend_energy,
    cost_models,
    parking_events,
    request_minutes,
    request_records,
    shadow_drops,
    shadow_minutes,
    shadow_records,
)
from gateway.errors import DatabaseUnavailable
from gateway.periodic import Periodic, helper_process
from gateway.settings import Settings

log = logging.getLogger(__name__)

DAY_S = 86400.0
BATCH_ROWS = 1000
# How far back the weekly report of the last full week reads (see the module docstring).
REPORT_REACH_DAYS = 21


@dataclass(frozen=True, slots=True)
class Windows:
    """How many days each kind of record is kept; 0 keeps it forever."""

    request_days: float = 30.0
    shadow_days: float = 30.0

    @classmethod
    def of(cls, settings: Settings) -> Windows:
        """Return the windows the settings ask for."""
        return cls(settings.retention_days, settings.shadow_retention_days)

    def days(self) -> dict[sa.Table, float]:
        """Return the window of every table retention looks after."""
        return {
            request_records: self.request_days,
            request_minutes: self.request_days,
            parking_events: self.request_days,
            backend_energy: self.request_days,
            shadow_records: self.shadow_days,
            shadow_minutes: self.shadow_days,
            shadow_drops: self.shadow_days,
        }

    def cutoffs(self, now: float) -> dict[sa.Table, float]:
        """Return, per table with a window, the time before which its rows are deleted."""
        return {table: now - days * DAY_S for table, days in self.days().items() if days > 0}


def delete_batch(db: sa.Engine, table: sa.TableClause, cutoff: float, rows: int) -> int:
    """Delete up to `rows` rows of `table` older than `cutoff`; return how many went."""
    oldest = (
        sa.select(table.c.id)
        .where(table.c.ts < cutoff)
        .limit(rows)
        .with_for_update(skip_locked=True)  # PostgreSQL only; SQLite has one writer anyway
    )
    try:
        with db.begin() as conn:
            return int(conn.execute(table.delete().where(table.c.id.in_(oldest))).rowcount or 0)
    except sa.exc.SQLAlchemyError as exc:
        raise DatabaseUnavailable(
            f"cannot delete old rows of {table.name} ({type(exc).__name__})"
        ) from exc


def delete_cost_models(db: sa.Engine, cutoff: float, rows: int) -> int:
    """Delete up to `rows` cost models created before `cutoff`, all but the newest good one."""
    m = cost_models.c
    in_force = (
        sa.select(sa.func.max(m.version)).where(m.status == "ok", m.created < cutoff)
    ).scalar_subquery()
    oldest = (
        sa.select(m.version)
        .where(m.created < cutoff, m.version != sa.func.coalesce(in_force, -1))
        .limit(rows)
    )
    try:
        with db.begin() as conn:
            return int(conn.execute(cost_models.delete().where(m.version.in_(oldest))).rowcount)
    except sa.exc.SQLAlchemyError as exc:
        raise DatabaseUnavailable(f"cannot delete old cost models ({type(exc).__name__})") from exc


def prune(
    db: sa.Engine,
    windows: Windows,
    now: float,
    *,
    batch_rows: int = BATCH_ROWS,
    pause_s: float = 0.0,
    stopping: threading.Event | multiprocessing.synchronize.Event | None = None,
) -> dict[str, int]:
    """Delete every record older than its window, batch by batch; return the count per table.

    Pauses `pause_s` between batches, and returns early once `stopping` is set. On PostgreSQL
    a partitioned table's batches read its default partition: its days go whole (`drop_days`).
    """
    batches: dict[str, Callable[[], int]] = {}
    for table, cutoff in windows.cutoffs(now).items():
        rows: sa.TableClause = table
        if db.dialect.name == "postgresql" and table.name in partitions.PARTITIONED:
            rows = sa.table(partitions.default_name(table.name), sa.column("id"), sa.column("ts"))
        batches[table.name] = functools.partial(delete_batch, db, rows, cutoff, batch_rows)
    if windows.request_days > 0:
        cutoff = now - windows.request_days * DAY_S
        batches[cost_models.name] = functools.partial(delete_cost_models, db, cutoff, batch_rows)
    deleted: dict[str, int] = {}
    for name, batch in batches.items():
        deleted[name] = 0
        while stopping is None or not stopping.is_set():
            n = batch()
            deleted[name] += n
            if n < batch_rows:
                break
            if stopping is None:
                time.sleep(pause_s)
            else:
                stopping.wait(pause_s)  # a stop ends the pause too
    return deleted


def drop_days(db: sa.Engine, windows: Windows, now: float) -> dict[str, list[str]]:
    """On PostgreSQL, make the partitioned tables' days ahead and drop each day whose whole
    span is past its table's window; return the partitions dropped per table ({} on SQLite)."""
    if db.dialect.name != "postgresql":
        return {}
    cutoffs = {table.name: cutoff for table, cutoff in windows.cutoffs(now).items()}
    return partitions.maintain(db, now, cutoffs)


class Pruner:
    """Prune on an interval in `gateway serve`, each round in a process of its own; off when the
    interval is 0, on SQLite when every window is 0, and for an in-memory database.

    The first round runs one interval after start; `gateway db prune` runs one at once.
    """

    def __init__(
        self,
        db: sa.Engine,
        windows: Windows,
        interval_s: float,
        *,
        batch_rows: int = BATCH_ROWS,
        pause_s: float = 0.05,
        wall: Callable[[], float] = time.time,
    ):
        self._db = db
        self._url = db.url.render_as_string(hide_password=False)
        self.windows = windows
        self._batch_rows = batch_rows
        self._pause_s = pause_s
        self._wall = wall
        # Seen by each round's process: once set, its round ends after the batch it is on.
        self._stopping = multiprocessing.get_context("spawn").Event()
        self.pid: int | None = None  # the process of the last round
        # On PostgreSQL the rounds also make the days ahead, which every window needs. An
        # in-memory database ends with the serving process, and a round's process cannot open it.
        partitioned = db.dialect.name == "postgresql"
        self.enabled = (
            interval_s > 0
            and reachable_apart(self._url)
            and (partitioned or bool(windows.cutoffs(0.0)))
        )
        self.periodic = Periodic("retention", interval_s, self.prune)

    async def keep_ahead(self) -> None:
        """Make the partitioned tables' days ahead now, as `gateway serve` starts (PostgreSQL)."""
        # A few statements before serving begins: a thread, not seconds of starting a process.
        try:
            await asyncio.to_thread(drop_days, self._db, Windows(0, 0), self._wall())
        except DatabaseUnavailable as exc:
            log.warning("retention: cannot make the days ahead now: %s", exc)

    async def prune(self) -> dict[str, int]:
        """Run one round in a process of its own: drop the days past the window (PostgreSQL),
        then delete the rows; return how many rows each table lost one by one (the days
        dropped are logged)."""
        now = self._wall()
        async with self._process() as process:
            await self._drop_days(process, self.windows, now)
            deleted = await asyncio.wrap_future(
                process.submit(_prune_apart, self.windows, now, self._batch_rows, self._pause_s)
            )
        if any(deleted.values()):
            log.info(
                "retention: deleted %s",
                ", ".join(f"{n} {table}" for table, n in deleted.items()),
            )
        return deleted

    @contextlib.asynccontextmanager
    async def _process(self) -> AsyncIterator[ProcessPoolExecutor]:
        # A process for each round: rounds come an interval apart (an hour by default), not
        # worth a process kept idle between them.
        # At the writer's priority, not lower: on SQLite a round at nice 19 on a saturated core
        # held the write lock for seconds between its slices of CPU, and the serving p99 went
        # from 10 to 150 ms (docs/operations.md, "Retention while serving").
        process = helper_process(_open, (self._url, self._stopping))
        try:
            self.pid = await asyncio.wrap_future(process.submit(os.getpid))
            yield process
        finally:
            # Waits for the round to end, which a stop makes the end of the batch it is on.
            await asyncio.to_thread(process.shutdown)

    async def _drop_days(self, process: ProcessPoolExecutor, windows: Windows, now: float) -> None:
        # A failure leaves records in the default partition, or old days in place, until a
        # round that succeeds; the round's deletes go on meanwhile.
        try:
            await asyncio.wrap_future(process.submit(_drop_days_apart, windows, now))
        except DatabaseUnavailable as exc:
            log.warning("retention: cannot make or drop days now: %s", exc)

    def start(self) -> None:
        if not self.enabled:
            return
        for name, days in (
            ("GATEWAY_RETENTION_DAYS", self.windows.request_days),
            ("GATEWAY_SHADOW_RETENTION_DAYS", self.windows.shadow_days),
        ):
            if 0 < days < REPORT_REACH_DAYS:
                log.warning(
                    "%s=%g deletes records the weekly report still reads (up to %d days back)",
                    name,
                    days,
                    REPORT_REACH_DAYS,
                )
        self._stopping.clear()
        self.periodic.start()

    async def stop(self) -> None:
        # A round in its process finishes the batch it is on instead of the whole backlog.
        self._stopping.set()
        await self.periodic.stop()


# The round's process: its own connection pool, and the event that stops its round.
_db: sa.Engine | None = None
_stopping: multiprocessing.synchronize.Event | None = None


def _open(url: str, stopping: multiprocessing.synchronize.Event) -> None:
    global _db, _stopping
    _db, _stopping = connect(url), stopping


def _drop_days_apart(windows: Windows, now: float) -> dict[str, list[str]]:
    assert _db is not None
    return drop_days(_db, windows, now)


def _prune_apart(windows: Windows, now: float, batch_rows: int, pause_s: float) -> dict[str, int]:
    assert _db is not None
    return prune(_db, windows, now, batch_rows=batch_rows, pause_s=pause_s, stopping=_stopping)
