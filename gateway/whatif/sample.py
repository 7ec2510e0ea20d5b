"""A stratified sample of a period's served requests, for the what-if to replay.

A week of a busy fleet is millions of requests; replaying them all takes longer than anyone
waits. The what-if replays a sample instead: the period is cut into strata, one per route and
hour, and each stratum gives at most `cap` requests, a systematic sample by arrival (every k-th
of the stratum in time order, chosen in SQL one hour at a time, so the period is never held in
memory). `cap` is the largest that keeps the whole sample within the size asked for, so small
strata are read whole and every stratum is represented. Each sampled request stands for
`N_h / n_h` of its stratum's requests (its weight), which scales the sample back to the period.

The sample is replayed at its own arrival times, thinner than the period's traffic: queueing
under the period's full load is not reproduced, which is why the what-if compares policies on
the same sample rather than quoting absolute figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import request_records
from gateway.whatif.trace import TraceRequest

DEFAULT_SAMPLE = 20_000
HOUR_S = 3600.0

Stratum = tuple[str | None, int]  # (route, hour as Unix seconds // 3600)


@dataclass(frozen=True, slots=True)
class RecordedSample:
    """The sampled requests, oldest first, with each one's stratum and every stratum's size in
    the period."""

    requests: list[TraceRequest]
    strata: list[Stratum]
    sizes: Mapping[Stratum, int]

    @property
    def period_requests(self) -> int:
        return sum(self.sizes.values())

    def taken(self) -> dict[Stratum, int]:
        """Return how many requests each stratum gave the sample."""
        counts: dict[Stratum, int] = dict.fromkeys(self.sizes, 0)
        for stratum in self.strata:
            counts[stratum] += 1
        return counts


def stratum_cap(sizes: Mapping[Stratum, int], size: int) -> int:
    """Return the largest per-stratum cap whose sample, each stratum giving at most the cap,
    holds at most `size` requests (at least 1, so every stratum is represented)."""
    counts = sorted(sizes.values())
    remaining, strata = size, len(counts)
    for count in counts:
        # Strata smaller than an even share are read whole; the rest share what is left.
        if count * strata > remaining:
            return max(remaining // strata, 1)
        remaining -= count
        strata -= 1
    return max(counts, default=1)


def trace_request(row: Any, first: float) -> TraceRequest:
    """Return a request record's row as a request of a trace that starts at `first`."""
    return TraceRequest(
        row.ts - first,
        int(row.prompt_tokens),
        0 if row.endpoint == "embeddings" else max(int(row.completion_tokens), 1),
        model=row.model,
        slo_class=row.slo_class,
        tenant=row.tenant,
        endpoint=row.endpoint,
        stream=bool(row.stream),
    )


def _served(since: float, until: float | None) -> list[sa.ColumnElement[bool]]:
    r = request_records.c
    where = [
        r.ts >= since,
        r.status == 200,
        r.prompt_tokens.is_not(None),
        r.completion_tokens.is_not(None),
    ]
    if until is not None:
        where.append(r.ts < until)
    return where


def stratum_sizes(db: sa.Engine, since: float, until: float | None = None) -> dict[Stratum, int]:
    """Return the period's served requests counted per route and hour."""
    r = request_records.c
    hour = sa.cast(sa.func.floor(r.ts / HOUR_S), sa.Integer).label("hour")
    query = (
        sa.select(r.route, hour, sa.func.count())
        .where(*_served(since, until))
        .group_by(r.route, hour)
    )
    with db.connect() as conn:
        return {(route, int(h)): int(n) for route, h, n in conn.execute(query)}


def sample_requests(
    db: sa.Engine, since: float, until: float | None = None, *, size: int = DEFAULT_SAMPLE
) -> RecordedSample:
    """Return a sample of at most about `size` of the period's served requests, stratified by
    route and hour (at least one request from every stratum)."""
    sizes = stratum_sizes(db, since, until)
    if not sizes:
        return RecordedSample([], [], {})
    cap = stratum_cap(sizes, size)
    r = request_records.c
    # Partitioned by an expression, not the column: partitioning by the column lets the
    # planner read the route index whole for its order, instead of the hour by the time index.
    route = sa.func.coalesce(r.route, "")
    rank = sa.func.row_number().over(partition_by=route, order_by=(r.ts, r.id))
    count = sa.func.count().over(partition_by=route)
    rows: list[sa.Row[tuple[object, ...]]] = []
    with db.connect() as conn:
        for hour in sorted({h for _, h in sizes}):
            start = max(hour * HOUR_S, since)
            end = (hour + 1) * HOUR_S if until is None else min((hour + 1) * HOUR_S, until)
            ranked = (
                sa.select(
                    r.ts,
                    r.route,
                    r.prompt_tokens,
                    r.completion_tokens,
                    r.model,
                    r.slo_class,
                    r.tenant,
                    r.endpoint,
                    r.stream,
                    rank.label("rank"),
                    count.label("size"),
                )
                .where(*_served(start, end))
                .subquery()
            )
            q = sa.case((ranked.c.size < cap, ranked.c.size), else_=cap)
            # Systematic: keep the rank where floor(rank * n / N) steps up, exactly n of N.
            pick = (ranked.c.rank * q) // ranked.c.size > ((ranked.c.rank - 1) * q) // ranked.c.size
            rows.extend(conn.execute(sa.select(ranked).where(pick)).all())
    rows.sort(key=lambda row: row.ts)
    first = rows[0].ts
    requests = [trace_request(row, first) for row in rows]
    strata = [(row.route, int(row.ts // HOUR_S)) for row in rows]
    return RecordedSample(requests, strata, sizes)
