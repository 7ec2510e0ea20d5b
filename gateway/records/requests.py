"""Request records: one row per downstream request, written off the request path in batches.

A record is written when its request ends; the energy its backend drew for it is known seconds
later (gateway/energy/ledger.py) and lands as an update of the record, written after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import RequestRecord, request_records, row_of
from gateway.metrics import GatewayMetrics
from gateway.records.batching import BatchWriter, Statement


def ms(seconds: float | None) -> float | None:
    """Return a duration as records keep it: milliseconds, to the microsecond."""
    return None if seconds is None else round(seconds * 1000, 3)


@dataclass(slots=True)
class RequestEnergy:
    """A request's energy and cost, once measured (or estimated): an update of its record."""

    decision_id: str
    energy_j: float | None
    cost_usd: float | None
    energy_estimated: bool

    def row(self) -> dict[str, Any]:
        return row_of(self)


class RecordWriter(BatchWriter[RequestRecord]):
    """Write request records in batches, and their energy after them; never waits, keeps what
    the database cannot take."""

    def __init__(self, db: sa.Engine, metrics: GatewayMetrics, **options: Any):
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
                ("decision_id",),
                ("energy_j", "cost_usd", "energy_estimated"),
                db,
            ),
            **options,
        )
        self.follow(self.energy)
