"""Shadow minutes: the shadow copies summarized as they are recorded, a row per minute and key.

What judges or reports shadow evidence reads these instead of every shadow record: the judge
(gateway/promotion/evidence.py, `gateway promote evaluate`), the weekly report and the console's
shadow summary. A row holds the copies whose primary arrived in one minute with one key (route,
candidate pool, primary pool, kind, sampled or not), folded into the judge's sufficient
statistics and what the report shows beside them:

- copies sent and answered, failures by kind and paired with the primary's (only the copy, only
  the primary, both), and upstream errors by code;
- SLO attainment of both sides of each copy, paired (gateway/records/slo.py), judged when the
  copy is recorded against its request's class as the policy then in force has it;
- paired energy and cost sums, and how many priced copies were cheaper;
- each measure's count and sum over answered copies (match rates, similarities, KL, energy and
  cost per side, and per token), and latency sketches of both sides (gateway/stats.py);
- the judged pairs (gateway/promotion/departures.py `judged`) by *class*: the values of what
  `departs` and `tolerance` read (`MEASURES`), similarities cut to buckets of 1/BUCKETS, with
  each class's count, how many of them have their words at risk known, and those words.

The judge reads the classes back as representative pairs (gateway/promotion/tally.py): each class's
similarities at the lower edge of its bucket, handed to the same `tolerance` and `departs` that
judge single pairs. So every count of the evidence is exact, and what depends on a similarity
is exact but for the pairs within one bucket of a tolerance: a noise floor's 1st percentile is
read at the lower edge of its bucket (at most 1/BUCKETS below the exact one), and a pair whose
similarity lies in the bucket at the tolerance, or between it and the exact tolerance, may be
counted as departing where the exact computation would not (or the other way round).

Rows add up: a minute and key may have several rows (replicas, a copy that ended minutes after
its request arrived), and every reader sums them. The serving process holds each copy it records
for SETTLE_S, for its energy and its primary's (which settle seconds after their answers), then
folds it into the open row of its minute, handed to the shadow writer once the minute has
settled (`ShadowMinutes`). The shadow writer compacts the rows of each settled hour into a
row per hour and key, and the rows of each day, a day after it ends, into a row per day and key
(`compact`), so a week is read as a few rows per key whatever the traffic; readers sum rows
whatever their span. `summarize` folds stored shadow records the same way: the migration
that adds this table runs it on the records written before, and a test checks the evidence read
from minutes against the one computed from records.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import orjson
import sqlalchemy as sa

from gateway.db.schema import ShadowMinute, shadow_minutes
from gateway.promotion.tally import FIGURES, LATENCIES, MEASURES, Row, Tally
from gateway.records.minutes import MINUTE_S, SETTLE_S, minute_of
from gateway.records.slo import Targets

# What a fold reads of a stored shadow record (with its primary's energy and cost and SLO class).
RECORD_COLUMNS = (
    "decision_id", "ts", "route", "kind", "sampled", "endpoint", "stream", "primary_pool",
    "candidate_pool", "primary_status", "candidate_status", "candidate_error", "failure",
    "primary_failure", *LATENCIES, "primary_prompt_tokens", "primary_completion_tokens",
    "candidate_prompt_tokens", "candidate_completion_tokens",
    "normalized_match", "length_ratio", *MEASURES,
    "reference_words", "first_divergence",
    "primary_energy_j", "candidate_energy_j", "primary_cost_usd", "candidate_cost_usd",
    "slo_class",
)  # fmt: skip

Key = tuple[float, str, str, str, str, bool]  # start, route, candidate, primary, kind, sampled
# A compacted row's span: the minutes of an hour, once settled, become one row per key; the
# rows of a day, a day after it settled, too (`compact`).
HOUR_S = 3600.0
DAY_S = 86400.0
# The targets of a request's SLO class, by the class its request names (None: the default).
TargetsOf = Callable[[str | None], Targets | None]


_FLOATS = {"primary_energy_j", "candidate_energy_j", "primary_cost_usd", "candidate_cost_usd"}


def minute_row(tally: Tally, key: Key, span_s: float = MINUTE_S) -> ShadowMinute:
    """Return a tally as the row of its minute (or span) and key."""
    ts, route, candidate, primary, kind, sampled = key
    figures: dict[str, Any] = {
        name: float(value) if name in _FLOATS else int(value)
        for name, value in zip(FIGURES, tally.figures, strict=True)
    }
    return ShadowMinute(
        ts=ts,
        span_s=span_s,
        route=route,
        candidate_pool=candidate,
        primary_pool=primary,
        kind=kind,
        sampled=sampled,
        **figures,
        first_ts=tally.first_ts,
        last_ts=tally.last_ts,
        failures=_json(tally.failures),
        errors=_json(tally.errors),
        measures=_json(tally.measures),
        latency=_json(tally.latency),
        pairs=_json([[list(cls), counts] for cls, counts in tally.pairs.items()]),
        floor=_json(tally.floor),
        worst=_json(tally.worst),
    )


def _json(value: Any) -> str | None:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() if value else None


def key_of(r: Row, span_s: float = MINUTE_S) -> Key:
    """Return the minute (or span) and key a shadow copy is counted under."""
    return (
        r["ts"] - r["ts"] % span_s,
        r["route"],
        r["candidate_pool"],
        r["primary_pool"],
        r["kind"],
        bool(r["sampled"]),
    )


def settled(now: float) -> float:
    """Return the time before which every minute's rows have been handed on to the writer, a
    minute's margin for its rounds included: a reader takes the minutes before it and the
    shadow records after it."""
    return minute_of(now - 2 * SETTLE_S) - MINUTE_S


def summarize(
    rows: Iterable[Row], targets: TargetsOf, span_s: float = MINUTE_S
) -> list[ShadowMinute]:
    """Fold stored shadow records (`RECORD_COLUMNS`) into minutes (or spans of `span_s`)."""
    return summarize_alike(((r, 1) for r in rows), targets, span_s)


def summarize_alike(
    copies: Iterable[tuple[Row, int]], targets: TargetsOf, span_s: float = MINUTE_S
) -> list[ShadowMinute]:
    """Fold shadow records, each standing for a number of copies alike, into minutes (or spans
    of `span_s`): the rows `summarize` gives of the records repeated, without a call per copy.
    The judge's calibration (bench/promotion.py) writes its weeks so."""
    tallies: dict[Key, Tally] = {}
    for r, n in copies:
        key = key_of(r, span_s)
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = Tally()
        tally.copy(r, targets(r.get("slo_class")), n)
    return [minute_row(tally, key, span_s) for key, tally in sorted(tallies.items())]


def compacted_before(now: float) -> tuple[float, float]:
    """Return the times before which `compact` leaves only day rows, and only hour or day rows:
    the start of yesterday (so a window that starts within the last day or two is read to the
    hour), and the start of the last hour settled by `now`."""
    hour = settled(now) - settled(now) % HOUR_S
    return hour - hour % DAY_S - DAY_S, hour


def compact(db: sa.Engine, now: float) -> int:
    """Fold the rows of every day settled a day before `now` into a row per day and key, and
    the minute rows of every hour settled by `now` into a row per hour and key; return how many
    rows were folded.

    Each row is deleted and returned in the transaction that writes its day's or hour's row, so
    replicas compacting at once fold each row once: a row another took is not returned.
    """
    day, hour = compacted_before(now)
    with db.begin() as conn:
        return fold(conn, day, DAY_S) + fold(conn, hour, HOUR_S)


def fold(
    conn: sa.Connection, before: float, span_s: float, table: sa.TableClause = shadow_minutes
) -> int:
    """Fold the rows shorter than `span_s` that start before `before` into a row per span and
    key; return how many were folded. `table` is the shadow minutes' table as a migration
    finds it, where that has not all of today's columns."""
    m = table.c
    taken = conn.execute(
        table.delete()
        .where(m.ts < before, m.span_s < span_s)
        .returning(*(c for c in table.columns if c.name != "id"))
    ).mappings()
    tallies: dict[Key, Tally] = {}
    folded = 0
    for row in taken:
        key = (
            row["ts"] - row["ts"] % span_s,
            row["route"],
            row["candidate_pool"],
            row["primary_pool"],
            row["kind"],
            bool(row["sampled"]),
        )
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = Tally()
        tally.add(row)
        folded += 1
    if tallies:
        names = [c.name for c in table.columns if c.name != "id"]
        rows = [minute_row(t, key, span_s).row() for key, t in sorted(tallies.items())]
        conn.execute(table.insert(), [{name: row[name] for name in names} for row in rows])
    return folded


# Primaries whose energy is kept for their copies, at most: it settles seconds after the answer.
MAX_PRIMARIES = 100_000


class ShadowMinutes:
    """Hold each recorded copy until its energy and its primary's have settled, fold it into the
    open row of its minute, and hand on the rows of minutes that have settled (`take`).

    O(1) per copy and per primary's energy: dictionary updates and a few additions.
    """

    def __init__(self, targets: TargetsOf, max_primaries: int = MAX_PRIMARIES):
        self._targets = targets
        self._tallies: dict[Key, Tally] = {}
        # Copies held for their energy: (decision id, kind, candidate backend) → (row, class, due).
        self._held: dict[tuple[str, str, str | None], tuple[dict[str, Any], str | None, float]] = {}
        # Oldest first; an OrderedDict drops its oldest at once, where a dict that lost its first
        # keys walks past their empty slots to find the next (a scan per request when full).
        self._primaries: OrderedDict[str, tuple[float | None, float | None]] = OrderedDict()
        self._max_primaries = max_primaries

    def copy(self, row: dict[str, Any], slo_class: str | None, now: float) -> None:
        """Hold a recorded copy (a shadow record's row) until its energy has settled."""
        self._held[(row["decision_id"], row["kind"], row["candidate_backend"])] = (
            row,
            slo_class,
            now + SETTLE_S,
        )

    def copy_energy(
        self, decision_id: str, kind: str, backend: str, energy_j: float | None, cost: float | None
    ) -> None:
        """Add a held copy's energy and cost on its candidate, once settled."""
        held = self._held.get((decision_id, kind, backend))
        if held is not None:
            held[0]["candidate_energy_j"], held[0]["candidate_cost_usd"] = energy_j, cost

    def primary_energy(self, decision_id: str, energy_j: float | None, cost: float | None) -> None:
        """Keep a request's energy and cost, for the copies of it."""
        primaries = self._primaries
        if len(primaries) >= self._max_primaries:  # the oldest have had their copies folded
            primaries.popitem(last=False)
        primaries[decision_id] = (energy_j, cost)

    def compact(self, db: sa.Engine, now: float) -> int:
        """Fold the rows of the days and hours settled by `now` into days and hours (`compact`)."""
        return compact(db, now)

    def take(self, now: float) -> list[ShadowMinute]:
        """Fold the copies held long enough, and hand on the rows of the minutes settled by
        `now` (every row when `now` is infinite)."""
        due = [key for key, (_, _, at) in self._held.items() if at <= now]
        for key in due:
            row, slo_class, _ = self._held.pop(key)
            energy = self._primaries.get(row["decision_id"])
            if energy is not None:
                if row.get("primary_energy_j") is None:
                    row["primary_energy_j"] = energy[0]
                if row.get("primary_cost_usd") is None:
                    row["primary_cost_usd"] = energy[1]
            key_ = key_of(row)
            tally = self._tallies.get(key_)
            if tally is None:
                tally = self._tallies[key_] = Tally()
            tally.copy(row, self._targets(slo_class))
        settled = now - SETTLE_S
        done = [key for key in self._tallies if key[0] + MINUTE_S <= settled]
        return [minute_row(self._tallies.pop(key), key) for key in done]
