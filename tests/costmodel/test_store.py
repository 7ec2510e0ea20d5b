"""Cost-model versions in the database, as replicas sharing it store them."""

from __future__ import annotations

import sqlalchemy as sa

from gateway.costmodel import store
from gateway.costmodel.model import CostModel
from gateway.db.connection import connect
from policies import fleet_policy


def test_a_version_number_another_replica_stored_first_is_stored_as_the_next(
    database: str,
) -> None:
    # Two replicas read the next version (1) before either stored it: both runs are kept.
    db = connect(database)
    policy = fleet_policy()
    try:
        first = store.save(db, CostModel(policy, version=1), {}, observations=10)
        second = store.save(db, CostModel(policy, version=1), {}, observations=20)
        failed = store.save_failure(db, 2, observations=30, error="boom")
        with db.connect() as conn:
            c = store.cost_models.c
            rows = conn.execute(
                sa.select(c.version, c.observations, c.status).order_by(c.version)
            ).all()
        latest = store.load_latest(db, policy)
    finally:
        db.dispose()
    assert (first.version, second.version, failed) == (1, 2, 3)
    assert [tuple(r) for r in rows] == [(1, 10, "ok"), (2, 20, "ok"), (3, 30, "failed")]
    assert latest is not None and latest.version == 2
