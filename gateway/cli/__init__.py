"""The `gateway` command: serve, migrate the database, and validate policies."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.errors import GatewayError, PolicyError
from gateway.policy.load import load_policy, parse_policy
from gateway.policy.model import Policy
from gateway.settings import Settings


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.ingress.protocol import HttpProtocol

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
        http=HttpProtocol,
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


def _db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.engine import upgrade

    upgrade(settings.database_url, args.revision)
    print(f"database migrated to {args.revision}")
    return 0


def _key_warnings(policy: Policy, text: str, source: str) -> list[str]:
    """List the upstream key variables the policy names that are unset here."""
    # Only warnings: the CLI may run where no secret is kept; each serving gateway checks its own.
    import os

    from gateway.policy import credentials
    from gateway.policy.load import locator

    at = locator(text, source)
    where = "here; every gateway that serves this policy needs it"
    return [str(at(p, m)) for p, m in credentials.unset(policy, os.environ, where)]


def _db_prune(args: argparse.Namespace, settings: Settings) -> int:
    import time
    from datetime import UTC, datetime

    from gateway.db.engine import make_engine
    from gateway.db.retention import Windows, prune
    from gateway.errors import DatabaseUnavailable

    windows, now = Windows.of(settings), time.time()
    engine = make_engine(settings.database_url)
    try:
        deleted = prune(engine, windows, now)
    except DatabaseUnavailable as exc:
        where = engine.url.render_as_string(hide_password=True)
        print(f"error: {exc} at {where}; run `gateway db upgrade` first", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    cutoffs = windows.cutoffs(now)
    for table, days in windows.days().items():
        if table not in cutoffs:
            print(f"{table.name}: kept forever (retention 0 days)")
            continue
        since = datetime.fromtimestamp(cutoffs[table], UTC).strftime("%Y-%m-%d %H:%M UTC")
        print(
            f"{table.name}: deleted {deleted[table.name]} rows from before {since} ({days:g} days)"
        )
    if "cost_models" in deleted:
        print(
            f"cost_models: deleted {deleted['cost_models']} from before the request window, "
            "all but the one in force at its edge"
        )
    return 0


def _policy_validate(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.policy.check import validate

    policy = load_policy(args.file)
    routes = ", ".join(r.name for r in policy.routes)
    print(f"{args.file}: valid ({len(policy.pools)} pools, routes: {routes})")
    text = Path(args.file).read_text()
    warnings = [
        *map(str, validate(text, args.file).warnings),
        *_key_warnings(policy, text, args.file),
    ]
    for warning in warnings:
        print(f"warning: {warning}")
    return 1 if warnings and args.strict else 0


def _policy_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the policy file: {exc.strerror}") from exc


def _os_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def _policy_diff(args: argparse.Namespace, settings: Settings) -> int:
    import difflib

    from gateway.db.engine import make_engine
    from gateway.policy import versions

    active = versions.active(make_engine(settings.database_url))
    text = _policy_text(args.file)
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


def _policy_simulate(args: argparse.Namespace, settings: Settings) -> int:
    import json
    import time

    from gateway.db.engine import make_engine
    from gateway.ops.admin import parse_since
    from gateway.policy import versions
    from gateway.policy.load import parse_policy
    from gateway.replay.whatif import recorded_requests, simulate

    engine = make_engine(settings.database_url)
    stored = versions.active(engine)
    active = (
        parse_policy(stored.content, f"version {stored.version}")
        if stored is not None
        else load_policy(settings.policy_path)
    )
    proposed = load_policy(args.file)
    since = parse_since(args.since, time.time()) or 0.0
    requests = recorded_requests(engine, since, limit=args.limit)
    if not requests:
        print(f"no recorded chat requests since {args.since}: nothing to replay", file=sys.stderr)
        return 1
    result = simulate(active, proposed, requests)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['requests']} recorded requests replayed under the active and proposed policy")
    for key, row in result["change"].items():
        if key == "pool_shares":
            print(f"  pool shares: {row['active']} -> {row['proposed']}")
        else:
            ratio = "" if row["ratio"] is None else f" (x{row['ratio']})"
            print(f"  {key}: {row['active']} -> {row['proposed']}{ratio}")
    return 0


def _policy_apply(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.engine import make_engine
    from gateway.policy import versions
    from gateway.policy.check import validate
    from gateway.policy.load import content_hash

    text = _policy_text(args.file)
    policy = parse_policy(text, args.file)  # an invalid policy stops here, every error located
    for warning in [
        *map(str, validate(text, args.file).warnings),
        *_key_warnings(policy, text, args.file),
    ]:
        print(f"warning: {warning}")
    engine = make_engine(settings.database_url)
    active = versions.active(engine)
    if active is not None and active.hash == content_hash(text):
        print(f"{args.file}: unchanged, already the active version {active.version}")
        return 0
    stored = versions.record(engine, text, args.author or _os_user(), args.message)
    print(
        f"applied {args.file} as version {stored.version} ({stored.hash[:12]}); running gateways "
        f"switch to it within {_switch_time(settings, stored.version)}"
    )
    return 0


def _switch_time(settings: Settings, version: int) -> str:
    """Tell running gateways a new version is active; return how soon they will serve it."""
    from gateway.fleet.sharedstate import tell_replicas

    if settings.redis_url and tell_replicas(
        settings.redis_url, settings.redis_prefix, "policy", version=version
    ):
        return "a second"
    return f"{settings.policy_poll_interval_s:g} s"


def _policy_history(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import UTC, datetime

    from gateway.db.engine import make_engine
    from gateway.policy import versions

    engine = make_engine(settings.database_url)
    active = versions.active_version(engine)
    print(f"{'':1} {'version':>7}  {'created (UTC)':19}  {'author':16} {'hash':12}  message")
    for v in versions.history(engine, args.limit):
        created = datetime.fromtimestamp(v.created, UTC).strftime("%Y-%m-%d %H:%M:%S")
        mark = "*" if v.version == active else ""
        print(
            f"{mark:1} {v.version:>7}  {created:19}  {v.author[:16]:16} {v.hash[:12]}  {v.message}"
        )
    return 0


def _policy_rollback(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.engine import make_engine
    from gateway.policy import versions

    engine = make_engine(settings.database_url)
    stored = versions.rollback(engine, args.author or _os_user(), args.version, args.message)
    print(
        f"version {stored.version} restores version {stored.restores}; running gateways switch "
        f"to it within {_switch_time(settings, stored.version)}"
    )
    return 0


def _policy_show(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.db.engine import make_engine
    from gateway.policy import versions

    engine = make_engine(settings.database_url)
    shown = versions.active(engine) if args.version is None else None
    if args.version is not None:
        shown = versions.get(engine, args.version)
    if shown is None:
        print("error: no policy version is stored yet", file=sys.stderr)
        return 1
    sys.stdout.write(shown.content)
    return 0


def _policy_schema(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.policy.load import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _explain(args: argparse.Namespace, settings: Settings) -> int:
    import json
    from pathlib import Path

    body_text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    headers = dict(_header(h) for h in args.header)
    if args.url:
        import httpx

        token = settings.admin_token.get_secret_value() if settings.admin_token else ""
        response = httpx.post(
            args.url.rstrip("/") + "/admin/explain",
            json={"endpoint": args.endpoint, "body": json.loads(body_text), "headers": headers},
            headers={"authorization": f"Bearer {token}"},
            timeout=10,
        )
        print(json.dumps(response.json(), indent=2))
        return 0 if response.status_code == 200 else 1
    from gateway.costmodel import store
    from gateway.costmodel.model import CostModel, OutputLengths
    from gateway.db.engine import make_engine
    from gateway.fleet.state import Fleet
    from gateway.routing.classify import TokenEstimator
    from gateway.routing.explain import explain
    from gateway.routing.ranking import CostRanker

    policy = load_policy(settings.policy_path)
    try:
        model = store.load_latest(make_engine(settings.database_url), policy)
    except Exception:
        model = None  # no database yet: the physics prior explains just as well
    ranker = CostRanker(lambda: model or CostModel(policy), OutputLengths())
    result = explain(
        args.endpoint,
        json.loads(body_text),
        headers,
        policy,
        Fleet(policy),
        ranker,
        TokenEstimator(),
    )
    print(json.dumps(result, indent=2))
    return 0 if result["status"] == 200 else 1


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep:
        raise SystemExit(f"error: header {text!r} is not NAME: VALUE")
    return name.strip().lower(), value.strip()


def _model_train(args: argparse.Namespace, settings: Settings) -> int:
    import time

    import sqlalchemy as sa

    from gateway.costmodel import store
    from gateway.costmodel.train import observations_from_rows, train
    from gateway.db.engine import make_engine
    from gateway.db.schema import request_records

    policy = load_policy(settings.policy_path)
    engine = make_engine(settings.database_url)
    since = time.time() - args.days * 86400
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(request_records)
            .where(request_records.c.ts >= since)
            .order_by(request_records.c.ts.desc())
            .limit(args.window)
        ).mappings()
        observations = observations_from_rows(reversed([dict(r) for r in rows]))
    model, scores = train(policy, observations, store.next_version(engine))
    model = store.save(engine, model, scores, len(observations))
    print(f"cost model version {model.version} trained on {len(observations)} requests")
    print(f"{'pool':8} {'model':28} {'target':7} {'n':>6} {'MAPE':>7} {'prior':>7}")
    for pool, models in scores.items():
        for name, targets in models.items():
            for target, score in targets.items():
                mape = "-" if score.mape is None else f"{score.mape:.1%}"
                prior = "-" if score.prior_mape is None else f"{score.prior_mape:.1%}"
                print(f"{pool:8} {name:28} {target:7} {score.observations:>6} {mape:>7} {prior:>7}")
    return 0


def _bench_routing(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.replay.bench import format_table, run_live_comparison, run_routing_benchmark
    from gateway.replay.trace import TraceError

    policy = args.policy or settings.policy_path
    try:
        if args.live:
            result = run_live_comparison(
                args.live,
                args.trace,
                args.out,
                policy,
                speed=args.live_speed,
                rate_scale=args.rate_scale,
                limit=args.limit,
                seed=args.seed,
            )
            print(json.dumps(result["comparison"], indent=2))
        else:
            result = run_routing_benchmark(
                args.trace,
                args.out,
                policy,
                rate_scale=args.rate_scale,
                limit=args.limit,
                seed=args.seed,
                strategies=args.strategies.split(",") if args.strategies else None,
            )
            print(format_table(result["strategies"]))
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"written to {args.out}")
    return 0


def _promote_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.db.engine import make_engine
    from gateway.promotion.evidence import evaluate

    policy = load_policy(settings.policy_path)
    verdicts = evaluate(make_engine(settings.database_url), policy, route=args.route)
    if args.json:
        print(json.dumps([v.as_dict() for v in verdicts], indent=2))
        return 0
    if not verdicts:
        print("no shadow evidence in the promotion window")
    for v in verdicts:
        needed = f" (~{v.samples_needed} more samples)" if v.samples_needed else ""
        print(f"{v.route} → {v.candidate}: {v.outcome.upper()}: {v.reason}{needed}")
        for check in v.checks:
            interval = (
                ""
                if check.interval is None
                else f" [{check.interval[0]:.4g}, {check.interval[1]:.4g}]"
            )
            estimate = "-" if check.estimate is None else f"{check.estimate:.4g}"
            print(
                f"    {check.name:9} {check.result:9} {estimate}{interval} vs {check.threshold:.4g}"
                f" on {check.samples} samples: {check.detail}"
            )
    return 0


def _rollout_call(args: argparse.Namespace, settings: Settings) -> int:
    import getpass
    import json

    from gateway.db.engine import make_engine
    from gateway.errors import GatewayError
    from gateway.promotion import rollout

    engine = make_engine(settings.database_url)
    policy = load_policy(settings.policy_path)
    author = getpass.getuser()
    try:
        if args.promote_command == "apply":
            result: object = rollout.start(
                engine, policy, args.route, args.candidate, author=author, force=args.force
            )
        elif args.promote_command == "rollback":
            result = rollout.stop(engine, args.route, author=author)
        elif args.promote_command == "step":
            result = rollout.advance(engine, policy, author=author)
        else:
            result = rollout.status(engine)
    except GatewayError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if args.promote_command != "status" and settings.redis_url:
        from gateway.fleet.sharedstate import tell_replicas

        # Each step is a policy version: running gateways pick it up at once.
        tell_replicas(settings.redis_url, settings.redis_prefix, "policy")
    print(json.dumps(result, indent=2))
    return 0


def _bench_promotion(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.promotion.calibration import calibrate

    result = calibrate(runs=args.runs, seed=args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "scenarios"}, indent=2))
    print(f"written to {args.out}")
    return 0


def _report_weekly(args: argparse.Namespace, settings: Settings) -> int:
    import time

    from gateway.costmodel import store
    from gateway.db.engine import make_engine
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
    engine = make_engine(settings.database_url)
    report = generate(engine, policy, span, args.out, model=store.load_latest(engine, policy))
    engine.dispose()
    for c in report["candidates"]:
        verdict = c["verdict"]["outcome"] if c["verdict"] else "no evidence"
        print(f"{c['route']} → {c['candidate']}: {verdict}")
    print(f"report {span.label} written to {args.out}/report.html, report.md, report.json")
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
    serve.add_argument(
        "--watch", action="store_true", help="apply GATEWAY_POLICY whenever it is saved, if valid"
    )
    serve.set_defaults(run=_serve)

    db = commands.add_parser("db", help="manage the database").add_subparsers(
        dest="db_command", required=True
    )
    up = db.add_parser("upgrade", help="apply migrations to DATABASE_URL")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(run=_db_upgrade)
    prune = db.add_parser(
        "prune", help="delete records past GATEWAY_RETENTION_DAYS and GATEWAY_SHADOW_RETENTION_DAYS"
    )
    prune.set_defaults(run=_db_prune)

    policy = commands.add_parser("policy", help="work with routing policies").add_subparsers(
        dest="policy_command", required=True
    )
    validate = policy.add_parser("validate", help="check a policy file and report every error")
    validate.add_argument("file")
    validate.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    validate.set_defaults(run=_policy_validate)
    diff = policy.add_parser("diff", help="unified diff of the active version against a file")
    diff.add_argument("file")
    diff.set_defaults(run=_policy_diff)
    simulate = policy.add_parser(
        "simulate", help="replay recorded requests through a proposed policy (what-if)"
    )
    simulate.add_argument("file")
    simulate.add_argument(
        "--since", default="7d", help="period to replay: an age like 7d, or a time"
    )
    simulate.add_argument("--limit", type=int, help="replay at most this many requests")
    simulate.add_argument("--json", action="store_true")
    simulate.set_defaults(run=_policy_simulate)
    apply = policy.add_parser("apply", help="store a valid policy as the new active version")
    apply.add_argument("file")
    apply.add_argument("-m", "--message", required=True, help="why this change")
    apply.add_argument("--author", help="who (default: the OS user)")
    apply.set_defaults(run=_policy_apply)
    history = policy.add_parser("history", help="list stored versions, newest first")
    history.add_argument("--limit", type=int, default=50)
    history.set_defaults(run=_policy_history)
    rollback = policy.add_parser(
        "rollback", help="serve a previous version again (default: the one before the active)"
    )
    rollback.add_argument("version", nargs="?", type=int)
    rollback.add_argument("-m", "--message", default="", help="why (default: 'roll back to N')")
    rollback.add_argument("--author", help="who (default: the OS user)")
    rollback.set_defaults(run=_policy_rollback)
    show = policy.add_parser("show", help="print a stored version (default: the active one)")
    show.add_argument("version", nargs="?", type=int)
    show.set_defaults(run=_policy_show)
    schema = policy.add_parser("schema", help="print the policy's JSON Schema")
    schema.set_defaults(run=_policy_schema)

    explain = commands.add_parser(
        "explain", help="show how a request would be routed, without sending it"
    )
    explain.add_argument("file", help="request body as JSON, or - for standard input")
    explain.add_argument(
        "--endpoint", choices=["chat", "completions", "embeddings"], default="chat"
    )
    explain.add_argument(
        "-H", "--header", action="append", default=[], help="request header, 'NAME: VALUE'"
    )
    explain.add_argument(
        "--url", help="ask a running gateway (its live load and model) instead of an idle fleet"
    )
    explain.set_defaults(run=_explain)

    model = commands.add_parser("model", help="the learned cost model").add_subparsers(
        dest="model_command", required=True
    )
    model_train = model.add_parser("train", help="retrain on recorded requests and store it")
    model_train.add_argument("--days", type=float, default=7.0, help="history to learn from")
    model_train.add_argument("--window", type=int, default=20_000, help="most requests to use")
    model_train.set_defaults(run=_model_train)

    bench = commands.add_parser("bench", help="benchmarks").add_subparsers(
        dest="bench_command", required=True
    )
    routing = bench.add_parser(
        "routing", help="replay a trace through every routing strategy on a virtual clock"
    )
    routing.add_argument("--trace", type=Path, required=True, help="CSV trace (Azure LLM format)")
    routing.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    routing.add_argument(
        "--rate-scale", type=float, default=1.0, help="arrivals this many times faster"
    )
    routing.add_argument("--limit", type=int, help="replay only the first N requests")
    routing.add_argument("--seed", type=int, default=0, help="meter phase and round-robin start")
    routing.add_argument("--policy", type=Path, help="policy file (default GATEWAY_POLICY)")
    routing.add_argument("--strategies", help="comma-separated subset (default: all)")
    routing.add_argument(
        "--live", metavar="URL", help="also send the slice through the gateway running at URL"
    )
    routing.add_argument(
        "--live-speed", type=float, default=1.0, help="the simulators' --speed, for --live"
    )
    routing.set_defaults(run=_bench_routing)
    promotion = bench.add_parser(
        "promotion", help="calibrate the judge on simulated shadow streams"
    )
    promotion.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    promotion.add_argument("--runs", type=int, default=200, help="simulated runs per scenario")
    promotion.add_argument("--seed", type=int, default=0)
    promotion.set_defaults(run=_bench_promotion)

    promote = commands.add_parser(
        "promote", help="judge candidate pools from their shadow evidence"
    ).add_subparsers(dest="promote_command", required=True)
    promote_evaluate = promote.add_parser(
        "evaluate", help="judge every route and candidate now and store the verdicts"
    )
    promote_evaluate.add_argument("--route", help="only this route")
    promote_evaluate.add_argument("--json", action="store_true", help="print the evidence as JSON")
    promote_evaluate.set_defaults(run=_promote_evaluate)
    promote_apply = promote.add_parser(
        "apply", help="start rolling a candidate out on a route (needs a promote verdict)"
    )
    promote_apply.add_argument("route")
    promote_apply.add_argument("candidate")
    promote_apply.add_argument(
        "--force", action="store_true", help="start without a promote verdict"
    )
    promote_apply.set_defaults(run=_rollout_call)
    promote_rollback = promote.add_parser(
        "rollback", help="take a route's rollout all the way back"
    )
    promote_rollback.add_argument("route")
    promote_rollback.set_defaults(run=_rollout_call)
    promote.add_parser("status", help="every rollout and its steps").set_defaults(run=_rollout_call)
    promote.add_parser(
        "step", help="check running rollouts now (gateway serve does it on its own)"
    ).set_defaults(run=_rollout_call)

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
    weekly.set_defaults(run=_report_weekly)

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
    except GatewayError as exc:  # the policy store, or a version that does not exist
        print(f"error: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
