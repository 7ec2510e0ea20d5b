"""An upstream that answers every chat completion at once: the floor for proxy benchmarks.

`GET /metrics` answers as a GPU's exporters do, so that a gateway's energy meter and
engine-load reader run as they do on a real fleet: DCGM's energy counter
(`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, mJ) advancing at an idle draw plus a fixed energy per
token answered, its power (`DCGM_FI_DEV_POWER_USAGE`, W), and vLLM's load series (requests
running and waiting, the KV cache in use).

A request to /v1/embeddings is answered with one fixed vector per input, so that a shadow
comparison's semantic measure (which asks the policy's embedding pool) has an answer too.

A request whose body asks for `"stream": true` is answered with `--chunks` server-sent events
(OpenAI's `chat.completion.chunk` shape, usage in the last one) and `data: [DONE]`, all at once,
or `--gap-ms` apart with each event's id stamped with the monotonic clock when it was sent
(`t<nanoseconds>`), so that a client on the same machine can time each chunk's way to it
(bench/chunk_latency.py).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson

from bench.loopback import serve

ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "llama-3.1-8b-instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }
)
# An H100-class GPU serving an 8B model: 120 W idle, about 0.5 J per token at moderate batch.
IDLE_W = 120.0
JOULES_PER_TOKEN = 0.5


class Device:
    """The draw of the GPU this upstream stands for: idle since it started, and its tokens."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.tokens = 0
        self.running = 0
        self._last: tuple[float, float] | None = None  # (time, joules) at the last scrape

    def joules(self, now: float) -> float:
        return IDLE_W * (now - self.started) + JOULES_PER_TOKEN * self.tokens

    def metrics(self) -> bytes:
        now = time.monotonic()
        joules = self.joules(now)
        last = self._last
        watts = IDLE_W if last is None or now <= last[0] else (joules - last[1]) / (now - last[0])
        self._last = (now, joules)
        return (
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
            f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0"}} {joules * 1000:.0f}\n'
            "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="0"}} {watts:.3f}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running {self.running}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            "vllm:num_requests_waiting 0\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc {min(self.running / 256, 1.0):.4f}\n"
        ).encode()


DEVICE = Device()
METRICS_HEADERS = [(b"content-type", b"text/plain; version=0.0.4")]

# One 1,024-wide vector (bge-large-en-v1.5's width), the same for every input.
VECTOR = [round(1 / (1 + i), 6) for i in range(1024)]


def embeddings(body: bytes) -> bytes:
    text = orjson.loads(body).get("input", "")
    count = len(text) if isinstance(text, list) else 1
    data = [{"object": "embedding", "index": i, "embedding": VECTOR} for i in range(count)]
    usage = {"prompt_tokens": count, "total_tokens": count}
    return orjson.dumps({"object": "list", "data": data, "model": "bench", "usage": usage})


HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]
STREAM_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
STREAM_FLAGS = (b'"stream":true', b'"stream": true')


def stream_events(chunks: int) -> list[bytes]:
    """Encode one streamed answer as `chunks` content events, the last with usage, then DONE."""
    events = []
    for i in range(chunks):
        last = i == chunks - 1
        event: dict[str, Any] = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "llama-3.1-8b-instruct",
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "ok"}
                    if i == 0
                    else {"content": " ok"},
                    "finish_reason": "stop" if last else None,
                }
            ],
        }
        if last:
            event["usage"] = {
                "prompt_tokens": 8,
                "completion_tokens": chunks,
                "total_tokens": 8 + chunks,
            }
        events.append(b"data: " + orjson.dumps(event) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


EVENTS = stream_events(16)
GAP_S = 0.0
STAMP = b'"id":"chatcmpl-bench"'


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["method"] == "GET" and scope["path"] == "/metrics":
        await send({"type": "http.response.start", "status": 200, "headers": METRICS_HEADERS})
        await send({"type": "http.response.body", "body": DEVICE.metrics()})
        return
    DEVICE.running += 1
    try:
        await answer(scope, receive, send)
    finally:
        DEVICE.running -= 1


async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"].endswith("/embeddings"):
        answer = embeddings(body)
        length = str(len(answer)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return
    if STREAM_FLAGS[0] in body or STREAM_FLAGS[1] in body:
        DEVICE.tokens += len(EVENTS) - 1
        await send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})
        for event in EVENTS:
            if GAP_S:
                await asyncio.sleep(GAP_S)
                event = event.replace(STAMP, b'"id":"t%d"' % time.monotonic_ns())
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    DEVICE.tokens += 1
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=16, help="content events per streamed answer")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="between streamed events")
    args = parser.parse_args()
    global EVENTS, GAP_S
    EVENTS = stream_events(args.chunks)
    GAP_S = args.gap_ms / 1000
    serve(app, args.port)


if __name__ == "__main__":
    main()
