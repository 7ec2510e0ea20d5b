"""The what-if's sampled windows against the full replay, on periods a full replay can afford.

    python -m bench.whatif_sample --requests 4000 --start 2026-11-25T14:00 --hours 1 \
        --seeds 1 2 3 --draws 2 --size 2400 --out R.json

For each seed, generates the period's records (`bench.records`, policies/default.yaml), replays
them whole through the learned router, then draws `--draws` window samples of at most `--size`
requests (gateway/whatif/windows.py) and replays each; and, for contrast, the sampler this one
replaced: as many requests picked at random across the period, replayed at their own arrivals.
Writes, per seed, the full replay's SLO attainment, energy per request and cost per 1k tokens,
each sample's estimates with their 95 % intervals and whether they hold the full figure, and the
thinned replay's figures.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.records import generate
from gateway.db.connection import connect
from gateway.policy.load import load_policy
from gateway.report.period import date_range
from gateway.whatif.simulate import recorded_requests, replay, replay_sample
from gateway.whatif.trace import TraceRequest
from gateway.whatif.windows import WARM_UP_S, WINDOW_S, sample_windows

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("slo_attainment", "energy_j_per_request", "cost_usd_per_1k_tokens")


def thinned(requests: list[TraceRequest], size: int, seed: int) -> list[TraceRequest]:
    """Return `size` of the requests picked at random, arrivals from the first picked."""
    picked = sorted(random.Random(seed).sample(range(len(requests)), size))
    first = requests[picked[0]].arrival_s
    return [replace(requests[i], arrival_s=requests[i].arrival_s - first) for i in picked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--start", default="2026-11-25T14:00")
    parser.add_argument("--hours", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--size", type=int, default=2400)
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    parser.add_argument("--warm-up-s", type=float, default=WARM_UP_S)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    policy = load_policy(ROOT / "policies" / "default.yaml")
    end = datetime.fromisoformat(args.start) + timedelta(hours=args.hours)
    period = date_range(args.start, end.strftime("%Y-%m-%dT%H:%M"))
    seeds: list[dict[str, Any]] = []
    covered = checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            url = f"sqlite:///{Path(tmp) / f'period-{seed}.db'}"
            generate(url, args.requests, 0, period, policy, seed=seed)
            db = connect(url)
            everything = recorded_requests(db, period.since)
            full, _ = replay(policy, everything)
            row: dict[str, Any] = {
                "seed": seed,
                "period_requests": len(everything),
                "full": {k: full[k] for k in (*FIGURES, "queued_share", "refused")},
                "samples": [],
            }
            for draw in range(args.draws):
                sample = sample_windows(
                    db,
                    period.since,
                    period.until,
                    size=args.size,
                    seed=seed * 1000 + draw,
                    window_s=args.window_s,
                    warm_up_s=args.warm_up_s,
                )
                figures = replay_sample(policy, sample)
                holds = {
                    k: figures["intervals"][k]["low"] <= full[k] <= figures["intervals"][k]["high"]
                    for k in FIGURES
                }
                covered += sum(holds.values())
                checked += len(holds)
                row["samples"].append(
                    {
                        "draw_seed": seed * 1000 + draw,
                        "replayed": len(sample.requests),
                        "measured": sample.measured_requests,
                        "windows": len(sample.windows),
                        "intervals": {k: figures["intervals"][k] for k in FIGURES},
                        "holds_full": holds,
                    }
                )
            thin, _ = replay(policy, thinned(everything, args.size, seed))
            row["thinned"] = {k: thin[k] for k in FIGURES}
            db.dispose()
            seeds.append(row)
            print(json.dumps(row), flush=True)
    doc = {
        "command": "python -m bench.whatif_sample "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
        ),
        "window_s": args.window_s,
        "warm_up_s": args.warm_up_s,
        "intervals_holding_the_full_replay": f"{covered} of {checked}",
        "seeds": seeds,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
