"""The shadow summary: shadow evidence per route and candidate pool, for operators to read.

Reads shadow records and drop counts (with the primaries' measured energy and cost from their
request records) and folds them into one entry per route and candidate: samples and drops,
agreement beside the route's noise floor (exact and normalized match, word similarity, near
ties at the first difference, KL from logprobs, semantic similarity), latency percentiles,
energy and cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import request_of_copy, request_records, shadow_drops, shadow_records
from gateway.shadow.sample import NOISE
from gateway.stats import mean, measured, percentile, share, total

_SUMMARY_COLUMNS = (
    "route",
    "kind",
    "candidate_pool",
    "sampled",
    "candidate_error",
    "exact_match",
    "normalized_match",
    "similarity",
    "length_ratio",
    "embedding_cosine",
    "near_tie",
    "kl_divergence",
    "semantic_similarity",
    "primary_e2e_ms",
    "candidate_e2e_ms",
    "primary_ttft_ms",
    "candidate_ttft_ms",
    "primary_energy_j",
    "candidate_energy_j",
    "primary_cost_usd",
    "candidate_cost_usd",
)


def _pct(rows: Sequence[Mapping[str, Any]], column: str, q: float) -> float | None:
    value = percentile(measured(rows, column), q)
    return None if value is None else round(value, 3)


def _accuracy(candidates: Sequence[Mapping[str, Any]], noise: Sequence[Mapping[str, Any]]) -> dict:
    ok = [r for r in candidates if r["candidate_error"] is None]
    noise_ok = [r for r in noise if r["candidate_error"] is None]
    return {
        "samples": len(candidates),
        "exact_match_rate": share(ok, "exact_match"),
        "normalized_match_rate": share(ok, "normalized_match"),
        "mean_similarity": mean(ok, "similarity"),
        "near_tie_rate": share(ok, "near_tie"),
        "mean_kl_divergence": mean(ok, "kl_divergence"),
        "mean_semantic_similarity": mean(ok, "semantic_similarity"),
        "noise_samples": len(noise),
        "noise_exact_match_rate": share(noise_ok, "exact_match"),
        "noise_normalized_match_rate": share(noise_ok, "normalized_match"),
        "noise_mean_similarity": mean(noise_ok, "similarity"),
        "noise_near_tie_rate": share(noise_ok, "near_tie"),
        "noise_mean_kl_divergence": mean(noise_ok, "kl_divergence"),
        "noise_mean_semantic_similarity": mean(noise_ok, "semantic_similarity"),
    }


def summarize_rows(
    rows: Iterable[Mapping[str, Any]], drops: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Summarise shadow records and drop counts per route and candidate pool.

    Noise (A/A) records belong to a route, not a candidate: each candidate of the route is
    shown beside the same noise floor. Temperature-0 and sampled traffic are split out under
    `greedy` and `sampled`, candidates and noise floor alike, since only greedy answers are
    expected to match exactly: a sampled candidate is judged against the sampled floor.
    """
    candidates: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    noise: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row["kind"] == NOISE:
            noise.setdefault(row["route"], []).append(row)
        else:
            candidates.setdefault((row["route"], row["candidate_pool"]), []).append(row)
    dropped: Counter[tuple[str, str]] = Counter()
    noise_dropped: Counter[str] = Counter()
    for drop in drops:
        if drop["kind"] == NOISE:
            noise_dropped[drop["route"]] += drop["count"]
        else:
            dropped[(drop["route"], drop["candidate_pool"])] += drop["count"]
    summary = []
    for route, candidate in sorted(set(candidates) | set(dropped)):
        sent = candidates.get((route, candidate), [])
        floor = noise.get(route, [])
        ok = [r for r in sent if r["candidate_error"] is None]
        errors = len(sent) - len(ok)
        entry: dict[str, Any] = {
            "route": route,
            "candidate": candidate,
            "samples": len(sent),
            "dropped": dropped[(route, candidate)],
            "candidate_error_rate": errors / len(sent) if sent else None,
            **{k: v for k, v in _accuracy(sent, floor).items() if k != "samples"},
            "noise_dropped": noise_dropped[route],
            "mean_length_ratio": mean(ok, "length_ratio"),
            "mean_embedding_cosine": mean(ok, "embedding_cosine"),
            "primary_latency_p50_ms": _pct(sent, "primary_e2e_ms", 50),
            "primary_latency_p95_ms": _pct(sent, "primary_e2e_ms", 95),
            "candidate_latency_p50_ms": _pct(ok, "candidate_e2e_ms", 50),
            "candidate_latency_p95_ms": _pct(ok, "candidate_e2e_ms", 95),
            "primary_ttft_p50_ms": _pct(sent, "primary_ttft_ms", 50),
            "candidate_ttft_p50_ms": _pct(ok, "candidate_ttft_ms", 50),
            "primary_energy_j": total(sent, "primary_energy_j"),
            "candidate_energy_j": total(sent, "candidate_energy_j"),
            "primary_cost_usd": total(sent, "primary_cost_usd"),
            "candidate_cost_usd": total(sent, "candidate_cost_usd"),
            "greedy": _accuracy(
                [r for r in sent if not r["sampled"]], [r for r in floor if not r["sampled"]]
            ),
            "sampled": _accuracy(
                [r for r in sent if r["sampled"]], [r for r in floor if r["sampled"]]
            ),
        }
        summary.append(entry)
    return summary


def summarize(
    db: sa.Engine,
    route: str | None = None,
    candidate: str | None = None,
    since: float | None = None,
) -> list[dict[str, Any]]:
    """Read the shadow records and drops that match the filters and summarise them."""
    c, d, r = shadow_records.c, shadow_drops.c, request_records.c
    # The primary's energy and cost are measured on its request record, written by the meter.
    measured = {
        "primary_energy_j": sa.func.coalesce(c.primary_energy_j, r.energy_j),
        "primary_cost_usd": sa.func.coalesce(c.primary_cost_usd, r.cost_usd),
    }
    query = sa.select(
        *(measured[n].label(n) if n in measured else c[n] for n in _SUMMARY_COLUMNS)
    ).select_from(shadow_records.outerjoin(request_records, request_of_copy(since)))
    drops_query = sa.select(d.route, d.candidate_pool, d.kind, d.count)
    if route is not None:
        query = query.where(c.route == route)
        drops_query = drops_query.where(d.route == route)
    if candidate is not None:
        query = query.where(sa.or_(c.candidate_pool == candidate, c.kind == NOISE))
        drops_query = drops_query.where(sa.or_(d.candidate_pool == candidate, d.kind == NOISE))
    if since is not None:
        query = query.where(c.ts >= since)
        drops_query = drops_query.where(d.ts >= since)
    with db.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
        drops = [dict(r._mapping) for r in conn.execute(drops_query)]
    return summarize_rows(rows, drops)
