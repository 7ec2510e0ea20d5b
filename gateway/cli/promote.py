"""`gateway promote`: judge candidate pools, and roll a promoted one out step by step."""

from __future__ import annotations

import argparse

from gateway.cli.changes import announce, operator
from gateway.policy.load import load_policy
from gateway.settings import Settings


def _evaluate(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.db.connection import connect
    from gateway.promotion.evidence import evaluate

    policy = load_policy(settings.policy_path)
    verdicts = evaluate(connect(settings.database_url), policy, route=args.route)
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
        shown = [
            f"{what} {v.latency[f'{key}_p95_ratio']:.2f}x the primary's"
            f" ({v.latency[f'candidate_{key}_p95_ms']:.0f} against"
            f" {v.latency[f'primary_{key}_p95_ms']:.0f} ms)"
            for key, what in (("ttft", "time to first token"), ("e2e", "end to end"))
            if v.latency.get(f"{key}_p95_ratio") is not None
        ]
        if shown:
            print(
                f"    {'latency':9} {'shown':9} p95 "
                + "; ".join(shown)
                + " (the slo check decides)"
            )
    return 0


def _rollout(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from gateway.db.connection import connect
    from gateway.promotion import rollout

    db = connect(settings.database_url)
    policy = load_policy(settings.policy_path)
    author = operator()
    if args.promote_command == "apply":
        result: object = rollout.start(
            db,
            policy,
            args.route,
            args.candidate,
            author=author,
            force=args.force,
            override_precision_gate=args.override_precision_gate,
        )
    elif args.promote_command == "rollback":
        result = rollout.stop(db, args.route, author=author)
    elif args.promote_command == "step":
        result = rollout.advance(db, policy, author=author)
    else:
        result = rollout.status(db)
    if args.promote_command != "status":
        announce(settings)  # each step is a policy version: running gateways serve it at once
    print(json.dumps(result, indent=2))
    return 0


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    promote = commands.add_parser(
        "promote", help="judge candidate pools from their shadow evidence"
    ).add_subparsers(dest="promote_command", required=True)
    promote_evaluate = promote.add_parser(
        "evaluate", help="judge every route and candidate now and store the verdicts"
    )
    promote_evaluate.add_argument("--route", help="only this route")
    promote_evaluate.add_argument("--json", action="store_true", help="print the evidence as JSON")
    promote_evaluate.set_defaults(run=_evaluate)
    promote_apply = promote.add_parser(
        "apply", help="start rolling a candidate out on a route (needs a promote verdict)"
    )
    promote_apply.add_argument("route")
    promote_apply.add_argument("candidate")
    promote_apply.add_argument(
        "--force", action="store_true", help="start without a promote verdict"
    )
    promote_apply.add_argument(
        "--override-precision-gate",
        action="store_true",
        help="start a shadow-only candidate without a passing precision check (the rollout's "
        "policy version records it)",
    )
    promote_apply.set_defaults(run=_rollout)
    promote_rollback = promote.add_parser(
        "rollback", help="take a route's rollout all the way back"
    )
    promote_rollback.add_argument("route")
    promote_rollback.set_defaults(run=_rollout)
    promote.add_parser("status", help="every rollout and its steps").set_defaults(run=_rollout)
    promote.add_parser(
        "step", help="check running rollouts now (gateway serve does it on its own)"
    ).set_defaults(run=_rollout)
