"""Batched writes: queue rows on the event loop and insert them elsewhere.

The inserts run in a worker thread, or in the writer process (gateway.records.writer) when the
gateway serves.

Adding never waits, so a slow or unreachable database cannot slow or stall requests. Rows the
database cannot take are kept and retried every round, oldest first:

    add ─▶ queue (max_pending records) ─────────insert──────────▶ database
                 │ insert failed                                   ▲
                 ▼                                                 │ retried every round
           held in memory (max_held rows) ─────────────────────────┤
                 │ full                                            │ replayed, then deleted
                 ▼                                                 │
           spill file <spill_dir>/<table>.jsonl (max_spill_bytes) ─┘

At shutdown, rows still held are spilled, so the next start replays them. A record is lost
only past those limits (counted as dropped: the queue is full, or memory and the spill file
are) or when the database refuses the row itself (counted as rejected: a constraint, which no
retry can fix). Request records and shadow records are both written this way.

A writer may be followed by another that updates the rows it inserts (a record's energy, known
seconds after the record): each round the follower writes after it, and only while every row
the first one took is in the database, else its updates are held and spilled behind them. So an
update never reaches the database before its row, through an outage or a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import os
import typing
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import orjson
import sqlalchemy as sa
from prometheus_client import Counter

from gateway.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

DEFAULT_MAX_SPILL_BYTES = 256 * 1024 * 1024
# A batch goes to the database in statements of this many rows, and the writer thread yields
# the CPU between them. On a core it shares with the event loop, the scheduler otherwise lets
# the thread run out its time slice, milliseconds of SQLite work, while a request that has just
# arrived waits; 50 rows are about 0.4 ms of it. Measured on one core: p99 2.7-3.0 ms with
# whole batches, 1.4-1.9 ms with this at 1 connection; 6.3-6.6 against 4.5-4.8 ms at 8
# (docs/performance.md). On PostgreSQL a batch is then several round trips, in this thread.
ROWS_PER_STATEMENT = 50
yield_cpu = getattr(os, "sched_yield", lambda: None)


class Row(Protocol):
    def row(self) -> dict[str, Any]: ...


T = TypeVar("T", bound=Row)


class Statement:
    """A statement compiled once for a database, taking rows of plain values as they are.

    Rows go to the driver without SQLAlchemy's per-row parameter processing, which is half the
    CPU of a batch insert; they hold only str, int, float, bool and None, which need none.
    """

    def __init__(self, clause: sa.Insert | sa.TextClause, columns: tuple[str, ...], db: sa.Engine):
        compiled = typing.cast(
            sa.sql.compiler.SQLCompiler,
            clause.compile(dialect=db.dialect, column_keys=list(columns)),
        )
        self.columns = columns
        self.sql = str(compiled)
        # Set for a positional paramstyle (SQLite's ?), empty for a named one (psycopg's).
        self.positions = tuple(compiled.positiontup or ())
        # Readers of a row's (a record's) values in the driver's order; a single column, and
        # named paramstyles, take the general path.
        several = len(self.positions) > 1
        self._from_row = operator.itemgetter(*self.positions) if several else None
        self._from_record = operator.attrgetter(*self.positions) if several else None

    @classmethod
    def insert(cls, table: sa.Table, db: sa.Engine) -> Statement:
        """Insert a row into `table`: a value for each column but its generated key."""
        generated = table.autoincrement_column
        columns = tuple(c.name for c in table.columns if c is not generated)
        return cls(table.insert(), columns, db)

    @classmethod
    def update(
        cls, table: sa.Table, keys: tuple[str, ...], values: tuple[str, ...], db: sa.Engine
    ) -> Statement:
        """Set `values` on the rows of `table` whose `keys` equal a row's."""
        where = " AND ".join(f"{k} = :{k}" for k in keys)
        sets = ", ".join(f"{v} = :{v}" for v in values)
        return cls(sa.text(f"UPDATE {table.name} SET {sets} WHERE {where}"), values + keys, db)

    def values(self, records: list[Any]) -> list[Any]:
        """Return records as the driver takes them, read from the attributes named as columns.

        A dataclass record whose fields are its table's columns goes to the driver without a
        row dict in between; a record without one of them takes the row path.
        """
        read = self._from_record
        if read is not None:
            try:
                return [read(record) for record in records]
            except AttributeError:
                pass
        return self.params([record.row() for record in records])

    def params(self, rows: list[dict[str, Any]]) -> list[Any]:
        """Return the rows as the driver takes them, a missing column as NULL."""
        read = self._from_row
        if read is not None:
            try:
                return [read(row) for row in rows]
            except KeyError:  # a row spilled by an older version, without a newer column
                pass
        if self.positions:
            return [tuple(row.get(k) for k in self.positions) for row in rows]
        return [{k: row.get(k) for k in self.columns} for row in rows]


def _execute(db: sa.Engine, sql: str, values: list[Any]) -> None:
    """Insert rows of driver values in one transaction, in statements of ROWS_PER_STATEMENT."""
    with db.begin() as conn:
        for start in range(0, len(values), ROWS_PER_STATEMENT):
            if start:
                yield_cpu()
            conn.exec_driver_sql(sql, values[start : start + ROWS_PER_STATEMENT])


def insert_batch(db: sa.Engine, sql: str, values: list[Any]) -> tuple[int, list[str]]:
    """Insert rows of driver values in one transaction; row by row if the database refuses one.

    Return how many rows were written and, for each row the database refused (a constraint,
    which no retry can fix), why. Raise DatabaseUnavailable when it cannot be reached.
    """
    try:
        _execute(db, sql, values)
    except (sa.exc.IntegrityError, sa.exc.DataError):
        pass
    except sa.exc.SQLAlchemyError as exc:
        raise DatabaseUnavailable(f"{type(exc).__name__}: {exc}") from exc
    else:
        return len(values), []
    written, refused = 0, []
    for n in range(len(values)):
        if n:
            yield_cpu()
        try:
            _execute(db, sql, values[n : n + 1])
        except (sa.exc.IntegrityError, sa.exc.DataError) as exc:
            refused.append(str(exc.orig))
        except sa.exc.SQLAlchemyError as exc:
            raise DatabaseUnavailable(f"{type(exc).__name__}: {exc}") from exc
        else:
            written += 1
    return written, refused


class Inserter(Protocol):
    """Where batches are inserted: a worker thread here, or the writer process."""

    async def insert(self, sql: str, values: list[Any]) -> tuple[int, list[str]]: ...


class InThread:
    """Insert batches from a worker thread of this process, on its connection pool."""

    def __init__(self, db: sa.Engine):
        self._db = db

    async def insert(self, sql: str, values: list[Any]) -> tuple[int, list[str]]:
        return await asyncio.to_thread(insert_batch, self._db, sql, values)


class BatchWriter(Generic[T]):
    """Write records of one table in batches, every `flush_interval_s`, off the request path.

    Without a `spill_dir`, rows beyond `max_held` that the database cannot take are dropped.
    """

    def __init__(
        self,
        db: sa.Engine,
        table: sa.Table,
        metrics: GatewayMetrics,
        written: Counter,
        dropped: Counter,
        *,
        flush_interval_s: float = 0.5,
        batch_size: int = 500,
        max_pending: int = 100_000,
        max_held: int = 10_000,
        spill_dir: Path | None = None,
        max_spill_bytes: int = DEFAULT_MAX_SPILL_BYTES,
        inserter: Inserter | None = None,
        name: str | None = None,
        statement: Statement | None = None,
    ):
        self._db = db
        self._inserter = inserter or InThread(db)
        # What its rows are called (spill file, metrics, logs) and how they are written: the
        # table's own, inserted, unless said otherwise.
        self.name = name = name or table.name
        self._statements: dict[str, Statement] = {}
        self._own = statement or self._statement(table)
        self._updates: list[BatchWriter[Any]] = []
        self._written = written
        self._dropped = dropped
        self._interval = flush_interval_s
        self._batch_size = batch_size
        # A deque, not an asyncio.Queue: nothing waits on it, and adding is on every request.
        self._queue: deque[T] = deque()
        self._max_pending = max_pending
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._held: deque[dict[str, Any]] = deque()
        self._max_held = max_held
        self._spill = None if spill_dir is None else Path(spill_dir) / f"{name}.jsonl"
        self._max_spill_bytes = max_spill_bytes
        self._spill_bytes = 0
        self._spill_rows = 0
        self._replayed_to = 0  # offset in the spill file before which every row is written
        self._outage = False
        self._held_gauge = metrics.records_buffered.labels(name, "memory")
        self._spill_gauge = metrics.records_buffered.labels(name, "disk")
        self._spilled = metrics.records_spilled.labels(name)
        self._replayed = metrics.records_replayed.labels(name)
        self._rejected = metrics.records_rejected.labels(name)
        self._failures = metrics.record_write_failures.labels(name)
        if self._spill is not None and self._spill.exists():
            self._count_spill()

    def add(self, record: T) -> None:
        """Queue a record for writing."""
        if len(self._queue) >= self._max_pending:
            self._dropped.inc()
        else:
            self._queue.append(record)

    def follow(self, updates: BatchWriter[Any]) -> None:
        """Have `updates`, a writer of updates to the rows this one inserts, write each round
        after this one, and only once every row it holds is in the database: an update never
        reaches the database before the row it updates, through an outage and a restart too.
        """
        self._updates.append(updates)

    def start(self) -> None:
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-writer")

    async def stop(self, *, write: bool = True) -> None:
        """Stop the worker after writing everything queued; spill what the database refuses
        (everything, without `write`)."""
        self._stopping.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if write:
            await self.flush()
            while self._queue:  # added while the last round wrote
                await self.flush()
        else:
            await self._hold()
        if self._held:
            rows = list(self._held)
            self._held.clear()
            self._held_gauge.set(0)
            await self._spill_or_drop(rows)
        for updates in self._updates:
            await updates.stop(write=write and self._caught_up)

    async def flush(self, limit: int | None = None) -> None:
        """Write what is held, spilled and queued (the first `limit` queued), oldest first;
        keep what cannot be written; then let the writers that follow this one write theirs.

        Records queued while it writes wait for the next round: chasing them under load would
        write them a few at a time, at several times the CPU per row of a full batch.
        """
        # The updates queued by now update rows queued by now, which this round writes.
        due = [len(updates._queue) for updates in self._updates]
        await self._flush(len(self._queue) if limit is None else min(limit, len(self._queue)))
        for updates, queued in zip(self._updates, due, strict=True):
            if self._caught_up:
                await updates.flush(queued)
            else:
                await updates._hold()

    @property
    def _caught_up(self) -> bool:
        """Whether every row this writer took is in the database (none held or spilled)."""
        return not self._held and self._spill_bytes == 0

    async def _flush(self, queued: int) -> None:
        if await self._write_backlog():
            while queued > 0:
                records = self._take(min(queued, self._batch_size))
                queued -= len(records)
                # Read on the loop: a thread would hold the interpreter as long, and a record's
                # values are what both a worker thread and the writer process take.
                if not await self._write(self._own.values(records)):
                    await self._keep([record.row() for record in records])
                    break
            else:
                return
        await self._hold()

    async def _hold(self) -> None:
        """Move the queue out of the way, to memory and the spill file, keeping its order: the
        database is down (or the rows an update needs are not in it yet)."""
        if self._queue:
            await self._keep([record.row() for record in self._take(len(self._queue))])

    async def tick(self) -> None:
        """Do one round of the worker's periodic work (subclasses add to it)."""
        await self.flush()

    async def insert(self, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        """Insert rows into a table in one transaction, as this writer's batches go."""
        statement = self._statement(table)
        _, refused = await self._inserter.insert(statement.sql, statement.params(rows))
        for reason in refused:
            log.error("the database refused a %s row: %s", table.name, reason)

    def _statement(self, table: sa.Table) -> Statement:
        statement = self._statements.get(table.name)
        if statement is None:
            statement = self._statements[table.name] = Statement.insert(table, self._db)
        return statement

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval)
            if self._stopping.is_set():
                return  # stop() does the last round
            try:
                await self.tick()
            except Exception:
                log.exception("%s writer round failed", self.name)

    def _take(self, n: int) -> list[T]:
        batch: list[T] = []
        take = self._queue.popleft
        while len(batch) < n and self._queue:
            batch.append(take())
        return batch

    async def _write(self, values: list[Any]) -> bool:
        """Insert rows of driver values; return False, keeping nothing, when the database is
        unreachable. Rows the database refuses are counted as rejected, not kept."""
        name = self.name
        try:
            written, refused = await self._inserter.insert(self._own.sql, values)
        except DatabaseUnavailable as exc:
            self._failures.inc()
            if not self._outage:
                self._outage = True
                log.error("cannot write to %s; keeping records to retry: %s", name, exc)
            return False
        if self._outage:
            self._outage = False
            log.warning("%s writable again; writing the records kept", name)
        self._written.inc(written)
        for reason in refused:
            log.error("the database refused a %s row: %s", name, reason)
        self._rejected.inc(len(refused))
        return True

    async def _write_backlog(self) -> bool:
        """Write held rows, then replay the spill file; return whether all of it is written."""
        while self._held:
            rows = [self._held[i] for i in range(min(self._batch_size, len(self._held)))]
            if not await self._write(self._own.params(rows)):
                return False
            for _ in rows:
                self._held.popleft()
            self._held_gauge.set(len(self._held))
        if self._spill is None or self._spill_bytes == 0:
            return True
        while True:
            rows, end = await asyncio.to_thread(self._read_spill, self._replayed_to)
            if end == self._replayed_to:
                break
            if rows and not await self._write(self._own.params(rows)):
                return False
            self._replayed_to = end
            self._spill_rows = max(0, self._spill_rows - len(rows))
            self._replayed.inc(len(rows))
            self._spill_gauge.set(self._spill_rows)
        await asyncio.to_thread(self._spill.unlink, missing_ok=True)
        self._replayed_to = self._spill_bytes = self._spill_rows = 0
        self._spill_gauge.set(0)
        return True

    async def _keep(self, rows: list[dict[str, Any]]) -> None:
        """Hold rows in memory up to max_held, spill the rest."""
        room = max(0, self._max_held - len(self._held))
        self._held.extend(rows[:room])
        self._held_gauge.set(len(self._held))
        if len(rows) > room:
            await self._spill_or_drop(rows[room:])

    async def _spill_or_drop(self, rows: list[dict[str, Any]]) -> None:
        spilled = await asyncio.to_thread(self._append_spill, rows)
        self._spilled.inc(spilled)
        self._spill_gauge.set(self._spill_rows)
        if spilled < len(rows):
            lost = len(rows) - spilled
            self._dropped.inc(lost)
            log.error(
                "dropped %d %s rows: memory (%d rows) and the spill file (%d bytes) are full",
                lost,
                self.name,
                self._max_held,
                self._max_spill_bytes if self._spill is not None else 0,
            )

    def _append_spill(self, rows: list[dict[str, Any]]) -> int:
        """Append rows to the spill file up to its size limit; return how many were written."""
        if self._spill is None:
            return 0
        lines = []
        size = self._spill_bytes
        for row in rows:
            line = orjson.dumps(row) + b"\n"
            if size + len(line) > self._max_spill_bytes:
                break
            lines.append(line)
            size += len(line)
        if not lines:
            return 0
        try:
            self._spill.parent.mkdir(parents=True, exist_ok=True)
            with self._spill.open("ab") as f:
                f.write(b"".join(lines))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            log.error("cannot spill %s rows to %s: %s", self.name, self._spill, exc)
            return 0
        self._spill_bytes = size
        self._spill_rows += len(lines)
        return len(lines)

    def _read_spill(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """Read up to one batch of spilled rows from offset; return them and the next offset."""
        assert self._spill is not None
        rows: list[dict[str, Any]] = []
        try:
            f = self._spill.open("rb")
        except FileNotFoundError:
            return rows, offset
        end = offset
        with f:
            f.seek(offset)
            while len(rows) < self._batch_size:
                line = f.readline()
                if not line.endswith(b"\n"):
                    break  # end of file, or a line cut short by a crash while spilling
                end += len(line)
                try:
                    rows.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    log.error("skipping an unreadable line in %s", self._spill)
                    self._rejected.inc()
        return rows, end

    def _count_spill(self) -> None:
        """Take up the spill file a previous run left, to replay it."""
        assert self._spill is not None
        data = self._spill.read_bytes()
        self._spill_bytes = len(data)
        self._spill_rows = data.count(b"\n")
        self._spill_gauge.set(self._spill_rows)
        log.warning(
            "found %d %s rows spilled by an earlier run in %s; they will be replayed",
            self._spill_rows,
            self.name,
            self._spill,
        )
