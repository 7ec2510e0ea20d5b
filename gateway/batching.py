"""Batched writes: queue rows on the event loop and insert them from a worker thread.

Adding never waits: when the bounded queue is full the row is dropped and counted, so a slow
database cannot slow or stall requests. Request records and shadow records are both written
this way.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import fields
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa
from prometheus_client import Counter

log = logging.getLogger(__name__)


class Row(Protocol):
    def row(self) -> dict[str, Any]: ...


T = TypeVar("T", bound=Row)


def row_of(record: Any) -> dict[str, Any]:
    """Return a dataclass record as a table row (shallow; asdict's deep copy costs more)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


class BatchWriter(Generic[T]):
    """Write records of one table in batches, every `flush_interval_s`, off the request path."""

    def __init__(
        self,
        engine: sa.Engine,
        table: sa.Table,
        written: Counter,
        dropped: Counter,
        *,
        flush_interval_s: float = 0.5,
        batch_size: int = 500,
        max_pending: int = 100_000,
    ):
        self._engine = engine
        self._table = table
        self._written = written
        self._dropped = dropped
        self._interval = flush_interval_s
        self._batch_size = batch_size
        self._queue: asyncio.Queue[T] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None

    def add(self, record: T) -> None:
        """Queue a record for writing."""
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._dropped.inc()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"{self._table.name}-writer")

    async def stop(self) -> None:
        """Stop the worker after writing everything queued."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()

    async def flush(self) -> None:
        """Write everything queued now."""
        while not self._queue.empty():
            batch: list[T] = []
            while len(batch) < self._batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._write(batch)

    async def tick(self) -> None:
        """Do one round of the worker's periodic work (subclasses add to it)."""
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.tick()
            except Exception:
                log.exception("%s writer round failed", self._table.name)

    async def _write(self, batch: list[T]) -> None:
        rows = [r.row() for r in batch]
        try:
            await asyncio.to_thread(self.insert, self._table, rows)
        except Exception:
            log.exception("could not write %d rows to %s", len(rows), self._table.name)
            self._dropped.inc(len(rows))
            return
        self._written.inc(len(rows))

    def insert(self, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        with self._engine.begin() as conn:
            conn.execute(table.insert(), rows)
