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
from gateway.policy.definition import Policy
from gateway.policy.tariffs import DAY_S
from gateway.records.slo import judged_on
from gateway.report.numbers import fleet_headline, parking_numbers
from gateway.report.period import Period
from gateway.report.records import (
    count_requests,
    read_draw,
    read_minutes,
    read_parking,
    read_traffic,
)
from gateway.routing.explanation import hardware, parking
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
    requests, before = (count_requests(db, p.since, p.until, now=now) for p in (period, previous))
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


# What the traffic view reads of each request minute.
TRAFFIC_COLUMNS = (
    "ts", "route", "pool", "endpoint", "stream", "requests", "slo_met",
    "energy_n", "energy_j", "cost_n", "cost_usd", "ttft_ms", "e2e_ms",
)  # fmt: skip


def traffic(db: sa.Engine, policy: Policy, now: float, window_s: float) -> list[dict[str, Any]]:
    """Per route over the last `window_s` (its whole minutes): the share each pool served, SLO
    attainment (the live rule), p50/p95 of what it is judged on (time to first token of
    streamed requests, end to end of successful ones that were not streamed, embeddings
    included), energy and cost per request, and the same per bucket of the window for charts.

    Read from the request minutes; percentiles from their sketches, within
    SKETCH_RELATIVE_ERROR (gateway/stats.py)."""
    since = now - window_s
    width = window_s / BUCKETS
    routes: dict[str, list[_Traffic]] = {}
    rows = read_minutes(db, policy, since, now, TRAFFIC_COLUMNS, now=now)
    for ts, route, pool, endpoint, stream, *figures, ttft, e2e in rows:
        if route is None:
            continue
        buckets = routes.get(route)
        if buckets is None:
            buckets = routes[route] = [_Traffic() for _ in range(BUCKETS)]
        bucket = buckets[min(BUCKETS - 1, max(0, int((ts - since) / width)))]
        # The end to end time is shown of the requests judged on it.
        judged = judged_on(endpoint, bool(stream)) == "e2e"
        bucket.add(pool or "none", figures, ttft, e2e if judged else None)
    out = []
    for route, buckets in sorted(routes.items()):
        whole = _Traffic()
        for bucket in buckets:
            whole.merge(bucket)
        out.append(
            {
                "route": route,
                **whole.figures(),
                "series": [
                    {"start": since + i * width, **bucket.figures()}
                    for i, bucket in enumerate(buckets)
                ],
            }
        )
    return out


class _Traffic:
    """A route's requests over a span: counts, sums and merged sketches (bucket → count, the
    buckets as the stored JSON names them)."""

    __slots__ = ("e2e", "pools", "sums", "ttft")

    def __init__(self) -> None:
        self.pools: dict[str, int] = defaultdict(int)
        self.sums = [0.0] * 6  # requests, slo_met, energy_n, energy_j, cost_n, cost_usd
        self.ttft: dict[str, int] = {}
        self.e2e: dict[str, int] = {}

    def add(self, pool: str, figures: Sequence[float], ttft: str | None, e2e: str | None) -> None:
        self.pools[pool] += int(figures[0])
        self.sums = [a + b for a, b in zip(self.sums, figures, strict=True)]
        if ttft is not None:
            _merge(self.ttft, orjson.loads(ttft))
        if e2e is not None:
            _merge(self.e2e, orjson.loads(e2e))

    def merge(self, other: _Traffic) -> None:
        for pool, n in other.pools.items():
            self.pools[pool] += n
        self.sums = [a + b for a, b in zip(self.sums, other.sums, strict=True)]
        _merge(self.ttft, other.ttft)
        _merge(self.e2e, other.e2e)

    def figures(self) -> dict[str, Any]:
        requests, met, energy_n, energy, cost_n, cost = self.sums
        ttft = {int(b): n for b, n in self.ttft.items()}
        e2e = {int(b): n for b, n in self.e2e.items()}
        return {
            "requests": int(requests),
            "pool_shares": {p: n / requests for p, n in sorted(self.pools.items())}
            if requests
            else {},
            "slo_attainment": met / requests if requests else None,
            "ttft_p50_ms": sketch_percentile(ttft, 50),
            "ttft_p95_ms": sketch_percentile(ttft, 95),
            "e2e_p50_ms": sketch_percentile(e2e, 50),
            "e2e_p95_ms": sketch_percentile(e2e, 95),
            "energy_j_per_request": energy / energy_n if energy_n else None,
            "cost_usd_per_request": cost / cost_n if cost_n else None,
        }


def _merge(counts: dict[str, int], sketch: dict[str, int]) -> None:
    """Add a sketch's counts into counts."""
    get = counts.get
    for bucket, n in sketch.items():
        counts[bucket] = get(bucket, 0) + n


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
        # Texts are kept only where a route's compare says `store_text` (off by default): with
        # none kept, the query would read the route's every copy for none (26 s on a cold
        # SQLite week of 2 M copies), while the oldest expiry comes from its index at once.
        if conn.execute(sa.select(sa.func.min(c.text_expires_at))).scalar() is None:
            return []
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
