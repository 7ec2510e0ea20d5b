"""A sample of a period's time windows, for the what-if to replay at the period's full load.

A week of a busy fleet is millions of requests; replaying them all takes longer than anyone
waits. A sample of requests scattered over the week would be replayed thinner than the fleet
served them: queues would be shorter and SLO attainment higher than at the period's load. So
the what-if samples time instead: the period is cut into windows of `WINDOW_S` on the clock's
minutes, the windows into `strata` runs of consecutive windows of equal length, and
`PER_STRATUM` windows are drawn at random (seeded) from each stratum. Every request of a drawn
window is replayed, at its recorded arrival, after the `WARM_UP_S` of traffic before it (also
replayed whole, not measured), so the window starts with its queues, prefix caches and cost
model in the state the period's traffic left them. The number of strata is the largest whose
windows and warm-ups hold at most the requests asked for, counted per minute from the request
minutes (gateway/records/minutes.py), so the period's records are never read whole. A period
with no more requests than that is replayed entire.

The windows are clusters of a stratified sample: gateway/whatif/estimate.py turns what was
measured in each into the period's figures, with an interval from the spread between the
windows of each stratum.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import request_minutes, request_records
from gateway.whatif.trace import TraceRequest

DEFAULT_SAMPLE = 20_000
MINUTE_S = 60.0
WINDOW_S = 60.0  # a window sampled: a minute of the period, every request of it
# Replayed before each window and not measured: long enough for the slots a window finds busy
# to hold the requests the period's traffic left in them. Most requests end within seconds, but
# in an hour of 8,000 requests under the default policy a 70B request held its slot 55 s on
# average and 270 s at the 99th percentile, and the batch a window finds is made of the long
# ones: on a saturated hour, a minute of warm-up left cost per 1k tokens outside both intervals
# drawn, three minutes outside one of two (docs/results/whatif-windows-busy-hour-2026-12-07.json);
# on half-busy hours three minutes held 26 of 30 intervals (...-coverage-2026-12-07.json).
WARM_UP_S = 180.0
PER_STRATUM = 2  # the fewest windows whose spread says anything of their stratum's


@dataclass(frozen=True, slots=True)
class Window:
    """A sampled window of the period (Unix seconds), its stratum, and where its warm-up starts."""

    stratum: int
    start: float
    end: float
    warm_up: float


@dataclass(frozen=True, slots=True)
class WindowSample:
    """The requests of the sampled windows and of their warm-ups, oldest first (arrivals in
    seconds from `first`), each with the index of its window in `windows` (None for warm-up
    traffic); and each stratum's number of windows in the period (`cells`)."""

    requests: list[TraceRequest]
    window_of: list[int | None]
    windows: list[Window]
    cells: list[int]
    first: float
    period_requests: int
    seed: int = 0
    whole: bool = False
    window_s: float = WINDOW_S
    warm_up_s: float = WARM_UP_S

    @property
    def measured_requests(self) -> int:
        return sum(1 for w in self.window_of if w is not None)


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


def minute_counts(db: sa.Engine, since: float, until: float | None = None) -> dict[int, int]:
    """Return the period's served requests per minute (keyed by Unix minute), from the request
    minutes where they are written, and from the records after the last minute written (the
    minutes not yet settled, or a database whose records were written without them)."""
    m, r = request_minutes.c, request_records.c
    start = math.floor(since / MINUTE_S) * MINUTE_S
    where = [m.ts >= start] + ([m.ts < until] if until is not None else [])
    minute = sa.cast(sa.func.floor(r.ts / MINUTE_S), sa.Integer)
    counts: dict[int, int] = {}
    with db.connect() as conn:
        summed = sa.select(m.ts, sa.func.sum(m.requests - m.errors)).where(*where).group_by(m.ts)
        for ts, n in conn.execute(summed):
            if n:
                counts[int(ts // MINUTE_S)] = int(n)
        # Records after the minutes written: counted from the records themselves.
        tail = (max(counts) + 1) * MINUTE_S if counts else since
        recorded = (
            sa.select(minute, sa.func.count())
            .where(*_served(max(tail, since), until))
            .group_by(minute)
        )
        for at, n in conn.execute(recorded):
            counts[int(at)] = counts.get(int(at), 0) + int(n)
    return counts


def _replayed(counts: Mapping[int, int], spans: list[tuple[float, float]]) -> int:
    """Return the requests the spans (Unix seconds, on minutes) hold, by the minutes' counts."""
    return sum(
        counts.get(minute, 0)
        for start, end in spans
        for minute in range(int(start // MINUTE_S), math.ceil(end / MINUTE_S))
    )


def _merged(windows: list[Window]) -> list[tuple[float, float]]:
    """Return the spans to replay: each window with its warm-up, overlapping ones joined."""
    spans: list[tuple[float, float]] = []
    for w in sorted(windows, key=lambda w: w.start):
        if spans and w.warm_up <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], w.end))
        else:
            spans.append((w.warm_up, w.end))
    return spans


def draw_windows(
    since: float,
    until: float,
    strata: int,
    *,
    seed: int = 0,
    window_s: float = WINDOW_S,
    warm_up_s: float = WARM_UP_S,
) -> tuple[list[Window], list[int]]:
    """Cut the period into windows on the clock's minutes and those into `strata` runs of
    consecutive windows; draw `PER_STRATUM` windows at random from each. Return the windows
    drawn, oldest first, and each stratum's number of windows."""
    origin = math.floor(since / MINUTE_S) * MINUTE_S
    cells = max(math.ceil((until - origin) / window_s), 1)
    strata = max(1, min(strata, cells // PER_STRATUM))
    rng = random.Random(seed)
    bounds = [round(i * cells / strata) for i in range(strata + 1)]
    windows: list[Window] = []
    for h in range(strata):
        run = range(bounds[h], bounds[h + 1])
        for cell in sorted(rng.sample(run, min(PER_STRATUM, len(run)))):
            start = origin + cell * window_s
            windows.append(
                Window(h, max(start, since), min(start + window_s, until), start - warm_up_s)
            )
    return windows, [bounds[h + 1] - bounds[h] for h in range(strata)]


def sample_windows(
    db: sa.Engine,
    since: float,
    until: float | None = None,
    *,
    size: int = DEFAULT_SAMPLE,
    seed: int = 0,
    window_s: float = WINDOW_S,
    warm_up_s: float = WARM_UP_S,
) -> WindowSample:
    """Return the requests of windows of the period drawn at random within equal strata of
    time, each after its warm-up, at most about `size` of them in all; or the whole period
    when it holds no more than that."""
    counts = minute_counts(db, since, until)
    total = sum(counts.values())
    if not counts:
        return WindowSample([], [], [], [], since, 0, seed)
    end = until if until is not None else (max(counts) + 1) * MINUTE_S
    if total <= size:
        whole = Window(0, since, end, since)
        requests, window_of, first = _read(db, [whole], [(since, end)], since)
        return WindowSample(
            requests, window_of, [whole], [1], first, total, seed, True, window_s, warm_up_s
        )
    minutes = (end - since) / MINUTE_S
    per_window = total / minutes * (window_s + warm_up_s) / MINUTE_S
    strata = max(1, int(size / (PER_STRATUM * per_window)))
    while True:
        windows, cells = draw_windows(
            since, end, strata, seed=seed, window_s=window_s, warm_up_s=warm_up_s
        )
        spans = [(max(a, since), b) for a, b in _merged(windows)]
        replayed = _replayed(counts, spans)
        if replayed <= size or len(cells) == 1:
            break
        # Busier windows than the period's mean were drawn: a stratum fewer, drawn again.
        strata = len(cells) - 1
    requests, window_of, first = _read(db, windows, spans, since)
    return WindowSample(
        requests, window_of, windows, cells, first, total, seed, False, window_s, warm_up_s
    )


def _read(
    db: sa.Engine, windows: list[Window], spans: list[tuple[float, float]], since: float
) -> tuple[list[TraceRequest], list[int | None], float]:
    """Read the spans' served requests by the time index, each with its window's index."""
    r = request_records.c
    columns = (
        r.ts, r.prompt_tokens, r.completion_tokens, r.model, r.slo_class, r.tenant,
        r.endpoint, r.stream,
    )  # fmt: skip
    rows: list[Any] = []
    with db.connect() as conn:
        for start, end in spans:
            query = sa.select(*columns).where(*_served(max(start, since), end)).order_by(r.ts)
            rows.extend(conn.execute(query).all())
    if not rows:
        return [], [], since
    first = rows[0].ts
    starts = [w.start for w in windows]
    window_of: list[int | None] = []
    at = 0
    for row in rows:
        while at < len(windows) and row.ts >= windows[at].end:
            at += 1
        inside = at < len(windows) and starts[at] <= row.ts < windows[at].end
        window_of.append(at if inside else None)
    return [trace_request(row, first) for row in rows], window_of, first
