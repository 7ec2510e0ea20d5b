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
from gateway.db.schema import shadow_records
from gateway.energy.draw import MINUTE_S
from gateway.ops.parts import OpsParts
from gateway.policy.model import Policy
from gateway.policy.tariffs import DAY_S
from gateway.records.slo import judged_on
from gateway.report.numbers import fleet_headline, parking_numbers
from gateway.report.period import Period
from gateway.report.records import read_draw, read_minutes, read_parking, read_traffic
from gateway.routing.explain import hardware, parking
from gateway.stats import sketch_percentile

WINDOWS = {"hour": 3600.0, "day": DAY_S}
BUCKETS = 12  # points of each traffic chart
COST_MODEL_TARGETS = ("e2e", "energy", "ttft", "tpot")


def fleet(gateway: OpsParts, now: float) -> list[dict[str, Any]]:
    """Every pool of the policy and its backends now: health, slots, queue, power, energy
    attributed today (UTC), and the serving cost model's held-out error."""
    serving = gateway.serving  # the policy and the fleet it configured: one version
    today = _energy_since(gateway.db, serving.policy, math.floor(now / DAY_S) * DAY_S, now)
    pools = []
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
    requests, before = (
        sum(r["requests"] for r in read_traffic(db, policy, p.since, p.until, now=now))
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


def _energy_since(db: sa.Engine, policy: Policy, since: float, now: float) -> dict[str, float]:
    """Return the energy attributed to each pool's requests since `since`."""
    energy: dict[str, float] = {}
    for r in read_traffic(db, policy, since, now + MINUTE_S, now=now):
        if r["pool"] is not None and r["energy_n"]:
            energy[r["pool"]] = energy.get(r["pool"], 0.0) + r["energy_j"]
    return energy


def traffic(db: sa.Engine, policy: Policy, now: float, window_s: float) -> list[dict[str, Any]]:
    """Per route over the last `window_s` (its whole minutes): the share each pool served, SLO
    attainment (the live rule), p50/p95 of what it is judged on (time to first token of
    streamed requests, end to end of successful ones that were not streamed, embeddings
    included), energy and cost per request, and the same per bucket of the window for charts.

    Read from the request minutes; percentiles from their sketches, within
    SKETCH_RELATIVE_ERROR (gateway/stats.py)."""
    since = now - window_s
    by_route: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in read_minutes(db, policy, since, now, now=now):
        if row["route"] is not None:
            by_route[row["route"]].append(row)
    width = window_s / BUCKETS
    out = []
    for route, served in sorted(by_route.items()):
        buckets: list[list[dict[str, Any]]] = [[] for _ in range(BUCKETS)]
        for row in served:
            buckets[min(BUCKETS - 1, max(0, int((row["ts"] - since) / width)))].append(row)
        out.append(
            {
                "route": route,
                **_figures(served),
                "series": [
                    {"start": since + i * width, **_figures(bucket)}
                    for i, bucket in enumerate(buckets)
                ],
            }
        )
    return out


def _figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    pools: dict[str, int] = defaultdict(int)
    for row in rows:
        pools[row["pool"] or "none"] += row["requests"]
    requests = sum(pools.values())
    ttft: dict[int, int] = {}
    whole: dict[int, int] = {}  # end to end of the answers judged on it
    for row in rows:
        _merge(ttft, row["ttft_ms"])
        if judged_on(row["endpoint"], bool(row["stream"])) == "e2e":
            _merge(whole, row["e2e_ms"])
    energy_n = sum(row["energy_n"] for row in rows)
    cost_n = sum(row["cost_n"] for row in rows)
    return {
        "requests": requests,
        "pool_shares": {p: n / requests for p, n in sorted(pools.items())} if requests else {},
        "slo_attainment": sum(row["slo_met"] for row in rows) / requests if requests else None,
        "ttft_p50_ms": sketch_percentile(ttft, 50),
        "ttft_p95_ms": sketch_percentile(ttft, 95),
        "e2e_p50_ms": sketch_percentile(whole, 50),
        "e2e_p95_ms": sketch_percentile(whole, 95),
        "energy_j_per_request": sum(row["energy_j"] for row in rows) / energy_n
        if energy_n
        else None,
        "cost_usd_per_request": sum(row["cost_usd"] for row in rows) / cost_n if cost_n else None,
    }


def _merge(counts: dict[int, int], sketch: str | None) -> None:
    """Add a stored sketch (JSON: bucket → count) into counts."""
    if sketch is not None:
        for bucket, n in orjson.loads(sketch).items():
            key = int(bucket)
            counts[key] = counts.get(key, 0) + n


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
