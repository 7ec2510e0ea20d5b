"""The writer process: batches of records go into the database from a process of their own.

The serving process keeps everything that makes records safe (the bounded queue, the rows held
while the database is down, the spill file, the flush at SIGTERM: gateway.records.batching);
this process only runs the INSERTs. So a batch's driver work, SQLite's commits and WAL
checkpoints, and PostgreSQL's round trips do not take the serving process's interpreter lock,
and run below its priority on a core they share with its event loop:

    serving process                                     writer process (gateway.periodic)
    BatchWriter ── sql, driver values (pickled) ──▶     insert_batch(db, ...)
                ◀── rows written, rows refused ────     one transaction, or row by row

A writer process that dies (killed, out of memory) loses nothing: the batch it held is still
the serving process's, kept and retried like a batch the database could not take, by a new
process started for the next round. As with a batch committed just as its connection broke, a
retried request record is refused as a duplicate (its decision id and time are unique) rather
than stored twice (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import sqlalchemy as sa

from gateway.db.connection import connect
from gateway.errors import DatabaseUnavailable
from gateway.periodic import helper_process
from gateway.records.batching import insert_batch

_db: sa.Engine | None = None  # the writer process's own


def _open(url: str) -> None:
    global _db
    _db = connect(url)


def _insert(sql: str, values: list[Any]) -> tuple[int, list[str], int]:
    assert _db is not None
    written, refused = insert_batch(_db, sql, values)
    return written, refused, os.getpid()


class WriterProcess:
    """Insert batches in a spawned process that opens its own connection pool on the database URL.

    It starts with the first batch, so a gateway that writes nothing starts none.
    """

    def __init__(self, url: str):
        self._url = url
        self._pool: ProcessPoolExecutor | None = None
        self.pid: int | None = None  # the process that wrote the last batch

    async def insert(self, sql: str, values: list[Any]) -> tuple[int, list[str]]:
        """Insert rows of driver values; return how many were written and why others were refused.

        Raises DatabaseUnavailable when the database, or the writer process, cannot take them.
        """
        try:
            written, refused, self.pid = await asyncio.get_running_loop().run_in_executor(
                self._process(), _insert, sql, values
            )
        except BrokenProcessPool as exc:
            self.close()  # it died (killed, out of memory): the next round starts a new one
            raise DatabaseUnavailable("the writer process died") from exc
        return written, refused

    def _process(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = helper_process(_open, (self._url,))
        return self._pool

    def close(self) -> None:
        """End the process once the batches sent to it are written (blocks: call it off the
        event loop)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
