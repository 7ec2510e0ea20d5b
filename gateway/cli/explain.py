"""`gateway explain`: how a request would be routed, without sending it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.policy.load import load_policy
from gateway.settings import Settings


def _explain(args: argparse.Namespace, settings: Settings) -> int:
    import json

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
    from gateway.costmodel.predict import CostModel, OutputLengths
    from gateway.db.connection import connect
    from gateway.fleet.state import Fleet
    from gateway.routing.classify import TokenEstimator
    from gateway.routing.explanation import explain
    from gateway.routing.ranking import CostRanker
    from gateway.routing.tokenizers import tokenizer_or_none

    policy = load_policy(settings.policy_path)
    try:
        model = store.load_latest(connect(settings.database_url), policy)
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
        TokenEstimator(tokenizers=tokenizer_or_none),
    )
    print(json.dumps(result, indent=2))
    return 0 if result["status"] == 200 else 1


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep:
        raise SystemExit(f"error: header {text!r} is not NAME: VALUE")
    return name.strip().lower(), value.strip()


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
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
