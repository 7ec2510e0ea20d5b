"""Request records: one row per downstream request, written off the request path in batches."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from gateway.db.schema import RequestRecord, request_records
from gateway.metrics import GatewayMetrics
from gateway.records.batching import BatchWriter


def ms(seconds: float | None) -> float | None:
    """Return a duration as records keep it: milliseconds, to the microsecond."""
    return None if seconds is None else round(seconds * 1000, 3)


class RecordWriter(BatchWriter[RequestRecord]):
    """Write request records in batches; never waits, keeps what the database cannot take."""

    def __init__(self, db: sa.Engine, metrics: GatewayMetrics, **options: Any):
        super().__init__(
            db,
            request_records,
            metrics,
            metrics.records_written,
            metrics.records_dropped,
            **options,
        )
