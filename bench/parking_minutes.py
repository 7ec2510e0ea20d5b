"""Where parking loses the SLO: a trace replayed by `learned-parked` (and `learned`, always on),
minute by minute.

    python -m bench.parking_minutes --trace traces/azure_llm_2023_code.csv \
        --policy bench/policies/mixed-fleet-release.yaml --seed 3 --out R.json

For each strategy: its requests missing the SLO by what they missed (TPOT, TTFT, refused) and
the pool that served them; and for each minute of the trace, its requests, its prompt tokens a
second, each strategy's misses, and the backends the parked fleet had switched off at some point
of it. The routing benchmark's figures are for the hour; these say which minutes lost them.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from gateway.policy.load import load_policy
from gateway.whatif.conditions import ReplayRates
from gateway.whatif.scorecard import replayed, summarize
from gateway.whatif.timeline import Passage, Replay
from gateway.whatif.trace import read_trace
from lab.scenario import PLAIN
from lab.strategies import strategy_for

STRATEGIES = ("learned", "learned-parked")
MINUTE_S = 60.0


def missed(passage: Passage) -> str | None:
    """Say what a request missing its SLO missed first ('refused', 'ttft', 'tpot', 'e2e'), or
    None where it met it."""
    if passage.meets_slo():
        return None
    if not passage.served:
        return "refused"
    profile = passage.profile
    ttft, tpot = passage.ttft_s, passage.tpot_s
    if profile.ttft_ms is not None and ttft is not None and ttft * 1000 > profile.ttft_ms:
        return "ttft"
    if profile.tpot_ms is not None and tpot is not None and tpot * 1000 > profile.tpot_ms:
        return "tpot"
    return "e2e"


def off_during(replay: Replay) -> dict[str, list[tuple[float, float]]]:
    """Return, per backend, when it was off: from its switching off to its wake-up's call."""
    spans: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for at, backend, what, _ in replay.moves:
        if what == "off":
            since[backend] = at
        elif what == "wake" and backend in since:
            spans.setdefault(backend, []).append((since.pop(backend), at))
    for backend, at in since.items():
        spans.setdefault(backend, []).append((at, float("inf")))
    return spans


def minutes(runs: dict[str, Replay]) -> list[dict[str, Any]]:
    """Return each minute's requests, prompt tokens a second, misses by strategy, and the
    backends the parked fleet had off in it."""
    first = next(iter(runs.values()))
    start = min(p.arrival_s for p in first.passages)
    count = int((max(p.arrival_s for p in first.passages) - start) // MINUTE_S) + 1
    rows: list[dict[str, Any]] = [
        {"minute": m, "requests": 0, "prompt_tokens_s": 0.0, "missed": Counter()}
        for m in range(count)
    ]
    for name, run in runs.items():
        for passage in run.passages:
            row = rows[int((passage.arrival_s - start) // MINUTE_S)]
            if name == STRATEGIES[0]:
                row["requests"] += 1
                row["prompt_tokens_s"] += passage.request.prompt_tokens / MINUTE_S
            row["missed"][name] += missed(passage) is not None
    parked = runs.get("learned-parked")
    spans = off_during(parked) if parked is not None else {}
    for row in rows:
        lo, hi = start + row["minute"] * MINUTE_S, start + (row["minute"] + 1) * MINUTE_S
        row["prompt_tokens_s"] = round(row["prompt_tokens_s"])
        row["missed"] = dict(row["missed"])
        row["off"] = sorted(b for b, s in spans.items() if any(a < hi and z > lo for a, z in s))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    policy = load_policy(args.policy)
    requests = read_trace(args.trace)
    runs: dict[str, Replay] = {}
    found: dict[str, Any] = {"trace": str(args.trace), "policy": str(args.policy)}
    found |= {"seed": args.seed, "strategies": {}}
    for name in STRATEGIES:
        rates = ReplayRates(policy, PLAIN)
        strategy = strategy_for(name, policy, seed=args.seed, rates=rates)
        run = replayed(strategy, requests, seed=args.seed, conditions=PLAIN, rates=rates)
        runs[name] = run
        summary = summarize(run)
        causes = Counter(
            f"{cause} on {p.pool or 'no pool'}"
            for p in run.passages
            if (cause := missed(p)) is not None
        )
        found["strategies"][name] = {
            key: summary[key]
            for key in ("slo_attainment", "fleet_energy_j", "ttft_p99_ms", "tpot_p99_ms")
        } | {"missed": dict(causes.most_common())}
    found["minutes"] = minutes(runs)
    text = json.dumps(found, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
