"""Rows to store: request and shadow records made up for a test, and rows of any age; and what
a records test reads back: the request records stored, and a writer's counters."""

from __future__ import annotations

import dataclasses
import uuid

import sqlalchemy as sa

from gateway.compare.measures import MEASURES, Diff
from gateway.db.connection import connect
from gateway.db.schema import (
    RequestRecord,
    ShadowRecord,
    request_minutes,
    request_records,
    shadow_minutes,
    shadow_records,
)
from gateway.metrics import GatewayMetrics
from gateway.promotion import evidence
from gateway.promotion import shadow_minutes as shadows
from gateway.records.minutes import summarize

DAY = 86400.0
NOW = 1_790_000_000.0


def request_record(n: int, decision_id: str | None = None) -> RequestRecord:
    return RequestRecord(
        decision_id=decision_id or uuid.uuid4().hex,
        ts=1_700_000_000.0 + n,
        endpoint="chat",
        route="r",
        pool="gpu",
        backend="gpu-0",
        model="m",
        tenant=None,
        slo_class="interactive",
        stream=False,
        prompt_tokens=10,
        prompt_tokens_estimated=9,
        max_tokens=20,
        completion_tokens=n,
        queue_ms=0.0,
        ttft_ms=None,
        tpot_ms=None,
        e2e_ms=12.5,
        gateway_ms=0.2,
        attempts=1,
        fallback=False,
        status=200,
        error=None,
    )


def same_decision(record: RequestRecord, n: int) -> RequestRecord:
    """Return request record `n` of the same decision (id and time) as `record`: a second
    record the database refuses, since a decision id is unique with its time."""
    return dataclasses.replace(request_record(n, record.decision_id), ts=record.ts)


def shadow_record(n: int, **fields: object) -> ShadowRecord:
    values: dict = {
        "decision_id": f"{n:032x}",
        "ts": 1_000.0 + n,
        "route": "chat",
        "model": "m",
        "tenant": "t",
        "kind": "candidate",
        "endpoint": "chat",
        "stream": False,
        "temperature": 0.0,
        "top_p": None,
        "seeded": False,
        "sampled": False,
        "primary_pool": "gpu",
        "primary_backend": "gpu-0",
        "candidate_pool": "cim",
        "candidate_backend": "cim-0",
        "primary_status": 200,
        "candidate_status": 200,
        "candidate_error": None,
        "primary_e2e_ms": 10.0 + n,
        "candidate_e2e_ms": 20.0 + n,
        "exact_match": n % 2 == 0,
        "normalized_match": True,
        "similarity": 0.5,
    }
    values.update(fields)
    measured = {name: values.pop(name) for name in MEASURES if name in values}
    return ShadowRecord(**values, diff=Diff(**measured))


def store_rows(db: sa.Engine, table: sa.Table, ages_days: list[float], now: float = NOW) -> None:
    """Store one row of `table` per age, its `route` naming the age: the columns the database
    holds at its revision (a test of a migration stores rows before the later ones add any)."""
    rows = []
    for n, age in enumerate(ages_days):
        ts, route = now - age * DAY, f"age-{age:g}"
        if table is request_records:
            rows.append(dataclasses.replace(request_record(n), ts=ts, route=route).row())
        elif table is request_minutes:
            record = dataclasses.replace(request_record(n), ts=ts, route=route).row()
            (minute,) = summarize([record], lambda _: None)
            rows.append(minute.row() | {"ts": ts})  # at the age itself, not its minute's start
        elif table is shadow_records:
            rows.append(shadow_record(n, ts=ts, route=route).row())
        elif table is shadow_minutes:
            copy = shadow_record(n, ts=ts, route=route).row() | {"slo_class": None}
            (minute,) = shadows.summarize([copy], lambda _: None)
            rows.append(minute.row() | {"ts": ts})
        else:
            rows.append(
                {
                    "ts": ts,
                    "route": route,
                    "candidate_pool": "cim",
                    "kind": "candidate",
                    "reason": "queue_full",
                    "count": 3,
                }
            )
    held = {c["name"] for c in sa.inspect(db).get_columns(table.name)}
    with db.begin() as conn:
        conn.execute(table.insert(), [{k: v for k, v in r.items() if k in held} for r in rows])


def store_shadow_minutes(
    db: sa.Engine,
    targets: shadows.TargetsOf = lambda _: None,
    since: float = 0.0,
    route: str | None = None,
) -> None:
    """Store the minutes of the shadow records stored from `since` (of one route), as the writer
    folds them. Each record is folded once: minutes stored twice would count its copy twice."""
    minutes = shadows.summarize(evidence.shadow_rows(db, since, route=route), targets)
    if minutes:
        with db.begin() as conn:
            conn.execute(shadow_minutes.insert(), [m.row() for m in minutes])


def stored(url: str) -> list[int]:
    """The completion tokens of every request record stored at url, sorted (request_record(n)
    numbers its record by them)."""
    db = connect(url)
    with db.connect() as conn:
        rows = conn.execute(sa.select(request_records.c.completion_tokens)).scalars().all()
    db.dispose()
    return sorted(rows)


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    """A counter's or gauge's value in a gateway's registry, 0 when it was never set."""
    return metrics.registry.get_sample_value(name, labels or None) or 0.0
