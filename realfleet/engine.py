"""llama.cpp's llama-server: where the binary is, and one server process started on loopback.

The binary is built by scripts/build-engine.sh (make engine) into the engine cache, once per
machine. A server is started with its model, alias, context and slots, on a port it is given,
and is ready when `/health` answers 200.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

VERSION = "0.3.36"  # of the llama-cpp-python sdist whose vendored sources are built


class EngineMissing(RuntimeError):
    """llama-server has not been built on this machine (make engine builds it)."""


def cache_dir() -> Path:
    """Return the folder where the engine and the fleet's model files are kept between runs."""
    if os.environ.get("ENGINE_CACHE"):
        return Path(os.environ["ENGINE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shadow-gateway"


def server_binary() -> Path:
    """Return the path of the built llama-server, or raise EngineMissing."""
    path = cache_dir() / f"llama.cpp-{VERSION}" / "bin" / "llama-server"
    if not os.access(path, os.X_OK):
        raise EngineMissing(f"no llama-server at {path}: `make engine` builds it")
    return path


def free_port() -> int:
    """Return a loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How one llama-server is started: its model file, the name it answers to, its shape."""

    model: Path
    alias: str
    context: int = 4096  # tokens in all; each slot gets context / slots
    slots: int = 2
    threads: int = 1
    embeddings: bool = False
    seed: int = 0

    def args(self, port: int) -> list[str]:
        """Return the command line of a server of this spec on `port`."""
        args = [
            str(server_binary()),
            "--model", str(self.model),
            "--alias", self.alias,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--ctx-size", str(self.context),
            "--parallel", str(self.slots),
            "--threads", str(self.threads),
            "--threads-batch", str(self.threads),
            "--seed", str(self.seed),
            "--metrics",
            "--no-webui",
        ]  # fmt: skip
        if self.embeddings:
            args += ["--embeddings", "--pooling", "mean"]
        return args


@dataclass
class Server:
    """A running llama-server process."""

    spec: ServerSpec
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid


def launch(
    spec: ServerSpec, port: int | None = None, log: Path | None = None, extra: Sequence[str] = ()
) -> Server:
    """Start a server of `spec` (on a free port unless one is given); it is not yet ready."""
    port = port or free_port()
    return Server(spec, spawn([*spec.args(port), *extra], log), port)


def spawn(
    args: Sequence[str], log: Path | None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a process whose output is appended to `log`, or discarded without one."""
    with open(log if log is not None else os.devnull, "ab") as out:
        # The child has its own copy of the descriptor, so ours closes at once.
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd
        )


def wait_ready(server: Server, timeout_s: float = 120.0) -> None:
    """Return once the server's /health answers 200; raise if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"llama-server for {server.spec.alias} exited with {server.process.returncode}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.url}/health").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"llama-server for {server.spec.alias} not ready in {timeout_s}s"
                )
            time.sleep(0.05)


def stop(server: Server, timeout_s: float = 10.0) -> None:
    """Stop a server: SIGTERM, then SIGKILL if it does not exit in time."""
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def start(spec: ServerSpec, log: Path | None = None, attempts: int = 3) -> Server:
    """Launch a server of `spec` on a free port and return it ready. One that exits before it
    serves is launched again on another port: a port free a moment ago may be taken before the
    server binds it (an outgoing connection's ephemeral port, another test's server)."""
    for attempt in range(attempts):
        server = launch(spec, log=log)
        try:
            wait_ready(server)
            return server
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def serving(spec: ServerSpec, log: Path | None = None) -> Iterator[Server]:
    """Run one server for the duration of a block, ready on entry."""
    server = start(spec, log=log)
    try:
        yield server
    finally:
        stop(server)
