"""Batched record writes through a database outage: held, spilled, replayed, never silently lost.

Each guarantee holds wherever the inserts run: a worker thread, or the writer process a serving
gateway uses (gateway/records/writer.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from dbswitch import switchable
from rows import request_record, same_decision, sample, stored
from waiting import wait_for

import gateway.records.batching as batching
from gateway.db.connection import connect
from gateway.db.schema import request_records
from gateway.errors import DatabaseUnavailable
from gateway.metrics import GatewayMetrics
from gateway.records.requests import RecordWriter, RequestEnergy
from gateway.records.writer import WriterProcess
from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

TABLE = "request_records"


@pytest.fixture(params=["thread", "process"])
def inserts(request: pytest.FixtureRequest) -> Iterator[Callable[[str], dict[str, Any]]]:
    """The writer's options that put its inserts in a worker thread or in the writer process."""
    started: list[WriterProcess] = []

    def options(url: str) -> dict[str, Any]:
        if request.param == "thread":
            return {}
        started.append(WriterProcess(url))
        return {"inserter": started[-1]}

    yield options
    for writer in started:
        writer.close()


def test_records_kept_while_the_database_is_unreachable_are_written_when_it_returns(
    database: str, tmp_path: Path, inserts: Callable[[str], dict[str, Any]]
) -> None:
    metrics = GatewayMetrics()
    spill = tmp_path / "spill"
    with switchable(database, tmp_path) as switch:
        db = connect(switch.url)
        writer = RecordWriter(
            db, metrics, batch_size=7, max_held=10, spill_dir=spill, **inserts(switch.url)
        )

        async def outage() -> None:
            for n in range(25):
                writer.add(request_record(n))
            await writer.flush()
            for n in range(25, 40):
                writer.add(request_record(n))
            await writer.flush()

        asyncio.run(outage())
        assert sample(metrics, "gateway_records_buffered", table=TABLE, where="memory") == 10
        assert sample(metrics, "gateway_records_buffered", table=TABLE, where="disk") == 30
        assert sample(metrics, "gateway_records_spilled_total", table=TABLE) == 30
        assert sample(metrics, "gateway_record_write_failures_total", table=TABLE) >= 1
        assert len((spill / f"{TABLE}.jsonl").read_bytes().splitlines()) == 30

        switch.up()
        asyncio.run(writer.flush())
        db.dispose()
    assert stored(database) == list(range(40))
    assert sample(metrics, "gateway_records_written_total") == 40
    assert sample(metrics, "gateway_records_replayed_total", table=TABLE) == 30
    assert sample(metrics, "gateway_records_dropped_total") == 0
    assert sample(metrics, "gateway_records_buffered", table=TABLE, where="memory") == 0
    assert sample(metrics, "gateway_records_buffered", table=TABLE, where="disk") == 0
    assert not (spill / f"{TABLE}.jsonl").exists()


def test_stop_spills_what_the_database_cannot_take_and_the_next_start_replays_it(
    database: str, tmp_path: Path, inserts: Callable[[str], dict[str, Any]]
) -> None:
    spill = tmp_path / "spill"
    with switchable(database, tmp_path) as switch:

        async def run(metrics: GatewayMetrics, adding: range) -> None:
            db = connect(switch.url)
            writer = RecordWriter(
                db, metrics, flush_interval_s=0.01, spill_dir=spill, **inserts(switch.url)
            )
            writer.start()
            for n in adding:
                writer.add(request_record(n))
            await writer.stop()
            db.dispose()

        before = GatewayMetrics()
        asyncio.run(run(before, range(20)))
        assert sample(before, "gateway_records_spilled_total", table=TABLE) == 20
        assert sample(before, "gateway_records_dropped_total") == 0

        switch.up()
        after = GatewayMetrics()
        asyncio.run(run(after, range(20, 25)))
    assert stored(database) == list(range(25))
    assert sample(after, "gateway_records_replayed_total", table=TABLE) == 20


def energy_of(url: str) -> dict[int, tuple[float | None, bool | None]]:
    """Each stored record's energy and whether it was estimated, by its completion tokens."""
    db = connect(url)
    c = request_records.c
    with db.connect() as conn:
        rows = conn.execute(sa.select(c.completion_tokens, c.energy_j, c.energy_estimated))
        energy = {n: (j, estimated) for n, j, estimated in rows}
    db.dispose()
    return energy


def test_energy_lands_after_its_record_through_an_outage_and_a_restart(
    database: str, tmp_path: Path, inserts: Callable[[str], dict[str, Any]]
) -> None:
    """A record is written when its request ends and its energy seconds later, as an update:
    held and spilled behind the records while the database is down, never before its row."""
    spill = tmp_path / "spill"
    with switchable(database, tmp_path) as switch:

        async def run(metrics: GatewayMetrics, adding: range, *, up: bool) -> None:
            db = connect(switch.url)
            writer = RecordWriter(
                db, metrics, batch_size=7, max_held=5, spill_dir=spill, **inserts(switch.url)
            )
            for n in adding:
                record = request_record(n)
                writer.add(record)
                if n % 4 == 3:  # energy comes later than its record, and in a later round
                    await writer.flush()
                writer.energy.add(
                    RequestEnergy(record.decision_id, record.ts, 1.5 * n, 1e-6 * n, False)
                )
            if up:
                switch.up()
            await writer.flush()
            await writer.stop()
            db.dispose()

        down = GatewayMetrics()
        asyncio.run(run(down, range(20), up=False))
        assert sample(down, "gateway_records_spilled_total", table="request_energy") > 0
        assert sample(down, "gateway_attribution_updates_written_total") == 0
        assert (spill / "request_energy.jsonl").exists()

        back = GatewayMetrics()
        asyncio.run(run(back, range(20, 30), up=True))
    assert energy_of(database) == {n: (1.5 * n, False) for n in range(30)}
    assert sample(back, "gateway_attribution_updates_written_total") == 30
    assert sample(back, "gateway_attribution_updates_dropped_total") == 0
    assert not (spill / "request_energy.jsonl").exists()


class InsertsRefused(batching.InThread):
    """A database that takes updates but, while `refusing`, no inserts: the moment in a round
    when it came back after the records' batch failed and before their energy's."""

    refusing = True

    async def insert(self, sql: str, values: list[Any]) -> tuple[int, list[str]]:
        if self.refusing and sql.lstrip().upper().startswith("INSERT"):
            raise DatabaseUnavailable("inserts refused")
        return await super().insert(sql, values)


def test_energy_waits_while_its_record_is_held_even_if_the_database_takes_updates(
    database: str, tmp_path: Path
) -> None:
    metrics = GatewayMetrics()
    db = connect(database)
    inserter = InsertsRefused(db)
    writer = RecordWriter(db, metrics, inserter=inserter)
    record = request_record(7)
    writer.add(record)
    writer.energy.add(RequestEnergy(record.decision_id, record.ts, 12.5, 1e-5, False))
    asyncio.run(writer.flush())
    assert energy_of(database) == {}
    assert sample(metrics, "gateway_records_buffered", table="request_energy", where="memory") == 1
    inserter.refusing = False
    asyncio.run(writer.flush())
    db.dispose()
    assert energy_of(database) == {7: (12.5, False)}


@pytest.mark.postgres
@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
def test_records_survive_postgresql_cutting_the_connections_the_writer_holds(
    database: str, tmp_path: Path, inserts: Callable[[str], dict[str, Any]]
) -> None:
    metrics = GatewayMetrics()
    with switchable(database, tmp_path) as switch:
        switch.up()
        db = connect(switch.url)
        writer = RecordWriter(
            db, metrics, max_held=3, spill_dir=tmp_path / "spill", **inserts(switch.url)
        )

        async def write(numbers: range) -> None:
            for n in numbers:
                writer.add(request_record(n))
            await writer.flush()

        asyncio.run(write(range(5)))
        switch.down()
        asyncio.run(write(range(5, 12)))
        assert sample(metrics, "gateway_records_written_total") == 5
        assert sample(metrics, "gateway_records_spilled_total", table=TABLE) == 4
        switch.up()
        asyncio.run(write(range(12, 15)))
        db.dispose()
    assert stored(database) == list(range(15))
    assert sample(metrics, "gateway_records_dropped_total") == 0


def test_records_past_memory_and_spill_limits_are_dropped_and_counted(tmp_path: Path) -> None:
    from gateway.db.connection import upgrade

    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    metrics = GatewayMetrics()
    one_row = len(orjson.dumps(request_record(10).row())) + 1
    with switchable(url, tmp_path) as switch:
        db = connect(switch.url)
        writer = RecordWriter(
            db,
            metrics,
            max_held=5,
            spill_dir=tmp_path / "spill",
            max_spill_bytes=3 * one_row,
        )

        async def outage() -> None:
            for n in range(40):
                writer.add(request_record(n))
            await writer.flush()

        asyncio.run(outage())
        held = sample(metrics, "gateway_records_buffered", table=TABLE, where="memory")
        spilled = sample(metrics, "gateway_records_spilled_total", table=TABLE)
        dropped = sample(metrics, "gateway_records_dropped_total")
        assert (held, spilled, dropped) == (5, 3, 32)
        assert held + spilled + dropped == 40

        switch.up()
        asyncio.run(writer.flush())
        db.dispose()
    assert len(stored(url)) == held + spilled


def test_a_row_the_database_refuses_is_rejected_without_holding_back_the_others(
    database: str, inserts: Callable[[str], dict[str, Any]]
) -> None:
    metrics = GatewayMetrics()
    db = connect(database)
    writer = RecordWriter(db, metrics, **inserts(database))
    first = request_record(0)

    async def scenario() -> None:
        writer.add(first)
        await writer.flush()
        writer.add(request_record(1))
        writer.add(same_decision(first, 2))
        writer.add(request_record(3))
        await writer.flush()

    asyncio.run(scenario())
    db.dispose()
    assert stored(database) == [0, 1, 3]
    assert sample(metrics, "gateway_records_rejected_total", table=TABLE) == 1
    assert sample(metrics, "gateway_records_dropped_total") == 0
    assert sample(metrics, "gateway_records_buffered", table=TABLE, where="memory") == 0


def test_a_batch_is_one_transaction_of_short_statements_with_the_cpu_yielded_between(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = GatewayMetrics()
    db = connect(database)
    statements: list[int] = []
    yields: list[int] = []

    @sa.event.listens_for(db, "before_cursor_execute", named=True)
    def count(statement: str, parameters: list, executemany: bool, **_: object) -> None:
        if statement.startswith("INSERT INTO request_records"):
            statements.append(len(parameters) if executemany else 1)

    real_yield = batching.yield_cpu

    def counted_yield() -> None:
        yields.append(len(statements))
        real_yield()

    monkeypatch.setattr(batching, "yield_cpu", counted_yield)
    writer = RecordWriter(db, metrics, batch_size=500)

    async def scenario() -> None:
        for n in range(500):
            writer.add(request_record(n))
        await writer.flush()
        # Ten statements of 50 rows, the CPU yielded between each.
        assert statements == [50] * 10 and yields == list(range(1, 10))
        # A row refused in the batch's second statement: the first statement's 50 rows are
        # rolled back with it, and the batch goes again row by row, so none is stored twice.
        batch = [request_record(n) for n in range(500, 600)]
        batch[60] = same_decision(batch[0], 560)
        for record in batch:
            writer.add(record)
        await writer.flush()

    asyncio.run(scenario())
    db.dispose()
    assert statements[10:12] == [50, 50]
    assert stored(database) == [n for n in range(600) if n != 560]
    assert sample(metrics, "gateway_records_rejected_total", table=TABLE) == 1
    assert sample(metrics, "gateway_records_written_total") == 599


def test_gateway_serves_while_its_database_is_unreachable_and_records_every_request(
    sims, database: str, tmp_path: Path
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    prompt = [{"role": "user", "content": "hello"}]
    with (
        switchable(database, tmp_path) as switch,
        run_gateway(policy, tmp_path, database_url=switch.url, record_buffer_rows=2) as gw,
    ):
        client = gw.client()
        ids = []
        for _ in range(6):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=prompt, max_tokens=4
            )
            assert raw.parse().choices[0].message.content
            ids.append(raw.headers["x-gateway-decision-id"])
        metrics = gw.gateway.metrics
        wait_for(
            lambda: sample(metrics, "gateway_records_spilled_total", table=TABLE) >= 4,
            message="the records were never spilled",
        )
        assert sample(metrics, "gateway_records_written_total") == 0
        assert gw.http().get("/readyz").json()["database"] is False

        switch.up()
        rows = gw.records(6)
        scraped = gw.http().get("/metrics").text
    assert sorted(r["decision_id"] for r in rows) == sorted(ids)
    assert f'gateway_records_replayed_total{{table="{TABLE}"}} 4.0' in scraped
    assert "gateway_records_dropped_total 0.0" in scraped
