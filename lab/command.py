"""`gateway bench routing`: the routing benchmark on a trace.

Registered under the entry point group `shadow_gateway.bench` (pyproject.toml), through which
the `gateway` command finds it (gateway/cli/bench.py): the gateway never imports the lab.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.settings import Settings


def _routing(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.whatif.trace import TraceError
    from lab.bench import format_table, run_live_comparison, run_routing_benchmark

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
                scenario=args.scenario,
            )
            print(format_table(result["strategies"]))
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"written to {args.out}")
    return 0


def add(bench: argparse._SubParsersAction) -> None:
    """Add `routing` to the `gateway bench` group."""
    routing = bench.add_parser(
        "routing", help="replay a trace through every routing strategy on a virtual clock"
    )
    routing.add_argument(
        "--trace",
        type=Path,
        required=True,
        help="the Azure LLM traces' CSV or Mooncake's JSONL (traces/README.md)",
    )
    routing.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    routing.add_argument(
        "--rate-scale", type=float, default=1.0, help="arrivals this many times faster"
    )
    routing.add_argument("--limit", type=int, help="replay only the first N requests")
    routing.add_argument("--seed", type=int, default=0, help="meter phase and round-robin start")
    routing.add_argument("--policy", type=Path, help="policy file (default GATEWAY_POLICY)")
    routing.add_argument("--strategies", help="comma-separated subset (default: all)")
    routing.add_argument(
        "--scenario",
        type=Path,
        help="events (hidden from the router) and tariffs (known to it) on the trace's clock",
    )
    routing.add_argument(
        "--live", metavar="URL", help="also send the slice through the gateway running at URL"
    )
    routing.add_argument(
        "--live-speed", type=float, default=1.0, help="the simulators' --speed, for --live"
    )
    routing.set_defaults(run=_routing)
