"""Day partitions on PostgreSQL: the upgrade moves every row into its day, days are made ahead
and dropped whole past the window, a row without a day lands in the default partition, and a
record is still found by its decision id."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory
from rows import DAY, request_record, shadow_record, store_rows
from waiting import wait_for

from gateway.db import partitions
from gateway.db.connection import alembic_config, connect, upgrade
from gateway.db.partitions import AHEAD_DAYS, day_name, day_of, default_name
from gateway.db.retention import Pruner, Windows, drop_days, prune
from gateway.db.schema import request_records, shadow_records
from gateway.metrics import GatewayMetrics
from gateway.records.requests import RecordWriter, RequestEnergy
from harness.databases import scratch_database
from harness.gateways import run_gateway
from policies import fleet_policy

pytestmark = pytest.mark.postgres

TABLES = (request_records, shadow_records)


@pytest.fixture
def url(postgres_server: str, tmp_path: Path) -> Iterator[str]:
    with scratch_database(postgres_server, tmp_path) as url:
        yield url


@pytest.fixture
def db(url: str) -> Iterator[sa.Engine]:
    db = connect(url)
    yield db
    db.dispose()


def where(db: sa.Engine, table: sa.Table) -> dict[str, str]:
    """Return the partition each row of `table` is stored in, by the row's route."""
    with db.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT route, tableoid::regclass::text FROM {table.name}"))
        return dict(rows.all())


def days_of(db: sa.Engine, table: sa.Table) -> list[float]:
    with db.connect() as conn:
        return sorted(partitions.days(conn, table.name))


def make_days(db: sa.Engine, first: float, last: float) -> None:
    with db.begin() as conn:
        for table in TABLES:
            partitions.make_days(conn, table.name, first, last)


def test_a_new_database_has_today_and_the_days_ahead_and_a_default(db: sa.Engine) -> None:
    today = day_of(time.time())
    for table in TABLES:
        assert days_of(db, table) == [today + n * DAY for n in range(AHEAD_DAYS + 1)]
        store_rows(db, table, [0.0], now=time.time())
        assert where(db, table) == {"age-0": day_name(table.name, day_of(time.time()))}


def test_the_upgrade_moves_every_row_into_its_days_partition(url: str) -> None:
    config = alembic_config(url)
    (partitioning,) = (
        r
        for r in ScriptDirectory.from_config(config).walk_revisions()
        if r.path.endswith("_day_partitions.py")
    )
    command.downgrade(config, partitioning.down_revision)
    db = connect(url)
    now = time.time()
    ages = [12.0, 3.5, 1.0, 0.0]
    for table in TABLES:
        store_rows(db, table, ages, now=now)

    # The tables as they were before the upgrade: the columns later migrations add are not there.
    held = [sa.Table(t.name, sa.MetaData(), autoload_with=db) for t in TABLES]

    def everything() -> dict[str, list[dict[str, Any]]]:
        with db.connect() as conn:
            return {
                t.name: [dict(r._mapping) for r in conn.execute(sa.select(t).order_by(t.c.id))]
                for t in held
            }

    before = everything()
    upgrade(url)

    assert everything() == before
    today = day_of(now)
    for table in TABLES:
        assert where(db, table) == {
            f"age-{age:g}": day_name(table.name, day_of(now - age * DAY)) for age in ages
        }
        first = day_of(now - 12 * DAY)
        assert days_of(db, table) == [first + n * DAY for n in range(13 + AHEAD_DAYS)]
        assert days_of(db, table)[-1] == today + AHEAD_DAYS * DAY
    # New rows are numbered after the moved ones, from the same sequence.
    store_rows(db, request_records, [0.5], now=now)
    with db.connect() as conn:
        newest = conn.execute(sa.select(sa.func.max(request_records.c.id))).scalar()
    assert newest == max(r["id"] for r in before["request_records"]) + 1
    db.dispose()
    command.downgrade(config, partitioning.down_revision)
    db = connect(url)
    assert len(everything()["request_records"]) == len(ages) + 1
    db.dispose()


def test_a_row_of_a_day_without_a_partition_lands_in_the_default_then_moves_into_its_day(
    db: sa.Engine,
) -> None:
    later = day_of(time.time()) + 10 * DAY
    for table in TABLES:
        store_rows(db, table, [0.0], now=later + 3600)
        assert where(db, table) == {"age-0": default_name(table.name)}

    # Its day is made (a round ten days on): the row moves out of the default into it.
    assert drop_days(db, Windows(30, 30), later + 7200)
    for table in TABLES:
        assert where(db, table) == {"age-0": day_name(table.name, later)}
        assert later + AHEAD_DAYS * DAY in days_of(db, table)


def test_retention_drops_the_days_past_the_window_and_keeps_the_day_across_its_edge(
    db: sa.Engine,
) -> None:
    today = day_of(time.time())
    now = today + 0.25 * DAY  # 06:00 UTC: the window's edge is at 06:00 too
    make_days(db, today - 40 * DAY, today)
    with db.begin() as conn:  # a day never made: its rows are the default partition's
        for table in TABLES:
            conn.execute(sa.text(f"DROP TABLE {day_name(table.name, today - 35 * DAY)}"))
    ages = [35.0, 33.0, 31.0, 30.5, 30.2, 30.0, 29.0, 1.0]
    for table in TABLES:
        store_rows(db, table, ages, now=now)

    dropped = drop_days(db, Windows(30, 30), now)
    deleted = prune(db, Windows(30, 30), now)

    for table in TABLES:
        # 30.2 days ago is 01:12 of the day the window's edge cuts: kept whole until it ends.
        assert where(db, table) == {
            f"age-{age:g}": day_name(table.name, day_of(now - age * DAY))
            for age in (30.2, 30.0, 29.0, 1.0)
        }
        assert dropped[table.name] == [
            day_name(table.name, today - n * DAY) for n in range(40, 30, -1) if n != 35
        ]
        assert days_of(db, table)[0] == today - 30 * DAY
        assert deleted[table.name] == 1  # the default partition's, one by one


def test_a_pruners_round_drops_the_days_and_deletes_the_default_partitions_rows_apart(
    db: sa.Engine,
) -> None:
    today = day_of(time.time())
    now = today + 0.25 * DAY
    make_days(db, today - 33 * DAY, today)
    with db.begin() as conn:  # a day never made: its rows are the default partition's
        for table in TABLES:
            conn.execute(sa.text(f"DROP TABLE {day_name(table.name, today - 32 * DAY)}"))
    for table in TABLES:
        store_rows(db, table, [33.0, 32.0, 1.0], now=now)
    pruner = Pruner(db, Windows(30, 30), interval_s=3600, wall=lambda: now)

    deleted = asyncio.run(pruner.prune())

    assert pruner.pid is not None
    for table in TABLES:
        assert where(db, table) == {"age-1": day_name(table.name, day_of(now - DAY))}
        assert days_of(db, table)[0] == today - 30 * DAY
        assert deleted[table.name] == 1  # the default partition's, one by one


def test_replicas_making_and_dropping_days_at_once_agree(db: sa.Engine) -> None:
    now = day_of(time.time()) + 20 * DAY
    make_days(db, now - 40 * DAY, now - 30 * DAY)
    errors: list[BaseException] = []
    results: list[dict[str, list[str]]] = []

    def replica() -> None:
        try:
            results.append(drop_days(db, Windows(30, 30), now))
        except BaseException as exc:  # the assertion below shows it
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    for table in TABLES:
        # Each old day dropped by one replica (the others found it locked or gone), the days
        # ahead made once.
        dropped = [name for r in results for name in r.get(table.name, [])]
        assert sorted(dropped) == [day_name(table.name, now - n * DAY) for n in range(40, 30, -1)]
        assert days_of(db, table)[-AHEAD_DAYS - 1 :] == [now + n * DAY for n in range(3)]


def test_a_records_energy_finds_it_in_its_day_by_decision_id_and_time(db: sa.Engine) -> None:
    now = time.time()
    record = dataclasses.replace(request_record(1), ts=now)
    other = dataclasses.replace(request_record(2), ts=now - 1)

    async def scenario() -> None:
        writer = RecordWriter(db, GatewayMetrics())
        writer.add(record)
        writer.add(other)
        await writer.flush()
        writer.add_energy(RequestEnergy(record.decision_id, record.ts, 7.5, 1e-4, False))
        await writer.stop()

    asyncio.run(scenario())
    with db.connect() as conn:
        energy = dict(
            conn.execute(sa.select(request_records.c.decision_id, request_records.c.energy_j)).all()
        )
        # The update reads the one partition of the record's day, by the decision's key.
        (plan,) = conn.exec_driver_sql(
            "EXPLAIN (FORMAT JSON) UPDATE request_records SET energy_j = 1"
            " WHERE decision_id = %(d)s AND ts = %(t)s",
            {"d": record.decision_id, "t": record.ts},
        ).one()
    assert energy == {record.decision_id: 7.5, other.decision_id: None}
    scans = _scans((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    assert scans == [("Index Scan", day_name("request_records", day_of(now)))]


def _scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    found = [(plan["Node Type"], plan["Relation Name"])] if "Relation Name" in plan else []
    if plan["Node Type"] == "ModifyTable":
        found = []
    for child in plan.get("Plans", ()):
        found += _scans(child)
    return found


def test_a_copys_request_is_joined_by_decision_id_and_time(db: sa.Engine) -> None:
    now = time.time()
    request = dataclasses.replace(request_record(1), ts=now, energy_j=3.0, slo_class="batch")
    copy = shadow_record(1, decision_id=request.decision_id, ts=now, primary_energy_j=None)
    with db.begin() as conn:
        conn.execute(request_records.insert(), [request.row()])
        conn.execute(shadow_records.insert(), [copy.row()])
    from gateway.promotion.evidence import shadow_rows

    (row,) = shadow_rows(db, now - 60)
    assert (row["primary_energy_j"], row["slo_class"]) == (3.0, "batch")


def test_gateway_serve_makes_the_days_ahead_as_it_starts(
    url: str, db: sa.Engine, tmp_path: Path
) -> None:
    tomorrow = day_of(time.time()) + DAY
    with db.begin() as conn:
        for table in TABLES:
            conn.execute(sa.text(f"DROP TABLE {day_name(table.name, tomorrow)}"))
    with run_gateway(fleet_policy(), tmp_path, database_url=url):
        wait_for(
            lambda: all(tomorrow in days_of(db, table) for table in TABLES),
            message="the gateway never made tomorrow's partitions",
        )
