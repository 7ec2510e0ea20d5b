"""Live mode: send a compressed slice of a trace through a running gateway, end to end.

Each request leaves at its arrival time as a streamed chat completion whose prompt has the
trace's token count and whose answer has exactly the trace's generated tokens (`ignore_eos`,
which the simulator honours as vLLM does). The gateway routes it to real simulator processes.
Durations are measured on the wall clock and multiplied by the simulators' `--speed`, so they
compare with the virtual-clock replay of the same slice; the gateway's own overhead is
multiplied too, which is why a low speed gives the closer comparison.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gateway.policy.definition import Policy
from gateway.records.slo import meets_slo, tpot_s
from gateway.whatif.scorecard import latency_percentile
from gateway.whatif.timeline import MODEL, request_profile
from gateway.whatif.trace import TraceRequest

# One simulator token and four characters for the gateway's estimate; the simulator adds 3
# tokens per message and 3 to prime the reply.
PROMPT_WORD = "abc"
CHAT_OVERHEAD_TOKENS = 6
TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class LiveOutcome:
    """What one request measured through the gateway: status, pool and timings (wall clock)."""

    status: int
    pool: str | None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


def chat_body(request: TraceRequest, model: str = MODEL) -> bytes:
    """Return a streamed chat request with the trace's prompt and output lengths."""
    words = max(request.prompt_tokens - CHAT_OVERHEAD_TOKENS, 1)
    return orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": " ".join([PROMPT_WORD] * words)}],
            "max_tokens": request.output_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
    )


async def _send(
    client: httpx.AsyncClient,
    url: str,
    request: TraceRequest,
    start: float,
    speed: float,
    clock: Callable[[], float],
) -> LiveOutcome:
    await asyncio.sleep(max(0.0, start + request.arrival_s / speed - clock()))
    sent = clock()
    first = last = None
    try:
        async with client.stream(
            "POST",
            url + "/v1/chat/completions",
            content=chat_body(request),
            headers={"content-type": "application/json"},
        ) as response:
            pool = response.headers.get("x-gateway-pool")
            if response.status_code != 200:
                await response.aread()
                return LiveOutcome(response.status_code, pool)
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content":"' in line:
                    last = clock()
                    first = first if first is not None else last
    except (httpx.HTTPError, TimeoutError):
        return LiveOutcome(0, None)
    if first is None or last is None:
        return LiveOutcome(0, pool)
    ttft, end = first - sent, last - sent
    return LiveOutcome(200, pool, ttft, tpot_s(ttft, end, request.output_tokens), end)


async def replay_live(
    url: str,
    requests: Sequence[TraceRequest],
    *,
    speed: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
) -> list[LiveOutcome]:
    """Send every request at its arrival time, compressed by `speed`; return what each measured."""
    # Every request of the slice may be in flight at once: no pool limit holds one back.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits) as client:
        start = clock()
        return list(
            await asyncio.gather(
                *(_send(client, url.rstrip("/"), r, start, speed, clock) for r in requests)
            )
        )


def summarize_live(
    policy: Policy, requests: Sequence[TraceRequest], outcomes: Sequence[LiveOutcome], speed: float
) -> dict[str, Any]:
    """Return the live run's SLO attainment, TTFT and pool shares, in simulated time."""
    total = max(len(outcomes), 1)
    met = 0
    ttft = []
    for request, outcome in zip(requests, outcomes, strict=True):
        # Durations on the simulators' clock: the wall clock's, times their speed.
        ttft_ms, tpot_ms, e2e_ms = (
            None if seconds is None else seconds * speed * 1e3
            for seconds in (outcome.ttft_s, outcome.tpot_s, outcome.e2e_s)
        )
        if ttft_ms is not None:
            ttft.append(ttft_ms)
        profile = request_profile(policy, request)
        met += meets_slo(
            profile,
            outcome.status,
            ttft_ms,
            tpot_ms,
            e2e_ms,
            endpoint="chat",
            stream=True,  # every request of a live run is a streamed chat (chat_body)
            completion_tokens=request.output_tokens,
        )
    pools = Counter(o.pool for o in outcomes if o.status == 200)
    live = [name for name, pool in policy.pools.items() if pool.live]
    return {
        "requests": len(outcomes),
        "served": sum(o.status == 200 for o in outcomes),
        "statuses": dict(Counter(str(o.status) for o in outcomes)),
        "slo_attainment": round(met / total, 5),
        "ttft_p50_ms": latency_percentile(ttft, 50),
        "ttft_p99_ms": latency_percentile(ttft, 99),
        "pool_shares": {name: round(pools[name] / total, 4) for name in live},
        "speed": speed,
    }
