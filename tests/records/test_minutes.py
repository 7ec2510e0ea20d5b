"""Request minutes: folded as requests end and their energy settles, written once settled,
kept through an outage like the records, and equal to the fold of the records stored."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dbswitch import switchable
from rows import request_record

from gateway.db.connection import connect
from gateway.db.schema import RequestMinute, RequestRecord, request_minutes
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import SloClass
from gateway.records.minutes import MINUTE_S, Minutes, summarize
from gateway.records.requests import RecordWriter, RequestEnergy

T0 = 1_700_000_040.0  # the start of a minute
INTERACTIVE = SloClass(ttft_ms=500, tpot_ms=50)
SUMS = [f.name for f in dataclasses.fields(RequestMinute)][7:-3]
KEY = ("ts", "route", "pool", "model", "endpoint", "slo_class", "stream")


def targets(name: str | None) -> SloClass | None:
    return INTERACTIVE if name in (None, "interactive") else None


def varied(n: int) -> RequestRecord:
    """A record of minute n // 7 with every kind of value the fold reads, its energy unset."""
    record = request_record(n)
    return dataclasses.replace(
        record,
        ts=T0 + 9 * n,
        pool=("gpu", "asic", None)[n % 3],
        backend=None if n % 3 == 2 else "b-0",
        slo_class=(None, "interactive", "batch")[n % 4 % 3],
        stream=n % 2 == 0,
        endpoint="embeddings" if n % 5 == 0 else "chat",
        status=502 if n % 6 == 1 else 200,
        ttft_ms=None if n % 2 else 40.0 + 30 * (n % 20),
        tpot_ms=None if n % 2 else 5.0 + n % 60,
        e2e_ms=100.0 + 17 * n,
        prompt_tokens=None if n % 11 == 3 else 10 + n,
        completion_tokens=None if n % 11 == 3 else n % 9,
        predicted_e2e_ms=None if n % 7 == 2 else 90.0 + 20 * n,
        predicted_energy_j=1.0 + n % 4,
    )


def energy_of(n: int) -> tuple[float | None, float | None]:
    return (None, None) if n % 10 == 4 else (0.5 * (n % 13), 1e-5 * n if n % 8 else None)


def merged(rows: Iterable[RequestMinute | dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """Sum rows per minute and key: what every reader does."""
    out: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        r = row if isinstance(row, dict) else row.row()
        key = tuple(r[k] for k in KEY)
        into = out.setdefault(key, dict.fromkeys(SUMS, 0) | {"sketches": []})
        for name in SUMS:
            into[name] += r[name]
        into["sketches"].append((r["ttft_ms"], r["tpot_ms"], r["e2e_ms"]))
    return out


def test_requests_and_their_later_energy_fold_into_the_minutes_of_the_stored_records() -> None:
    minutes = Minutes(targets)
    records = [varied(n) for n in range(120)]
    handed: list[RequestMinute] = []
    for n, record in enumerate(records):
        minutes.request(record)
        if n % 3 != 2:  # a backend served it: its energy comes later, some after its minute
            if n % 4 == 0:
                handed += minutes.take(record.ts - MINUTE_S)
            minutes.energy(record.decision_id, *energy_of(n))
    handed += minutes.take()
    assert minutes.take() == []

    stored = []
    for n, record in enumerate(records):
        energy, cost = energy_of(n) if n % 3 != 2 else (None, None)
        stored.append(dataclasses.replace(record, energy_j=energy, cost_usd=cost).row())
    expected = merged(summarize(stored, targets))
    got = merged(handed)
    assert got.keys() == expected.keys()
    for key, sums in expected.items():
        assert {k: pytest.approx(v) for k, v in sums.items() if k != "sketches"} == {
            k: v for k, v in got[key].items() if k != "sketches"
        }
    assert sum(s["requests"] for s in got.values()) == 120
    assert sum(s["errors"] for s in got.values()) == sum(r.status != 200 for r in records)


def test_awaited_energy_beyond_the_cap_forgets_the_oldest_request_only() -> None:
    minutes = Minutes(targets, max_awaited=2)
    records = [dataclasses.replace(request_record(n), ts=T0 + n) for n in range(3)]
    for record in records:
        minutes.request(record)
    for n, record in enumerate(records):  # the first's comes after two newer were awaited
        minutes.energy(record.decision_id, 2.0 + n, None)

    (row,) = minutes.take()
    assert row.requests == 3
    assert (row.energy_n, row.energy_j) == (2, 7.0)


def test_a_minute_is_written_once_settled_and_the_open_ones_at_stop(database: str) -> None:
    db = connect(database)
    now = [T0]
    metrics = GatewayMetrics()

    async def scenario() -> tuple[int, int, int]:
        writer = RecordWriter(db, metrics, targets=targets, clock=lambda: now[0])
        for n in range(14):  # two minutes of requests
            writer.add(varied(n))
        now[0] = T0 + 125  # the first minute has settled, the second not yet
        await writer.flush()
        first = count(db)
        now[0] = T0 + 185
        writer.add(varied(1))  # a late request of the first minute makes a row of its own
        await writer.flush()
        second = count(db)
        writer.add(varied(30))
        await writer.stop()
        return first, second, count(db)

    first, second, last = asyncio.run(scenario())
    with db.connect() as conn:
        total = conn.execute(sa.select(sa.func.sum(request_minutes.c.requests))).scalar()
    db.dispose()
    assert 0 < first < second < last
    assert total == 16


def count(db: sa.Engine) -> int:
    with db.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(request_minutes)).scalar())


def test_minutes_are_kept_through_an_outage_and_written_after_a_restart(
    database: str, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    with switchable(database, tmp_path) as switch:

        async def run(adding: range) -> None:
            db = connect(switch.url)
            writer = RecordWriter(db, GatewayMetrics(), spill_dir=spill, targets=targets)
            for n in adding:
                record = varied(n)
                writer.add(record)
                if record.backend is not None:
                    writer.add_energy(
                        RequestEnergy(record.decision_id, record.ts, 2.0, 1e-5, False)
                    )
            await writer.stop()
            db.dispose()

        asyncio.run(run(range(20)))  # down: records, energy and minutes spilled
        assert (spill / "request_minutes.jsonl").exists()
        switch.up()
        asyncio.run(run(range(20, 25)))
    db = connect(database)
    m = request_minutes.c
    with db.connect() as conn:
        requests, energy_n = conn.execute(
            sa.select(sa.func.sum(m.requests), sa.func.sum(m.energy_n))
        ).one()
    db.dispose()
    assert requests == 25
    assert energy_n == sum(varied(n).backend is not None for n in range(25))
