"""Shadow records: one row per mirrored copy with its diff, written in batches; and their summary.

Two tables. `shadow_records` holds each copy that was sent: both sides' statuses, latencies,
tokens, energy and cost, and the comparators' measures (raw texts only when the route opts in,
erased after its retention limit). `shadow_drops` counts the copies that were *not* sent, per
minute, route, candidate pool, kind and reason, so the summary can say how much evidence was
lost without writing a row for every drop of an overloaded candidate.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.engine import metadata
from gateway.metrics import GatewayMetrics
from gateway.records.batching import BatchWriter, row_of
from gateway.records.requests import request_records

log = logging.getLogger(__name__)

CANDIDATE = "candidate"
NOISE = "noise"

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

shadow_records = sa.Table(
    "shadow_records",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column("decision_id", sa.String(32), nullable=False, index=True),
    sa.Column(
        "ts", sa.Float, nullable=False, index=True, comment="Primary's arrival, Unix seconds."
    ),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(64)),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("endpoint", sa.String(16), nullable=False),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("temperature", sa.Float),
    sa.Column("top_p", sa.Float),
    sa.Column("seeded", sa.Boolean, nullable=False),
    sa.Column("sampled", sa.Boolean, nullable=False),
    sa.Column("primary_pool", sa.String(64), nullable=False),
    sa.Column("primary_backend", sa.String(64)),
    sa.Column("candidate_pool", sa.String(64), nullable=False),
    sa.Column("candidate_backend", sa.String(64)),
    sa.Column("primary_status", sa.Integer, nullable=False),
    sa.Column("candidate_status", sa.Integer),
    sa.Column("candidate_error", sa.String(64)),
    sa.Column("primary_ttft_ms", sa.Float),
    sa.Column("primary_tpot_ms", sa.Float),
    sa.Column("primary_e2e_ms", sa.Float),
    sa.Column("candidate_ttft_ms", sa.Float),
    sa.Column("candidate_tpot_ms", sa.Float),
    sa.Column("candidate_e2e_ms", sa.Float),
    sa.Column("primary_prompt_tokens", sa.Integer),
    sa.Column("primary_completion_tokens", sa.Integer),
    sa.Column("candidate_prompt_tokens", sa.Integer),
    sa.Column("candidate_completion_tokens", sa.Integer),
    sa.Column("exact_match", sa.Boolean),
    sa.Column("normalized_match", sa.Boolean),
    sa.Column("similarity", sa.Float),
    sa.Column("similarity_method", sa.String(16)),
    sa.Column("first_divergence", sa.Integer),
    sa.Column("length_ratio", sa.Float),
    sa.Column("json_diff", sa.Text),
    sa.Column("embedding_cosine", sa.Float),
    sa.Column("measures", sa.Text),
    sa.Column("primary_energy_j", sa.Float),
    sa.Column("candidate_energy_j", sa.Float),
    sa.Column("primary_cost_usd", sa.Float),
    sa.Column("candidate_cost_usd", sa.Float),
    sa.Column("primary_text", sa.Text),
    sa.Column("candidate_text", sa.Text),
    sa.Column(
        "text_expires_at",
        sa.Float,
        index=True,
        comment="When the stored texts are erased, Unix seconds.",
    ),
    # The judge, the summary and the rollout guards read one route's time range (migration 0007).
    sa.Index("ix_shadow_records_route_ts", "route", "ts"),
)

shadow_drops = sa.Table(
    "shadow_drops",
    metadata,
    sa.Column("id", _ID, primary_key=True),
    sa.Column(
        "ts", sa.Float, nullable=False, index=True, comment="Start of the minute, Unix seconds."
    ),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("candidate_pool", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(32), nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Index("ix_shadow_drops_route_ts", "route", "ts"),
)


@dataclass(slots=True)
class ShadowRecord:
    """One mirrored copy: who answered, how fast, and how the two answers differ."""

    decision_id: str
    ts: float
    route: str
    model: str
    tenant: str | None
    kind: str
    endpoint: str
    stream: bool
    temperature: float | None
    top_p: float | None
    seeded: bool
    sampled: bool
    primary_pool: str
    primary_backend: str | None
    candidate_pool: str
    candidate_backend: str | None
    primary_status: int
    candidate_status: int | None
    candidate_error: str | None
    primary_ttft_ms: float | None = None
    primary_tpot_ms: float | None = None
    primary_e2e_ms: float | None = None
    candidate_ttft_ms: float | None = None
    candidate_tpot_ms: float | None = None
    candidate_e2e_ms: float | None = None
    primary_prompt_tokens: int | None = None
    primary_completion_tokens: int | None = None
    candidate_prompt_tokens: int | None = None
    candidate_completion_tokens: int | None = None
    exact_match: bool | None = None
    normalized_match: bool | None = None
    similarity: float | None = None
    similarity_method: str | None = None
    first_divergence: int | None = None
    length_ratio: float | None = None
    json_diff: str | None = None
    embedding_cosine: float | None = None
    measures: str | None = None
    primary_energy_j: float | None = None
    candidate_energy_j: float | None = None
    primary_cost_usd: float | None = None
    candidate_cost_usd: float | None = None
    primary_text: str | None = None
    candidate_text: str | None = None
    text_expires_at: float | None = None

    def row(self) -> dict[str, Any]:
        return row_of(self)


DropKey = tuple[float, str, str, str, str]


class ShadowWriter(BatchWriter[ShadowRecord]):
    """Write shadow records and drop counts in batches, and erase stored texts when due.

    Like request records, adding never waits, and what the database cannot take is held and
    spilled (gateway.records.batching).
    Drops of copies are tallied in memory per minute and written as counts. Stored texts past
    their retention limit are erased on a slower period.
    """

    def __init__(
        self,
        engine: sa.Engine,
        metrics: GatewayMetrics,
        *,
        flush_interval_s: float = 0.5,
        batch_size: int = 200,
        max_pending: int = 10_000,
        purge_interval_s: float = 60.0,
        wall: Callable[[], float] = time.time,
        **options: Any,
    ):
        super().__init__(
            engine,
            shadow_records,
            metrics,
            metrics.shadow_records_written,
            metrics.shadow_records_dropped,
            flush_interval_s=flush_interval_s,
            batch_size=batch_size,
            max_pending=max_pending,
            **options,
        )
        self._purge_interval = purge_interval_s
        self._next_purge = 0.0
        self._wall = wall
        self._drops: Tally[DropKey] = Tally()

    def count_drop(self, route: str, candidate: str, kind: str, reason: str) -> None:
        """Count a copy that was not sent, in the current minute."""
        minute = math.floor(self._wall() / 60) * 60.0
        self._drops[(minute, route, candidate, kind, reason)] += 1

    async def flush(self) -> None:
        """Write every queued record and drop count now."""
        await super().flush()
        await self._write_drops()

    async def tick(self) -> None:
        await self.flush()
        if self._wall() >= self._next_purge:
            self._next_purge = self._wall() + self._purge_interval
            await self.purge()

    async def purge(self) -> int:
        """Erase stored texts past their retention limit; return how many records were erased."""
        return await asyncio.to_thread(self._erase_expired, self._wall())

    async def _write_drops(self) -> None:
        if not self._drops:
            return
        drops, self._drops = self._drops, Tally()
        rows = [
            {
                "ts": ts,
                "route": route,
                "candidate_pool": candidate,
                "kind": kind,
                "reason": reason,
                "count": count,
            }
            for (ts, route, candidate, kind, reason), count in drops.items()
        ]
        try:
            await asyncio.to_thread(self.insert, shadow_drops, rows)
        except Exception:
            log.exception("could not write %d shadow drop counts", len(rows))

    def _erase_expired(self, now: float) -> int:
        c = shadow_records.c
        with self._engine.begin() as conn:
            result = conn.execute(
                shadow_records.update()
                .where(c.text_expires_at <= now)
                .values(primary_text=None, candidate_text=None, text_expires_at=None)
            )
        return int(result.rowcount or 0)


# Summary -----------------------------------------------------------------------------------

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
    "primary_e2e_ms",
    "candidate_e2e_ms",
    "primary_ttft_ms",
    "candidate_ttft_ms",
    "primary_energy_j",
    "candidate_energy_j",
    "primary_cost_usd",
    "candidate_cost_usd",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the q-th percentile (0..100) by linear interpolation, or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _rate(rows: Sequence[Mapping[str, Any]], column: str) -> float | None:
    values = [r[column] for r in rows if r[column] is not None]
    return None if not values else sum(bool(v) for v in values) / len(values)


def _mean(rows: Sequence[Mapping[str, Any]], column: str) -> float | None:
    values = [r[column] for r in rows if r[column] is not None]
    return None if not values else math.fsum(values) / len(values)


def _total(rows: Sequence[Mapping[str, Any]], column: str) -> float | None:
    values = [r[column] for r in rows if r[column] is not None]
    return None if not values else math.fsum(values)


def _pct(rows: Sequence[Mapping[str, Any]], column: str, q: float) -> float | None:
    value = percentile([r[column] for r in rows if r[column] is not None], q)
    return None if value is None else round(value, 3)


def _accuracy(candidates: Sequence[Mapping[str, Any]], noise: Sequence[Mapping[str, Any]]) -> dict:
    ok = [r for r in candidates if r["candidate_error"] is None]
    noise_ok = [r for r in noise if r["candidate_error"] is None]
    return {
        "samples": len(candidates),
        "exact_match_rate": _rate(ok, "exact_match"),
        "normalized_match_rate": _rate(ok, "normalized_match"),
        "mean_similarity": _mean(ok, "similarity"),
        "noise_samples": len(noise),
        "noise_exact_match_rate": _rate(noise_ok, "exact_match"),
        "noise_mean_similarity": _mean(noise_ok, "similarity"),
    }


def summarize_rows(
    rows: Iterable[Mapping[str, Any]], drops: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Summarise shadow records and drop counts per route and candidate pool.

    Noise (A/A) records belong to a route, not a candidate: each candidate of the route is
    shown beside the same noise floor. Temperature-0 and sampled traffic are split out under
    `greedy` and `sampled`, since only greedy answers are expected to match exactly.
    """
    candidates: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    noise: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row["kind"] == NOISE:
            noise.setdefault(row["route"], []).append(row)
        else:
            candidates.setdefault((row["route"], row["candidate_pool"]), []).append(row)
    dropped: Tally[tuple[str, str]] = Tally()
    noise_dropped: Tally[str] = Tally()
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
            "mean_length_ratio": _mean(ok, "length_ratio"),
            "mean_embedding_cosine": _mean(ok, "embedding_cosine"),
            "primary_latency_p50_ms": _pct(sent, "primary_e2e_ms", 50),
            "primary_latency_p95_ms": _pct(sent, "primary_e2e_ms", 95),
            "candidate_latency_p50_ms": _pct(ok, "candidate_e2e_ms", 50),
            "candidate_latency_p95_ms": _pct(ok, "candidate_e2e_ms", 95),
            "primary_ttft_p50_ms": _pct(sent, "primary_ttft_ms", 50),
            "candidate_ttft_p50_ms": _pct(ok, "candidate_ttft_ms", 50),
            "primary_energy_j": _total(sent, "primary_energy_j"),
            "candidate_energy_j": _total(sent, "candidate_energy_j"),
            "primary_cost_usd": _total(sent, "primary_cost_usd"),
            "candidate_cost_usd": _total(sent, "candidate_cost_usd"),
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
    engine: sa.Engine,
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
    ).select_from(shadow_records.outerjoin(request_records, r.decision_id == c.decision_id))
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
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
        drops = [dict(r._mapping) for r in conn.execute(drops_query)]
    return summarize_rows(rows, drops)
