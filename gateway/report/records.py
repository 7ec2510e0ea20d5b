"""The report's reading: a period's records read from the database, then judged and folded.

`collect` is the one edge of the report that reads: the request minutes (gateway/records/
minutes.py) summed per key in the database, a bounded sample of request records per route for
the projected savings, the shadow minutes (gateway/promotion/shadow_minutes.py) and the few
shadow records they name as the least similar, shadow drops, the newest cost model, the stored
verdicts and precision checks, parking events, and each backend's energy and time on and parked
(backend_energy). What it reads of requests and shadow copies is the same size whatever the
traffic. The judge
(gateway/report/verdicts.py) and the pure folds (gateway/report/numbers.py) make the report's
numbers of them.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from gateway.costmodel.predict import CostModel
from gateway.db.schema import (
    RequestMinute,
    backend_energy,
    cost_models,
    parking_events,
    request_minutes,
    request_records,
    shadow_drops,
    shadow_records,
)
from gateway.db.schema import shadow_minutes as shadow_minutes_table
from gateway.policy.definition import Policy
from gateway.promotion import evidence, shadow_minutes
from gateway.promotion.precision import results
from gateway.promotion.tally import Tally
from gateway.records.minutes import MINUTE_S, RECORD_COLUMNS, settled, summarize, targets_of
from gateway.report.numbers import Sample, build
from gateway.report.period import Period
from gateway.report.verdicts import judge_minutes, judge_window
from gateway.shadow.sample import CANDIDATE

# The keys of the request minutes the report sums per, and the figures it sums.
MINUTE_KEYS = ("route", "pool", "model", "endpoint", "slo_class", "stream")
MINUTE_SUMS = (
    "requests",
    "errors",
    "slo_met",
    "prompt_tokens",
    "completion_tokens",
    "energy_n",
    "energy_j",
    "energy_j_tokened",
    "energy_tokens",
    "cost_n",
    "cost_usd",
    "cost_usd_tokened",
    "cost_tokens",
    "e2e_ape",
    "e2e_ape_n",
    "energy_ape",
    "energy_ape_n",
)
# What the projected savings read of each sampled request record.
SAMPLE_COLUMNS = (
    "route",
    "pool",
    "model",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "concurrent",
)
# Requests of a route the projected savings are predicted from, at most (about): beyond it,
# whole minutes spread evenly over the period, read by index.
SAMPLE_REQUESTS = 20_000
# What the report reads of each shadow drop.
DROP_COLUMNS = ("ts", "route", "candidate_pool", "kind", "reason", "count")


def collect(
    db: sa.Engine, policy: Policy, period: Period, *, now: float, model: CostModel | None
) -> dict[str, Any]:
    """Read everything the report needs for `period` and return its numbers."""
    previous = period.previous()
    rules = evidence.criteria(policy)
    start = min(previous.since, period.until - judge_window(rules))
    traffic = read_traffic(db, policy, period.since, period.until, now=now)
    samples = {
        route: read_sample(db, route, period, requests)
        for route, requests in _per_route(traffic).items()
    }
    shadows = read_shadow_minutes(db, policy, start, period.until, now=now)
    drops = _read_drops(db, start, period.until)
    cost_model = _read_cost_model(db, period.until)
    stored = evidence.latest(db)
    predict = (model or CostModel(policy)).predict
    return build(
        policy,
        period,
        traffic=traffic,
        traffic_before=read_traffic(db, policy, previous.since, previous.until, now=now),
        samples=samples,
        shadows=shadows,
        disagreements=read_disagreements(db, shadows, period),
        drops=drops,
        cost_model=cost_model,
        stored_verdicts=stored,
        predict=predict,
        now=now,
        rules=rules,
        verdicts=judge_minutes(shadows, policy, period.until),
        verdicts_before=judge_minutes(shadows, policy, previous.until),
        checks=results.newest(db, until=period.until),
        parking=read_parking(db, period.until),
        draw=read_draw(db, previous.since, period.until),
    )


def read_traffic(
    db: sa.Engine, policy: Policy, since: float, until: float, *, now: float
) -> list[dict[str, Any]]:
    """Read the request minutes from `since` to `until`, summed per key in the database; the
    minutes not settled by `now` are folded here from their request records."""
    horizon = min(until, max(since, settled(now)))
    m = request_minutes.c
    keys = [m[k] for k in MINUTE_KEYS]
    query = (
        sa.select(*keys, *(sa.func.sum(m[name]).label(name) for name in MINUTE_SUMS))
        .where(m.ts >= since, m.ts < horizon)
        .group_by(*keys)
    )
    with db.connect() as conn:
        traffic = [dict(r._mapping) for r in conn.execute(query)]
    if horizon < until:
        traffic += [row.row() for row in read_unsettled(db, policy, horizon, until)]
    return traffic


def count_requests(db: sa.Engine, since: float, until: float, *, now: float) -> int:
    """Count the requests from `since` to `until`: the settled minutes' sum and, after them,
    the request records."""
    horizon = min(until, max(since, settled(now)))
    m, r = request_minutes.c, request_records.c
    with db.connect() as conn:
        summed = conn.execute(
            sa.select(sa.func.sum(m.requests)).where(m.ts >= since, m.ts < horizon)
        ).scalar()
        recent = conn.execute(
            sa.select(sa.func.count()).where(r.ts >= horizon, r.ts < until)
        ).scalar()
    return int(summed or 0) + int(recent or 0)


def read_minutes(
    db: sa.Engine,
    policy: Policy,
    since: float,
    until: float,
    columns: Sequence[str],
    *,
    now: float,
) -> list[tuple[Any, ...]]:
    """Read `columns` of the rows of the request minutes that start from `since` to `until`;
    the minutes not settled by `now` are folded here from their request records."""
    horizon = min(until, max(since, settled(now)))
    m = request_minutes.c
    query = sa.select(*(m[c] for c in columns)).where(m.ts >= since, m.ts < horizon)
    with db.connect() as conn:
        rows = [tuple(r) for r in conn.execute(query)]
    if horizon < until:
        read = operator.attrgetter(*columns)
        rows += [read(row) for row in read_unsettled(db, policy, horizon, until)]
    return rows


def read_unsettled(
    db: sa.Engine, policy: Policy, since: float, until: float
) -> list[RequestMinute]:
    """Fold the request records from `since` to `until` into minutes, as the writer will."""
    r = request_records.c
    query = sa.select(*(r[n] for n in RECORD_COLUMNS)).where(r.ts >= since, r.ts < until)
    with db.connect() as conn:
        return summarize(conn.execute(query).mappings(), targets_of(policy))


def _per_route(traffic: Iterable[dict[str, Any]]) -> dict[str, int]:
    routes: dict[str, int] = {}
    for r in traffic:
        if r["route"] is not None:
            routes[r["route"]] = routes.get(r["route"], 0) + r["requests"]
    return routes


def read_sample(db: sa.Engine, route: str, period: Period, requests: int) -> Sample:
    """Read a route's requests of the period for the projected savings: all of them up to
    SAMPLE_REQUESTS, else every k-th minute of those it served in (a systematic sample in
    time, so each hour weighs as its traffic does), scaled by the period's requests over the
    sample's."""
    r = request_records.c
    columns = [r[n] for n in SAMPLE_COLUMNS]
    with db.connect() as conn:
        if requests <= SAMPLE_REQUESTS:
            query = sa.select(*columns).where(
                r.route == route, r.ts >= period.since, r.ts < period.until
            )
            return Sample([dict(row._mapping) for row in conn.execute(query)])
        m = request_minutes.c
        minutes = conn.execute(
            sa.select(m.ts, sa.func.sum(m.requests))
            .where(m.route == route, m.ts >= period.since, m.ts < period.until)
            .group_by(m.ts)
            .order_by(m.ts)
        ).all()
        every = math.ceil(requests / SAMPLE_REQUESTS)
        chosen = minutes[every // 2 :: every]
        # A query per minute, each a short range of the time index: one query of many ranges
        # OR'ed had SQLite scan the whole table (30 s for a week of 1 M records), and a plain
        # test of the route had it walk the route's every row by its index, once per minute
        # (94 s), so the route is tested through coalesce, which no index serves.
        query = sa.select(*columns).where(
            sa.func.coalesce(r.route, "") == route,
            r.ts >= sa.bindparam("since"),
            r.ts < sa.bindparam("until"),
        )
        rows: list[dict[str, Any]] = []
        for ts, _ in chosen:
            found = conn.execute(query, {"since": ts, "until": ts + MINUTE_S})
            rows += [dict(row._mapping) for row in found]
    counted = sum(n for _, n in chosen)
    return Sample(rows, requests / counted if counted else 1.0)


def read_shadow_minutes(
    db: sa.Engine, policy: Policy, since: float, until: float, *, now: float
) -> list[dict[str, Any]]:
    """Read the shadow minutes from `since` to `until`; the minutes not settled by `now` are
    folded here from their shadow records."""
    horizon = min(until, max(since, shadow_minutes.settled(now)))
    m = shadow_minutes_table.c
    query = sa.select(shadow_minutes_table).where(m.ts >= since, m.ts < horizon)
    with db.connect() as conn:
        minutes = [dict(r) for r in conn.execute(query).mappings()]
    if horizon < until:
        recent = evidence.shadow_rows(db, horizon, until)
        minutes += [s.row() for s in shadow_minutes.summarize(recent, evidence.slo_targets(policy))]
    return minutes


def read_disagreements(
    db: sa.Engine, minutes: Iterable[dict[str, Any]], period: Period
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Read the shadow records each candidate's minutes of the period name as least similar
    (those retention has not deleted)."""
    named: dict[tuple[str, str], Tally] = {}
    for m in minutes:
        if m["kind"] == CANDIDATE and m["worst"] and period.since <= m["ts"] < period.until:
            tally = named.setdefault((m["route"], m["candidate_pool"]), Tally())
            tally.merge_worst(m["worst"])
    c = shadow_records.c
    columns = [col for col in shadow_records.columns if col.name not in evidence.LEFT_OUT]
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with db.connect() as conn:
        for (route, pool), tally in named.items():
            query = sa.select(*columns).where(
                c.decision_id.in_([worst[-1] for worst in tally.worst]),
                c.kind == CANDIDATE,
                c.candidate_pool == pool,
            )
            found[route, pool] = [dict(r._mapping) for r in conn.execute(query)]
    return found


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
