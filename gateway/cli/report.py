"""`gateway report`: the weekly shadow-comparison report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.policy.load import load_policy
from gateway.settings import Settings


def _weekly(args: argparse.Namespace, settings: Settings) -> int:
    import time

    from gateway.costmodel import store
    from gateway.db.connection import connect
    from gateway.report import generate, period

    try:
        if args.week:
            if args.until:
                raise ValueError("--until goes with --since, not with --week")
            span = period.week(args.week)
        elif args.since or args.until:
            if not (args.since and args.until):
                raise ValueError("--since and --until go together")
            span = period.date_range(args.since, args.until)
        else:
            span = period.last_complete_week(time.time())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    policy = load_policy(settings.policy_path)
    db = connect(settings.database_url)
    report = generate(db, policy, span, args.out, model=store.load_latest(db, policy))
    db.dispose()
    for c in report["candidates"]:
        verdict = c["verdict"]["outcome"] if c["verdict"] else "no evidence"
        print(f"{c['route']} → {c['candidate']}: {verdict}")
    print(f"report {span.label} written to {args.out}/report.html, report.md, report.json")
    return 0


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    report = commands.add_parser("report", help="shadow-comparison reports").add_subparsers(
        dest="report_command", required=True
    )
    weekly = report.add_parser(
        "weekly", help="write report.html, report.md and report.json for a week (docs/report.md)"
    )
    span = weekly.add_mutually_exclusive_group()
    span.add_argument("--week", help="ISO week like 2026-W48 (default: the last complete week)")
    span.add_argument("--since", help="first day (UTC), with --until")
    weekly.add_argument("--until", help="last day, included (UTC), with --since")
    weekly.add_argument("--out", type=Path, required=True, help="directory to write into")
    weekly.set_defaults(run=_weekly)
