"""Stored precision checks: each result kept in `precision_checks`, and each pool's newest.

The go-live gate (gateway/policy/apply.py) and the weekly report read the newest; a retry
after a fail reads the failed checks it is pooled with (gateway/promotion/precision/retries.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import precision_checks


def store(db: sa.Engine, result: Mapping[str, Any]) -> int:
    """Keep a check's result in `precision_checks`; return its id."""
    with db.begin() as conn:
        inserted = conn.execute(
            precision_checks.insert().values(
                ts=result["ts"],
                pool=result["pool"],
                reference=result["reference"],
                suite=result["suite"],
                verdict=result["verdict"],
                result=json.dumps(result, allow_nan=False),
            )
        )
    key = inserted.inserted_primary_key
    return int(key[0]) if key else 0


def newest(db: sa.Engine, until: float | None = None) -> list[dict[str, Any]]:
    """Return each pool's newest stored check (before `until`), by pool name."""
    c = precision_checks.c
    last = sa.select(c.pool, sa.func.max(c.id).label("id")).group_by(c.pool)
    if until is not None:
        last = last.where(c.ts < until)
    latest = last.subquery()
    query = sa.select(c.result).join(latest, c.id == latest.c.id).order_by(c.pool)
    with db.connect() as conn:
        return [json.loads(row.result) for row in conn.execute(query)]


def failed_since_pass(
    db: sa.Engine, pool: str, sha256: str, reference: str, newest: int = 20
) -> list[dict[str, Any]]:
    """Return the failed checks of `pool` on the suite of `sha256` against `reference` since
    its last pass on them (at most `newest`), newest first: what a retry is pooled with."""
    c = precision_checks.c
    query = (
        sa.select(c.verdict, c.result)
        .where(c.pool == pool, c.reference == reference)
        .order_by(c.id.desc())
    )
    failed: list[dict[str, Any]] = []
    with db.connect() as conn:
        for row in conn.execute(query):
            result = json.loads(row.result)
            if result.get("suite_sha256") != sha256:
                continue
            if row.verdict != "fail" or len(failed) >= newest:
                break
            failed.append(result)
    return failed
