"""Shadow records: one row per mirrored copy with its diff, written in batches.

Three tables. `shadow_records` holds each copy that was sent: both sides' statuses, latencies,
tokens, energy and cost, and the comparators' measures (raw texts only when the route opts in,
erased after its retention limit). `shadow_minutes` summarizes them as they are recorded, per
minute and key, in a fold passed in (gateway/promotion/shadow_minutes.py): what the judge, the
weekly report and the console's summary read. `shadow_drops` counts the copies that were *not*
sent, per minute, route, candidate pool, kind and reason, so the summary can say how much
evidence was lost without writing a row for every drop of an overloaded candidate.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa

from gateway.db.schema import (
    ShadowMinute,
    ShadowRecord,
    row_of,
    shadow_drops,
    shadow_minutes,
    shadow_records,
)
from gateway.metrics import GatewayMetrics
from gateway.records.batching import BatchWriter, Statement

log = logging.getLogger(__name__)


DropKey = tuple[float, str, str, str, str]


@dataclass(slots=True)
class CopyEnergy:
    """A shadow copy's energy and cost on its candidate, once measured: an update of its record
    (whose time, its primary's, names its partition on PostgreSQL)."""

    decision_id: str
    ts: float
    kind: str
    candidate_backend: str
    candidate_energy_j: float | None
    candidate_cost_usd: float | None

    def row(self) -> dict[str, Any]:
        return row_of(self)


class Summaries(Protocol):
    """Shadow copies folded into minutes as they are recorded, with their energy and their
    primaries' once settled (gateway/promotion/shadow_minutes.py `ShadowMinutes`)."""

    def copy(self, row: dict[str, Any], slo_class: str | None, now: float) -> None: ...

    def copy_energy(
        self, decision_id: str, kind: str, backend: str, energy_j: float | None, cost: float | None
    ) -> None: ...

    def primary_energy(
        self, decision_id: str, energy_j: float | None, cost: float | None
    ) -> None: ...

    def take(self, now: float) -> list[ShadowMinute]: ...

    def compact(self, db: sa.Engine, now: float) -> int: ...


class ShadowWriter(BatchWriter[ShadowRecord]):
    """Write shadow records, their minutes and drop counts in batches, and erase stored texts
    when due.

    Like request records, adding never waits, and what the database cannot take is held and
    spilled (gateway.records.batching). With `summaries`, each copy is folded into its minute,
    written once the minute has settled. Drops of copies are tallied in memory per minute and
    written as counts. Stored texts past their retention limit are erased on a slower period.
    """

    def __init__(
        self,
        db: sa.Engine,
        metrics: GatewayMetrics,
        *,
        flush_interval_s: float = 0.5,
        batch_size: int = 200,
        max_pending: int = 10_000,
        purge_interval_s: float = 60.0,
        wall: Callable[[], float] = time.time,
        summaries: Summaries | None = None,
        **options: Any,
    ):
        super().__init__(
            db,
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
        self._drops: Counter[DropKey] = Counter()
        # A copy's energy is known seconds after its record: an update, written after it.
        self.energy: BatchWriter[CopyEnergy] = BatchWriter(
            db,
            shadow_records,
            metrics,
            metrics.attribution_updates_written,
            metrics.attribution_updates_dropped,
            flush_interval_s=flush_interval_s,
            batch_size=batch_size,
            max_pending=max_pending,
            name="shadow_energy",
            statement=Statement.update(
                shadow_records,
                ("decision_id", "ts", "kind", "candidate_backend"),
                ("candidate_energy_j", "candidate_cost_usd"),
                db,
            ),
            **options,
        )
        self.follow(self.energy)
        self._summaries = summaries
        self.minutes: BatchWriter[ShadowMinute] = BatchWriter(
            db,
            shadow_minutes,
            metrics,
            metrics.shadow_minutes_written,
            metrics.shadow_minutes_dropped,
            flush_interval_s=flush_interval_s,
            batch_size=batch_size,
            max_pending=max_pending,
            **options,
        )
        self.follow(self.minutes)

    def add(self, record: ShadowRecord, slo_class: str | None = None) -> None:
        """Queue a copy's record for writing, and fold it into its minute, judged against the
        targets of its request's SLO class."""
        super().add(record)
        if self._summaries is not None:
            self._summaries.copy(record.row(), slo_class, self._wall())

    def add_energy(self, energy: CopyEnergy) -> None:
        """Queue a copy's energy for writing, and add it to the copy held for its minute."""
        self.energy.add(energy)
        if self._summaries is not None:
            self._summaries.copy_energy(
                energy.decision_id,
                energy.kind,
                energy.candidate_backend,
                energy.candidate_energy_j,
                energy.candidate_cost_usd,
            )

    def primary_energy(self, decision_id: str, energy_j: float | None, cost: float | None) -> None:
        """Keep a request's energy and cost, settled, for the minutes of its copies."""
        if self._summaries is not None:
            self._summaries.primary_energy(decision_id, energy_j, cost)

    def count_drop(self, route: str, candidate: str, kind: str, reason: str) -> None:
        """Count a copy that was not sent, in the current minute."""
        minute = math.floor(self._wall() / 60) * 60.0
        self._drops[(minute, route, candidate, kind, reason)] += 1

    async def flush(self, limit: int | None = None) -> None:
        """Write every queued record, settled minute and drop count now."""
        self._hand_on(self._wall())
        await super().flush(limit)
        await self._write_drops()

    async def stop(self, *, write: bool = True) -> None:
        self._hand_on(math.inf)
        await super().stop(write=write)

    def _hand_on(self, now: float) -> None:
        """Queue the rows of the minutes settled by `now` for writing."""
        if self._summaries is not None:
            for row in self._summaries.take(now):
                self.minutes.add(row)

    async def tick(self) -> None:
        await self.flush()
        if self._wall() >= self._next_purge:
            self._next_purge = self._wall() + self._purge_interval
            await self.purge()
            await self.compact()

    async def compact(self) -> int:
        """Fold the minutes of the settled hours into hours; return how many were folded."""
        if self._summaries is None:
            return 0
        try:
            return await asyncio.to_thread(self._summaries.compact, self._db, self._wall())
        except Exception:  # the database is down: the next round compacts them
            log.exception("could not compact the shadow minutes")
            return 0

    async def purge(self) -> int:
        """Erase stored texts past their retention limit; return how many records were erased."""
        return await asyncio.to_thread(self._erase_expired, self._wall())

    async def _write_drops(self) -> None:
        if not self._drops:
            return
        drops, self._drops = self._drops, Counter()
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
            await self.insert(shadow_drops, rows)
        except Exception:
            log.exception("could not write %d shadow drop counts", len(rows))

    def _erase_expired(self, now: float) -> int:
        c = shadow_records.c
        with self._db.begin() as conn:
            result = conn.execute(
                shadow_records.update()
                .where(c.text_expires_at <= now)
                .values(primary_text=None, candidate_text=None, text_expires_at=None)
            )
        return int(result.rowcount or 0)
