"""The shadow summary: shadow evidence per route and candidate pool, for operators to read.

Reads the shadow minutes (gateway/promotion/shadow_minutes.py; the last minutes, not yet
settled, folded from their records) and drop counts, and folds them into one entry per route
and candidate: samples and drops, agreement beside the route's noise floor (exact and
normalized match, word similarity, near ties at the first difference, KL from logprobs,
semantic similarity), latency percentiles of the answered copies (from the minutes' sketches,
within their stated error), energy and cost. What it reads is the same size whatever the
traffic.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import shadow_drops, shadow_minutes
from gateway.promotion import evidence
from gateway.promotion.shadow_minutes import settled
from gateway.promotion.shadow_minutes import summarize as fold
from gateway.promotion.tally import Tally, agreement
from gateway.shadow.kinds import NOISE
from gateway.stats import sketch_percentile

Row = Mapping[Any, Any]


def _pct(t: Tally, latency: str, q: float) -> float | None:
    value = sketch_percentile(t.latency.get(latency, {}), q)
    return None if value is None else round(value, 3)


def _total(t: Tally, measure: str) -> float | None:
    n, total = t.measures.get(measure, (0, 0.0))
    return total if n else None


def _accuracy(candidates: Tally, noise: Tally) -> dict[str, Any]:
    """Agreement of the answered copies beside the noise floor's, with the copies sent."""
    return {
        "samples": int(candidates["sent"]),
        "noise_samples": int(noise["sent"]),
        **agreement(candidates, noise),
    }


def summarize_minutes(minutes: Iterable[Row], drops: Iterable[Row]) -> list[dict[str, Any]]:
    """Summarise shadow minutes and drop counts per route and candidate pool.

    Noise (A/A) copies belong to a route, not a candidate: each candidate of the route is
    shown beside the same noise floor. Temperature-0 and sampled traffic are split out under
    `greedy` and `sampled`, candidates and noise floor alike, since only greedy answers are
    expected to match exactly: a sampled candidate is judged against the sampled floor.
    """
    candidates: dict[tuple[str, str, bool], Tally] = {}
    noise: dict[tuple[str, bool], Tally] = {}
    for m in minutes:
        sampled = bool(m["sampled"])
        if m["kind"] == NOISE:
            tally = noise.setdefault((m["route"], sampled), Tally())
        else:
            tally = candidates.setdefault((m["route"], m["candidate_pool"], sampled), Tally())
        tally.add(m)
    dropped: Counter[tuple[str, str]] = Counter()
    noise_dropped: Counter[str] = Counter()
    for drop in drops:
        if drop["kind"] == NOISE:
            noise_dropped[drop["route"]] += drop["count"]
        else:
            dropped[(drop["route"], drop["candidate_pool"])] += drop["count"]
    summary = []
    for route, candidate in sorted({(r, c) for r, c, _ in candidates} | set(dropped)):
        greedy = candidates.get((route, candidate, False), Tally())
        sampled_copies = candidates.get((route, candidate, True), Tally())
        floor_greedy = noise.get((route, False), Tally())
        floor_sampled = noise.get((route, True), Tally())
        sent, floor = Tally(), Tally()
        for part, into in ((greedy, sent), (sampled_copies, sent), (floor_greedy, floor)):
            into.merge(part)
        floor.merge(floor_sampled)
        samples = int(sent["sent"])
        summary.append(
            {
                "route": route,
                "candidate": candidate,
                "samples": samples,
                "dropped": dropped[(route, candidate)],
                "candidate_error_rate": (
                    (samples - sent["answered"]) / samples if samples else None
                ),
                **{k: v for k, v in _accuracy(sent, floor).items() if k != "samples"},
                "noise_dropped": noise_dropped[route],
                "mean_length_ratio": sent.mean("length_ratio"),
                "mean_embedding_cosine": sent.mean("embedding_cosine"),
                "primary_latency_p50_ms": _pct(sent, "primary_e2e_ms", 50),
                "primary_latency_p95_ms": _pct(sent, "primary_e2e_ms", 95),
                "candidate_latency_p50_ms": _pct(sent, "candidate_e2e_ms", 50),
                "candidate_latency_p95_ms": _pct(sent, "candidate_e2e_ms", 95),
                "primary_ttft_p50_ms": _pct(sent, "primary_ttft_ms", 50),
                "candidate_ttft_p50_ms": _pct(sent, "candidate_ttft_ms", 50),
                "primary_energy_j": _total(sent, "primary_energy_j"),
                "candidate_energy_j": _total(sent, "candidate_energy_j"),
                "primary_cost_usd": _total(sent, "primary_cost_usd"),
                "candidate_cost_usd": _total(sent, "candidate_cost_usd"),
                "greedy": _accuracy(greedy, floor_greedy),
                "sampled": _accuracy(sampled_copies, floor_sampled),
            }
        )
    return summary


def summarize_rows(rows: Iterable[Row], drops: Iterable[Row]) -> list[dict[str, Any]]:
    """Summarise shadow records (with their primaries' energy and cost) as their minutes read."""
    return summarize_minutes((m.row() for m in fold(rows, lambda _: None)), drops)


def summarize(
    db: sa.Engine,
    route: str | None = None,
    candidate: str | None = None,
    since: float | None = None,
    *,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Read the shadow minutes and drops that match the filters and summarise them; the minutes
    not settled by `now` are folded from their shadow records."""
    now = time.time() if now is None else now
    start = 0.0 if since is None else since
    horizon = max(start, settled(now))
    m, d = shadow_minutes.c, shadow_drops.c
    query = sa.select(shadow_minutes).where(m.ts >= start, m.ts < horizon)
    drops_query = sa.select(d.route, d.candidate_pool, d.kind, d.count).where(d.ts >= start)
    if route is not None:
        query = query.where(m.route == route)
        drops_query = drops_query.where(d.route == route)
    if candidate is not None:
        query = query.where(sa.or_(m.candidate_pool == candidate, m.kind == NOISE))
        drops_query = drops_query.where(sa.or_(d.candidate_pool == candidate, d.kind == NOISE))
    recent = [
        r
        for r in evidence.shadow_rows(db, horizon, route=route)
        if candidate is None or r["candidate_pool"] == candidate or r["kind"] == NOISE
    ]
    with db.connect() as conn:
        minutes: list[Row] = list(conn.execute(query).mappings())
        drops = [dict(r._mapping) for r in conn.execute(drops_query)]
    minutes += [s.row() for s in fold(recent, lambda _: None)]
    return summarize_minutes(minutes, drops)
