"""`gateway db`: migrate the database, and drop or delete what is past retention."""

from __future__ import annotations

import argparse
import sys

from gateway.settings import Settings


def _upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.connection import upgrade

    upgrade(settings.database_url, args.revision)
    print(f"database migrated to {args.revision}")
    return 0


def _prune(args: argparse.Namespace, settings: Settings) -> int:
    import time
    from datetime import UTC, datetime

    from gateway.db.connection import connect
    from gateway.db.retention import Windows, drop_days, prune
    from gateway.errors import DatabaseUnavailable

    windows, now = Windows.of(settings), time.time()
    db = connect(settings.database_url)
    try:
        dropped = drop_days(db, windows, now)
        deleted = prune(db, windows, now)
    except DatabaseUnavailable as exc:
        where = db.url.render_as_string(hide_password=True)
        print(f"error: {exc} at {where}; run `gateway db upgrade` first", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    cutoffs = windows.cutoffs(now)
    for table, days in windows.days().items():
        if table not in cutoffs:
            print(f"{table.name}: kept forever (retention 0 days)")
            continue
        since = datetime.fromtimestamp(cutoffs[table], UTC).strftime("%Y-%m-%d %H:%M UTC")
        print(
            f"{table.name}: deleted {deleted[table.name]} rows from before {since} ({days:g} days)"
        )
        if dropped.get(table.name):
            print(f"{table.name}: dropped the days {', '.join(dropped[table.name])}")
    if "cost_models" in deleted:
        print(
            f"cost_models: deleted {deleted['cost_models']} from before the request window, "
            "all but the one in force at its edge"
        )
    return 0


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    db = commands.add_parser("db", help="manage the database").add_subparsers(
        dest="db_command", required=True
    )
    up = db.add_parser("upgrade", help="apply migrations to DATABASE_URL")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(run=_upgrade)
    prune = db.add_parser(
        "prune", help="delete records past GATEWAY_RETENTION_DAYS and GATEWAY_SHADOW_RETENTION_DAYS"
    )
    prune.set_defaults(run=_prune)
