"""How long a real engine takes to serve again once parked by stopping its process.

    python -m bench.real_fleet_wake [--runs 5] [--out docs/results/real-fleet-wake.json]

For each chat part of the real fleet (realfleet/fleet.py), the llama-server is started, its
`/health` awaited, a one-token chat answered, and the process stopped, `--runs` times: the
hook "a llama.cpp process stopped and restarted" parks and wakes with. Reports per part the
median and range of the time from the start to `/health` and to the first answer, and the
model file's size. The model file is in the page cache after the first run, as it is for a
process stopped and started again on the same host.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from realfleet import engine
from realfleet.corpus import MODEL
from realfleet.fleet import BACKENDS, models, spec


def wake_once(spec_: engine.ServerSpec) -> tuple[float, float]:
    """Start a server, await its health and one answer, stop it; return both times in s."""
    started = time.perf_counter()
    server = engine.launch(spec_)
    try:
        engine.wait_ready(server)
        healthy = time.perf_counter() - started
        with httpx.Client(timeout=60.0) as client:
            answer = client.post(
                f"{server.url}/v1/chat/completions",
                json={
                    "model": spec_.alias,
                    "messages": [{"role": "user", "content": "Say yes."}],
                    "max_tokens": 1,
                },
            )
        answer.raise_for_status()
        return healthy, time.perf_counter() - started
    finally:
        engine.stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    files = models(engine.cache_dir())
    parts: dict[str, Any] = {}
    for i, backend in enumerate(BACKENDS):
        if backend.part == "embedding" or backend.part in parts:
            continue
        server_spec = spec(backend, files, seed=i)
        runs = [wake_once(server_spec) for _ in range(args.runs)]
        healthy = [h for h, _ in runs]
        answered = [a for _, a in runs]
        parts[backend.part] = {
            "model_mb": round(files[backend.part].stat().st_size / 1e6, 1),
            "to_health_s": _summary(healthy),
            "to_first_answer_s": _summary(answered),
        }
    document = {
        "model": MODEL,
        "runs": args.runs,
        "date": datetime.date.today().isoformat(),
        "parts": parts,
    }
    text = json.dumps(document, indent=2) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


if __name__ == "__main__":
    main()
