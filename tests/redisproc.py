"""A private Redis server for tests that stop and restart it: `with start_redis() as r: r.url`.

Tests that only need Redis use the machine's server (the `redis_url` fixture); tests that break
it on purpose get their own process on a free port, so nothing else is disturbed.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from harness.gateways import free_port


class RedisProcess:
    """A redis-server subprocess that keeps nothing on disk, and can be stopped and started."""

    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self._workdir = workdir
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        self._process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.ping()
                break
            except (redis.ConnectionError, redis.TimeoutError):  # not listening, or answering, yet
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        """Kill the server: it forgets everything, as an unpersisted Redis does."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None


@contextlib.contextmanager
def start_redis(workdir: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(free_port(), workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
