"""Shadow records: the tables and their migration, the batch writer, text retention, summary."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from alembic import command

from gateway.db.engine import alembic_config, make_engine, upgrade
from gateway.db.schema import shadow_records
from gateway.metrics import GatewayMetrics
from gateway.shadow.records import ShadowRecord, ShadowWriter
from gateway.shadow.summary import summarize, summarize_rows
from gateway.stats import percentile


def record(n: int, **fields: object) -> ShadowRecord:
    values: dict = {
        "decision_id": f"{n:032x}",
        "ts": 1_000.0 + n,
        "route": "chat",
        "model": "m",
        "tenant": "t",
        "kind": "candidate",
        "endpoint": "chat",
        "stream": False,
        "temperature": 0.0,
        "top_p": None,
        "seeded": False,
        "sampled": False,
        "primary_pool": "gpu",
        "primary_backend": "gpu-0",
        "candidate_pool": "cim",
        "candidate_backend": "cim-0",
        "primary_status": 200,
        "candidate_status": 200,
        "candidate_error": None,
        "primary_e2e_ms": 10.0 + n,
        "candidate_e2e_ms": 20.0 + n,
        "exact_match": n % 2 == 0,
        "normalized_match": True,
        "similarity": 0.5,
    }
    values.update(fields)
    return ShadowRecord(**values)


def test_migration_0002_adds_and_removes_the_shadow_tables(database: str) -> None:
    command.downgrade(alembic_config(database), "0001")
    engine = make_engine(database)
    assert not {"shadow_records", "shadow_drops"} & set(sa.inspect(engine).get_table_names())
    upgrade(database, "0002")
    assert {"shadow_records", "shadow_drops"} <= set(
        sa.inspect(make_engine(database)).get_table_names()
    )


def test_writer_inserts_every_record_in_batches(database: str) -> None:
    engine, metrics = make_engine(database), GatewayMetrics()

    async def scenario() -> None:
        writer = ShadowWriter(engine, metrics, flush_interval_s=0.01, batch_size=7)
        writer.start()
        for n in range(30):
            writer.add(record(n))
        await writer.stop()

    asyncio.run(scenario())
    with engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(shadow_records)).scalar()
    assert count == 30
    assert metrics.registry.get_sample_value("gateway_shadow_records_written_total") == 30


def test_stored_texts_are_erased_after_their_retention(database: str) -> None:
    engine, now = make_engine(database), [5_000.0]
    writer = ShadowWriter(engine, GatewayMetrics(), wall=lambda: now[0])
    for n, expires in enumerate((4_000.0, 6_000.0)):
        writer.add(record(n, primary_text="a", candidate_text="b", text_expires_at=expires))
    asyncio.run(writer.flush())
    assert asyncio.run(writer.purge()) == 1
    with engine.connect() as conn:
        texts = conn.execute(
            sa.select(shadow_records.c.primary_text, shadow_records.c.candidate_text).order_by(
                shadow_records.c.id
            )
        ).all()
    assert [tuple(t) for t in texts] == [(None, None), ("a", "b")]


def row(**fields: object) -> dict:
    shadow = record(0, **fields)
    return {name: getattr(shadow, name) for name in ShadowRecord.__slots__}


def test_summary_reports_candidates_beside_their_routes_noise_floor() -> None:
    rows = [
        row(exact_match=True, similarity=1.0, primary_e2e_ms=10.0, candidate_e2e_ms=30.0),
        row(exact_match=False, similarity=0.5, primary_e2e_ms=20.0, candidate_e2e_ms=50.0),
        row(exact_match=None, similarity=None, candidate_status=None,
            candidate_error="upstream_timeout", candidate_e2e_ms=1500.0),
        row(sampled=True, temperature=0.8, exact_match=False, similarity=0.25),
        row(kind="noise", candidate_pool="gpu", exact_match=True, similarity=1.0),
        row(kind="noise", candidate_pool="gpu", sampled=True, exact_match=False, similarity=0.5),
        row(candidate_pool="asic", exact_match=True, similarity=1.0),
    ]  # fmt: skip
    drops = [
        {"route": "chat", "candidate_pool": "cim", "kind": "candidate", "count": 3},
        {"route": "chat", "candidate_pool": "cim", "kind": "candidate", "count": 2},
        {"route": "chat", "candidate_pool": "gpu", "kind": "noise", "count": 1},
    ]
    asic, cim = summarize_rows(rows, drops)
    assert (asic["candidate"], asic["samples"], asic["dropped"]) == ("asic", 1, 0)
    assert cim["route"] == "chat" and cim["candidate"] == "cim"
    assert (cim["samples"], cim["dropped"], cim["noise_dropped"]) == (4, 5, 1)
    assert cim["candidate_error_rate"] == 0.25
    assert cim["exact_match_rate"] == pytest.approx(1 / 3)  # the timed-out copy is no answer
    assert cim["mean_similarity"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert (cim["noise_samples"], cim["noise_exact_match_rate"]) == (2, 0.5)
    assert cim["noise_mean_similarity"] == 0.75
    assert cim["primary_latency_p50_ms"] == 10.0  # primaries of all four copies
    assert cim["candidate_latency_p50_ms"] == 30.0  # answered copies only: 20, 30, 50
    assert cim["primary_energy_j"] is None  # unknown, not zero
    greedy, sampled = cim["greedy"], cim["sampled"]
    assert (greedy["samples"], greedy["exact_match_rate"], greedy["noise_exact_match_rate"]) == (
        3,
        0.5,
        1.0,
    )
    assert (sampled["samples"], sampled["exact_match_rate"], sampled["noise_samples"]) == (
        1,
        0.0,
        1,
    )


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([10.0, 20.0], 95) == pytest.approx(19.5)


def test_summary_filters_by_route_candidate_and_time(database: str) -> None:
    engine = make_engine(database)
    writer = ShadowWriter(engine, GatewayMetrics())
    writer.add(record(1))
    writer.add(record(2, route="other"))
    writer.add(record(3, candidate_pool="asic"))
    writer.add(record(4, kind="noise", candidate_pool="gpu"))
    asyncio.run(writer.flush())
    everything = summarize(engine)
    assert [(s["route"], s["candidate"]) for s in everything] == [
        ("chat", "asic"),
        ("chat", "cim"),
        ("other", "cim"),
    ]
    (cim,) = summarize(engine, route="chat", candidate="cim")
    assert (cim["samples"], cim["noise_samples"]) == (1, 1)
    assert summarize(engine, since=1_003.5) == []
