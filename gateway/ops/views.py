"""What the console shows, read for the admin API: the fleet now, its energy, cost and carbon and
its parking over a window, traffic over a window, and sampled shadow pairs with where they part.

Each view is plain data (JSON), so the console is one client of the admin API among others.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa

from gateway.compare.measures import MEASURES, WORD
from gateway.db.schema import request_records, shadow_records
from gateway.energy.draw import MINUTE_S
from gateway.ops.parts import OpsParts
from gateway.policy.model import Policy
from gateway.policy.tariffs import DAY_S
from gateway.records.slo import judged_on, record_meets_slo
from gateway.report.numbers import fleet_headline, parking_numbers
from gateway.report.period import Period
from gateway.report.records import read_draw, read_parking
from gateway.routing.explain import hardware, parking
from gateway.stats import percentile

WINDOWS = {"hour": 3600.0, "day": DAY_S}
BUCKETS = 12  # points of each traffic chart
COST_MODEL_TARGETS = ("e2e", "energy", "ttft", "tpot")


def fleet(gateway: OpsParts, now: float) -> list[dict[str, Any]]:
    """Every pool of the policy and its backends now: health, slots, queue, power, energy
    attributed today (UTC), and the serving cost model's held-out error."""
    today = _energy_since(gateway.db, math.floor(now / DAY_S) * DAY_S)
    pools = []
    serving = gateway.serving  # the policy and the fleet it configured: one version
    for name, spec in serving.policy.pools.items():
        state = serving.fleet.pools.get(name)
        backends: list[dict[str, Any]] = []
        for b in state.backends if state is not None else []:
            backends.append(
                {
                    "name": b.name,
                    "healthy": not b.ejected,
                    "ejected_for_s": max(0.0, b.ejected_until - now) if b.ejected else None,
                    "slots": b.slots,
                    "in_flight": b.in_flight,
                    "other_replicas": b.elsewhere,
                    "external": b.external,
                    "engine_full": b.engine_full or None,
                    "engine_cached_share": b.engine_cached_share,
                    "engine_tokens_per_s": b.engine_tokens_per_s,
                    "power_w": gateway.meter.power_w(b),
                    "parking": parking(b),
                }
            )
        powers = [b["power_w"] for b in backends if b["power_w"] is not None]
        errors = {
            target: gateway.metrics.registry.get_sample_value(
                "gateway_cost_model_mape", {"pool": name, "target": target}
            )
            for target in COST_MODEL_TARGETS
        }
        pools.append(
            {
                "pool": name,
                **hardware(spec),
                "live": spec.live,
                "backends": backends,
                "healthy": sum(b["healthy"] for b in backends),
                "parked": sum(b["parking"] is not None for b in backends),
                "slots": sum(b["slots"] for b in backends),
                "in_use": sum(
                    b["in_flight"] + b["other_replicas"] + b["external"] for b in backends
                ),
                "queued": len(state.waiters) if state is not None else 0,
                "power_w": sum(powers) if powers else None,
                "energy_today_j": today.get(name),
                "cost_model_error": {t: e for t, e in errors.items() if e is not None},
            }
        )
    return pools


def fleet_energy(db: sa.Engine, policy: Policy, now: float, window_s: float) -> dict[str, Any]:
    """The fleet's energy (idle included), cost (device-hours and energy) and carbon over the
    last `window_s` of whole minutes, against the window before: the weekly report's headline
    (gateway/report/numbers.py)."""
    until = math.floor(now / MINUTE_S) * MINUTE_S  # a minute's draw is written once it ends
    period = Period(until - window_s, until, f"the last {window_s / 3600:g} h")
    previous = period.previous()
    r = request_records.c
    count = sa.select(sa.func.count()).select_from(request_records)
    with db.connect() as conn:
        requests, before = (
            int(conn.execute(count.where(r.ts >= p.since, r.ts < p.until)).scalar_one())
            for p in (period, previous)
        )
    draw = read_draw(db, previous.since, period.until)
    return {
        "since": period.since,
        "until": period.until,
        **fleet_headline(draw, requests, before, policy, period),
    }


def parking_history(db: sa.Engine, policy: Policy, now: float, window_s: float) -> dict[str, Any]:
    """Parking over the last `window_s`: per pool, backends on and parked in each of BUCKETS
    buckets, parks, wake-ups, hook failures and energy saved; and the wake-ups (the weekly
    report's fold, gateway/report/numbers.py)."""
    period = Period(now - window_s, now, f"the last {window_s / 3600:g} h")
    return parking_numbers(read_parking(db, now), policy, period, window_s / BUCKETS)


def _energy_since(db: sa.Engine, since: float) -> dict[str, float]:
    r = request_records.c
    query = (
        sa.select(r.pool, sa.func.sum(r.energy_j))
        .where(r.ts >= since, r.pool.is_not(None))
        .group_by(r.pool)
    )
    with db.connect() as conn:
        return {pool: float(j) for pool, j in conn.execute(query) if j is not None}


def traffic(db: sa.Engine, policy: Policy, now: float, window_s: float) -> list[dict[str, Any]]:
    """Per route over the last `window_s`: the share each pool served, SLO attainment (the live
    rule), p50/p95 of what it is judged on (time to first token of streamed requests, end to end
    of successful ones that were not streamed, embeddings included), energy and cost per
    request, and the same per bucket of the window for charts."""
    r = request_records.c
    query = sa.select(
        r.ts, r.route, r.pool, r.status, r.slo_class, r.endpoint, r.stream, r.completion_tokens,
        r.ttft_ms, r.tpot_ms, r.e2e_ms, r.energy_j, r.cost_usd,
    ).where(r.ts >= now - window_s, r.route.is_not(None))  # fmt: skip
    with db.connect() as conn:
        rows = conn.execute(query).all()
    by_route: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_route[row.route].append(row)
    width = window_s / BUCKETS
    out = []
    for route, served in sorted(by_route.items()):
        buckets: list[list[Any]] = [[] for _ in range(BUCKETS)]
        for row in served:
            buckets[min(BUCKETS - 1, max(0, int((row.ts - (now - window_s)) / width)))].append(row)
        out.append(
            {
                "route": route,
                **_figures(served, policy),
                "series": [
                    {"start": now - window_s + i * width, **_figures(bucket, policy)}
                    for i, bucket in enumerate(buckets)
                ],
            }
        )
    return out


def _figures(rows: Sequence[Any], policy: Policy) -> dict[str, Any]:
    pools: dict[str, int] = defaultdict(int)
    for row in rows:
        pools[row.pool or "none"] += 1
    met = 0
    whole: list[float] = []  # end to end of the answers judged on it
    for row in rows:
        spec = policy.slo_classes.get(row.slo_class or policy.default_slo_class)
        met += record_meets_slo(spec, row._mapping)
        on = judged_on(row.endpoint, bool(row.stream))
        if on == "e2e" and row.status == 200 and row.e2e_ms is not None:
            whole.append(row.e2e_ms)
    ttft = [row.ttft_ms for row in rows if row.ttft_ms is not None]
    energy = [row.energy_j for row in rows if row.energy_j is not None]
    cost = [row.cost_usd for row in rows if row.cost_usd is not None]
    return {
        "requests": len(rows),
        "pool_shares": {p: n / len(rows) for p, n in sorted(pools.items())},
        "slo_attainment": met / len(rows) if rows else None,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p95_ms": percentile(ttft, 95),
        "e2e_p50_ms": percentile(whole, 50),
        "e2e_p95_ms": percentile(whole, 95),
        "energy_j_per_request": sum(energy) / len(energy) if energy else None,
        "cost_usd_per_request": sum(cost) / len(cost) if cost else None,
    }


def shadow_pairs(db: sa.Engine, route: str, candidate: str, limit: int) -> list[dict[str, Any]]:
    """The newest sampled pairs of a route and candidate whose answers are still stored, each
    with both answers, every measure of the pair under `diff`, and, where they part, the
    character offset of the first differing word in each (the word tokens `first_divergence`
    counts)."""
    c = shadow_records.c
    columns = (
        "ts", "decision_id", "kind", "temperature", "primary_pool", "candidate_pool",
        "primary_status", "candidate_status", "candidate_error", "primary_e2e_ms",
        "candidate_e2e_ms", "primary_text", "candidate_text",
    )  # fmt: skip
    query = (
        sa.select(*(c[name] for name in (*columns, *MEASURES)))
        .where(c.route == route, c.candidate_pool == candidate, c.primary_text.is_not(None))
        .order_by(c.ts.desc())
        .limit(limit)
    )
    with db.connect() as conn:
        stored = [row._mapping for row in conn.execute(query)]
    pairs = []
    for row in stored:
        pair = {name: row[name] for name in columns}
        pair["diff"] = diff = {name: row[name] for name in MEASURES}
        for name in ("json_diff", "measures"):  # stored as JSON text
            diff[name] = None if diff[name] is None else orjson.loads(diff[name])
        at = diff["first_divergence"]
        pair["divergence_offsets"] = (
            None
            if at is None
            else [_offset(pair["primary_text"], at), _offset(pair["candidate_text"] or "", at)]
        )
        pairs.append(pair)
    return pairs


def _offset(text: str, index: int) -> int:
    """The character offset of the index-th word token of text (its end when it has fewer)."""
    for n, match in enumerate(WORD.finditer(text)):
        if n == index:
            return match.start()
    return len(text)
