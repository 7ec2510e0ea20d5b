"""Retention: old records go, batch by batch, each table by its own window; the rest stay."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from rows import DAY, NOW, store_rows
from waiting import until, wait_for

from gateway.db.connection import connect
from gateway.db.retention import Pruner, Windows, prune
from gateway.db.schema import (
    BackendEnergy,
    ParkingEvent,
    backend_energy,
    cost_models,
    parking_events,
    request_minutes,
    request_records,
    shadow_drops,
    shadow_minutes,
    shadow_records,
)
from harness.gateways import run_gateway
from policies import fleet_policy


def kept(db: sa.Engine, table: sa.Table) -> list[str]:
    with db.connect() as conn:
        return sorted(conn.execute(sa.select(table.c.route)).scalars())


def routes(*ages_days: float) -> list[str]:
    return sorted(f"age-{age:g}" for age in ages_days)


@pytest.fixture
def db(database: str) -> Iterator[sa.Engine]:
    db = connect(database)
    yield db
    db.dispose()


def deletes(db: sa.Engine) -> list[int]:
    """Start recording the row count of every DELETE the database runs; return the list."""
    counts: list[int] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            counts.append(cursor.rowcount)

    sa.event.listen(db, "after_cursor_execute", count)
    return counts


def test_deletes_exactly_the_rows_past_each_tables_window(db: sa.Engine) -> None:
    ages = [45, 30.5, 30, 29.9, 10.5, 9.5, 1, 0]
    for table in (request_records, request_minutes, shadow_records, shadow_minutes, shadow_drops):
        store_rows(db, table, ages)

    with db.begin() as conn:
        conn.execute(
            parking_events.insert(),
            [ParkingEvent(NOW - a * DAY, "gpu", f"age-{a:g}", "wake", "").row() for a in ages],
        )
        conn.execute(
            backend_energy.insert(),
            [BackendEnergy(NOW - a * DAY, "gpu", f"age-{a:g}", 60, 0, 1, 0).row() for a in ages],
        )

    deleted = prune(db, Windows(request_days=30, shadow_days=10), NOW)

    # A row exactly at the window's edge is kept: it is not older than the window.
    assert kept(db, request_records) == routes(30, 29.9, 10.5, 9.5, 1, 0)
    assert kept(db, request_minutes) == routes(30, 29.9, 10.5, 9.5, 1, 0)  # as their records
    with db.connect() as conn:
        parked = sorted(conn.execute(sa.select(parking_events.c.backend)).scalars())
    assert parked == routes(30, 29.9, 10.5, 9.5, 1, 0)  # kept as long as request records
    with db.connect() as conn:
        drawn = sorted(conn.execute(sa.select(backend_energy.c.backend)).scalars())
    assert drawn == routes(30, 29.9, 10.5, 9.5, 1, 0)  # and the backends' draw too
    for table in (shadow_records, shadow_minutes, shadow_drops):
        assert kept(db, table) == routes(9.5, 1, 0)
    assert deleted == {
        "request_records": 2,
        "request_minutes": 2,
        "parking_events": 2,
        "backend_energy": 2,
        "shadow_records": 5,
        "shadow_minutes": 5,
        "shadow_drops": 5,
        "cost_models": 0,
    }


def test_deletes_in_batches_of_at_most_batch_rows(db: sa.Engine) -> None:
    store_rows(db, request_records, [40.0] * 25 + [1.0] * 3)
    batches = deletes(db)

    deleted = prune(db, Windows(request_days=30, shadow_days=0), NOW, batch_rows=10)

    # Then request minutes, parking events and backend energy, none stored (nor cost models).
    assert batches == [10, 10, 5, 0, 0, 0, 0]
    assert deleted == {
        "request_records": 25,
        "request_minutes": 0,
        "parking_events": 0,
        "backend_energy": 0,
        "cost_models": 0,
    }
    assert kept(db, request_records) == ["age-1"] * 3


def test_zero_keeps_a_table_forever(db: sa.Engine) -> None:
    for table in (request_records, shadow_records, shadow_drops):
        store_rows(db, table, [400, 1])

    assert prune(db, Windows(request_days=0, shadow_days=0), NOW) == {}
    assert prune(db, Windows(request_days=0, shadow_days=30), NOW) == {
        "shadow_records": 1,
        "shadow_minutes": 0,
        "shadow_drops": 1,
    }
    assert kept(db, request_records) == ["age-1", "age-400"]


def test_old_cost_models_go_but_the_one_in_force_at_the_windows_edge_stays(
    db: sa.Engine,
) -> None:
    ages = {1: (45, "ok"), 2: (40, "failed"), 3: (35, "ok"), 4: (31, "failed"), 5: (10, "ok")}
    ages[6] = (1, "ok")
    with db.begin() as conn:
        conn.execute(
            cost_models.insert(),
            [
                {
                    "version": version,
                    "created": NOW - age * DAY,
                    "observations": 100,
                    "status": status,
                    "scores": "{}",
                    "residuals": "{}" if status == "ok" else None,
                }
                for version, (age, status) in ages.items()
            ],
        )

    assert "cost_models" not in prune(db, Windows(request_days=0, shadow_days=30), NOW)
    deleted = prune(db, Windows(request_days=30, shadow_days=30), NOW, batch_rows=2)

    with db.connect() as conn:
        versions = sorted(conn.execute(sa.select(cost_models.c.version)).scalars())
    # 3 was in force 30 days ago: a report of the week that began then reads it.
    assert versions == [3, 5, 6]
    assert deleted["cost_models"] == 3


def test_the_job_is_off_when_its_interval_is_zero_or_on_sqlite_every_window(
    db: sa.Engine,
) -> None:
    assert not Pruner(db, Windows(30, 30), interval_s=0).enabled
    # On PostgreSQL the job also makes the days ahead, which records need kept forever too.
    partitioned = db.dialect.name == "postgresql"
    assert Pruner(db, Windows(0, 0), interval_s=3600).enabled == partitioned
    assert Pruner(db, Windows(0, 30), interval_s=3600).enabled


def test_the_job_is_off_for_an_in_memory_database() -> None:
    # A round's process would open an empty database of its own and fail every round.
    memory = connect("sqlite://")
    assert not Pruner(memory, Windows(30, 30), interval_s=3600).enabled
    memory.dispose()


def test_a_stopped_round_ends_after_the_batch_it_is_on(db: sa.Engine) -> None:
    store_rows(db, request_records, [40.0] * 25)
    stopping = threading.Event()

    def stop_after_a_delete(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            stopping.set()

    sa.event.listen(db, "after_cursor_execute", stop_after_a_delete)

    deleted = prune(db, Windows(30, 0), NOW, batch_rows=10, stopping=stopping)

    # Neither request minutes, parking events, backend energy nor cost models begun.
    assert deleted == {
        "request_records": 10,
        "request_minutes": 0,
        "parking_events": 0,
        "backend_energy": 0,
        "cost_models": 0,
    }
    assert len(kept(db, request_records)) == 15


def test_replicas_pruning_at_once_delete_each_old_row_once(db: sa.Engine) -> None:
    store_rows(db, request_records, [40.0] * 300 + [1.0] * 7)
    results: list[dict[str, int]] = []
    errors: list[BaseException] = []

    def replica() -> None:
        try:
            results.append(prune(db, Windows(30, 0), NOW, batch_rows=20))
        except BaseException as exc:  # the assertion below shows it
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sum(r["request_records"] for r in results) == 300
    assert kept(db, request_records) == ["age-1"] * 7


def test_pruner_runs_rounds_in_the_background_until_stopped(db: sa.Engine) -> None:
    store_rows(db, shadow_records, [40.0, 1.0])

    async def scenario() -> None:
        pruner = Pruner(db, Windows(30, 30), interval_s=0.02, wall=lambda: NOW)
        pruner.start()
        await until(lambda: len(kept(db, shadow_records)) == 1, message="the pruner never pruned")
        await pruner.stop()
        store_rows(db, shadow_records, [50.0])
        # Nothing shows a stopped pruner: one still running would prune within these five
        # intervals. A slower machine can only miss that, never fail a pruner that stopped.
        await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert kept(db, shadow_records) == ["age-1", "age-50"]


def test_a_round_deletes_from_a_process_of_its_own_never_the_serving_one(db: sa.Engine) -> None:
    store_rows(db, request_records, [40.0] * 25 + [1.0])
    batches = deletes(db)  # what this process, the serving one, deletes

    async def scenario() -> Pruner:
        pruner = Pruner(db, Windows(30, 30), interval_s=0.02, batch_rows=10, wall=lambda: NOW)
        pruner.start()
        await until(lambda: len(kept(db, request_records)) == 1, message="the pruner never pruned")
        await pruner.stop()
        return pruner

    pruner = asyncio.run(scenario())
    assert batches == []
    assert pruner.pid is not None and pruner.pid != os.getpid()


def test_a_stopped_pruner_ends_its_round_after_the_batch_it_is_on(db: sa.Engine) -> None:
    store_rows(db, request_records, [40.0] * 25)

    async def scenario() -> None:
        # The pause after the first batch outlasts the test: only the stop can end it.
        pruner = Pruner(
            db, Windows(30, 0), interval_s=0.02, batch_rows=10, pause_s=3600, wall=lambda: NOW
        )
        pruner.start()
        await until(lambda: len(kept(db, request_records)) == 15, message="no batch deleted")
        await pruner.stop()

    asyncio.run(scenario())  # returns once the round's process has ended
    assert len(kept(db, request_records)) == 15


def test_gateway_serve_prunes_on_its_interval(database: str, tmp_path: Path) -> None:
    db = connect(database)
    now = time.time()
    store_rows(db, request_records, [40.0, 1.0], now=now)
    with run_gateway(
        fleet_policy(), tmp_path, database_url=database, retention_interval_s=0.05
    ) as gw:
        assert gw.gateway.retention.enabled
        wait_for(lambda: len(kept(db, request_records)) == 1, message="the gateway never pruned")
    assert kept(db, request_records) == ["age-1"]
    db.dispose()
