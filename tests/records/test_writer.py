"""The writer process: a serving gateway's records are inserted apart, and its death loses none."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sqlite3
from pathlib import Path

import priority_at_import
from rows import request_record, sample, stored
from waiting import until

from gateway.db.connection import connect, reachable_apart, upgrade
from gateway.metrics import GatewayMetrics
from gateway.periodic import HELPER_NICE, helper_process
from gateway.records.requests import RecordWriter
from gateway.records.writer import WriterProcess
from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

TABLE = "request_records"


def test_a_serving_gateway_inserts_its_records_from_a_process_of_its_own(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()
        for _ in range(3):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
        assert len(gw.records(3)) == 3
        writer = gw.gateway.writer
        assert writer is not None and writer.pid is not None
        assert writer.pid != os.getpid()


def test_an_in_memory_database_keeps_its_inserts_in_the_serving_process() -> None:
    assert not reachable_apart("sqlite://")
    assert not reachable_apart("sqlite:///:memory:")
    assert reachable_apart("sqlite:////var/lib/gateway/gateway.db")
    assert reachable_apart("postgresql+psycopg://gateway@db:5432/gateway")


def test_a_batch_in_flight_when_the_writer_process_dies_is_kept_and_written_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    metrics = GatewayMetrics()
    db = connect(url)
    inserter = WriterProcess(url)
    writer = RecordWriter(db, metrics, inserter=inserter)
    # The test holds the database's write lock, so the batch cannot commit before the kill.
    lock = sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")

    async def scenario() -> None:
        before = {child.pid for child in multiprocessing.active_children()}
        for n in range(20):
            writer.add(request_record(n))
        flushing = asyncio.create_task(writer.flush())
        started = await until(
            lambda: [c for c in multiprocessing.active_children() if c.pid not in before],
            message="the writer process never started",
        )
        os.kill(started[0].pid, signal.SIGKILL)
        await flushing
        assert sample(metrics, "gateway_records_written_total") == 0
        assert sample(metrics, "gateway_record_write_failures_total", table=TABLE) == 1
        assert sample(metrics, "gateway_records_buffered", table=TABLE, where="memory") == 20

        lock.execute("ROLLBACK")
        await writer.flush()  # a new writer process
        assert inserter.pid not in (None, started[0].pid, os.getpid())

    try:
        asyncio.run(scenario())
    finally:
        lock.close()
        inserter.close()
        db.dispose()
    assert stored(url) == list(range(20))
    assert sample(metrics, "gateway_records_written_total") == 20
    assert sample(metrics, "gateway_records_buffered", table=TABLE, where="memory") == 0


def _helper_state() -> tuple[object, object, int]:
    return (
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
        os.getpriority(os.PRIO_PROCESS, 0),
    )


def test_a_helper_process_runs_low_before_it_imports_its_work() -> None:
    # The worker imports its initializer's module to unpickle it, before any code of its own
    # runs: a second of CPU, to be spent below the serving process too.
    helper = helper_process(priority_at_import.start)
    try:
        at_import = helper.submit(priority_at_import.noted).result(timeout=120)
    finally:
        helper.shutdown()
    assert at_import == min(os.getpriority(os.PRIO_PROCESS, 0) + HELPER_NICE, 19)


def test_helper_processes_run_below_the_serving_process_and_leave_stopping_to_it() -> None:
    helper = helper_process()
    try:
        interrupt, terminate, nice = helper.submit(_helper_state).result(timeout=120)
    finally:
        helper.shutdown()
    # Ctrl-C and SIGTERM reach the whole process group; the serving process ends its helpers
    # after its last flush.
    assert interrupt == signal.SIG_IGN and terminate == signal.SIG_IGN
    assert nice == min(os.getpriority(os.PRIO_PROCESS, 0) + HELPER_NICE, 19)
