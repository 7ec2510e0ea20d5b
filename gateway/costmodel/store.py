"""Cost-model versions in the database: each training run with its error, the newest served.

Replicas sharing a database train on their own observations and number their versions from
the same table: a version another replica stored first is stored as the next free number.

A version's residuals are JSON, per `pool|model`: each target's `[weights, log bound]`, and
`span`, the lower and the upper corner of the log prompt, output and concurrency training saw
(`Span`). Code that computes other features reads none of a version's residuals, as their
weights number other than its features (the span's corners too), and serves the prior.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

import sqlalchemy as sa

from gateway.costmodel.predict import FEATURES, CostModel, Learned, Residual, Span
from gateway.costmodel.train import Score
from gateway.db.schema import cost_models
from gateway.policy.definition import Policy

Scores = dict[str, dict[str, dict[str, Score]]]

# Replicas that store a version at the same moment take turns for the next number.
VERSION_ATTEMPTS = 5


def scores_json(scores: Scores) -> dict[str, Any]:
    return {
        pool: {model: {t: asdict(s) for t, s in targets.items()} for model, targets in m.items()}
        for pool, m in scores.items()
    }


def next_version(db: sa.Engine) -> int:
    with db.connect() as conn:
        latest = conn.execute(sa.select(sa.func.max(cost_models.c.version))).scalar()
    return int(latest or 0) + 1


def _insert(db: sa.Engine, version: int, row: dict[str, Any]) -> int:
    """Insert a version's row, under the next free number if `version` is taken; return it."""
    attempts = 1
    while True:
        try:
            with db.begin() as conn:
                conn.execute(cost_models.insert().values(version=version, **row))
            return version
        except sa.exc.IntegrityError:
            if attempts == VERSION_ATTEMPTS:
                raise
            attempts += 1
            version = next_version(db)


def save(db: sa.Engine, model: CostModel, scores: Scores, observations: int) -> CostModel:
    """Store a trained version with its held-out error; return it with the number it got."""
    residuals = {
        f"{pool}|{name}": {t: [list(r.weights), r.log_bound] for t, r in learned.residuals.items()}
        | {"span": [list(corner) for corner in zip(*learned.span, strict=True)]}
        for (pool, name), learned in model.trained.items()
    }
    row = {
        "created": time.time(),
        "observations": observations,
        "status": "ok",
        "scores": json.dumps(scores_json(scores)),
        "residuals": json.dumps(residuals),
    }
    version = _insert(db, model.version, row)
    return model if version == model.version else CostModel(model.policy, version, model.trained)


def save_failure(db: sa.Engine, version: int, observations: int, error: str) -> int:
    """Record a training run that failed (the previous version keeps serving); return its number."""
    row = {
        "created": time.time(),
        "observations": observations,
        "status": "failed",
        "error": error[:2000],
    }
    return _insert(db, version, row)


def load_latest(db: sa.Engine, policy: Policy) -> CostModel | None:
    """Return the newest good version for this policy's pools, or None."""
    with db.connect() as conn:
        row = conn.execute(
            sa.select(cost_models.c.version, cost_models.c.residuals)
            .where(cost_models.c.status == "ok")
            .order_by(cost_models.c.version.desc())
            .limit(1)
        ).first()
    if row is None:
        return None
    trained = {}
    for key, targets in json.loads(row.residuals).items():
        pool, name = key.split("|", 1)
        # A version stored with other features than this code computes cannot be read.
        if pool in policy.pools and "span" in targets:
            low, high = targets.pop("span")
            span = Span(*((float(a), float(b)) for a, b in zip(low, high, strict=True)))
            trained[(pool, name)] = Learned(
                {
                    t: Residual(tuple(w), bound)
                    for t, (w, bound) in targets.items()
                    if len(w) == len(FEATURES)
                },
                span,
            )
    return CostModel(policy, version=row.version, trained=trained)
