"""Request records: one row per downstream request, written off the request path in batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from gateway.db.engine import metadata
from gateway.metrics import GatewayMetrics
from gateway.records.batching import BatchWriter, row_of

request_records = sa.Table(
    "request_records",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("decision_id", sa.String(32), nullable=False, unique=True),
    sa.Column("ts", sa.Float, nullable=False, index=True, comment="Arrival, Unix seconds."),
    sa.Column("endpoint", sa.String(16), nullable=False),
    sa.Column("route", sa.String(64)),
    sa.Column("pool", sa.String(64)),
    sa.Column("backend", sa.String(64)),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("tenant", sa.String(64)),
    sa.Column("slo_class", sa.String(32)),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("prompt_tokens_estimated", sa.Integer),
    sa.Column("max_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("queue_ms", sa.Float),
    sa.Column("ttft_ms", sa.Float),
    sa.Column("tpot_ms", sa.Float),
    sa.Column("e2e_ms", sa.Float),
    sa.Column("gateway_ms", sa.Float),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("fallback", sa.Boolean, nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("error", sa.String(64)),
    sa.Column("energy_j", sa.Float, comment="Measured energy attributed to the request."),
    sa.Column("cost_usd", sa.Float, comment="Energy price plus the device time it held."),
    sa.Column(
        "energy_estimated",
        sa.Boolean,
        comment="True when the pool reported no power and energy_j is from nominal figures.",
    ),
    sa.Column("concurrent", sa.Integer, comment="Requests on the backend, this one included."),
    sa.Column("predicted_ttft_ms", sa.Float),
    sa.Column("predicted_e2e_ms", sa.Float),
    sa.Column("predicted_energy_j", sa.Float),
    sa.Column("first_pool", sa.String(64), comment="The pool tried first, before any fallback."),
    # The rollout guards' read of a canary's requests (migration 0007 says which query).
    sa.Index("ix_request_records_route_first_pool_ts", "route", "first_pool", "ts"),
)


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
