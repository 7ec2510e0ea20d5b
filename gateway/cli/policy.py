"""`gateway policy`: validate, diff, simulate, apply, list, roll back and show policy versions."""

from __future__ import annotations

import argparse
import os
import sys

from gateway.cli.changes import announce, operator
from gateway.policy.credentials import Access
from gateway.policy.load import load_policy, read_text
from gateway.settings import Settings


def _access(settings: Settings) -> Access:
    """Return the upstream rules of these settings, with the keys this shell holds."""
    return Access(os.environ, settings.upstream_key_hosts, settings.upstream_hosts)


def _validate(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.policy.validation import validate

    # Upstream keys unset here are warnings: the CLI may run where no secret is kept, and each
    # serving gateway checks its own environment.
    checked = validate(read_text(args.file), args.file, _access(settings), serving=False)
    policy = checked.accepted()
    routes = ", ".join(r.name for r in policy.routes)
    print(f"{args.file}: valid ({len(policy.pools)} pools, routes: {routes})")
    for warning in checked.warnings:
        print(f"warning: {warning}")
    return 1 if checked.warnings and args.strict else 0


def _diff(args: argparse.Namespace, settings: Settings) -> int:
    import difflib

    from gateway.db.connection import connect
    from gateway.policy import versions

    active = versions.active(connect(settings.database_url))
    text = read_text(args.file)
    before = active.content if active is not None else ""
    label = f"version {active.version} (active)" if active is not None else "no active version"
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), text.splitlines(keepends=True), label, args.file
    )
    lines = list(diff)
    if not lines:
        print(f"{args.file}: no changes against {label}")
    sys.stdout.writelines(line if line.endswith("\n") else line + "\n" for line in lines)
    return 0


def _simulate(args: argparse.Namespace, settings: Settings) -> int:
    import json
    import time

    from gateway.db.connection import connect
    from gateway.policy import versions
    from gateway.policy.load import parse_policy
    from gateway.report.period import parse_since
    from gateway.whatif.simulate import simulate_sample
    from gateway.whatif.windows import sample_windows

    db = connect(settings.database_url)
    stored = versions.active(db)
    active = (
        parse_policy(stored.content, f"version {stored.version}")
        if stored is not None
        else load_policy(settings.policy_path)
    )
    proposed = load_policy(args.file)
    since = parse_since(args.since, time.time()) or 0.0
    sample = sample_windows(db, since, size=args.sample, seed=args.seed)
    if not sample.requests:
        print(f"no recorded chat requests since {args.since}: nothing to replay", file=sys.stderr)
        return 1
    result = simulate_sample(active, proposed, sample, processes=args.processes)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    drawn = result["sample"]
    print(
        f"{drawn['requests']} of the period's {drawn['period_requests']} recorded requests"
        f" replayed under the active and proposed policy: {drawn['design']}"
    )
    for key, row in result["change"].items():
        if key == "pool_shares":
            print(f"  pool shares: {row['active']} -> {row['proposed']}")
        else:
            ratio = "" if row["ratio"] is None else f" (x{row['ratio']})"
            print(f"  {key}: {row['active']} -> {row['proposed']}{ratio}")
    if not drawn["whole"]:
        print(f"  the period's figures, 95% intervals ({drawn['interval']}):")
        for name, run in result["runs"].items():
            for key, interval in run["intervals"].items():
                print(
                    f"    {name} {key}: {interval['estimate']}"
                    f" ({interval['low']} to {interval['high']})"
                )
    return 0


def _apply(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.connection import connect
    from gateway.policy.apply import apply

    applied = apply(
        connect(settings.database_url),
        read_text(args.file),
        args.file,
        author=args.author or operator(),
        message=args.message,
        access=_access(settings),
        serving=False,
        precision_gate="override" if args.override_precision_gate else "check",
    )
    for warning in applied.warnings:
        print(f"warning: {warning}")
    stored = applied.version
    if not applied.changed:
        print(f"{args.file}: unchanged, already the active version {stored.version}")
        return 0
    print(
        f"applied {args.file} as version {stored.version} ({stored.hash[:12]}); running gateways "
        f"switch to it within {announce(settings, stored.version)}"
    )
    return 0


def _history(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import UTC, datetime

    from gateway.db.connection import connect
    from gateway.policy import versions

    db = connect(settings.database_url)
    active = versions.active_version(db)
    print(f"{'':1} {'version':>7}  {'created (UTC)':19}  {'author':16} {'hash':12}  message")
    for v in versions.history(db, args.limit):
        created = datetime.fromtimestamp(v.created, UTC).strftime("%Y-%m-%d %H:%M:%S")
        mark = "*" if v.version == active else ""
        print(
            f"{mark:1} {v.version:>7}  {created:19}  {v.author[:16]:16} {v.hash[:12]}  {v.message}"
        )
    return 0


def _rollback(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.connection import connect
    from gateway.policy.apply import rollback

    applied = rollback(
        connect(settings.database_url),
        author=args.author or operator(),
        version=args.version,
        message=args.message,
        access=_access(settings),
        serving=False,
        precision_gate="override" if args.override_precision_gate else "check",
    )
    stored = applied.version
    if not applied.changed:
        print(f"version {stored.version} is active and already serves that text; nothing changed")
        return 0
    print(
        f"version {stored.version} restores version {stored.restores}; running gateways switch "
        f"to it within {announce(settings, stored.version)}"
    )
    return 0


def _show(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.connection import connect
    from gateway.policy import versions

    db = connect(settings.database_url)
    shown = versions.active(db) if args.version is None else None
    if args.version is not None:
        shown = versions.get(db, args.version)
    if shown is None:
        print("error: no policy version is stored yet", file=sys.stderr)
        return 1
    sys.stdout.write(shown.content)
    return 0


def _schema(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.policy.load import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    policy = commands.add_parser("policy", help="work with routing policies").add_subparsers(
        dest="policy_command", required=True
    )
    validate = policy.add_parser("validate", help="check a policy file and report every error")
    validate.add_argument("file")
    validate.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    validate.set_defaults(run=_validate)
    diff = policy.add_parser("diff", help="unified diff of the active version against a file")
    diff.add_argument("file")
    diff.set_defaults(run=_diff)
    simulate = policy.add_parser(
        "simulate", help="replay recorded requests through a proposed policy (what-if)"
    )
    simulate.add_argument("file")
    simulate.add_argument(
        "--since", default="7d", help="period to replay: an age like 7d, or a time"
    )
    simulate.add_argument(
        "--sample",
        type=int,
        default=20_000,
        help="replay at most about this many requests: whole windows of the period, each after"
        " its warm-up, drawn at random within strata of time",
    )
    simulate.add_argument(
        "--seed", type=int, default=0, help="the draw of the sampled windows (default 0)"
    )
    simulate.add_argument(
        "--processes",
        type=int,
        default=2,
        help="replay the two policies in this many processes (1: one after the other)",
    )
    simulate.add_argument("--json", action="store_true")
    simulate.set_defaults(run=_simulate)
    apply = policy.add_parser("apply", help="store a valid policy as the new active version")
    apply.add_argument("file")
    apply.add_argument("-m", "--message", required=True, help="why this change")
    apply.add_argument("--author", help="who (default: the OS user)")
    apply.add_argument(
        "--override-precision-gate",
        action="store_true",
        help="let a shadow-only pool go live without a passing precision check (the version's "
        "message records it)",
    )
    apply.set_defaults(run=_apply)
    history = policy.add_parser("history", help="list stored versions, newest first")
    history.add_argument("--limit", type=int, default=50)
    history.set_defaults(run=_history)
    rollback = policy.add_parser(
        "rollback", help="serve a previous version again (default: the one before the active)"
    )
    rollback.add_argument("version", nargs="?", type=int)
    rollback.add_argument("-m", "--message", default="", help="why (default: 'roll back to N')")
    rollback.add_argument("--author", help="who (default: the OS user)")
    rollback.add_argument(
        "--override-precision-gate",
        action="store_true",
        help="let a shadow-only pool the version has serve clients do so without a passing "
        "precision check (the new version's message records it)",
    )
    rollback.set_defaults(run=_rollback)
    show = policy.add_parser("show", help="print a stored version (default: the active one)")
    show.add_argument("version", nargs="?", type=int)
    show.set_defaults(run=_show)
    schema = policy.add_parser("schema", help="print the policy's JSON Schema")
    schema.set_defaults(run=_schema)
