"""Shadow records: the tables and their migration, the batch writer, text retention, summary."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from rows import shadow_record

from gateway.db.connection import connect
from gateway.db.schema import shadow_records
from gateway.metrics import GatewayMetrics
from gateway.shadow.records import ShadowWriter


def test_writer_inserts_every_record_in_batches(database: str) -> None:
    db, metrics = connect(database), GatewayMetrics()

    async def scenario() -> None:
        writer = ShadowWriter(db, metrics, flush_interval_s=0.01, batch_size=7)
        writer.start()
        for n in range(30):
            writer.add(shadow_record(n))
        await writer.stop()

    asyncio.run(scenario())
    with db.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(shadow_records)).scalar()
    assert count == 30
    assert metrics.registry.get_sample_value("gateway_shadow_records_written_total") == 30


def test_stored_texts_are_erased_after_their_retention(database: str) -> None:
    db, now = connect(database), [5_000.0]
    writer = ShadowWriter(db, GatewayMetrics(), wall=lambda: now[0])
    for n, expires in enumerate((4_000.0, 6_000.0)):
        writer.add(shadow_record(n, primary_text="a", candidate_text="b", text_expires_at=expires))
    asyncio.run(writer.flush())
    assert asyncio.run(writer.purge()) == 1
    with db.connect() as conn:
        texts = conn.execute(
            sa.select(shadow_records.c.primary_text, shadow_records.c.candidate_text).order_by(
                shadow_records.c.id
            )
        ).all()
    assert [tuple(t) for t in texts] == [(None, None), ("a", "b")]
