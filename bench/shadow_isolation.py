"""Shadow isolation: does copying every request to a slow, failing candidate touch the primary?

Runs real processes on loopback: two simulated GPUs (the primary pool), one simulated CIM part
made slow and failing (the candidate), and the gateway (`python -m gateway serve`, pinned to
core 0; everything else on core 1). The same open-loop Poisson load is sent to a gateway whose
policy shadows nothing, and to one that shadows 100% of requests to the candidate, alternating
rounds so drift hits both alike. It reports the primary's p50/p99 latency in each mode, their
ratios, and the shadowing gateway's resident memory at the start and end of its load.

    python -m bench.shadow_isolation                 # 2 rounds x 20 s per mode, ~2 minutes
    python -m bench.shadow_isolation --seconds 5     # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.stats import percentile

ROOT = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-8b-instruct"
GATEWAY_CORE, OTHER_CORE = {0}, {1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cores: set[int]) -> Any:
    def pin() -> None:
        with contextlib.suppress(OSError):  # fewer cores than expected: run unpinned
            os.sched_setaffinity(0, cores)

    return pin


def wait_http(url: str, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def process(command: list[str], cores: set[int], env: dict | None = None) -> Iterator[Any]:
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=pinned(cores),
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def simulator(profile: str, port: int, seed: int, speed: float, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "simulator", "--profile", profile, "--host", "127.0.0.1",
        "--port", str(port), "--seed", str(seed), "--speed", str(speed), *extra,
    ]  # fmt: skip


def policy(gpu_ports: list[int], cim_port: int, shadow: bool) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    doc["pools"]["gpu"]["backends"] = [{"url": f"http://127.0.0.1:{p}"} for p in gpu_ports]
    doc["pools"]["cim"]["backends"] = [{"url": f"http://127.0.0.1:{cim_port}"}]
    route: dict[str, Any] = {
        "name": "chat",
        "match": {"models": [MODEL]},
        "pools": ["gpu"],
    }
    if shadow:
        route["shadow"] = [
            {
                "pool": "cim",
                "sample_rate": 1.0,
                "budget": {"max_concurrent": 4, "max_per_second": 1000, "max_slot_share": 1.0},
            }
        ]
    doc["routes"] = [route]
    for pool in doc["pools"].values():
        pool["power_metrics"] = None  # energy metering is not what is measured here
    return doc


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


async def load(url: str, rate: float, seconds: float, seed: int) -> list[float]:
    """Send Poisson arrivals at `rate`/s for `seconds`; return each answer's latency in ms."""
    rng = random.Random(seed)
    latencies: list[float] = []
    failures = 0
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Summarise the energy budget of a decode step."}],
        "max_tokens": 32,
        "temperature": 0,
    }
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(at: float) -> None:
            nonlocal failures
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            sent = time.perf_counter()
            async with session.post(url, json=body) as response:
                await response.read()
                if response.status != 200:
                    failures += 1
                    return
            latencies.append((time.perf_counter() - sent) * 1000)

        start, at, tasks = time.perf_counter() + 0.05, 0.0, []
        while at < seconds:
            tasks.append(asyncio.create_task(one(start + at)))
            at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    if failures:
        raise RuntimeError(f"{failures} primary requests failed")
    return latencies


def shadow_counters(metrics: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in metrics.splitlines():
        match = re.match(r"gateway_shadow_(sent|dropped|failed)_total\{(.*)\} (\S+)", line)
        if match:
            name, labels, value = match.groups()
            detail = re.search(r'(?:reason|code)="([^"]+)"', labels)
            key = name + (f":{detail.group(1)}" if detail else "")
            found[key] = found.get(key, 0) + float(value)
    return found


def run_mode(
    shadow: bool, gpu_ports: list[int], cim_port: int, args: argparse.Namespace, round_: int
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="shadow-bench-"))
    policy_path = workdir / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy(gpu_ports, cim_port, shadow)))
    port = free_port()
    env = {
        "DATABASE_URL": f"sqlite:///{workdir / 'gateway.db'}",
        "GATEWAY_POLICY": str(policy_path),
        "GATEWAY_LOG_LEVEL": "warning",
    }
    subprocess.run(
        [sys.executable, "-m", "gateway", "db", "upgrade"],
        cwd=ROOT,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
    )
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(port)]
    with process(command, GATEWAY_CORE, env) as gateway:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/healthz")
        url = base + "/v1/chat/completions"
        asyncio.run(load(url, args.rate, min(3.0, args.seconds), seed=99))  # warm up
        rss_start = rss_kib(gateway.pid)
        latencies = asyncio.run(load(url, args.rate, args.seconds, seed=round_))
        rss_end = rss_kib(gateway.pid)
        import urllib.request

        with urllib.request.urlopen(base + "/metrics") as response:
            counters = shadow_counters(response.read().decode())
    return {
        "shadow": shadow,
        "requests": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "rss_start_mib": round(rss_start / 1024, 1),
        "rss_end_mib": round(rss_end / 1024, 1),
        "shadow_counters": counters,
        "latencies": latencies,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="load per mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--speed", type=float, default=1.0, help="simulator speed-up")
    parser.add_argument("--out", default="bench/results/shadow_isolation.json")
    args = parser.parse_args()

    gpu_ports, cim_port = [free_port(), free_port()], free_port()
    with contextlib.ExitStack() as stack:
        for i, port in enumerate(gpu_ports):
            stack.enter_context(process(simulator("gpu", port, i + 1, args.speed), OTHER_CORE))
        # The candidate: ten times slower than its physics and failing half of its answers.
        stack.enter_context(
            process(
                simulator(
                    "cim", cim_port, 4, args.speed, "--slow-factor", "10", "--error-rate", "0.5"
                ),
                OTHER_CORE,
            )
        )
        for port in [*gpu_ports, cim_port]:
            wait_http(f"http://127.0.0.1:{port}/metrics")
        runs = []
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for shadow in order:
                run = run_mode(shadow, gpu_ports, cim_port, args, round_)
                runs.append(run)
                print(
                    f"round {round_ + 1} {'shadow 100%' if shadow else 'no shadow  '}: "
                    f"{run['requests']} requests, p50 {run['p50_ms']:.1f} ms, "
                    f"p99 {run['p99_ms']:.1f} ms, RSS {run['rss_start_mib']} -> "
                    f"{run['rss_end_mib']} MiB",
                    flush=True,
                )

    def pooled(shadow: bool) -> list[float]:
        return [v for r in runs if r["shadow"] is shadow for v in r["latencies"]]

    plain, shadowed = pooled(False), pooled(True)
    shadow_runs = [r for r in runs if r["shadow"]]
    summary = {
        "rate_per_s": args.rate,
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "speed": args.speed,
        "no_shadow": {
            "p50_ms": round(percentile(plain, 50), 2),
            "p99_ms": round(percentile(plain, 99), 2),
        },
        "shadow": {
            "p50_ms": round(percentile(shadowed, 50), 2),
            "p99_ms": round(percentile(shadowed, 99), 2),
        },
        "p50_ratio": round(percentile(shadowed, 50) / percentile(plain, 50), 3),
        "p99_ratio": round(percentile(shadowed, 99) / percentile(plain, 99), 3),
        "rss_growth_ratio": {
            mode: round(
                max(r["rss_end_mib"] / r["rss_start_mib"] for r in runs if r["shadow"] is shadow), 3
            )
            for mode, shadow in (("no_shadow", False), ("shadow", True))
        },
        "runs": [{k: v for k, v in r.items() if k != "latencies"} for r in runs],
    }
    print(
        f"\nprimary latency, shadow 100% / no shadow: p50 x{summary['p50_ratio']:.3f}, "
        f"p99 x{summary['p99_ratio']:.3f}"
    )
    growth = summary["rss_growth_ratio"]
    print(
        f"gateway RSS end / start of a run: no shadow x{growth['no_shadow']:.3f}, "
        f"shadow 100% x{growth['shadow']:.3f}"
    )
    print("shadow counters (last shadow run):", shadow_runs[-1]["shadow_counters"])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
