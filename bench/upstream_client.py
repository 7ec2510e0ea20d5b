"""Measure FastAPI proxies built on httpx, aiohttp and the gateway's client, instant upstream.

    python -m bench.upstream_client [--seconds 5] [--out bench/results/upstream_client.json]

The proxy runs pinned to core 0; the upstream and wrk share core 1. Reports requests per second
and p50/p99 latency at 1, 8 and 32 connections. Needs wrk (Debian package `wrk`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.client_proxy import CLIENTS

BODY = json.dumps(
    {"model": "llama-3.1-8b-instruct", "messages": [{"role": "user", "content": "hi"}]}
)
LUA = f"""wrk.method = "POST"
wrk.body = {json.dumps(BODY)}
wrk.headers["Content-Type"] = "application/json"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], core: int, port: int, path: str = "/") -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["taskset", "-c", str(core), *cmd])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1)
            return proc
        except urllib.error.HTTPError:
            return proc  # it answers: any status will do
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{cmd} did not start")


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(url: str, connections: int, seconds: int, script: str) -> dict[str, float]:
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            script,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": round(rps, 1),
        "p50_ms": round(_ms(*p50.groups()), 3),  # type: ignore[union-attr]
        "p99_ms": round(_ms(*p99.groups()), 3),  # type: ignore[union-attr]
        "non_2xx": int(errors.group(1)) if errors else 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/upstream_client.json")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    script = Path(tempfile.mkdtemp()) / "post.lua"
    script.write_text(LUA)
    up_port = free_port()
    upstream = start(
        [sys.executable, "-m", "bench.instant_upstream", "--port", str(up_port)], 1, up_port
    )
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for client in CLIENTS:
            port = free_port()
            proxy = start(
                [
                    sys.executable,
                    "-m",
                    "bench.client_proxy",
                    "--client",
                    client,
                    "--upstream",
                    f"http://127.0.0.1:{up_port}",
                    "--port",
                    str(port),
                ],
                0,
                port,
            )
            try:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                wrk(url, 8, 1, str(script))  # warm up
                results[client] = {
                    str(c): wrk(url, c, args.seconds, str(script)) for c in (1, 8, 32)
                }
            finally:
                proxy.terminate()
                proxy.wait()
    finally:
        upstream.terminate()
        upstream.wait()
    print(f"{'client':8} {'conns':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for client, rows in results.items():
        for conns, row in rows.items():
            print(
                f"{client:8} {conns:>5} {row['rps']:>9.0f} {row['p50_ms']:>8.2f} "
                f"{row['p99_ms']:>8.2f}"
            )
    for conns in ("1", "8", "32"):
        for client, against in (("aiohttp", "httpx"), ("gateway", "aiohttp")):
            ratio = results[client][conns]["rps"] / results[against][conns]["rps"]
            print(f"{client} / {against} throughput at {conns} connections: {ratio:.2f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
