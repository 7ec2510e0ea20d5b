"""Run the real gateway app in-process on a loopback port, the way tests and users reach it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import sqlalchemy as sa
import uvicorn

from gateway.app import GatewayApp
from gateway.db.connection import upgrade
from gateway.db.schema import request_records
from gateway.ingress.protocol import HttpProtocol, Limits
from gateway.policy.definition import Policy
from gateway.runtime import Gateway
from gateway.settings import Settings


class GatewayServer:
    """A started gateway: its URL, its internals for inspection, and clients for it."""

    def __init__(self, gateway: Gateway, url: str):
        self.gateway = gateway
        self.url = url

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="test-key", max_retries=0, **kw)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def records(self, expected: int, timeout: float = 60.0, *, settled: bool = True) -> list[dict]:
        """Wait until at least `expected` request records are written, and, if `settled`, the
        energy of every one that reached a backend (it lands seconds after its record); return
        them all."""
        deadline = time.monotonic() + timeout
        while True:
            with self.gateway.db.connect() as conn:
                rows = [dict(r._mapping) for r in conn.execute(sa.select(request_records))]
            done = len(rows) >= expected and (
                not settled
                or all(r["energy_estimated"] is not None for r in rows if r["backend"] is not None)
            )
            if done or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)


def free_port() -> int:
    """Return a loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int) -> None:
    """Wait until a gateway process on port answers /readyz with 200."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "gateway did not become ready"
        time.sleep(0.1)


@contextlib.contextmanager
def run_gateway(policy: Policy, tmp_path: Path, **settings: object) -> Iterator[GatewayServer]:
    """Migrate a fresh SQLite database, start the gateway on a free port, stop it after."""
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    fields: dict[str, object] = {
        "database_url": url,
        "record_flush_interval_s": 0.05,
        "health_check_interval_s": 0.2,
        "spill_dir": tmp_path / "spill",
    }
    fields.update(settings)
    gateway = Gateway(Settings(**fields), policy)  # type: ignore[arg-type]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        GatewayApp(gateway),
        http=HttpProtocol.within(Limits.of(gateway.settings)),
        ws="none",
        lifespan="on",
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the gateway did not start")
        time.sleep(0.01)
    try:
        yield GatewayServer(gateway, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


ROOT = Path(__file__).resolve().parent.parent


class GatewayProcess:
    """A `gateway serve` subprocess on a loopback port."""

    def __init__(self, process: subprocess.Popen[str], port: int):
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="test-key", max_retries=0, **kw)

    def readiness(self) -> dict:
        result: dict = httpx.get(self.url + "/readyz", timeout=5).json()
        return result

    def kill(self) -> None:
        """Kill the process at once, as a crash would: nothing is given back or flushed."""
        self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def gateway_process(env: dict[str, str], log: Path) -> Iterator[GatewayProcess]:
    """Run `python -m gateway serve` with env (on top of os.environ) until the block exits.

    Its output goes to `log`, for the test to read or to show when it fails.
    """
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
            env={**os.environ, **env},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        wait_ready(port)
        yield GatewayProcess(process, port)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
