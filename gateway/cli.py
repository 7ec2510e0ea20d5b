"""The `gateway` command: serve, migrate the database, and validate policies."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from gateway.errors import PolicyError
from gateway.policy import load_policy
from gateway.settings import Settings


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from gateway.app import create_app

    host = args.host or settings.host
    port = args.port or settings.port
    app = create_app(settings)

    # uvicorn drains and runs the lifespan shutdown (records flushed), then re-raises the
    # signal; a stop the operator asked for is a clean exit, not a death by signal.
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
        http="httptools",
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
    )
    return 0


def _db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db import upgrade

    upgrade(settings.database_url, args.revision)
    print(f"database migrated to {args.revision}")
    return 0


def _policy_validate(args: argparse.Namespace, settings: Settings) -> int:
    policy = load_policy(args.file)
    routes = ", ".join(r.name for r in policy.routes)
    print(f"{args.file}: valid ({len(policy.pools)} pools, routes: {routes})")
    return 0


def parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    root = argparse.ArgumentParser(prog="gateway", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="run the gateway (reads GATEWAY_POLICY, DATABASE_URL)"
    )
    serve.add_argument("--host", help="address to listen on (default GATEWAY_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default GATEWAY_PORT or 8080)")
    serve.set_defaults(run=_serve)

    db = commands.add_parser("db", help="manage the database").add_subparsers(
        dest="db_command", required=True
    )
    up = db.add_parser("upgrade", help="apply migrations to DATABASE_URL")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(run=_db_upgrade)

    policy = commands.add_parser("policy", help="work with routing policies").add_subparsers(
        dest="policy_command", required=True
    )
    validate = policy.add_parser("validate", help="check a policy file and report every error")
    validate.add_argument("file")
    validate.set_defaults(run=_policy_validate)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gateway command; return its exit status."""
    args = parser().parse_args(argv)
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.run(args, settings))
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
