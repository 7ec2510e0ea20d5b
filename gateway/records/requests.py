"""Request records: one row per downstream request, written off the request path in batches.

A record is written when its request ends; the energy its backend drew for it is known seconds
later (gateway/energy/ledger.py) and lands as an update of the record, written after it. Both
are folded as they come into the traffic's minutes (gateway/records/minutes.py), whose rows are
written in the same rounds, once their minute has settled.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import RequestMinute, RequestRecord, request_minutes, request_records, row_of
from gateway.metrics import GatewayMetrics
from gateway.records.batching import BatchWriter, Statement
from gateway.records.minutes import SETTLE_S, Minutes, TargetsOf


def ms(seconds: float | None) -> float | None:
    """Return a duration as records keep it: milliseconds, to the microsecond."""
    return None if seconds is None else round(seconds * 1000, 3)


@dataclass(slots=True)
class RequestEnergy:
    """A request's energy and cost, once measured (or estimated): an update of its record,
    found by its decision id and time (on PostgreSQL, the time names the record's partition)."""

    decision_id: str
    ts: float
    energy_j: float | None
    cost_usd: float | None
    energy_estimated: bool

    def row(self) -> dict[str, Any]:
        return row_of(self)


class RecordWriter(BatchWriter[RequestRecord]):
    """Write request records in batches, their energy after them and the traffic's minutes;
    never waits, keeps what the database cannot take.

    `targets` gives the SLO targets of a class (None: the policy's default class) as the policy
    in force has them; `clock` says when a minute has settled.
    """

    def __init__(
        self,
        db: sa.Engine,
        metrics: GatewayMetrics,
        *,
        targets: TargetsOf = lambda _: None,
        clock: Callable[[], float] = time.time,
        **options: Any,
    ):
        super().__init__(
            db,
            request_records,
            metrics,
            metrics.records_written,
            metrics.records_dropped,
            **options,
        )
        self.energy: BatchWriter[RequestEnergy] = BatchWriter(
            db,
            request_records,
            metrics,
            metrics.attribution_updates_written,
            metrics.attribution_updates_dropped,
            name="request_energy",
            statement=Statement.update(
                request_records,
                ("decision_id", "ts"),
                ("energy_j", "cost_usd", "energy_estimated"),
                db,
            ),
            **options,
        )
        self.follow(self.energy)
        self.minutes = Minutes(targets)
        self._clock = clock
        self.summaries: BatchWriter[RequestMinute] = BatchWriter(
            db,
            request_minutes,
            metrics,
            metrics.request_minutes_written,
            metrics.request_minutes_dropped,
            **options,
        )
        self.follow(self.summaries)

    def add(self, record: RequestRecord) -> None:
        """Queue a record for writing, and count it in its minute."""
        super().add(record)
        self.minutes.request(record)

    def add_energy(self, energy: RequestEnergy) -> None:
        """Queue a record's energy for writing, and add it to its minute."""
        self.energy.add(energy)
        self.minutes.energy(energy.decision_id, energy.energy_j, energy.cost_usd)

    async def flush(self, limit: int | None = None) -> None:
        self._hand_on(self._clock() - SETTLE_S)
        await super().flush(limit)

    async def stop(self, *, write: bool = True) -> None:
        self._hand_on(math.inf)
        await super().stop(write=write)

    def _hand_on(self, until: float) -> None:
        """Queue the rows of the minutes settled by `until` for writing."""
        for row in self.minutes.take(until):
            self.summaries.add(row)
