"""What folding the summaries costs the serving process per request, early and at steady state.

    python -m bench.summaries_cpu [--requests 400000] [--shadow-rate 0.1] [--out R.json]

The serving process folds every finished request into its minute (gateway/records/minutes.py)
and every recorded shadow copy, with its primary's energy, into the copy's minute
(gateway/promotion/shadow_minutes.py). This drives both folds as the serving process does, on
a simulated clock: requests at `--rate` a second over the default policy's routes, pools and
SLO classes, a copy of `--shadow-rate` of them, each request's energy settled two seconds after
it ended, and the minutes' rows handed on every simulated second. It times the folds with the
process's CPU clock over the first `--window` requests and over the last, once the folds hold
all they keep (the primaries' energy, for their copies, up to 100,000), a thousand requests at
a time. A fold whose cost grows
with what it holds shows as a ratio above 1; divided by the serving CPU per request that
`python -m bench.hot_path` reports, the steady figure is the share of serving the folds take.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from gateway.compare.measures import Diff
from gateway.db.schema import RequestMinute, RequestRecord, ShadowMinute, ShadowRecord
from gateway.policy.load import load_policy
from gateway.promotion.shadow_minutes import ShadowMinutes
from gateway.records.minutes import Minutes, targets_of

ROOT = Path(__file__).resolve().parent.parent
SETTLE_AFTER_S = 2.0  # a request's energy, after it ended
CHUNK = 1_000  # requests timed at once


def request(n: int, ts: float, route: str, pool: str, model: str, slo: str | None) -> RequestRecord:
    return RequestRecord(
        decision_id=f"{n:032x}",
        ts=ts,
        endpoint="chat",
        route=route,
        pool=pool,
        backend=f"{pool}-{n % 4}",
        model=model,
        tenant=f"tenant-{n % 50}",
        slo_class=slo,
        stream=n % 3 == 0,
        prompt_tokens=200 + n % 700,
        prompt_tokens_estimated=200 + n % 700,
        max_tokens=512,
        completion_tokens=50 + n % 300,
        queue_ms=0.0,
        ttft_ms=40.0 + n % 90,
        tpot_ms=12.0 + n % 20,
        e2e_ms=900.0 + n % 2000,
        gateway_ms=0.3,
        attempts=1,
        fallback=False,
        status=200 if n % 97 else 503,
        error=None,
        predicted_e2e_ms=950.0,
        predicted_energy_j=40.0,
    )


def copy(record: RequestRecord, candidate: str) -> ShadowRecord:
    n = int(record.decision_id, 16)
    return ShadowRecord(
        decision_id=record.decision_id,
        ts=record.ts,
        route=record.route,
        model=record.model,
        tenant=record.tenant,
        kind="candidate",
        endpoint="chat",
        stream=False,
        temperature=0.0,
        top_p=None,
        seeded=False,
        sampled=False,
        primary_pool=record.pool,
        primary_backend=record.backend,
        candidate_pool=candidate,
        candidate_backend=f"{candidate}-0",
        primary_status=200,
        candidate_status=200,
        candidate_error=None,
        primary_e2e_ms=record.e2e_ms,
        candidate_e2e_ms=(record.e2e_ms or 0.0) * 1.2,
        diff=Diff(
            exact_match=n % 5 != 0,
            normalized_match=n % 5 != 0,
            similarity=1.0 if n % 5 else 0.93,
        ),
    )


def run(requests: int, rate: float, shadow_rate: float, window: int) -> dict[str, Any]:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    targets = targets_of(policy)
    keys = [
        (route.name, pool, route.match.models[0] if route.match.models else "m", slo)
        for route in policy.routes
        for pool in route.pools
        for slo in (None, *policy.slo_classes)
    ]
    candidates = sorted(policy.pools)
    minutes, shadows = Minutes(targets), ShadowMinutes(targets)
    pending: deque[tuple[float, str]] = deque()
    every = round(1 / shadow_rate) if shadow_rate else 0
    spent: list[float] = []  # CPU seconds per chunk of requests
    handed: list[RequestMinute] = []
    copied: list[ShadowMinute] = []
    handed_at = 0.0
    start = 1_796_000_000.0
    cycle = itertools.cycle(keys)
    for first in range(0, requests, CHUNK):
        # The records and copies are made before the clock starts: the serving process makes
        # them to write them, summaries or not.
        chunk = []
        for n in range(first, min(first + CHUNK, requests)):
            route, pool, model, slo = next(cycle)
            record = request(n, start + n / rate, route, pool, model, slo)
            shadow = (
                copy(record, candidates[n % len(candidates)]) if every and n % every == 0 else None
            )
            chunk.append((record, shadow, slo))
        t0 = time.process_time()
        for record, shadow, slo in chunk:
            now = record.ts
            minutes.request(record)
            if shadow is not None:
                shadows.copy(shadow.row(), slo, now)
            pending.append((now + SETTLE_AFTER_S, record.decision_id))
            while pending and pending[0][0] <= now:
                decision_id = pending.popleft()[1]
                minutes.energy(decision_id, 41.0, 0.0002)
                shadows.primary_energy(decision_id, 41.0, 0.0002)
            if now - handed_at >= 1.0:
                handed += minutes.take(now - 120.0)
                copied += shadows.take(now)
                handed_at = now
        spent.append(time.process_time() - t0)
    chunks = window // CHUNK
    early = sum(spent[:chunks]) / (chunks * CHUNK)
    steady = sum(spent[-chunks:]) / (chunks * CHUNK)
    handed += minutes.take()
    copied += shadows.take(math.inf)
    return {
        "requests": requests,
        "requests_folded": sum(row.requests for row in handed),
        "copies_folded": sum(row.sent for row in copied),
        "rate": rate,
        "shadow_rate": shadow_rate,
        "keys": len(keys),
        "early_us_per_request": round(early * 1e6, 2),
        "steady_us_per_request": round(steady * 1e6, 2),
        "steady_over_early": round(steady / early, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.summaries_cpu", description=__doc__)
    parser.add_argument("--requests", type=int, default=400_000)
    parser.add_argument("--rate", type=float, default=20.0, help="requests a simulated second")
    parser.add_argument("--shadow-rate", type=float, default=0.1)
    parser.add_argument("--window", type=int, default=50_000, help="requests timed at each end")
    parser.add_argument("--out", help="write the result as JSON here too")
    args = parser.parse_args(argv)
    result = run(args.requests, args.rate, args.shadow_rate, args.window)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
