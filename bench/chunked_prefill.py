"""The simulated GPU's chunked prefill beside vLLM's documented behaviour.

    python -m bench.chunked_prefill [--out docs/results/chunked-prefill.json]

On the bundled GPU profile's device engine (simulator/device.py), the 8B model, simulated time:

- a 32k-token prompt alone, and arriving while 16 sequences decode: its time to first token and
  the longest decode step beside it, with step budgets of 2,048 and 8,192 tokens (vLLM: a
  smaller `max_num_batched_tokens` gives a better inter-token latency, a larger one a better
  time to first token);
- four 6,000-token prompts sharing a 5,000-token prefix arriving at once with an unrelated
  1,000-token prompt: the unrelated prompt's wait with the prefix cold and cached (a hit frees
  compute for the device's other requests).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simulator.device import Device, Job
from simulator.power import PowerCurve
from simulator.profile import PrefixCacheFigures, load_profile

PROFILE = load_profile("gpu")
MODEL = PROFILE.model("llama-3.1-8b-instruct")


def device(budget: int | None = None, cache: bool = False) -> Device:
    """Return an idle simulated GPU with a step budget of `budget` tokens (its profile's: None)."""
    timing = PROFILE.timing
    if budget is not None:
        timing = timing.model_copy(update={"max_batched_tokens": budget})
    cached = PROFILE.prefix_cache if cache else PrefixCacheFigures()
    return Device(0, timing, PROFILE.slots, PowerCurve(PROFILE.power), prefix_cache=cached)


def run(engine: Device) -> None:
    """Process every event until nothing runs."""
    while (at := engine.next_event_at()) is not None:
        engine.advance(at)


def long_prompt(budget: int) -> dict[str, float]:
    """Return a 32k-token prompt's time to first token alone and among 16 decoding sequences,
    and the decode steps beside it, in seconds."""
    assert MODEL is not None
    alone = device(budget)
    job = Job(MODEL, 32_000, 2)
    alone.submit(job, 0.0)
    run(alone)
    busy = device(budget)
    decoding = [Job(MODEL, 1000, 2000) for _ in range(16)]
    for member in decoding:
        busy.submit(member, 0.0)
    while any(member.first_token_at is None for member in decoding):
        busy.advance(busy.next_event_at() or 0.0)
    busy.advance(busy.next_event_at() or 0.0)  # every one decoding now
    plain = (busy.next_event_at() or 0.0) - busy.time
    late = Job(MODEL, 32_000, 2)
    start = busy.time
    busy.submit(late, start)
    steps = []
    while late.first_token_at is None:
        at = busy.next_event_at() or 0.0
        steps.append(at - busy.time)
        busy.advance(at)
    return {
        "ttft_alone_s": round(job.first_token_at or 0.0, 4),
        "decode_step_s": round(plain, 4),
        "longest_step_beside_it_s": round(max(steps), 4),
        "ttft_among_16_decoding_s": round((late.first_token_at or 0.0) - start, 4),
    }


def shared_prefix(cached: bool) -> float:
    """Return the unrelated prompt's wait for its first token, in seconds."""
    assert MODEL is not None
    engine = device(8192, cache=True)
    prefix = list(range(1, 313))  # 4,992 tokens of 16-token blocks
    if cached:
        engine.submit(Job(MODEL, 5008, 1, blocks=prefix), 0.0)
        run(engine)
    start = engine.time + 1.0
    for k in range(4):
        own = [10_000 + 100 * k + i for i in range(62)]
        engine.submit(Job(MODEL, 6000, 2, blocks=prefix + own), start)
    other = Job(MODEL, 1000, 2, blocks=[50_000 + i for i in range(62)])
    engine.submit(other, start)
    run(engine)
    return round((other.first_token_at or 0.0) - start, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="also write the result to this JSON file")
    args = parser.parse_args()
    result = {
        "budget_2048": long_prompt(2048),
        "budget_8192": long_prompt(8192),
        "unrelated_prompt_wait_s": {
            "prefix_cold": shared_prefix(False),
            "prefix_cached": shared_prefix(True),
        },
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
