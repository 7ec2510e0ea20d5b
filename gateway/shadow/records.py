"""Shadow records: one row per mirrored copy with its diff, written in batches.

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import ShadowRecord, row_of, shadow_drops, shadow_records
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


class ShadowWriter(BatchWriter[ShadowRecord]):
    """Write shadow records and drop counts in batches, and erase stored texts when due.

    Like request records, adding never waits, and what the database cannot take is held and
    spilled (gateway.records.batching).
    Drops of copies are tallied in memory per minute and written as counts. Stored texts past
    their retention limit are erased on a slower period.
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

    def count_drop(self, route: str, candidate: str, kind: str, reason: str) -> None:
        """Count a copy that was not sent, in the current minute."""
        minute = math.floor(self._wall() / 60) * 60.0
        self._drops[(minute, route, candidate, kind, reason)] += 1

    async def flush(self, limit: int | None = None) -> None:
        """Write every queued record and drop count now."""
        await super().flush(limit)
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
