"""Energy attribution under load: how long the ledger holds the loop, and how late energy is final.

    python -m bench.attribution                         # 2,000 req/s, 4 backends, 60 s
    python -m bench.attribution --rate 5000 --stream-s 3600

Drives the gateway's ledger (gateway/energy/ledger.py) alone, on a virtual clock, as the meter
does: requests of `--request-s` each arrive at `--rate` a second spread over `--backends`,
each backend also runs one stream that lasts `--stream-s`, and every backend's counter is read
once a second. After each reading the due intervals are split as the meter's settling task
splits them, between pauses where it yields to the event loop. Reports, from the CPU time each
piece of work took on this machine (the thread's own, so that other processes on a busy machine
do not count, while this one's garbage collections do):

- the longest stretch of work between two pauses (what one request could wait behind), and
  the p99 and total per reading;
- how long a reading itself takes (it runs in the scrape's round, on the loop);
- the most requests whose energy was still unknown at once, and how late, in virtual seconds,
  a request's energy was final after its end (median, p99, worst).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

from gateway.energy.ledger import BackendLedger


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    ledgers = [BackendLedger(idle_w=120.0) for _ in range(args.backends)]
    joules = [0.0] * args.backends
    gap = 1.0 / args.rate
    ended: dict[str, float] = {}  # key: virtual end
    late: list[float] = []
    stretches: list[float] = []  # real seconds of work between two pauses
    per_reading: list[float] = []
    reading_s: list[float] = []
    held = 0
    n = 0
    streams = 0
    for b, ledger in enumerate(ledgers):
        ledger.reading(0.0, 0.0)
        ledger.open(f"stream-{b}-0", 0.0)
    running: deque[tuple[float, int, str]] = deque()  # (end, backend, key), in end order
    t = 0.0
    next_reading = 1.0
    while t < args.seconds:
        t = n * gap
        while running and running[0][0] <= t:
            end, b, key = running.popleft()
            ledgers[b].close(key, end, prompt_tokens=200, completion_tokens=50, first_token=None)
            ended[key] = end
        if t >= next_reading:
            for b, ledger in enumerate(ledgers):
                joules[b] += 120.0 + 300.0  # idle and a busy device's draw over the second
                began = time.thread_time()
                ledger.reading(next_reading, joules[b])
                reading_s.append(time.thread_time() - began)
                if next_reading >= (streams + 1) * args.stream_s:  # the next stream starts
                    end = (streams + 1) * args.stream_s
                    ledger.close(f"stream-{b}-{streams}", end, 200, int(20 * args.stream_s))
                    ledger.open(f"stream-{b}-{streams + 1}", end)
                total = 0.0
                began = time.thread_time()
                for item in ledger.settling():
                    if item is not None and item.key in ended:
                        late.append(next_reading - ended.pop(item.key))
                    if item is None:
                        now = time.thread_time()
                        stretches.append(now - began)
                        total += now - began
                        began = now
                now = time.thread_time()
                stretches.append(now - began)
                per_reading.append(total + now - began)
            held = max(held, sum(len(ledger.pending()) for ledger in ledgers))
            if next_reading >= (streams + 1) * args.stream_s:
                streams += 1
            next_reading += 1.0
        b = n % args.backends
        key = f"r{n}"
        ledgers[b].open(key, t)
        running.append((t + args.request_s, b, key))
        n += 1
    return {
        "requests": n,
        "rate": args.rate,
        "backends": args.backends,
        "stream_s": args.stream_s,
        "longest_stretch_ms": round(max(stretches) * 1000, 3),
        "stretch_p99_ms": round(percentile(stretches, 0.99) * 1000, 3),
        "work_per_reading_p99_ms": round(percentile(per_reading, 0.99) * 1000, 3),
        "reading_p99_us": round(percentile(reading_s, 0.99) * 1e6, 1),
        "most_held": held,
        "final_after_end_s": {
            "median": round(statistics.median(late), 3) if late else None,
            "p99": round(percentile(late, 0.99), 3),
            "max": round(max(late), 3) if late else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="requests a second")
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--request-s", type=float, default=0.5, help="each request's length")
    parser.add_argument("--stream-s", type=float, default=8.0, help="each backend's long stream")
    parser.add_argument("--seconds", type=float, default=60.0, help="virtual seconds to drive")
    parser.add_argument("--out", default="bench/results/attribution.json")
    args = parser.parse_args(argv)
    results = run(args)
    print(json.dumps(results, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
