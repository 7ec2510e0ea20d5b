"""Each streamed chunk's time from the upstream to the client, direct and through the gateway.

    python -m bench.chunk_latency                 # ~30 s
    python -m bench.chunk_latency --streams 1,8 --seconds 5 --gap-ms 2

wrk times whole responses, so bench/hot_path.py can only bound a chunk's added latency by the
whole stream's. Here the instant upstream (bench/instant_upstream.py --gap-ms) sends 16 events
`--gap-ms` apart, each stamped with the monotonic clock when it was sent, and a client keeps
`--streams` streams going for `--seconds`, noting for every event the time from its stamp to its
arrival. The monotonic clock is one clock for every process on the machine. The gateway (full
feature set, as in hot_path) runs alone on core 0; the upstream and the client share core 1.
The added latency per chunk is the gateway's percentile less direct's, from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from bench.hot_path import LOAD_CORE, MODEL, gateway, instant_upstream
from gateway.stats import percentile

TARGET_ADDED_P99_MS = 1.0  # issue #10
STAMP = re.compile(rb'"id":"t(\d+)"')
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench"}


async def load(url: str, streams: int, seconds: float) -> tuple[list[float], int]:
    """Keep `streams` streams going for `seconds`; return each event's delay (ms) and failures."""
    delays: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds

    async def one_stream(session: aiohttp.ClientSession) -> None:
        nonlocal failures
        while time.monotonic() < deadline:
            async with session.post(url, data=BODY, headers=HEADERS) as response:
                if response.status != 200:
                    failures += 1
                    await response.read()
                    continue
                pending = b""
                async for chunk in response.content.iter_any():
                    now = time.monotonic_ns()
                    pending += chunk
                    *events, pending = pending.split(b"\n\n")
                    for event in events:
                        stamp = STAMP.search(event)
                        if stamp:
                            delays.append((now - int(stamp.group(1))) / 1e6)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one_stream(session) for _ in range(streams)))
    return delays, failures


@contextlib.contextmanager
def on_core(core: int) -> Iterator[None]:
    """Run this process on `core` until the block ends, then where it ran before."""
    before = os.sched_getaffinity(0)
    with contextlib.suppress(OSError):  # fewer cores than expected: run unpinned
        os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def measure(url: str, streams: int, seconds: float) -> dict[str, Any]:
    asyncio.run(load(url, streams, 1.0))  # warm up
    delays, failures = asyncio.run(load(url, streams, seconds))
    return {
        "events": len(delays),
        "failures": failures,
        "p50_ms": round(percentile(delays, 50) or 0.0, 3),
        "p99_ms": round(percentile(delays, 99) or 0.0, 3),
        "max_ms": round(max(delays, default=0.0), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,8", help="concurrent streams, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--gap-ms", type=float, default=2.0, help="between the upstream's events")
    parser.add_argument("--out", default="bench/results/chunk_latency.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"gap_ms": args.gap_ms, "seconds": args.seconds, "points": {}}
    with (
        instant_upstream("--gap-ms", str(args.gap_ms)) as (_, upstream),
        gateway(upstream, 0.0) as (_, base),
        on_core(LOAD_CORE),  # the client, next to the upstream
    ):
        for streams in (int(s) for s in args.streams.split(",")):
            direct = measure(upstream + "/v1/chat/completions", streams, args.seconds)
            through = measure(base + "/v1/chat/completions", streams, args.seconds)
            point = {
                "direct": direct,
                "gateway": through,
                "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 3),
                "added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 3),
            }
            results["points"][str(streams)] = point
            print(
                f"{streams:>3} streams: direct p50 {direct['p50_ms']:.3f} p99 "
                f"{direct['p99_ms']:.3f} ms ({direct['events']} events); gateway p50 "
                f"{through['p50_ms']:.3f} p99 {through['p99_ms']:.3f} ms "
                f"({through['events']} events, {through['failures']} failed); added per "
                f"chunk p50 {point['added_p50_ms']:.3f} p99 {point['added_p99_ms']:.3f} ms",
                flush=True,
            )
    print("\nissue #10 target, each streamed chunk relayed with <= 1 ms added at p99:")
    for streams, point in results["points"].items():
        added = point["added_p99_ms"]
        verdict = "met    " if added <= TARGET_ADDED_P99_MS else "NOT met"
        print(f"  {verdict}  {streams:>3} streams  {added:.3f} ms")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
