"""bench/records.py: a week of records that the gateway's readers take as their own."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from bench.records import generate
from gateway.db.connection import connect
from gateway.db.schema import backend_energy, request_records, shadow_records
from gateway.policy.load import load_policy
from gateway.report import records
from gateway.report.period import week

ROOT = Path(__file__).resolve().parents[2]
WEEK = week("2026-W48")


def test_writes_a_week_the_weekly_report_reads_with_a_fleet_headline(database: str) -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")

    written = generate(database, 5000, 1000, WEEK, policy, seed=1)

    db = connect(database)
    r, s = request_records.c, shadow_records.c
    with db.connect() as conn:
        first, last = conn.execute(sa.select(sa.func.min(r.ts), sa.func.max(r.ts))).one()
        routes = set(conn.execute(sa.select(r.route).distinct()).scalars())
        orphans = conn.execute(
            sa.select(sa.func.count())
            .select_from(shadow_records)
            .where(s.decision_id.not_in(sa.select(r.decision_id)))
        ).scalar_one()
        minutes = conn.execute(sa.select(sa.func.count(backend_energy.c.ts.distinct()))).scalar()
    assert written["request_records"] == 5000
    assert 800 < written["shadow_records"] < 1200
    assert WEEK.since <= first and last < WEEK.until
    assert routes == {route.name for route in policy.routes}
    assert orphans == 0  # every copy is of a request the week holds
    assert minutes == 7 * 24 * 60
    report = records.collect(db, policy, WEEK, now=WEEK.until, model=None)
    fleet = report["fleet"]
    assert fleet["requests"] == 5000
    assert 0 < fleet["errors"] < 5000 * 0.05
    assert fleet["headline"]["recorded_share"] == 1.0
    assert fleet["headline"]["energy_j"] > fleet["energy_j"] > 0  # idle draw included
    assert {c["candidate"] for c in report["candidates"]} >= {"cim", "asic"}
    db.dispose()


def test_draws_the_same_week_from_the_same_seed(tmp_path: Path) -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    rows = []
    for name in ("a", "b"):
        url = f"sqlite:///{tmp_path / name}.db"
        generate(url, 800, 100, WEEK, policy, seed=7)
        db = connect(url)
        with db.connect() as conn:
            rows.append(conn.execute(sa.select(request_records).order_by("id")).all())
        db.dispose()
    assert rows[0] == rows[1]
