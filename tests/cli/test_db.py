"""`gateway db`: migrate the database, and drop or delete what is past retention."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from command import gateway
from rows import DAY, store_rows

from gateway.db import partitions
from gateway.db.partitions import day_name, day_of
from gateway.db.schema import request_records, shadow_records


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    result = gateway("db", "upgrade", env={"DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    db = sa.create_engine(url)
    assert request_records.name in sa.inspect(db).get_table_names()
    db.dispose()


def test_db_prune_deletes_records_past_retention_and_says_how_many(database: str) -> None:
    db = sa.create_engine(database)
    now = time.time()
    store_rows(db, request_records, [40, 35, 1], now=now)
    store_rows(db, shadow_records, [40, 1], now=now)
    result = gateway(
        "db",
        "prune",
        env={"DATABASE_URL": database, "GATEWAY_SHADOW_RETENTION_DAYS": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert "request_records: deleted 2 rows from before" in result.stdout
    assert "shadow_records: kept forever" in result.stdout
    assert "cost_models: deleted 0 from before the request window" in result.stdout
    with db.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(request_records)).scalar() == 1
        assert conn.execute(sa.select(sa.func.count()).select_from(shadow_records)).scalar() == 2
    db.dispose()


def test_db_prune_on_an_unmigrated_database_says_so(tmp_path: Path) -> None:
    result = gateway("db", "prune", env={"DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"})
    assert result.returncode == 1
    assert "cannot delete old rows of request_records" in result.stderr
    assert "gateway db upgrade" in result.stderr


def test_db_prune_drops_the_days_past_retention_on_postgresql(database: str) -> None:
    if not database.startswith("postgresql"):
        pytest.skip("SQLite keeps each table whole")
    db = sa.create_engine(database)
    today = day_of(time.time())
    with db.begin() as conn:
        partitions.make_days(conn, request_records.name, today - 41 * DAY, today)
    store_rows(db, request_records, [40, 1], now=today + DAY / 2)
    result = gateway("db", "prune", env={"DATABASE_URL": database})
    assert result.returncode == 0, result.stderr
    old = ", ".join(day_name(request_records.name, today - n * DAY) for n in (41, 40, 39, 38, 37))
    assert f"request_records: dropped the days {old}, " in result.stdout
    with db.connect() as conn:
        assert conn.execute(sa.select(request_records.c.route)).scalars().all() == ["age-1"]
    db.dispose()
