"""`gateway precision check`: replay a prompt suite on a pool and its reference, and judge it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.policy.definition import Policy
from gateway.promotion.precision.limits import (
    MAX_DEPARTURE_RATE,
    MAX_ERROR_SHARE,
    MAX_TURNED_WRONG,
)
from gateway.settings import Settings


def _policy(args: argparse.Namespace, settings: Settings) -> tuple[Policy, str]:
    """Return the policy to check against and where it came from.

    `--policy FILE` if given; else the active version in the database; else the policy file of
    the settings (GATEWAY_POLICY), as a gateway starting on an empty database would.
    """
    from gateway.db.connection import connect
    from gateway.errors import PolicyStoreUnavailable
    from gateway.policy import versions
    from gateway.policy.load import load_policy, parse_policy

    if args.policy:
        return load_policy(args.policy), str(args.policy)
    db = connect(settings.database_url)
    try:
        stored = versions.active(db)
    except PolicyStoreUnavailable:
        stored = None
    finally:
        db.dispose()
    if stored is not None:
        source = f"policy version {stored.version}"
        return parse_policy(stored.content, source), source
    return load_policy(settings.policy_path), str(settings.policy_path)


def _check(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio
    import json
    import logging
    import os

    import sqlalchemy as sa

    from gateway.db.connection import connect
    from gateway.errors import InvalidRequest
    from gateway.policy.credentials import Access
    from gateway.policy.suites import refused
    from gateway.promotion.precision.check import read_suite, run
    from gateway.promotion.precision.comparison import plan
    from gateway.promotion.precision.figures import PASS
    from gateway.promotion.precision.limits import Limits
    from gateway.promotion.precision.results import store

    for name in ("max_departure_rate", "max_turned_wrong", "max_error_share"):
        if not 0 <= getattr(args, name) <= 1:
            raise InvalidRequest(f"--{name.replace('_', '-')} is from 0 to 1")
    if args.concurrency < 1 or args.timeout <= 0:
        raise InvalidRequest("--concurrency and --timeout must be positive")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request is noise here
    suite = read_suite(args.suite)
    policy, source = _policy(args, settings)
    spec = policy.pools.get(args.pool)
    changed = None if spec is None else refused(suite.file, suite.sha256, spec.go_live)
    if changed is not None:
        raise InvalidRequest(f"the suite {args.suite} is refused: {changed}", param="suite")
    access = Access(os.environ, settings.upstream_key_hosts, settings.upstream_hosts)
    limits = Limits(args.max_departure_rate, args.max_turned_wrong, args.max_error_share)
    reference = plan(policy, suite, args.pool, args.reference, args.embedding_model).reference
    earlier = _earlier(settings, args.pool, suite.sha256, reference)
    result = asyncio.run(
        run(
            policy,
            access,
            suite,
            args.pool,
            args.reference,
            embedding_model=args.embedding_model,
            limits=limits,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            earlier=earlier,
        )
    )
    result["policy"] = source
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    db = connect(settings.database_url)
    try:
        store(db, result)
        stored = "stored"
    except sa.exc.SQLAlchemyError as exc:
        # The file is the check's record too; without the table, the policy gate cannot see it.
        stored = f"not stored ({type(exc).__name__}; run `gateway db upgrade`)"
        print(f"warning: the check was {stored}", file=sys.stderr)
    finally:
        db.dispose()
    print(_summary(result))
    print(f"written to {args.out}; {stored}")
    return 0 if result["verdict"] == PASS else 1


def _earlier(settings: Settings, pool: str, sha256: str, reference: str) -> list:
    """Return the outcomes of the pool's failed checks on this suite and reference since its
    last pass, which this run is pooled with (none where the database has no checks table)."""
    import sqlalchemy as sa

    from gateway.db.connection import connect
    from gateway.promotion.precision.results import failed_since_pass
    from gateway.promotion.precision.retries import outcomes_of

    db = connect(settings.database_url)
    try:
        return [outcomes_of(r) for r in failed_since_pass(db, pool, sha256, reference)]
    except sa.exc.SQLAlchemyError:
        return []
    finally:
        db.dispose()


def _summary(result: dict) -> str:
    """Say a check's verdict, figures and reasons for a terminal."""

    def share(value: float | None) -> str:
        return "–" if value is None else f"{value:.1%}"

    kl = "–" if result["mean_kl"] is None else f"{result['mean_kl']:.4f}"
    runs = result.get("runs", 1)
    pooled = f", pooled with {runs - 1} earlier failed run(s)" if runs > 1 else ""
    lines = [
        f"{result['pool']} against {result['reference']} on {result['suite']} "
        f"({result['prompts']} prompts{pooled}): {result['verdict'].upper()}",
        f"  top-1 agreement {share(result['top1_agreement'])} (reference with itself "
        f"{share(result['noise_top1_agreement'])}), mean KL {kl}, near ties "
        f"{share(result['near_tie_share'])} of differences, harmful "
        f"{share(result['harmful_share'])} (reference with itself "
        f"{share(result['noise_harmful_share'])})",
    ]
    lines += [f"  - {reason}" for reason in result["reasons"]]
    return "\n".join(lines)


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    precision = commands.add_parser(
        "precision", help="precision checks: a prompt suite on a pool against a reference"
    ).add_subparsers(dest="precision_command", required=True)
    check = precision.add_parser(
        "check",
        help="replay a suite on a pool and a reference at temperature 0 and judge the "
        "difference (exit 0 pass, 1 fail; docs/precision.md)",
    )
    check.add_argument("--pool", required=True, help="the pool to check")
    check.add_argument(
        "--reference", help="the pool to compare with (default: the first live gpu pool)"
    )
    check.add_argument("--suite", required=True, help="JSON lines of chat bodies (suites/)")
    check.add_argument("--out", type=Path, required=True, help="where to write the result")
    check.add_argument(
        "--policy", help="policy file (default: the active version, else GATEWAY_POLICY)"
    )
    check.add_argument(
        "--embedding-model",
        help="embedding model for semantic similarity (default: the first a live pool serves)",
    )
    check.add_argument(
        "--max-departure-rate",
        type=float,
        default=MAX_DEPARTURE_RATE,
        help="most the 95%% upper bound of departures per word at risk may exceed the "
        f"reference's own ({MAX_DEPARTURE_RATE})",
    )
    check.add_argument(
        "--max-turned-wrong",
        type=float,
        default=MAX_TURNED_WRONG,
        help="on a labelled suite, most the 95%% upper bound of the share of answers turned "
        f"wrong may exceed the reference's own ({MAX_TURNED_WRONG})",
    )
    check.add_argument(
        "--max-error-share",
        type=float,
        default=MAX_ERROR_SHARE,
        help=f"share of the candidate's requests that may fail ({MAX_ERROR_SHARE:g})",
    )
    check.add_argument("--concurrency", type=int, default=8, help="prompts in flight (8)")
    check.add_argument("--timeout", type=float, default=60.0, help="seconds per request (60)")
    check.set_defaults(run=_check)
