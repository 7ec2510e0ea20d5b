"""Serve a simulator app with uvicorn (uvloop + httptools) on one port."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Iterator

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from simulator.app import SimulatorApp
from simulator.clock import ScaledClock
from simulator.exchange import TRANSPORT_EXTENSION
from simulator.external import ExternalLoad
from simulator.faults import Faults
from simulator.fleet import Fleet
from simulator.kv_events import KvEventsConfig, Publisher
from simulator.profile import Profile

# Long enough for a stream to finish, short enough that hung requests do not block exit.
GRACEFUL_SHUTDOWN_S = 1


class _TransportExposingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, handing each request its transport so faults can cut it,
    and calling the request's `lost` callbacks as the connection is lost."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._lost: list[Callable[[], None]] = []
        self.scope["extensions"] = {
            TRANSPORT_EXTENSION: {"transport": self.transport, "lost": self._lost}
        }

    def connection_lost(self, exc: Exception | None) -> None:
        # uvicorn only wakes the request's task here; a client gone must stop counting now.
        for callback in list(getattr(self, "_lost", ())):
            callback()
        super().connection_lost(exc)


class _Server(uvicorn.Server):
    """uvicorn's server, exiting with status 0 on SIGINT/SIGTERM instead of re-raising them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def bind(host: str, port: int) -> socket.socket:
    """Return a socket bound to (host, port); port 0 picks a free one."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    return sock


def url_of(sock: socket.socket) -> str:
    """Return the http:// URL a bound socket serves."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(
    profile: Profile,
    sock: socket.socket,
    *,
    devices: int = 1,
    speed: float = 1.0,
    seed: int = 0,
    faults: Faults | None = None,
    on_ready: Callable[[str], None] = print,
    log_level: str = "warning",
    api_key: str | None = None,
    engine: str | None = None,
    external_load: ExternalLoad | None = None,
    kv_events: KvEventsConfig | None = None,
) -> None:
    """Run a simulator on the bound socket `sock` until SIGINT or SIGTERM."""
    fleet = Fleet(profile, devices, ScaledClock(speed))
    port = sock.getsockname()[1]
    publisher = Publisher(kv_events) if kv_events is not None and kv_events.enabled else None
    app = SimulatorApp(
        profile,
        fleet,
        seed=seed,
        faults=faults,
        instance=str(port),
        api_key=api_key,
        engine=engine,
        kv_events=publisher,
    )
    if external_load is not None:
        app.set_external_load(external_load)
    config = uvicorn.Config(
        app,
        http=_TransportExposingProtocol,
        lifespan="off",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = _Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving  # startup failed: surface its error
            return
        await asyncio.sleep(0.005)
    on_ready(url_of(sock))
    try:
        await serving
    finally:
        if publisher is not None:
            publisher.close()


def run(profile: Profile, sock: socket.socket, **options: object) -> None:
    """Run `serve` on a uvloop event loop (asyncio's own if uvloop is missing)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        factory = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(profile, sock, **options))  # type: ignore[arg-type]
