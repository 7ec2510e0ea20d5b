"""Cost-model versions in the database, as replicas sharing it store them."""

from __future__ import annotations

import json

import sqlalchemy as sa

from gateway.costmodel import store
from gateway.costmodel.predict import FEATURES, CostModel, Learned, Residual, Span
from gateway.db.connection import connect
from policies import MODEL, fleet_policy


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


def test_a_stored_version_predicts_as_it_did_when_trained(database: str) -> None:
    policy = fleet_policy()
    weights = tuple(0.01 * (i % 5 - 2) for i in range(len(FEATURES)))
    span = Span((3.0, 7.5), (1.0, 6.0), (0.0, 2.0))
    learned = Learned({"tpot": Residual(weights, 0.3), "energy": Residual(weights, 0.1)}, span)
    trained = CostModel(policy, version=1, trained={("gpu", MODEL): learned})
    db = connect(database)
    try:
        store.save(db, trained, {}, observations=500)
        loaded = store.load_latest(db, policy)
    finally:
        db.dispose()
    assert loaded is not None and loaded.trained == {("gpu", MODEL): learned}
    for prompt in (10, 600, 90_000):  # below the span, within it, past it
        assert loaded.predict("gpu", MODEL, prompt, 40, 3) == trained.predict(
            "gpu", MODEL, prompt, 40, 3
        )


def test_a_version_of_other_features_serves_the_prior(database: str) -> None:
    # What the code before stored: eight weights a target, and no span.
    policy = fleet_policy()
    db = connect(database)
    try:
        with db.begin() as conn:
            conn.execute(
                store.cost_models.insert().values(
                    version=1,
                    created=0.0,
                    observations=500,
                    status="ok",
                    residuals=json.dumps({f"gpu|{MODEL}": {"tpot": [[0.3] * 8, 0.2]}}),
                )
            )
        loaded = store.load_latest(db, policy)
    finally:
        db.dispose()
    assert loaded is not None and loaded.version == 1
    assert loaded.predict("gpu", MODEL, 600, 40, 3) == CostModel(policy).predict(
        "gpu", MODEL, 600, 40, 3
    )
