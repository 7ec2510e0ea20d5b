"""`gateway serve` stopped by SIGTERM while streams are in flight: drain, flush, exit 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import sqlalchemy as sa
import yaml
from command import ROOT, gateway
from rawhttp import NOT_HTTP, UPGRADE, not_http_error
from waiting import wait_for

from gateway.db.schema import request_records
from harness.gateways import free_port, gateway_process, wait_ready
from policies import MODEL

STREAMS = 4


def migrated_fleet(sims, tmp_path: Path, **settings: str) -> dict[str, str]:
    """Point the default policy at the simulators, migrate a database; return the environment.

    Records are flushed only every 30 s, so what a stop finds unwritten it must flush itself.
    """
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    for name, pool in doc["pools"].items():
        pool["backends"] = [{"url": u} for u in sims.urls(name)]
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc))
    env = {
        **os.environ,
        "GATEWAY_POLICY": str(policy),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}",
        "GATEWAY_RECORD_FLUSH_INTERVAL_S": "30",
        **settings,
    }
    assert gateway("db", "upgrade", env=env).returncode == 0
    return env


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def test_sigterm_finishes_in_flight_streams_refuses_new_connections_and_flushes(
    sims, tmp_path: Path
) -> None:
    for sim in sims.all():
        # Streams last (~3 s) long enough to be cut by a bad stop, and to be still going when a
        # busy machine's gateway has stopped listening.
        sim.set_faults(slow_factor=1500)
    env = migrated_fleet(
        sims,
        tmp_path,
        GATEWAY_SPILL_DIR=str(tmp_path / "spill"),
        GATEWAY_DRAIN_TIMEOUT_S="60",
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = threading.Barrier(STREAMS + 1, timeout=20)
    results: list[tuple[str, str | None]] = []
    failures: list[BaseException] = []

    def stream() -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        try:
            chunks = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a long story."}],
                max_tokens=40,
                stream=True,
            )
            text, finish = [], None
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    if not text:
                        started.wait()
                    text.append(chunk.choices[0].delta.content)
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            results.append(("".join(text), finish))
        except BaseException as exc:
            failures.append(exc)
            started.abort()

    try:
        wait_ready(port)
        threads = [threading.Thread(target=stream) for _ in range(STREAMS)]
        for t in threads:
            t.start()
        started.wait()  # every stream has its first token: all are in flight
        proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: refuses_connections(port), message="the gateway kept accepting connections"
        )
        still_streaming = sum(t.is_alive() for t in threads)
        for t in threads:
            t.join(timeout=30)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not failures, failures
    assert still_streaming > 0, "the streams ended before the gateway stopped listening"
    assert len(results) == STREAMS
    assert all(text and finish in ("stop", "length") for text, finish in results), results
    db = sa.create_engine(env["DATABASE_URL"])
    with db.connect() as conn:
        rows = conn.execute(sa.select(request_records.c.status, request_records.c.stream)).all()
    db.dispose()
    # The flush interval is 30 s: the records exist only because shutdown wrote them.
    assert sorted(rows) == [(200, True)] * STREAMS


def test_serve_refuses_an_invalid_policy_at_startup(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {}\n")
    result = gateway("serve", "--port", "1", env={"GATEWAY_POLICY": str(bad)})
    assert result.returncode == 2
    assert str(bad) in result.stderr and "pools" in result.stderr


def test_serve_answers_then_stops_on_sigterm_with_records_flushed(sims, tmp_path: Path) -> None:
    env = migrated_fleet(sims, tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_ready(port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        for _ in range(3):
            assert client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            ).choices
        error = not_http_error(f"http://127.0.0.1:{port}", NOT_HTTP[0])
        assert error["code"] == "invalid_http_request"
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=UPGRADE, timeout=10)
        assert models.status_code == 200, models.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    db = sa.create_engine(env["DATABASE_URL"])
    with db.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(request_records)).scalar()
    db.dispose()
    # The flush interval is 30 s: the records exist only because shutdown wrote them.
    assert count == 3


def test_serve_holds_to_the_connection_and_header_limits_of_its_settings(
    sims, tmp_path: Path
) -> None:
    env = migrated_fleet(
        sims, tmp_path, GATEWAY_MAX_CONNECTIONS="2", GATEWAY_MAX_HEADER_BYTES="4096"
    )
    with gateway_process(env, tmp_path / "serve.log") as served:
        held = [socket.create_connection(("127.0.0.1", served.port), timeout=20) for _ in range(2)]
        try:
            for raw in held:  # each answered once: the gateway counts both
                raw.sendall(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
                assert raw.recv(65536).startswith(b"HTTP/1.1 200")  # its head comes first
            with socket.create_connection(("127.0.0.1", served.port), timeout=20) as extra:
                assert extra.recv(65536).startswith(b"HTTP/1.1 503")
        finally:
            for raw in held:
                raw.close()
        wait_for(lambda: httpx.get(served.url + "/healthz").status_code == 200)
        big = httpx.get(served.url + "/healthz", headers={"x-filler": "a" * 5000})
    assert big.status_code == 431
