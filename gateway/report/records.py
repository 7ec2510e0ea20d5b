"""The report's reading: a period's records read from the database, then judged and folded.

`collect` is the one edge of the report that reads: request records, shadow records (with the
primary's measured energy and cost where the copy carries none), shadow drops, the newest cost
model, the stored verdicts and precision checks, parking events, and each backend's energy and
time on and parked (backend_energy). The judge
(gateway/report/verdicts.py) and the pure folds (gateway/report/numbers.py) make the report's
numbers of them.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from gateway.costmodel.model import CostModel
from gateway.db.schema import (
    backend_energy,
    cost_models,
    parking_events,
    request_records,
    shadow_drops,
)
from gateway.policy.model import Policy
from gateway.promotion import evidence
from gateway.promotion.precision import results
from gateway.report.numbers import build
from gateway.report.period import Period
from gateway.report.verdicts import judge_rows, judge_window

# What the report reads of each request record.
REQUEST_COLUMNS = (
    "ts",
    "route",
    "pool",
    "model",
    "endpoint",
    "slo_class",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "status",
    "error",
    "energy_j",
    "cost_usd",
    "concurrent",
    "predicted_e2e_ms",
    "predicted_energy_j",
)
# What the report reads of each shadow drop.
DROP_COLUMNS = ("ts", "route", "candidate_pool", "kind", "reason", "count")


def collect(
    db: sa.Engine, policy: Policy, period: Period, *, now: float, model: CostModel | None
) -> dict[str, Any]:
    """Read everything the report needs for `period` and return its numbers."""
    previous = period.previous()
    rules = evidence.criteria(policy)
    start = min(previous.since, period.until - judge_window(rules))
    requests = _read_requests(db, start, period.until)
    shadows = evidence.shadow_rows(db, start, period.until)
    drops = _read_drops(db, start, period.until)
    cost_model = _read_cost_model(db, period.until)
    stored = evidence.latest(db)
    predict = (model or CostModel(policy)).predict
    return build(
        policy,
        period,
        requests=requests,
        shadows=shadows,
        drops=drops,
        cost_model=cost_model,
        stored_verdicts=stored,
        predict=predict,
        now=now,
        rules=rules,
        verdicts=judge_rows(shadows, policy, period.until),
        verdicts_before=judge_rows(shadows, policy, previous.until),
        checks=results.newest(db, until=period.until),
        parking=read_parking(db, period.until),
        draw=read_draw(db, previous.since, period.until),
    )


def _read_requests(db: sa.Engine, since: float, until: float) -> list[dict[str, Any]]:
    c = request_records.c
    query = sa.select(*(c[n] for n in REQUEST_COLUMNS)).where(c.ts >= since, c.ts < until)
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def _read_drops(db: sa.Engine, since: float, until: float) -> list[dict[str, Any]]:
    d = shadow_drops.c
    query = sa.select(*(d[n] for n in DROP_COLUMNS)).where(d.ts >= since, d.ts < until)
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def read_parking(db: sa.Engine, until: float) -> list[dict[str, Any]]:
    """Read every parking event before `until`: a backend parked weeks ago is parked still."""
    query = sa.select(parking_events).where(parking_events.c.ts < until)
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def read_draw(db: sa.Engine, since: float, until: float) -> list[dict[str, Any]]:
    """Read the backends' minutes (energy, time on and parked) from `since` to `until`."""
    e = backend_energy.c
    query = sa.select(e.ts, e.pool, e.backend, e.on_s, e.parked_s, e.energy_j, e.estimated_j)
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query.where(e.ts >= since, e.ts < until))]


def _read_cost_model(db: sa.Engine, until: float) -> dict[str, Any] | None:
    m = cost_models.c
    query = (
        sa.select(m.version, m.created, m.observations, m.scores)
        .where(m.status == "ok", m.created < until)
        .order_by(m.version.desc())
        .limit(1)
    )
    with db.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    return {
        "version": row.version,
        "created": row.created,
        "observations": row.observations,
        "scores": json.loads(row.scores or "{}"),
    }
