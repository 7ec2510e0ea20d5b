"""`gateway model`: retrain the cost model on recorded requests."""

from __future__ import annotations

import argparse

from gateway.policy.load import load_policy
from gateway.settings import Settings


def _train(args: argparse.Namespace, settings: Settings) -> int:
    import time

    import sqlalchemy as sa

    from gateway.costmodel import store
    from gateway.costmodel.train import observations_from_rows, train
    from gateway.db.connection import connect
    from gateway.db.schema import request_records

    policy = load_policy(settings.policy_path)
    db = connect(settings.database_url)
    since = time.time() - args.days * 86400
    with db.connect() as conn:
        rows = conn.execute(
            sa.select(request_records)
            .where(request_records.c.ts >= since)
            .order_by(request_records.c.ts.desc())
            .limit(args.window)
        ).mappings()
        observations = observations_from_rows(reversed([dict(r) for r in rows]))
    model, scores = train(policy, observations, store.next_version(db))
    model = store.save(db, model, scores, len(observations))
    print(f"cost model version {model.version} trained on {len(observations)} requests")
    print(f"{'pool':8} {'model':28} {'target':7} {'n':>6} {'MAPE':>7} {'prior':>7}")
    for pool, models in scores.items():
        for name, targets in models.items():
            for target, score in targets.items():
                mape = "-" if score.mape is None else f"{score.mape:.1%}"
                prior = "-" if score.prior_mape is None else f"{score.prior_mape:.1%}"
                print(f"{pool:8} {name:28} {target:7} {score.observations:>6} {mape:>7} {prior:>7}")
    return 0


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    model = commands.add_parser("model", help="the learned cost model").add_subparsers(
        dest="model_command", required=True
    )
    model_train = model.add_parser("train", help="retrain on recorded requests and store it")
    model_train.add_argument("--days", type=float, default=7.0, help="history to learn from")
    model_train.add_argument("--window", type=int, default=20_000, help="most requests to use")
    model_train.set_defaults(run=_train)
