"""The `gateway` command: serve, migrate the database, and validate policies."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

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
    from gateway.classify import TokenEstimator
    from gateway.costmodel import store
    from gateway.costmodel.model import CostModel, OutputLengths
    from gateway.db import make_engine
    from gateway.explain import explain
    from gateway.routing.fleet import Fleet
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
    from gateway.db import make_engine
    from gateway.records import request_records

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
    store.save(engine, model, scores, len(observations))
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
