"""The real fleet's processes, started and stopped together: `python -m realfleet.fleet`.

Five llama-server engines (two f16 replicas for the reference GPU pool, the Q8_0 ASIC, the
analog CIM part, the embedding model) and the power exporter that meters them. Their ports are
policies/real.yaml's for `make real`; tests start the same fleet on free ports and serve the same
policy file with their URLs put in (`policy`).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from realfleet import embedding, engine, weights
from realfleet.corpus import MODEL
from realfleet.engine import Server, ServerSpec

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "policies" / "real.yaml"
EMBEDDING_MODEL = "all-minilm-l6-v2"


@dataclass(frozen=True, slots=True)
class Backend:
    """One engine of the fleet: its pool, the model part it serves and its shape."""

    name: str
    pool: str
    part: str  # a precision of realfleet.weights, or "embedding"
    context: int
    slots: int


# Context is in all; each slot holds context / slots (the pool's max_context in the policy).
BACKENDS = (
    Backend("gpu-0", "gpu", "f16", 8192, 4),
    Backend("gpu-1", "gpu", "f16", 8192, 4),
    Backend("asic-0", "asic", "q8_0", 2048, 4),
    Backend("cim-0", "cim", "analog", 2048, 2),
    Backend("embed-0", "embed", "embedding", 1024, 2),
)


def models(cache: Path) -> dict[str, Path]:
    """Return each part's model file, made (once) in the cache."""
    folder = cache / "models"
    parts = {name: part.path for name, part in weights.derive(folder).items()}
    parts["embedding"] = embedding.ensure(folder)
    return parts


def spec(backend: Backend, files: Mapping[str, Path], seed: int = 0) -> ServerSpec:
    """Return how `backend`'s engine is started."""
    embeds = backend.part == "embedding"
    return ServerSpec(
        model=files[backend.part],
        alias=EMBEDDING_MODEL if embeds else MODEL,
        context=backend.context,
        slots=backend.slots,
        embeddings=embeds,
        seed=seed,
    )


def _backends(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for pool in doc["pools"].values() for b in pool["backends"]]


def default_ports() -> dict[str, int]:
    """Return each backend's port as policies/real.yaml gives it, and the exporter's."""
    backends = _backends(yaml.safe_load(POLICY.read_text()))
    ports = {b["name"]: int(urlsplit(b["url"]).port or 0) for b in backends}
    (ports["power"],) = {int(urlsplit(b["metrics_url"]).port or 0) for b in backends}
    return ports


def policy(ports: Mapping[str, int]) -> str:
    """Return policies/real.yaml with each backend and its power page on `ports`."""
    doc = yaml.safe_load(POLICY.read_text())
    for b in _backends(doc):
        b["url"] = f"http://127.0.0.1:{ports[b['name']]}"
        b["metrics_url"] = f"http://127.0.0.1:{ports['power']}/backends/{b['name']}/metrics"
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class RealFleet:
    """The running fleet: its engines by backend name, the exporter, and their ports."""

    servers: dict[str, Server]
    exporter: subprocess.Popen[bytes]
    ports: dict[str, int] = field(default_factory=dict)

    def url(self, backend: str) -> str:
        return self.servers[backend].url

    def policy(self) -> str:
        return policy(self.ports)


def _exporter(
    servers: Mapping[str, Server], port: int, log: Path | None
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "realfleet.power", "--port", str(port)]
    for name, server in servers.items():
        args += ["--backend", f"{name}={server.pid}"]
    return engine.spawn(args, log, cwd=ROOT)


def _wait_exporter(process: subprocess.Popen[bytes], port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    return
            # A paced poll that ends at once if the exporter exits.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.05)
                raise RuntimeError(f"the power exporter exited with {process.returncode}")
    raise TimeoutError(f"the power exporter did not start in {timeout_s} s")


@contextlib.contextmanager
def running(
    ports: Mapping[str, int] | None = None, logs: Path | None = None
) -> Iterator[RealFleet]:
    """Start the whole fleet (on free ports unless given), ready on entry; stop it after."""
    cache = engine.cache_dir()
    files = models(cache)
    chosen = dict(ports) if ports else {b.name: engine.free_port() for b in BACKENDS}
    chosen.setdefault("power", engine.free_port())
    servers: dict[str, Server] = {}
    exporter = None
    try:
        for i, backend in enumerate(BACKENDS):
            log = logs / f"{backend.name}.log" if logs else None
            servers[backend.name] = engine.launch(
                spec(backend, files, seed=i), chosen[backend.name], log
            )
        for server in servers.values():
            engine.wait_ready(server)
        for attempt in range(3):
            started = _exporter(servers, chosen["power"], logs / "power.log" if logs else None)
            exporter = started
            try:
                _wait_exporter(exporter, chosen["power"])
                break
            except RuntimeError:
                if ports or attempt == 2:
                    raise
                started.terminate()
                started.wait()
                # Its free port was chosen before the engines started, and another process
                # (another fleet's engine, a client's ephemeral port) may have taken it since.
                chosen["power"] = engine.free_port()
        yield RealFleet(servers, started, chosen)
    finally:
        if exporter is not None:
            exporter.terminate()
            exporter.wait()
        for server in servers.values():
            engine.stop(server)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m realfleet.fleet", description=__doc__)
    parser.add_argument("--logs", type=Path, default=Path("run"))
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    stopped = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with running(default_ports(), args.logs) as fleet:
        for b in BACKENDS:
            print(f"{b.name} ({b.pool}, {b.part}): {fleet.url(b.name)}", flush=True)
        print(f"power exporter: http://127.0.0.1:{fleet.ports['power']}", flush=True)
        print("real fleet ready", flush=True)
        while not stopped:
            signal.pause()


if __name__ == "__main__":
    main()
