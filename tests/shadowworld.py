"""Shared world for shadow-traffic tests: policies with shadow targets, reading shadow records."""

from __future__ import annotations

import time
from collections.abc import Sequence

import sqlalchemy as sa
from waiting import wait_for

from gateway.db.schema import shadow_drops, shadow_records
from gateway.policy.definition import Policy
from harness.gateways import GatewayServer
from policies import MODEL, fleet_policy

PROMPT = [{"role": "user", "content": "Explain how an analog array multiplies a vector."}]
# Budgets that never drop a copy of sequential test traffic, so drops are only where a test
# asks for them.
ROOMY = {"max_concurrent": 16, "max_per_second": 1000, "max_slot_share": 1.0}


def shadow_policy(
    gpu: Sequence[str],
    asic: Sequence[str],
    cim: Sequence[str],
    *,
    rate: float = 1.0,
    budget: dict | None = None,
    compare: dict | None = None,
    noise: float | None = 0.0,
    noise_budget: dict | None = None,
    timeout_s: float = 5,
    deadline_s: float = 600,
    pools: Sequence[str] = ("gpu",),
    target: str = "cim",
) -> Policy:
    """One 8B route served by `pools`, copying `rate` of its requests to `target`.

    `noise` is its noise floor's share, off by default so that a test counts only the copies
    it asks for; None names no noise floor, so the route gets the default one.
    """
    route: dict = {
        "name": "chat",
        "match": {"models": [MODEL]},
        "pools": list(pools),
        "shadow": [
            {
                "pool": target,
                "sample_rate": rate,
                "budget": budget or ROOMY,
                "compare": compare or {"store_text": True},
            }
        ],
    }
    if noise is not None:
        route["noise_floor"] = {
            "share": noise,
            "budget": noise_budget or ROOMY,
            "compare": compare or {"store_text": True},
        }
    slo = {"timeout_s": timeout_s, "deadline_s": deadline_s}
    return fleet_policy(gpu, asic, cim, routes=[route], interactive=slo)


def shadow_rows(gw: GatewayServer, expected: int, timeout: float = 60.0) -> list[dict]:
    """Wait until at least `expected` shadow records are written; return them all."""
    deadline = time.monotonic() + timeout
    while True:
        with gw.gateway.db.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(sa.select(shadow_records))]
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def drop_counts(gw: GatewayServer, expected: int = 0, timeout: float = 60.0) -> dict[str, int]:
    """Wait until at least `expected` drops are written; return counts by reason."""
    deadline = time.monotonic() + timeout
    while True:
        with gw.gateway.db.connect() as conn:
            rows = conn.execute(sa.select(shadow_drops.c.reason, shadow_drops.c.count)).all()
        counts: dict[str, int] = {}
        for reason, count in rows:
            counts[reason] = counts.get(reason, 0) + count
        if sum(counts.values()) >= expected or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def settle(gw: GatewayServer, timeout: float = 60.0) -> None:
    """Wait until the mirror has no copy queued or in flight."""
    mirror = gw.gateway.mirror
    wait_for(
        lambda: not (mirror.pending or mirror.in_flight),
        timeout,
        lambda: f"the mirror still has {mirror.pending} copies queued, {mirror.in_flight} sent",
    )


def serve(gw: GatewayServer, requests: int) -> None:
    """Send chat requests through a gateway of shadow_policy (every one copied, no noise floor)
    and wait until their request and shadow records are written."""
    client = gw.client()
    for _ in range(requests):
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=20)
    settle(gw)
    shadow_rows(gw, requests)
    gw.records(requests)
