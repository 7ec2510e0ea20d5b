"""A constructed week of records for report tests: every value chosen so a test can recount it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from rows import shadow_record, store_shadow_minutes

from gateway.db.schema import (
    backend_energy,
    request_minutes,
    request_records,
    shadow_drops,
    shadow_records,
)
from gateway.policy.definition import Policy
from gateway.policy.load import load_policy
from gateway.records.minutes import summarize, targets_of
from gateway.report.period import Period, week

ROOT = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-8b-instruct"
WEEK = "2026-W48"
# Answer texts a route stored: saved reports, kept for ever, must not copy them.
STORED_TEXT = "stored answer text"


@dataclass
class World:
    """What was stored, kept as plain rows so tests compute expectations from them."""

    policy: Policy
    period: Period
    requests: list[dict]
    shadows: list[dict]
    drops: list[dict]
    draw: list[dict]


def request_row(n: int, ts: float, **fields: object) -> dict:
    row: dict = {
        "decision_id": f"r{n:031x}",
        "ts": ts,
        "endpoint": "chat",
        "route": "chat-8b",
        "pool": "gpu",
        "backend": "gpu-0",
        "model": MODEL,
        "tenant": "acme",
        "slo_class": "interactive",
        "stream": True,
        "prompt_tokens": 200 + n,
        "prompt_tokens_estimated": 200 + n,
        "max_tokens": 256,
        "completion_tokens": 40 + n % 30,
        "queue_ms": 0.0,
        "ttft_ms": 100.0 + 15 * (n % 40),
        "tpot_ms": 20.0 + n % 50,
        "e2e_ms": 1000.0 + 10 * n,
        "gateway_ms": 1.0,
        "attempts": 1,
        "fallback": False,
        "status": 200,
        "error": None,
        "energy_j": 30.0 + n % 7,
        "cost_usd": 2e-4 + 1e-6 * (n % 5),
        "energy_estimated": False,
        "concurrent": 1 + n % 6,
        "predicted_ttft_ms": 120.0,
        "predicted_e2e_ms": 1100.0 + 5 * n,
        "predicted_energy_j": 33.0,
    }
    row.update(fields)
    return row


def build(db: sa.Engine) -> World:
    """Store a week of requests, shadow copies and drops (and a little of the week before)."""
    policy = load_policy(ROOT / "policies/default.yaml")
    period = week(WEEK)
    start, step = period.since, 7 * 86400 / 70
    requests = []
    for n in range(60):
        extra: dict = {}
        if n % 20 == 7:
            extra = {"status": 502, "error": "upstream_error", "energy_j": None, "cost_usd": None}
        if n >= 50:  # short interactive prompts on the ASIC, not streamed
            extra.update(
                route="chat-8b-short", pool="asic", stream=False, ttft_ms=None, tpot_ms=None
            )
        if n in (51, 53):  # two tokens in 1.5 s: later than a stream meeting its class ends
            extra.update(completion_tokens=2)
        if n == 3:  # too long for the CIM part's 4k context
            extra.update(prompt_tokens=5000)
        if n % 9 == 4:
            extra.update(slo_class="batch", e2e_ms=130_000.0 if n == 13 else 2_000.0)
        requests.append(request_row(n, start + 60 + n * 9000, **extra))
    for n in range(60, 65):  # the week before
        requests.append(request_row(n, start - 86400 + n, pool="asic"))

    shadows = []
    for i in range(70):
        failed = i % 14 == 3
        exact = i % 5 != 0
        fields: dict = {
            "route": "chat-8b",
            "model": MODEL,
            "ts": start + 30 + i * step,
            "stream": True,
            "sampled": i % 7 == 0,
            "temperature": 0.7 if i % 7 == 0 else 0.0,
            "exact_match": None if failed else exact,
            "normalized_match": None if failed else i % 10 != 0,
            "similarity": None if failed else (1.0 if exact else 0.5 + i / 1000),
            "first_divergence": None if failed or exact else i % 13,
            "length_ratio": None if failed else 1.0 + (i % 4) / 10,
            "candidate_status": None if failed else 200,
            "candidate_error": "upstream_timeout" if failed else None,
            "primary_ttft_ms": 20.0 + i % 10,
            "candidate_ttft_ms": None if failed else 30.0 + i % 10,
            "primary_tpot_ms": 10.0 + i % 3,
            "candidate_tpot_ms": None if failed else 8.0 + i % 4,
            "primary_e2e_ms": 100.0 + i,
            "candidate_e2e_ms": None if failed else 150.0 + 2 * i,
            "primary_prompt_tokens": 100,
            "primary_completion_tokens": 50 + i,
            "candidate_prompt_tokens": None if failed else 100,
            "candidate_completion_tokens": None if failed else 50 + i,
            "primary_energy_j": 50.0,
            "candidate_energy_j": None if failed else 10.0 + i % 3,
            "primary_cost_usd": 1e-4,
            "candidate_cost_usd": None if failed else 4e-5,
        }
        if not failed and not exact:  # the route stores texts, kept for a while yet
            fields.update(
                primary_text=f"{STORED_TEXT} {i}, primary",
                candidate_text=f"{STORED_TEXT} {i}, candidate",
                text_expires_at=start + 365 * 86400,
            )
        shadows.append(shadow_record(i, **fields).row())
    for i in range(70, 90):  # the route's A/A noise floor
        shadows.append(
            shadow_record(
                i,
                route="chat-8b",
                kind="noise",
                candidate_pool="gpu",
                candidate_backend="gpu-1",
                ts=start + 100 + (i - 70) * 20000,
                exact_match=i % 10 != 0,
                normalized_match=True,
                similarity=1.0 if i % 10 else 0.9,
            ).row()
        )
    for i in range(90, 100):  # the week before: every copy agreed
        shadows.append(
            shadow_record(
                i,
                route="chat-8b",
                ts=start - 3 * 86400 + i,
                exact_match=True,
                similarity=1.0,
                candidate_e2e_ms=120.0,
            ).row()
        )
    drops = [
        {"ts": start + 600, "route": "chat-8b", "candidate_pool": "cim", "kind": "candidate",
         "reason": "concurrency", "count": 5},
        {"ts": start + 7200, "route": "chat-8b", "candidate_pool": "cim", "kind": "candidate",
         "reason": "rate", "count": 3},
        {"ts": start - 600, "route": "chat-8b", "candidate_pool": "cim", "kind": "candidate",
         "reason": "rate", "count": 11},
        {"ts": start + 600, "route": "chat-8b", "candidate_pool": "gpu", "kind": "noise",
         "reason": "concurrency", "count": 2},
    ]  # fmt: skip
    with db.begin() as conn:
        conn.execute(request_records.insert(), requests)
        conn.execute(shadow_records.insert(), shadows)
        conn.execute(shadow_drops.insert(), drops)
        conn.execute(backend_energy.insert(), draw := draw_rows(period))
        # The minutes the writer would have written beside the records.
        conn.execute(
            request_minutes.insert(), [m.row() for m in summarize(requests, targets_of(policy))]
        )
    store_shadow_minutes(db, targets_of(policy))
    return World(policy, period, requests, shadows, drops, draw)


def draw_rows(period: Period) -> list[dict]:
    """The backends' minutes: each day an hour of the GPU on at 150 W, the ASIC card parked at
    5 W (read by its meter) and the CIM part on without a meter (estimated at its 8 W idle);
    and the week before, half an hour of the GPU alone."""

    def minute(ts: float, pool: str, on_s: float, parked_s: float, j: float, estimated: float):
        return {"ts": ts, "pool": pool, "backend": f"{pool}-0", "on_s": on_s,
                "parked_s": parked_s, "energy_j": j, "estimated_j": estimated}  # fmt: skip

    rows = []
    for day in range(7):
        for m in range(60):
            ts = period.since + day * 86400 + 3600 + m * 60
            rows.append(minute(ts, "gpu", 60.0, 0.0, 60 * 150.0, 0.0))
            rows.append(minute(ts, "asic", 0.0, 60.0, 60 * 5.0, 0.0))
            rows.append(minute(ts, "cim", 60.0, 0.0, 60 * 8.0, 60 * 8.0))
    for m in range(30):
        rows.append(minute(period.since - 86400 + m * 60, "gpu", 60.0, 0.0, 60 * 150.0, 0.0))
    return rows
