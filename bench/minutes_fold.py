"""The serving process's cost of the request minutes: CPU per request of folding a finished
request, and then its energy, into its minute (gateway/records/minutes.py).

    python -m bench.minutes_fold [--requests 200000] [--runs 5]

Records of three routes, two pools, forty tenants and streamed and whole answers, a minute's
worth every 1,000; prints the microseconds per request of each run and their median as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from gateway.db.schema import RequestRecord
from gateway.policy.definition import SloClass
from gateway.records.minutes import Minutes

INTERACTIVE = SloClass(ttft_ms=500, tpot_ms=50)


def records(n: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            decision_id=f"{i:032x}",
            ts=1_700_000_000.0 + i * 0.06,
            endpoint="chat",
            route=("a", "b", "c")[i % 3],
            pool=("gpu", "asic")[i % 2],
            backend="b-0",
            model="m",
            tenant=f"t{i % 40}",
            slo_class="interactive",
            stream=i % 2 == 0,
            prompt_tokens=100 + i % 500,
            prompt_tokens_estimated=100,
            max_tokens=256,
            completion_tokens=1 + i % 300,
            queue_ms=0.1,
            ttft_ms=100.0 + i % 300 if i % 2 == 0 else None,
            tpot_ms=10.0 + i % 30 if i % 2 == 0 else None,
            e2e_ms=500.0 + i % 900,
            gateway_ms=0.3,
            attempts=1,
            fallback=False,
            status=200 if i % 50 else 502,
            error=None,
            predicted_e2e_ms=520.0,
            predicted_energy_j=2.0,
        )
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    finished = records(args.requests)
    runs = []
    for _ in range(args.runs):
        minutes = Minutes(lambda _: INTERACTIVE)
        started = time.perf_counter()
        for record in finished:
            minutes.request(record)
            minutes.energy(record.decision_id, 1.5, 1e-5)
        runs.append((time.perf_counter() - started) / len(finished) * 1e6)
        minutes.take()
    print(
        json.dumps(
            {
                "us_per_request": [round(r, 2) for r in runs],
                "median": round(statistics.median(runs), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
