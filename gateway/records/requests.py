"""Request records: one row per downstream request, written off the request path in batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import request_records
from gateway.metrics import GatewayMetrics
from gateway.records.batching import BatchWriter, row_of


def ms(seconds: float | None) -> float | None:
    """Return a duration as records keep it: milliseconds, to the microsecond."""
    return None if seconds is None else round(seconds * 1000, 3)


@dataclass(slots=True)
class RequestRecord:
    """What the gateway keeps about one request; never the prompt or the answer."""

    decision_id: str
    ts: float
    endpoint: str
    route: str | None
    pool: str | None
    backend: str | None
    model: str
    tenant: str | None
    slo_class: str | None
    stream: bool
    prompt_tokens: int | None
    prompt_tokens_estimated: int | None
    max_tokens: int | None
    completion_tokens: int | None
    queue_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    gateway_ms: float | None
    attempts: int
    fallback: bool
    status: int
    error: str | None
    energy_j: float | None = None
    cost_usd: float | None = None
    energy_estimated: bool | None = None
    concurrent: int | None = None
    context_tokens: int | None = None
    predicted_ttft_ms: float | None = None
    predicted_e2e_ms: float | None = None
    predicted_energy_j: float | None = None
    first_pool: str | None = None

    def row(self) -> dict[str, Any]:
        return row_of(self)


class RecordWriter(BatchWriter[RequestRecord]):
    """Write request records in batches; never waits, keeps what the database cannot take."""

    def __init__(self, engine: sa.Engine, metrics: GatewayMetrics, **options: Any):
        super().__init__(
            engine,
            request_records,
            metrics,
            metrics.records_written,
            metrics.records_dropped,
            **options,
        )
