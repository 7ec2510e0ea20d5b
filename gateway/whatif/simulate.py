"""What-if: replay the requests a period recorded through a proposed policy, before applying it.

The period's served requests, as they were recorded (arrival, model, SLO class, tenant,
endpoint, streaming, prompt and completion tokens), are replayed on a virtual clock through the
real router and a learning cost model, once under the active policy and once under the proposed
one, and the two are compared: energy, cost, SLO attainment and pool shares. The replay's
devices follow the simulator's physics for each pool's kind (its hardware model,
gateway/whatif/hardware.py), so on a real fleet read the differences between the policies, not
the absolute figures.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import request_records
from gateway.policy.model import Policy
from gateway.whatif.conditions import ReplayRates
from gateway.whatif.strategy import learned
from gateway.whatif.summary import measure
from gateway.whatif.trace import TraceRequest

COMPARED = ("energy_j_per_request", "cost_usd_per_1k_tokens", "slo_attainment", "ttft_p99_ms")


def recorded_requests(
    db: sa.Engine, since: float, *, limit: int | None = None
) -> list[TraceRequest]:
    """Return the period's successful requests as a replayable trace, oldest first: each with
    its model, SLO class, tenant, endpoint and streaming as recorded."""
    r = request_records.c
    query = (
        sa.select(
            r.ts,
            r.prompt_tokens,
            r.completion_tokens,
            r.model,
            r.slo_class,
            r.tenant,
            r.endpoint,
            r.stream,
        )
        .where(
            r.ts >= since,
            r.status == 200,
            r.prompt_tokens.is_not(None),
            r.completion_tokens.is_not(None),
        )
        .order_by(r.ts)
    )
    if limit is not None:
        query = query.limit(limit)
    with db.connect() as conn:
        rows = conn.execute(query).all()
    if not rows:
        return []
    first = rows[0].ts
    return [
        TraceRequest(
            row.ts - first,
            int(row.prompt_tokens),
            0 if row.endpoint == "embeddings" else max(int(row.completion_tokens), 1),
            model=row.model,
            slo_class=row.slo_class,
            tenant=row.tenant,
            endpoint=row.endpoint,
            stream=bool(row.stream),
        )
        for row in rows
    ]


def replay(policy: Policy, requests: list[TraceRequest]) -> dict[str, Any]:
    """Return the figures of the requests replayed through the learned router under a policy."""
    rates = ReplayRates(policy)
    return measure(learned(policy, rates=rates), requests, rates=rates)


def simulate(active: Policy, proposed: Policy, requests: list[TraceRequest]) -> dict[str, Any]:
    """Replay the requests under both policies; return each one's figures and the change."""
    runs = {
        name: replay(policy, requests)
        for name, policy in (("active", active), ("proposed", proposed))
    }
    change: dict[str, Any] = {}
    for key in COMPARED:
        before, after = runs["active"].get(key), runs["proposed"].get(key)
        if isinstance(before, int | float) and isinstance(after, int | float):
            change[key] = {
                "active": before,
                "proposed": after,
                "ratio": None if before == 0 else round(after / before, 4),
            }
    change["pool_shares"] = {
        "active": runs["active"]["pool_shares"],
        "proposed": runs["proposed"]["pool_shares"],
    }
    return {"requests": len(requests), "change": change, "runs": runs, "computed": time.time()}
