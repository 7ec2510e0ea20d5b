"""The hot path side by side: direct, this gateway (shadow 0% and 10%) and LiteLLM's proxy.

    python -m bench.hot_path                      # all paths, ~5 minutes; needs wrk
    python -m bench.hot_path --seconds 2 --paths direct,gateway,gateway-shadow10
    python -m bench.hot_path --profile            # py-spy on the gateway under load, no table

An instant upstream (bench/instant_upstream.py: a chat answer, or `--chunks` streamed events)
and wrk share core 1; each server under test runs on core 0. Every path is loaded with
non-streaming and streaming chat at 1, 8 and 64 connections; the paths other than LiteLLM's
are loaded in turn at each point, so drift in the machine's speed falls on them alike. Paths:

- direct: wrk straight to the upstream, the floor.
- gateway: `python -m gateway serve` with its full feature set: learned routing
  (`objective: min_cost` over two live pools), metrics, request records in SQLite, energy
  metering (the upstream's /metrics serves DCGM's counters and vLLM's load, as a GPU's does)
  and a shadow-only pool sampled at 0%.
- gateway-shadow10: the same with 10% of requests copied to the shadow pool.
- gateway-default (only when named in --paths): the gateway with the shipped policy's own
  routes (policies/default.yaml), every backend on the instant upstream: learned routing with
  exploration, 20% shadowed to CIM with semantic comparison, and the noise floor, as `make run`
  serves.
- relay (only when named in --paths): bench/relay.py, a bare ASGI app relaying through the
  gateway's upstream client; the floor of a proxy on this stack.
- gateway-redis (only when named in --paths): the gateway with REDIS_URL set (Redis on
  127.0.0.1:6379, or GATEWAY_BENCH_REDIS_URL), so slots, ejections and budgets are shared.
- litellm: LiteLLM's proxy (`litellm[proxy]==1.93.0` in its own virtual environment, created
  on first use in bench/.litellm-venv), one worker, no database, access log off.

Reports requests per second, p50/p99/p99.9 latency, the latency added over direct, the server's
CPU time per request (steadier than throughput on a busy machine; the serving process's share
apart), each server's peak resident memory (VmHWM; a gateway's serving process apart from its
writer and trainer), and for a gateway the stalls its loop-lag probe and collector timing saw,
as a table, ratios (each gateway's latency over the bare relay's, run by run, with `--runs N`
as the median and range of N side-by-side runs), the targets, and JSON.

    python -m bench.hot_path --paths direct,relay,gateway,gateway-shadow10 --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from bench.upstream_client import _ms, free_port

ROOT = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-8b-instruct"
SERVER_CORE, LOAD_CORE = 0, 1
LITELLM_VERSION = "1.93.0"  # the orientation figures; never 1.82.7, 1.82.8 or 1.107.0
PATHS = ("direct", "gateway", "gateway-shadow10", "litellm")
# Run only when asked: the gateway with its slots, ejections and budgets shared through Redis.
REDIS_PATH = "gateway-redis"
REDIS_URL = os.environ.get("GATEWAY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# Run only when asked: the gateway with the shipped policy's routes, shadows and noise floor.
DEFAULT_PATH = "gateway-default"
# Run only when asked: a bare relay (bench/relay.py), the floor of a proxy on this stack.
RELAY_PATH = "relay"
MODES = ("chat", "stream")
CHAT = "/v1/chat/completions"
CONNECTIONS = (1, 8, 64)


def wrk_script(stream: bool) -> str:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(body))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        'wrk.headers["Authorization"] = "Bearer sk-bench"\n'
        # wrk prints 50/75/90/99; the tail past the p99 is what stalls show in.
        "done = function(summary, latency, requests)\n"
        '  io.write(string.format("p999_us %d\\n", latency:percentile(99.9)))\n'
        "end\n"
    )


def wrk(
    url: str, connections: int, seconds: int, script: str, cores: str | None = None
) -> dict[str, Any]:
    """Load `url` with wrk pinned to `cores` (the load core unless given); return req/s,
    p50/p99 ms and failures."""
    command = [
        "taskset", "-c", cores or str(LOAD_CORE), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s",
        "--timeout", "10s", "--latency", "-s", script, url,
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    p999 = re.search(r"p999_us (\d+)", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    counts = map(int, socket.groups()) if socket else (0, 0, 0, 0)
    errors = dict(zip(("connect", "read", "write", "timeout"), counts, strict=True))
    return {
        "rps": round(float(rps.group(1)), 1) if rps else 0.0,
        "p50_ms": round(_ms(*p50.groups()), 3) if p50 else 0.0,
        "p99_ms": round(_ms(*p99.groups()), 3) if p99 else 0.0,
        "p999_ms": round(int(p999.group(1)) / 1000, 3) if p999 else 0.0,
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": sum(errors.values()),
        # A read error is a connection the server closed, a timeout a request it left
        # unanswered for wrk's --timeout.
        "socket_error_kinds": errors,
    }


def pin(core: int) -> Any:
    def set_affinity() -> None:
        with contextlib.suppress(OSError):  # fewer cores than expected: run unpinned
            os.sched_setaffinity(0, {core})

    return set_affinity


@contextlib.contextmanager
def server(
    command: list[str], core: int, ready_url: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` pinned to `core` until the block ends; wait until `ready_url` answers."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env or dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=pin(core),
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(ready_url, timeout=2):
                    break
            except urllib.error.HTTPError:
                break  # it answers: any status will do
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"{command[:3]} did not start:\n{tail}") from None
                time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def process_tree(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                pids += [int(p) for p in task.read_text().split()]
        i += 1
    return pids


def cpu_s(pid: int, children: bool = True) -> float:
    """Return the CPU time (user + system) a process and its children have used, in seconds."""
    total = 0
    for p in process_tree(pid) if children else [pid]:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: every thread's
    return total / os.sysconf("SC_CLK_TCK")


def kernel_s(pid: int) -> float:
    """Return the CPU time a process (every thread of it) has spent in the kernel, in seconds."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[12]) / os.sysconf("SC_CLK_TCK")  # stime
    return 0.0


def memory_mib(pid: int, field: str, children: bool = True) -> float:
    """Sum `field` (VmRSS now, VmHWM the peak) over a process and its children, in MiB."""
    total = 0
    for p in process_tree(pid) if children else [pid]:
        with contextlib.suppress(OSError, AttributeError):
            status = Path(f"/proc/{p}/status").read_text()
            total += int(re.search(rf"{field}:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return round(total / 1024, 1)


def bench_policy(upstream: str, shadow_rate: float | None) -> dict[str, Any]:
    """The default policy with every backend on the instant upstream and one learned route
    shadowed at `shadow_rate`, or with the shipped routes when `shadow_rate` is None."""
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    for pool in doc["pools"].values():
        pool["backends"] = [{"url": upstream}]
        pool["slots_per_backend"] = 1000  # never queue: admission is not what is measured
    if shadow_rate is None:
        return doc
    doc["routes"] = [
        {
            "name": "chat",
            "match": {"models": [MODEL]},
            "pools": ["asic", "gpu"],
            "fallback": "gpu",
            "objective": "min_cost",
            "shadow": [
                {
                    "pool": "cim",
                    "sample_rate": shadow_rate,
                    "budget": {
                        "max_concurrent": 64,
                        "max_per_second": 100000,
                        "max_slot_share": 1.0,
                    },
                }
            ],
        }
    ]
    return doc


@contextlib.contextmanager
def gateway(
    upstream: str, shadow_rate: float | None, redis_url: str | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    work = Path(tempfile.mkdtemp(prefix="hot-path-"))
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump(bench_policy(upstream, shadow_rate)))
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{work / 'gateway.db'}",
        "GATEWAY_POLICY": str(policy),
        "GATEWAY_LOG_LEVEL": "warning",
    }
    env.pop("REDIS_URL", None)
    env.pop("GATEWAY_ADMIN_TOKEN", None)
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
        env["GATEWAY_REDIS_PREFIX"] = f"hot-path-{os.getpid()}"
    subprocess.run(
        [sys.executable, "-m", "gateway", "db", "upgrade"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(port)]
    try:
        with server(command, SERVER_CORE, base + "/healthz", env) as proc:
            yield proc, base
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def instant_upstream(*flags: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Run bench/instant_upstream.py with `flags` on the load core; yield it and its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "bench.instant_upstream", "--port", str(port), *flags]
    with server(command, LOAD_CORE, url + "/") as proc:
        yield proc, url


@contextlib.contextmanager
def relay(upstream: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "bench.relay", "--upstream", upstream, "--port", str(port)]
    with server(command, SERVER_CORE, base + "/healthz") as proc:
        yield proc, base


def litellm_binary(venv: Path) -> Path:
    """Return LiteLLM's CLI in `venv`, creating the environment with the pinned proxy first."""
    binary = venv / "bin" / "litellm"
    if not binary.exists():
        print(f"installing litellm[proxy]=={LITELLM_VERSION} into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", f"litellm[proxy]=={LITELLM_VERSION}"],
            check=True,
        )
    return binary


@contextlib.contextmanager
def litellm(upstream: str, venv: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    binary = litellm_binary(venv)
    work = Path(tempfile.mkdtemp(prefix="hot-path-litellm-"))
    config = work / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": f"openai/{MODEL}",
                            "api_base": upstream + "/v1",
                            "api_key": "sk-bench",
                        },
                    }
                ],
                "litellm_settings": {"set_verbose": False, "telemetry": False},
            }
        )
    )
    log_config = work / "logging.json"
    log_config.write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "root": {"level": "WARNING"},
                "loggers": {
                    "uvicorn.access": {"level": "WARNING", "propagate": False},
                    "uvicorn.error": {"level": "WARNING"},
                },
            }
        )
    )
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list at start
        "LITELLM_TELEMETRY": "False",
    }
    for name in ("DATABASE_URL", "REDIS_URL", "LITELLM_MASTER_KEY"):
        env.pop(name, None)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
        "--num_workers", "1", "--log_config", str(log_config),
    ]  # fmt: skip
    try:
        with server(command, SERVER_CORE, base + "/health/liveliness", env) as proc:
            yield proc, base
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scrape(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
        return str(response.read().decode())


def stall_counts(base: str) -> dict[str, float]:
    """Read the gateway's loop-lag histogram (how many timer rounds ran more than each bound
    late, as "over_5ms") and its collections past the youngest (count and seconds paused)."""
    buckets: dict[float, float] = {}
    found: dict[str, float] = {}
    for line in scrape(base).splitlines():
        match = re.match(r'gateway_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)', line)
        if match:
            buckets[float(match.group(1))] = float(match.group(2))
        match = re.match(r'gateway_gc_pause_seconds_(count|sum)\{generation="(\d)"\} (\S+)', line)
        if match:
            kind, generation, value = match.groups()
            name = f"gc{generation}_{'collections' if kind == 'count' else 'paused_s'}"
            found[name] = float(value)
    total = buckets.get(float("inf"), 0.0)
    # Buckets hold rounds up to `le`; what ran later than the bucket below is total minus it.
    for le, n in sorted(buckets.items()):
        if le != float("inf"):
            found[f"over_{le * 1000:g}ms"] = total - n
    return found


def stalls(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What one point added to each of stall_counts' figures."""
    return {key: round(value - before.get(key, 0.0), 4) for key, value in after.items()}


def worst_stall(stalls: dict[str, float]) -> str:
    """Say how late the loop ran at worst, as the loop-lag histogram's buckets bound it."""
    bounds = sorted(float(k[5:-2]) for k in stalls if k.startswith("over_") and k.endswith("ms"))
    late = [b for b in bounds if stalls[f"over_{b:g}ms"] > 0]
    if not late:
        return f"<{bounds[0]:g} ms" if bounds else "-"
    above = [b for b in bounds if b > late[-1]]
    return f"{late[-1]:g}-{above[0]:g} ms" if above else f">{late[-1]:g} ms"


def shadow_copies(base: str) -> dict[str, float]:
    text = scrape(base)
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"gateway_shadow_(sent|dropped|failed)_total(?:\{.*\})? (\S+)", line)
        if match:
            found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
    return found


@contextlib.contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """Stop these servers for the block, then let them go on.

    A server idling beside the one being measured still runs its timers (health checks,
    scrapes, writer rounds) on the same core, which shows in the measured server's p99.
    """
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if pids:
            time.sleep(0.3)  # their overdue timers run now, not during the next point


def measure_paths(
    targets: dict[str, tuple[int, str]], args: argparse.Namespace, scripts: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Load each path (name: server pid, base URL) at every point, the paths in turn per point.

    Taking the paths point by point, rather than one after the other, puts any drift in the
    machine's speed on all of them alike, so their ratios are measured side by side; the
    servers not being measured are stopped meanwhile (paused). With `args.runs` > 1 every point
    is measured that many times in turn, and each figure is the median, with every run kept.
    """
    rows: dict[str, dict[str, Any]] = {name: {} for name in targets}
    for name, (pid, base) in targets.items():
        for mode in args.modes:
            # Warm caches, pools and the learned model; a proxy may answer its health check
            # before it serves requests, so wait until it does.
            for _ in range(15):
                if wrk(base + CHAT, 8, args.warmup, scripts[mode])["rps"] > 0:
                    break
        rows[name]["rss_start_mib"] = memory_mib(pid, "VmRSS")
    for run in range(args.runs):
        for mode in args.modes:
            for connections in args.connections:
                for name in targets:
                    point = measure_point(name, targets, args, scripts[mode], connections)
                    runs = rows[name].setdefault(mode, {}).setdefault(str(connections), [])
                    runs.append(point)
                    print(
                        f"  {f'run {run + 1}' if args.runs > 1 else '':5} {name:17} {mode:6} "
                        f"{connections:>3} conns: {point['rps']:>9.0f} req/s  "
                        f"p50 {point['p50_ms']:.3f}  p99 {point['p99_ms']:.3f}  "
                        f"p99.9 {point['p999_ms']:.3f} ms",
                        flush=True,
                    )
                    if point["non_2xx"] or point["socket_errors"]:
                        print(f"  {name} failed some requests: {point}", flush=True)
    for name, (pid, base) in targets.items():
        for mode in args.modes:
            for conns, runs in rows[name][mode].items():
                rows[name][mode][conns] = {**median_point(runs), "runs": runs}
        rows[name]["rss_end_mib"] = memory_mib(pid, "VmRSS")
        rows[name]["peak_rss_mib"] = memory_mib(pid, "VmHWM")
        # The serving process apart from the processes it starts (records writer, trainer).
        rows[name]["serving_peak_rss_mib"] = memory_mib(pid, "VmHWM", children=False)
        rows[name]["helpers_peak_rss_mib"] = round(
            rows[name]["peak_rss_mib"] - rows[name]["serving_peak_rss_mib"], 1
        )
        if name.startswith("gateway"):
            rows[name]["shadow_copies"] = shadow_copies(base)
    return rows


def measure_point(
    name: str,
    targets: dict[str, tuple[int, str]],
    args: argparse.Namespace,
    script: str,
    connections: int,
) -> dict[str, Any]:
    """Load one path at one point with the other servers paused; return wrk's figures, the
    CPU per request (all of it, and the serving process's) and, for the gateway, its stalls."""
    pid, base = targets[name]
    # direct's server is the upstream, which every path needs.
    idle = [p for other, (p, _) in targets.items() if other not in (name, "direct")]
    gateway = name.startswith("gateway")
    with paused(idle):
        lag = stall_counts(base) if gateway else {}
        used, serving, kernel = cpu_s(pid), cpu_s(pid, children=False), kernel_s(pid)
        point = wrk(base + CHAT, connections, args.seconds, script)
        used, serving = cpu_s(pid) - used, cpu_s(pid, children=False) - serving
        kernel = kernel_s(pid) - kernel
        if gateway:
            point["loop_stalls"] = stalls(lag, stall_counts(base))
            point["worst_stall"] = worst_stall(point["loop_stalls"])
    # CPU per request moves far less than throughput when the machine is not quiet.
    served = point["rps"] * args.seconds
    point["cpu_us_per_req"] = round(used * 1e6 / served) if served else 0
    point["serving_cpu_us_per_req"] = round(serving * 1e6 / served) if served else 0
    # Of it, the kernel's (socket reads and writes, wake-ups): the rest is the interpreter's.
    point["serving_kernel_us_per_req"] = round(kernel * 1e6 / served) if served else 0
    return point


def median_point(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over runs, with the range of the latencies and throughput."""
    point: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, int | float):
            values = sorted(run[key] for run in runs)
            point[key] = statistics.median(values)
            if key in ("rps", "p50_ms", "p99_ms", "p999_ms"):
                point[f"{key}_range"] = [values[0], values[-1]]
        elif isinstance(value, dict):
            point[key] = {k: statistics.median(run[key][k] for run in runs) for k in value}
    if "loop_stalls" in point:
        # The worst of every run, not their median: one stall is one too many.
        point["loop_stalls_worst_run"] = {
            k: max(run["loop_stalls"][k] for run in runs) for k in point["loop_stalls"]
        }
        point["worst_stall"] = worst_stall(point["loop_stalls_worst_run"])
    return point


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every path in `args.paths` against one instant upstream; return the results.

    Every path but LiteLLM's runs at once and is measured side by side (measure_paths);
    LiteLLM's proxy, whose background work would load the server core, runs alone after them.
    """
    work = Path(tempfile.mkdtemp(prefix="hot-path-wrk-"))
    scripts = {}
    for mode in MODES:
        scripts[mode] = str(work / f"{mode}.lua")
        Path(scripts[mode]).write_text(wrk_script(mode == "stream"))
    results: dict[str, Any] = {
        "seconds": args.seconds,
        "runs": args.runs,
        "chunks": args.chunks,
        "connections": list(args.connections),
        "load_average_at_start": list(os.getloadavg()),  # other work on the machine skews all
        "paths": {},
    }
    try:
        with instant_upstream("--chunks", str(args.chunks)) as (up, upstream):
            with contextlib.ExitStack() as stack:
                together: dict[str, tuple[int, str]] = {}
                for name in args.paths:
                    if name == "direct":
                        together[name] = (up.pid, upstream)
                    elif name == RELAY_PATH:
                        proc, base = stack.enter_context(relay(upstream))
                        together[name] = (proc.pid, base)
                    elif name != "litellm":
                        shadow = {"gateway-shadow10": 0.1, DEFAULT_PATH: None}.get(name, 0.0)
                        redis = REDIS_URL if name == REDIS_PATH else None
                        proc, base = stack.enter_context(gateway(upstream, shadow, redis))
                        together[name] = (proc.pid, base)
                results["paths"].update(measure_paths(together, args, scripts))
            if "litellm" in args.paths:
                with litellm(upstream, Path(args.litellm_venv)) as (proc, base):
                    results["paths"].update(
                        measure_paths({"litellm": (proc.pid, base)}, args, scripts)
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    add_comparisons(results)
    return results


def add_comparisons(results: dict[str, Any]) -> None:
    """Add the latency each path adds over direct and the ratios issue #10 sets targets for."""
    paths = results["paths"]
    floor = paths.get("direct")
    for name, row in paths.items():
        if floor is None or name == "direct":
            continue
        for mode in MODES:
            for conns, point in row.get(mode, {}).items():
                base = floor.get(mode, {}).get(conns)
                if base:
                    point["added_p50_ms"] = round(point["p50_ms"] - base["p50_ms"], 3)
                    point["added_p99_ms"] = round(point["p99_ms"] - base["p99_ms"], 3)

    def rps(name: str, mode: str, conns: int) -> float | None:
        point = paths.get(name, {}).get(mode, {}).get(str(conns))
        return None if point is None else float(point["rps"])

    ratios: dict[str, float] = {}
    for mode in MODES:
        for conns in results["connections"]:
            pairs = {
                f"gateway/litellm {mode} @{conns}": ("gateway", "litellm"),
                f"gateway/direct {mode} @{conns}": ("gateway", "direct"),
                f"shadow10/shadow0 {mode} @{conns}": ("gateway-shadow10", "gateway"),
                f"redis/local {mode} @{conns}": (REDIS_PATH, "gateway"),
                f"gateway/relay {mode} @{conns}": ("gateway", RELAY_PATH),
            }
            for label, (a, b) in pairs.items():
                num, den = rps(a, mode, conns), rps(b, mode, conns)
                if num is not None and den:
                    ratios[label] = round(num / den, 3)
    results["ratios"] = ratios
    results["tail_ratios"] = tail_ratios(results)


def tail_ratios(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each gateway path's latency over the bare relay's, run by run (side by side), as the
    median and range over runs: p50, p99 and p99.9, chat and stream, at every point."""
    paths = results["paths"]
    relay = paths.get(RELAY_PATH)
    found: dict[str, dict[str, Any]] = {}
    if relay is None:
        return found
    for name in ("gateway", "gateway-shadow10", DEFAULT_PATH):
        for mode in MODES:
            for conns, point in paths.get(name, {}).get(mode, {}).items():
                base = relay.get(mode, {}).get(conns)
                if base is None:
                    continue
                for key in ("p50_ms", "p99_ms", "p999_ms"):
                    each = sorted(
                        round(run[key] / floor[key], 2)
                        for run, floor in zip(point["runs"], base["runs"], strict=True)
                        if floor[key]
                    )
                    if each:
                        label = f"{name}/relay {key[:-3]} {mode} @{conns}"
                        found[label] = {
                            "median": statistics.median(each),
                            "range": [each[0], each[-1]],
                        }
    return found


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Check the targets this run measured: (target, measured, met)."""
    checks: list[tuple[str, str, bool]] = []
    paths, ratios = results["paths"], results["ratios"]
    for conns in (8, 64):
        label = f"gateway/litellm chat @{conns}"
        if label in ratios:
            checks.append(
                (f"throughput >= 15x LiteLLM @{conns}", f"{ratios[label]}x", ratios[label] >= 15)
            )
    gw = paths.get("gateway", {}).get("chat", {})
    if "added_p50_ms" in gw.get("1", {}):
        added = gw["1"]["added_p50_ms"]
        checks.append(("added p50 <= 0.3 ms @1", f"{added:.3f} ms", added <= 0.3))
    if "added_p99_ms" in gw.get("8", {}):
        added = gw["8"]["added_p99_ms"]
        checks.append(("added p99 <= 1.5 ms @8", f"{added:.3f} ms", added <= 1.5))
    for name in ("gateway", "gateway-shadow10"):
        if name in paths:
            peak = paths[name]["serving_peak_rss_mib"]
            helpers = paths[name]["helpers_peak_rss_mib"]
            checks.append(
                (
                    f"{name} serving process peak RSS <= 150 MiB",
                    f"{peak} MiB (+{helpers} MiB in its writer and trainer)",
                    peak <= 150,
                )
            )
    tails = results.get("tail_ratios", {})
    for mode in MODES:
        for conns in (1, 8):
            label = f"gateway/relay p99 {mode} @{conns}"
            if label in tails:
                ratio = tails[label]
                low, high = ratio["range"]
                checks.append(
                    (
                        f"p99 <= 2x the bare relay's, {mode} @{conns}",
                        f"{ratio['median']}x ({low}-{high})",
                        ratio["median"] <= 2,
                    )
                )
    for mode in MODES:
        for conns, point in paths.get("gateway", {}).get(mode, {}).items():
            if int(conns) > 8 or "loop_stalls" not in point:
                continue
            worst = point.get("loop_stalls_worst_run", point["loop_stalls"])
            late = worst.get("over_5ms", 0)
            checks.append(
                (
                    f"no loop stall over 5 ms, {mode} @{conns}",
                    f"{late:g} stalls, worst {point['worst_stall']}",
                    late == 0,
                )
            )
    for conns in (8, 64):
        label = f"shadow10/shadow0 chat @{conns}"
        if label in ratios:
            cost = 1 - ratios[label]
            checks.append(
                (f"10% shadow costs <= 15% throughput @{conns}", f"{cost:.1%}", cost <= 0.15)
            )
    return checks


def print_report(results: dict[str, Any]) -> None:
    print(
        f"\n{'path':17} {'mode':6} {'conns':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'p99.9 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} {'CPU us/req':>10} {'stalls >5ms':>11} "
        f"{'worst stall':>11} {'peak RSS MiB':>12}"
    )
    for name, row in results["paths"].items():
        for mode in MODES:
            for conns, p in row.get(mode, {}).items():
                added50 = f"{p['added_p50_ms']:.3f}" if "added_p50_ms" in p else "-"
                added99 = f"{p['added_p99_ms']:.3f}" if "added_p99_ms" in p else "-"
                lagged = p.get("loop_stalls_worst_run", p.get("loop_stalls", {})).get("over_5ms")
                print(
                    f"{name:17} {mode:6} {conns:>5} {p['rps']:>9.0f} {p['p50_ms']:>8.3f} "
                    f"{p['p99_ms']:>8.3f} {p['p999_ms']:>8.3f} {added50:>8} {added99:>8} "
                    f"{p['cpu_us_per_req']:>10} {'-' if lagged is None else f'{lagged:g}':>11} "
                    f"{p.get('worst_stall', '-'):>11} {row['peak_rss_mib']:>12}"
                )
    print("\nratios (throughput, same run):")
    for label, value in results["ratios"].items():
        print(f"  {label:32} {value:.3f}x")
    if results.get("tail_ratios"):
        runs = results["runs"]
        print(f"\nlatency over the bare relay's, side by side (median and range of {runs} runs):")
        for label, ratio in results["tail_ratios"].items():
            low, high = ratio["range"]
            print(f"  {label:36} {ratio['median']:.2f}x ({low:.2f}-{high:.2f})")
    checks = targets(results)
    if checks:
        print("\ntargets:")
        for target, measured, met in checks:
            print(f"  {'met    ' if met else 'NOT met'}  {target:44} {measured}")
        # wrk times whole streams; the per-chunk target is measured chunk by chunk there.
        print("  (each streamed chunk <= 1 ms added at p99: python -m bench.chunk_latency)")


def summarise_profile(raw: Path, top: int) -> dict[str, Any]:
    """Read py-spy's folded stacks; return the top functions by own and by inclusive samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        by_package[package_of(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * n / total, 1)) for f, n in counter.most_common(top)]

    return {
        "samples": total,
        "own_pct_by_package": share(by_package),
        "own_pct": share(own),
        "inclusive_pct": share(inclusive),
    }


def package_of(frame: str) -> str:
    """Name the package (or gateway module) a py-spy frame `function (path/file.py)` is in."""
    path = frame[frame.rfind("(") + 1 : -1]
    parts = path.split("/")
    if parts[0] == "gateway":
        return path
    if parts[0] in ("asyncio", "concurrent", "threading.py", "selectors.py", "<frozen runpy>"):
        return f"stdlib {parts[0]}"
    return parts[0]


def profile(args: argparse.Namespace) -> int:
    """Record the shadow-10% gateway with py-spy under 8 connections of non-streaming chat."""
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        print(f"py-spy is not installed next to {sys.executable}", file=sys.stderr)
        return 2
    out = Path(args.out).with_suffix(".pyspy.txt")
    script = Path(tempfile.mkdtemp(prefix="hot-path-wrk-")) / "chat.lua"
    script.write_text(wrk_script(args.profile_mode == "stream"))
    with (
        instant_upstream() as (_, upstream),
        gateway(upstream, 0.1) as (proc, base),
    ):
        url = base + "/v1/chat/completions"
        wrk(url, 8, args.warmup, str(script))
        record = [
            str(py_spy), "record", "-p", str(proc.pid), "-d", str(args.seconds + 1),
            "-r", str(args.rate), "-f", "raw", "-o", str(out), "--nonblocking",
        ]  # fmt: skip
        recorder = subprocess.Popen(record, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        point = wrk(url, 8, args.seconds, str(script))
        recorder.wait(60)
    summary = summarise_profile(out, args.top)
    print(f"gateway under py-spy: {point['rps']:.0f} req/s; {summary['samples']} samples")
    titles = (("own time, by package", "own_pct_by_package"), ("own time", "own_pct"))
    for title, key in (*titles, ("inclusive", "inclusive_pct")):
        print(f"\ntop {args.top} by {title}:")
        for frame, pct in summary[key]:
            print(f"  {pct:5.1f}%  {frame}")
    print(f"\nfolded stacks: {out}")
    Path(args.out).with_suffix(".profile.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per point")
    parser.add_argument("--runs", type=int, default=1, help="side-by-side runs of every point")
    parser.add_argument("--warmup", type=int, default=2, help="wrk warm-up per path and mode")
    parser.add_argument("--chunks", type=int, default=16, help="events per streamed answer")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset")
    parser.add_argument("--modes", default=",".join(MODES), help="chat, stream or both")
    parser.add_argument("--connections", default="1,8,64")
    parser.add_argument("--litellm-venv", default=str(ROOT / "bench" / ".litellm-venv"))
    parser.add_argument("--out", default="bench/results/hot_path.json")
    parser.add_argument("--profile", action="store_true", help="py-spy the gateway instead")
    parser.add_argument("--profile-mode", choices=MODES, default="chat")
    parser.add_argument("--top", type=int, default=25, help="functions listed by --profile")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    known = (*PATHS, REDIS_PATH, RELAY_PATH, DEFAULT_PATH)
    unknown = sorted(set(args.paths) - set(known))
    if unknown:
        parser.error(f"unknown paths {unknown} (paths: {', '.join(known)})")
    args.modes = [m for m in args.modes.split(",") if m]
    args.connections = [int(c) for c in args.connections.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like an exception: paused servers go on and every server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    if args.profile:
        return profile(args)
    results = run(args)
    print_report(results)
    results["targets"] = [{"target": t, "measured": m, "met": ok} for t, m, ok in targets(results)]
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
