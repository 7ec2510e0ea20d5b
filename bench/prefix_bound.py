"""What a prefix cache can do for a trace's time to first token, whatever the routing.

    python -m bench.prefix_bound [--trace traces/mooncake_conversation_trace.jsonl]
        [--kind gpu] [--out R.json]

Each request's prefill on an idle simulated device of `kind` (the routing replay's hardware,
simulator/hardware.py) twice: with nothing cached, and with every earlier prompt of the trace
cached (a cache that never evicts, on the one device every request goes to): the best any
routing can give it, since a router can only send a prompt where its prefix already is. Reports
the share of prompt tokens an earlier prompt holds, and the percentiles of both prefills and
the share of requests whose prefill is within 2 s. Queueing and slower devices only add to both.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gateway.stats import percentile
from gateway.whatif.timeline import MODEL
from gateway.whatif.trace import read_trace
from simulator.hardware import SimulatorHardware
from simulator.prefix_cache import PrefixCache

GOODPUT_TTFT_S = 2.0  # gateway/whatif/scorecard.py
UNBOUNDED = 10**12


def bound(trace: Path, kind: str = "gpu") -> dict[str, object]:
    """Return the prefills of a trace's requests with nothing cached and with a perfect cache."""
    requests = read_trace(trace)
    device = SimulatorHardware().device(kind, {MODEL: 8.0})
    cache = device.device.prefix_cache
    device.device.prefix_cache = PrefixCache(UNBOUNDED, cache.block_tokens)
    cold, warm = [], []
    prompt = cached = 0
    now = 0.0
    for request in requests:
        blocks, size = request.blocks, request.block_tokens
        context = request.prompt_tokens + request.output_tokens // 2
        cold.append(device.marginal(MODEL, request.prompt_tokens, context).prefill_s)
        figures = device.marginal(MODEL, request.prompt_tokens, context, blocks, size)
        warm.append(figures.prefill_s)
        prompt += request.prompt_tokens
        cached += figures.cached_tokens
        # One token: its prefill keeps its blocks and it ends; the device is idle again.
        device.submit(MODEL, request.prompt_tokens, 1, now, lambda: None, blocks, size)
        while (at := device.next_event_at()) is not None:
            device.advance(at)
        now = device.time
    return {
        "trace": str(trace),
        "kind": kind,
        "requests": len(requests),
        "cached_share": round(cached / max(prompt, 1), 4),
        "nothing_cached": figures_of(cold),
        "everything_earlier_cached": figures_of(warm),
    }


def figures_of(prefills: list[float]) -> dict[str, float | None]:
    """Return a list of prefills' percentiles in ms and the share within the goodput's TTFT."""
    ms = [p * 1e3 for p in prefills]
    return {
        "p50_ms": _round(percentile(ms, 50)),
        "p90_ms": _round(percentile(ms, 90)),
        "p99_ms": _round(percentile(ms, 99)),
        "within_2s": round(sum(p <= GOODPUT_TTFT_S for p in prefills) / max(len(prefills), 1), 5),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace", type=Path, default=Path("traces/mooncake_conversation_trace.jsonl")
    )
    parser.add_argument("--kind", default="gpu", help="the simulated device: gpu, asic or cim")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args()
    found = bound(args.trace, args.kind)
    text = json.dumps(found, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
