"""`gateway serve`: run the gateway until SIGTERM or Ctrl-C, then drain and flush."""

from __future__ import annotations

import argparse
import math
import signal

from gateway.settings import Settings


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.ingress.protocol import HttpProtocol, Limits

    host = args.host or settings.host
    port = args.port or settings.port
    if args.watch:
        settings = settings.model_copy(update={"watch_policy": True})
    app = create_app(settings)

    # uvicorn stops listening, lets in-flight requests finish (up to the drain timeout), runs
    # the lifespan shutdown (records flushed), then re-raises the signal; a stop the operator
    # asked for is a clean exit, not a death by signal.
    def exit_cleanly(signum: int, frame: object) -> None:
        raise SystemExit(0)

    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, exit_cleanly)
    print(f"gateway listening on http://{host}:{port} (policy {settings.policy_path})", flush=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=HttpProtocol.within(Limits.of(settings)),
        ws="none",  # the gateway serves no WebSockets: an Upgrade header is ignored
        log_level=settings.log_level,
        access_log=False,
        # The gateway reads no client address, so X-Forwarded-* rewriting is a layer of
        # middleware on every request for nothing.
        proxy_headers=False,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s),
    )
    return 0


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    serve = commands.add_parser(
        "serve", help="run the gateway (reads GATEWAY_POLICY, DATABASE_URL)"
    )
    serve.add_argument("--host", help="address to listen on (default GATEWAY_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default GATEWAY_PORT or 8080)")
    serve.add_argument(
        "--watch", action="store_true", help="apply GATEWAY_POLICY whenever it is saved, if valid"
    )
    serve.set_defaults(run=_serve)
