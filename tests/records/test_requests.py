"""Request records: migrations on SQLite and PostgreSQL, and batched writes through them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import sqlalchemy as sa
from rows import request_record, same_decision
from waiting import until

from gateway.db.connection import connect, upgrade
from gateway.db.schema import request_records
from gateway.metrics import GatewayMetrics
from gateway.records.requests import RecordWriter


def test_writer_inserts_every_queued_record_in_batches(database: str) -> None:
    upgrade(database)
    db = connect(database)
    metrics = GatewayMetrics()

    async def scenario() -> None:
        writer = RecordWriter(db, metrics, flush_interval_s=0.01, batch_size=7)
        writer.start()
        for n in range(50):
            writer.add(request_record(n))
        await until(  # the background flushes write them, 7 at a time
            lambda: metrics.registry.get_sample_value("gateway_records_written_total") == 50,
            message="the background flushes never wrote the first 50 records",
        )
        for n in range(50, 60):
            writer.add(request_record(n))
        await writer.stop()

    asyncio.run(scenario())
    with db.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(request_records)).scalar()
    db.dispose()
    assert count == 60
    assert metrics.registry.get_sample_value("gateway_records_written_total") == 60


def test_a_large_batch_is_written_whole_with_every_field_and_a_refused_row_alone(
    database: str,
) -> None:
    upgrade(database)
    db = connect(database)
    metrics = GatewayMetrics()
    records = [request_record(n) for n in range(123)]
    records[77].error, records[77].energy_j, records[77].tenant = "upstream_error", 1.5, "acme"

    async def scenario() -> None:
        writer = RecordWriter(db, metrics, batch_size=500)
        for r in records:
            writer.add(r)
        await writer.flush()
        writer.add(same_decision(records[5], 200))  # refused: not unique
        writer.add(request_record(201))
        await writer.stop()

    asyncio.run(scenario())
    with db.connect() as conn:
        rows = conn.execute(sa.select(request_records).order_by(request_records.c.ts)).all()
    db.dispose()
    assert [row.completion_tokens for row in rows] == [*range(123), 201]
    stored = rows[77]._mapping
    assert {k: stored[k] for k in records[77].row()} == records[77].row()
    assert metrics.registry.get_sample_value("gateway_records_written_total") == 124
    assert (
        metrics.registry.get_sample_value(
            "gateway_records_rejected_total", {"table": "request_records"}
        )
        == 1
    )


def test_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(url)
    metrics = GatewayMetrics()

    async def scenario() -> None:
        writer = RecordWriter(connect(url), metrics, max_pending=5)
        for n in range(8):
            writer.add(request_record(n))
        await writer.stop()

    asyncio.run(scenario())
    assert metrics.registry.get_sample_value("gateway_records_dropped_total") == 3
    assert metrics.registry.get_sample_value("gateway_records_written_total") == 5
