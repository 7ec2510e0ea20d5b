"""What-if: replay the requests a period recorded through a proposed policy, before applying it.

The period's served requests, as they were recorded (arrival, model, SLO class, tenant,
endpoint, streaming, prompt and completion tokens), are replayed on a virtual clock through the
real router and a learning cost model, once under the active policy and once under the proposed
one, and the two are compared: energy, cost, SLO attainment and pool shares. The replay's
devices follow the simulator's physics for each pool's kind (its hardware model,
gateway/whatif/hardware.py), so on a real fleet read the differences between the policies, not
the absolute figures.

A period's requests are many; the CLI and the admin API replay a stratified sample of them
(gateway/whatif/sample.py), the same sample under both policies, and state its size, the
period's and, for SLO attainment, the stratified estimate for the period with its 95 % interval
from the spread within each route and hour.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import request_records
from gateway.policy.model import Policy
from gateway.whatif.conditions import ReplayRates
from gateway.whatif.sample import RecordedSample, Stratum, trace_request
from gateway.whatif.strategy import learned
from gateway.whatif.summary import replayed, summarize
from gateway.whatif.timeline import Passage
from gateway.whatif.trace import TraceRequest

Z_95 = 1.96
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
    return [trace_request(row, first) for row in rows]


def replay(policy: Policy, requests: list[TraceRequest]) -> tuple[dict[str, Any], list[Passage]]:
    """Return the figures of the requests replayed through the learned router under a policy,
    and each request's passage."""
    rates = ReplayRates(policy)
    run = replayed(learned(policy, rates=rates), requests, rates=rates)
    return summarize(run), run.passages


def stratified_share(
    sample: RecordedSample, passages: list[Passage], hit: Callable[[Passage], bool]
) -> dict[str, float]:
    """Return the period's share of requests for which `hit(passage)` holds, estimated from the
    sample stratum by stratum, with its 95 % interval (normal, from the within-stratum spread,
    finite-population corrected)."""
    stratum_of = {
        id(request): stratum
        for request, stratum in zip(sample.requests, sample.strata, strict=True)
    }
    hits: dict[Stratum, list[int]] = defaultdict(lambda: [0, 0])
    for passage in passages:
        tally = hits[stratum_of[id(passage.request)]]
        tally[0] += 1 if hit(passage) else 0
        tally[1] += 1
    total = sample.period_requests
    estimate = variance = 0.0
    for stratum, (k, n) in hits.items():
        size = sample.sizes[stratum]
        p, weight = k / n, size / total
        estimate += weight * p
        # One request says nothing of its stratum's spread: take the widest a share can have.
        spread = p * (1 - p) * n / (n - 1) if n > 1 else 0.25
        variance += weight**2 * (1 - n / size) * spread / n
    half = Z_95 * math.sqrt(variance)
    return {
        "estimate": round(estimate, 5),
        "low": round(max(estimate - half, 0.0), 5),
        "high": round(min(estimate + half, 1.0), 5),
    }


def simulate_sample(active: Policy, proposed: Policy, sample: RecordedSample) -> dict[str, Any]:
    """Replay a sample under both policies; return the comparison, the sample's and the
    period's size and the period's SLO attainment under each policy with its interval."""
    result, passages = _compare(active, proposed, sample.requests)
    taken = sample.taken()
    result["sample"] = {
        "requests": len(sample.requests),
        "period_requests": sample.period_requests,
        "strata": len(sample.sizes),
        "strata_sampled": sum(1 for n in taken.values() if n),
        "largest_stratum_sample": max(taken.values(), default=0),
        "design": "stratified by route and hour, systematic by arrival within each stratum",
        "slo_attainment": {
            name: stratified_share(sample, run, Passage.meets_slo) for name, run in passages.items()
        },
        "interval": "95 % normal interval from the within-stratum spread, SLO attainment only;"
        " the other figures are the sample's replay, compared on the same sample",
    }
    return result


def simulate(active: Policy, proposed: Policy, requests: list[TraceRequest]) -> dict[str, Any]:
    """Replay the requests under both policies; return each one's figures and the change."""
    return _compare(active, proposed, requests)[0]


def _compare(
    active: Policy, proposed: Policy, requests: list[TraceRequest]
) -> tuple[dict[str, Any], dict[str, list[Passage]]]:
    runs: dict[str, Any] = {}
    passages: dict[str, list[Passage]] = {}
    for name, policy in (("active", active), ("proposed", proposed)):
        runs[name], passages[name] = replay(policy, requests)
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
    result = {"requests": len(requests), "change": change, "runs": runs, "computed": time.time()}
    return result, passages
