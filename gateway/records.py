"""Request records: one row per downstream request, written off the request path in batches."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, fields

import sqlalchemy as sa

from gateway.db import metadata
from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

request_records = sa.Table(
    "request_records",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("decision_id", sa.String(32), nullable=False, unique=True),
    sa.Column("ts", sa.Float, nullable=False, index=True, comment="Arrival, Unix seconds."),
    sa.Column("endpoint", sa.String(16), nullable=False),
    sa.Column("route", sa.String(64)),
    sa.Column("pool", sa.String(64)),
    sa.Column("backend", sa.String(64)),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(64)),
    sa.Column("slo_class", sa.String(32)),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("prompt_tokens_estimated", sa.Integer),
    sa.Column("max_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("queue_ms", sa.Float),
    sa.Column("ttft_ms", sa.Float),
    sa.Column("tpot_ms", sa.Float),
    sa.Column("e2e_ms", sa.Float),
    sa.Column("gateway_ms", sa.Float),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("fallback", sa.Boolean, nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("error", sa.String(64)),
    sa.Column("energy_j", sa.Float, comment="Measured energy attributed to the request."),
    sa.Column("cost_usd", sa.Float, comment="Energy price plus the device time it held."),
    sa.Column(
        "energy_estimated",
        sa.Boolean,
        comment="True when the pool reported no power and energy_j is from nominal figures.",
    ),
    sa.Column("concurrent", sa.Integer, comment="Requests on the backend, this one included."),
    sa.Column("predicted_ttft_ms", sa.Float),
    sa.Column("predicted_e2e_ms", sa.Float),
    sa.Column("predicted_energy_j", sa.Float),
)


@dataclass(slots=True)
class RequestRecord:
    """What the gateway keeps about one request; never the prompt or the answer."""

    decision_id: str
    ts: float
    endpoint: str
    route: str | None
    pool: str | None
    backend: str | None
    model: str
    tenant: str | None
    slo_class: str | None
    stream: bool
    prompt_tokens: int | None
    prompt_tokens_estimated: int | None
    max_tokens: int | None
    completion_tokens: int | None
    queue_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    gateway_ms: float | None
    attempts: int
    fallback: bool
    status: int
    error: str | None
    energy_j: float | None = None
    cost_usd: float | None = None
    energy_estimated: bool | None = None
    concurrent: int | None = None
    predicted_ttft_ms: float | None = None
    predicted_e2e_ms: float | None = None
    predicted_energy_j: float | None = None

    def row(self) -> dict[str, object]:
        """Return the record as a table row (a shallow dict; asdict's deep copy costs more)."""
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in fields(RequestRecord))


class RecordWriter:
    """Queue records on the event loop and insert them in batches from a worker thread.

    Adding a record never waits: when the bounded queue is full the record is dropped and
    counted, so a slow database cannot slow or stall requests.
    """

    def __init__(
        self,
        engine: sa.Engine,
        metrics: GatewayMetrics,
        *,
        flush_interval_s: float = 0.5,
        batch_size: int = 500,
        max_pending: int = 100_000,
    ):
        self._engine = engine
        self._metrics = metrics
        self._interval = flush_interval_s
        self._batch_size = batch_size
        self._queue: asyncio.Queue[RequestRecord] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None

    def add(self, record: RequestRecord) -> None:
        """Queue a record for writing."""
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._metrics.records_dropped.inc()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="record-writer")

    async def stop(self) -> None:
        """Stop the worker after writing every queued record."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        while not self._queue.empty():
            await self._write(self._take())

    async def flush(self) -> None:
        """Write every queued record now."""
        while not self._queue.empty():
            await self._write(self._take())

    def _take(self) -> list[RequestRecord]:
        batch: list[RequestRecord] = []
        while len(batch) < self._batch_size and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            while not self._queue.empty():
                await self._write(self._take())

    async def _write(self, batch: list[RequestRecord]) -> None:
        if not batch:
            return
        rows = [r.row() for r in batch]
        try:
            await asyncio.to_thread(self._insert, rows)
        except Exception:
            log.exception("could not write %d request records", len(rows))
            self._metrics.records_dropped.inc(len(rows))
            return
        self._metrics.records_written.inc(len(rows))

    def _insert(self, rows: list[dict[str, object]]) -> None:
        with self._engine.begin() as conn:
            conn.execute(request_records.insert(), rows)
