"""Soak: minutes of steady traffic, shadowed and faulted, then a count of everything left behind.

Runs real processes on loopback: the simulated fleet of policies/default.yaml (two GPUs, the 70B
model's GPU backend, an ASIC card, a CIM part; harness/simulators.py) and one or two `gateway
serve` processes (harness/gateways.py) on that policy with every shadow target sampled at 10%. Two
replicas share Redis (and, given `--database-url`, PostgreSQL, in a schema of their own that is
dropped after). An open loop sends chat at a steady rate, alternating between replicas: 8B and 70B,
short and long prompts, half of them streamed. Every minute one backend gets a fault for 15 s
through the simulator's `/admin/faults`, in turn: streams dropped mid-answer (ASIC), 5xx
(ASIC), a hang (a GPU), slowness (ASIC), refused connections (the other GPU).

Every client-visible error is classified. Expected is only what a fault must cause: a stream
cut mid-answer by a drop fault on the backend serving it, which ends with an OpenAI-style
error event. Anything else is unexpected. Once the load stops, it checks:

- no unexpected client-visible error;
- each gateway's RSS flat: median of the first minute against the last, growth within bounds;
- no slot held: every backend's in-flight count 0 in each gateway's /metrics and on the
  simulators, and with Redis no lease left under the prefix;
- one request record per request sent, and the records' failures the ones clients saw;
- one shadow record per shadow copy sent;
- no exception in the gateways' logs.

It prints a table, writes JSON and exits 1 when a check fails.

    python -m bench.soak                                     # 1 replica, SQLite, 300 s at 15/s
    python -m bench.soak --replicas 2 --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test
    python -m bench.soak --seconds 40 --fault-every 15 --fault-seconds 6   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from random import Random
from typing import Any

import httpx
import orjson
import redis
import sqlalchemy as sa
import yaml

from gateway.db.schema import request_records, shadow_records
from gateway.stats import percentile
from harness.databases import scratch_database
from harness.gateways import GatewayProcess, gateway_process
from harness.metrics import metric_value, parse_metrics
from harness.simulators import SimulatorProcess, start_simulator

ROOT = Path(__file__).resolve().parent.parent
SMALL, BIG = "llama-3.1-8b-instruct", "llama-3.1-70b-instruct"
REDIS_URL = "redis://127.0.0.1:6379/0"

# The default policy's backends, by the names the soak's policy gives them (POOL-INDEX):
# (profile, seed, simulator flags).
FLEET: dict[str, tuple[str, int, list[str]]] = {
    "gpu-0": ("gpu", 1, []),
    "gpu-1": ("gpu", 2, []),
    "gpu-70b-0": ("gpu", 5, ["--models", BIG]),
    "asic-0": ("asic", 3, []),
    "cim-0": ("cim", 4, []),
}

OK, EXPECTED, UNEXPECTED = "ok", "expected", "unexpected"


@dataclass(frozen=True)
class FaultKind:
    """A fault the soak injects: its name, the backend it hits and the simulator's fields."""

    name: str
    backend: str
    fields: dict[str, Any]


# In turn, one a period. Only `drop` may be seen by a client: a stream already relayed cannot
# be retried. The others are retried on another backend before the first byte.
FAULTS = (
    FaultKind("drop", "asic-0", {"drop_after_tokens": 3}),
    FaultKind("5xx", "asic-0", {"error_rate": 1.0}),
    FaultKind("hang", "gpu-0", {"hang": True}),
    FaultKind("slow", "asic-0", {"slow_factor": 4.0}),
    FaultKind("refuse", "gpu-1", {"refuse": True}),
)


@dataclass(frozen=True)
class Soak:
    """What to run: load, faults, replicas, stores, and the bounds the checks hold it to."""

    seconds: float = 300.0
    rate: float = 15.0
    replicas: int = 1
    database_url: str | None = None  # None: a SQLite file in the work directory
    redis_url: str = REDIS_URL  # used with two replicas
    shadow_rate: float = 0.1
    stream_share: float = 0.5
    fault_every_s: float = 60.0
    fault_s: float = 15.0
    first_fault_s: float = 20.0
    warmup_s: float = 10.0  # load before the measured span: counted, but no faults or RSS windows
    rss_every_s: float = 5.0
    rss_window_s: float = 60.0
    max_rss_growth_pct: float = 10.0
    drain_timeout_s: float = 45.0
    speed: float = 1.0  # the simulators' speed-up
    seed: int = 0


@dataclass
class FaultWindow:
    """A fault as injected: when it was on and off (seconds from the measured start), its hits."""

    kind: str
    backend: str
    on_s: float
    off_s: float = 0.0
    hits: float = 0.0  # what the simulator counted injecting it


@dataclass
class Outcome:
    """What the client saw of one request."""

    index: int
    replica: int
    model: str
    stream: bool
    sent_s: float
    ended_s: float = 0.0
    status: int | None = None
    backend: str | None = None
    route: str | None = None
    done: bool = False  # a whole answer: [DONE] for a stream, a choice for a plain answer
    tokens: int = 0
    error_event: dict[str, Any] | None = None  # the stream's `data: {"error": ...}`
    problem: str | None = None  # what else went wrong, for the report
    verdict: str = ""
    reason: str = ""
    fault: int | None = None  # the fault window that explains an expected error


@dataclass
class Check:
    """One promise held against a soak's result: whether it held, and the numbers that say so."""

    name: str
    ok: bool
    detail: str


@dataclass
class Deployment:
    """The running simulators and gateways of one soak."""

    sims: dict[str, SimulatorProcess]
    gateways: list[GatewayProcess]
    logs: list[Path]
    database_url: str
    redis_prefix: str | None
    redis_url: str | None


def fault_plan(soak: Soak) -> list[tuple[float, float, FaultKind]]:
    """Return (on, off, fault) for every fault that fits in the measured span, in turn."""
    plan = []
    at, i = soak.first_fault_s, 0
    while at + soak.fault_s <= soak.seconds:
        plan.append((at, at + soak.fault_s, FAULTS[i % len(FAULTS)]))
        at += soak.fault_every_s
        i += 1
    return plan


SHORT_PROMPTS = (
    "Summarise the energy budget of a decode step.",
    "Explain KV-cache paging in two sentences.",
    "Why is a warm GPU cheap at the margin?",
    "List three failure modes of analog compute-in-memory.",
    "What does an ASIC inference card trade away for efficiency?",
    "Describe how a load balancer ejects a failing backend.",
)
LONG_PROMPT = " ".join(
    f"Paragraph {i}: the fleet mixes GPUs, ASIC cards and compute-in-memory parts, and every "
    "decision is made from measured cost per watt rather than from a static table."
    for i in range(70)
)  # about 3,000 tokens: the 8B route for long prompts, served by GPUs


def request_body(rng: Random, stream: bool) -> dict[str, Any]:
    """Return one chat request of the soak's mix."""
    if rng.random() < 0.2:
        model, prompt, max_tokens = BIG, rng.choice(SHORT_PROMPTS), rng.randint(8, 32)
    else:
        long = rng.random() < 0.1
        model = SMALL
        prompt = LONG_PROMPT if long else rng.choice(SHORT_PROMPTS)
        max_tokens = rng.randint(16, 96)
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": rng.choice((0, 0.7)),
    }
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return body


def judge(outcome: Outcome, faults: Sequence[FaultWindow], grace_s: float = 1.0) -> None:
    """Say whether what a client saw is a whole answer, an error a fault must cause, or neither.

    The only expected error: a stream that started, was cut before [DONE] and ended with an
    OpenAI-style error event, served by a backend under a drop fault while it ran.
    """
    outcome.verdict, outcome.reason, outcome.fault = UNEXPECTED, "", None
    if outcome.done and outcome.status == 200 and outcome.error_event is None:
        outcome.verdict = OK
    elif outcome.stream and outcome.status == 200 and outcome.error_event is not None:
        for i, fault in enumerate(faults):
            if (
                fault.kind == "drop"
                and fault.backend == outcome.backend
                and outcome.sent_s <= fault.off_s + grace_s
                and outcome.ended_s >= fault.on_s - grace_s
            ):
                outcome.verdict, outcome.fault = EXPECTED, i
                outcome.reason = f"stream cut mid-answer by the drop fault on {fault.backend}"
                return
        message = str(outcome.error_event.get("message", ""))[:120]
        outcome.reason = f"stream ended with an error event, no drop fault on it: {message}"
    else:
        outcome.reason = outcome.problem or f"status {outcome.status}, answer incomplete"


def rss_summary(samples: Sequence[tuple[float, float]], seconds: float, window_s: float) -> dict:
    """Compare the median RSS (MiB) of the first window of the span with that of the last."""
    window = min(window_s, seconds / 3)
    first = [mib for t, mib in samples if t <= window]
    last = [mib for t, mib in samples if t >= seconds - window]
    if not first or not last:
        return {"window_s": window, "samples": len(samples), "growth_pct": None}
    first_mib, last_mib = statistics.median(first), statistics.median(last)
    return {
        "window_s": round(window, 1),
        "samples": len(samples),
        "first_median_mib": round(first_mib, 1),
        "last_median_mib": round(last_mib, 1),
        "peak_mib": round(max(mib for _, mib in samples), 1),
        "growth_pct": round((last_mib - first_mib) / first_mib * 100, 2),
    }


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


def checks(result: dict[str, Any], soak: Soak) -> list[Check]:
    """Hold a soak's result to its promises."""
    req, slots, rec = result["requests"], result["slots"], result["records"]
    found = [
        Check(
            "no unexpected client-visible error",
            req["unexpected"] == 0,
            f"{req['sent']} sent: {req['ok']} whole answers, {req['expected']} streams cut by "
            f"a drop fault (expected), {req['unexpected']} unexpected",
        )
    ]
    for i, rss in enumerate(result["rss"]):
        growth = rss["growth_pct"]
        found.append(
            Check(
                f"RSS flat, replica {i}",
                growth is not None and growth <= soak.max_rss_growth_pct,
                "too few samples"
                if growth is None
                else f"median {rss['first_median_mib']} MiB over the first {rss['window_s']:g} s, "
                f"{rss['last_median_mib']} MiB over the last: {growth:+.1f}% "
                f"(bound {soak.max_rss_growth_pct:g}%)",
            )
        )
    held = {
        f"replica {i} {name}": n
        for i, backends in enumerate(slots["gateway_in_flight"])
        for name, n in backends.items()
        if n
    }
    held |= {f"simulator {name}": n for name, n in slots["simulator_in_flight"].items() if n}
    held |= {f"replica {i} queue": n for i, n in enumerate(slots["gateway_queued"]) if n}
    if slots["redis_leases"]:
        held["redis leases"] = slots["redis_leases"]
    found.append(
        Check(
            "no slot held once the load stops",
            not held,
            ", ".join(f"{k}: {v:g}" for k, v in held.items())
            or f"every backend at 0 after {slots['drained_after_s']:g} s"
            + ("" if slots["redis_leases"] is None else ", no lease in Redis"),
        )
    )
    found.append(
        Check(
            "one request record per request",
            rec["request_records"] == req["sent"],
            f"{rec['request_records']} records, {req['sent']} requests",
        )
    )
    errors_seen = req["expected"] + req["unexpected"]
    found.append(
        Check(
            "records fail where clients saw a failure",
            rec["failed_records"] == errors_seen,
            f"{rec['failed_records']} records not 200, {errors_seen} client-visible errors",
        )
    )
    found.append(
        Check(
            "one shadow record per shadow copy sent",
            # Some copy is sent: at 10% of the shortest soak the suite runs (33 s at 15 a
            # second, 495 requests), none has a chance of 0.9**495, below 1e-22.
            rec["shadow_records"] == rec["shadow_sent"] and rec["shadow_sent"] > 0,
            f"{rec['shadow_records']} records, {rec['shadow_sent']:g} copies sent",
        )
    )
    found.append(
        Check(
            "faults injected and hit",
            bool(result["faults"]) and sum(f["hits"] for f in result["faults"]) > 0,
            ", ".join(f"{f['kind']} {f['backend']} ({f['hits']:g} hits)" for f in result["faults"])
            or "no fault fits in the span",
        )
    )
    found.append(
        Check(
            "no exception in the gateways' logs",
            result["logged_exceptions"] == 0,
            f"{result['logged_exceptions']} tracebacks",
        )
    )
    return found


def soak_policy(urls: dict[str, str], shadow_rate: float) -> dict[str, Any]:
    """The default policy on the soak's simulators, every shadow target sampled at shadow_rate."""
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    for pool in doc["pools"].values():
        pool["backends"] = []
    for name, url in urls.items():
        doc["pools"][name.rsplit("-", 1)[0]]["backends"].append({"name": name, "url": url})
    for route in doc["routes"]:
        for target in route.get("shadow", []):
            target["sample_rate"] = shadow_rate
    return doc


@contextlib.contextmanager
def deployment(soak: Soak, workdir: Path) -> Iterator[Deployment]:
    """Start the simulators and the gateway replicas; stop them all after."""
    prefix = f"soak-{uuid.uuid4().hex[:12]}" if soak.replicas > 1 else None
    with contextlib.ExitStack() as stack:
        sims = {
            name: stack.enter_context(
                start_simulator(profile, speed=soak.speed, seed=seed, extra_args=flags)
            )
            for name, (profile, seed, flags) in FLEET.items()
        }
        policy = workdir / "policy.yaml"
        urls = {name: sim.url for name, sim in sims.items()}
        policy.write_text(yaml.safe_dump(soak_policy(urls, soak.shadow_rate), sort_keys=False))
        url = stack.enter_context(scratch_database(soak.database_url, workdir, "soak"))
        env = {
            "DATABASE_URL": url,
            "GATEWAY_POLICY": str(policy),
            "GATEWAY_LOG_LEVEL": "warning",
            "REDIS_URL": soak.redis_url if prefix else "",
            "GATEWAY_REDIS_PREFIX": prefix or "gateway",
            "GATEWAY_ADMIN_TOKEN": "",
        }
        if prefix:
            stack.callback(forget_prefix, soak.redis_url, prefix)
        logs = [workdir / f"gateway-{i}.log" for i in range(soak.replicas)]
        gateways = [
            stack.enter_context(
                gateway_process({**env, "GATEWAY_SPILL_DIR": str(workdir / f"spill-{i}")}, log)
            )
            for i, log in enumerate(logs)
        ]
        yield Deployment(sims, gateways, logs, url, prefix, soak.redis_url if prefix else None)


def forget_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


async def send(client: httpx.AsyncClient, outcome: Outcome, body: dict[str, Any]) -> None:
    """Send one request and fill in what the client saw."""
    try:
        if outcome.stream:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                _headers(outcome, response)
                if response.status_code != 200:
                    outcome.problem = _error_of(await response.aread(), response.status_code)
                    return
                async for line in response.aiter_lines():
                    _event(outcome, line)
                if not outcome.done and outcome.error_event is None:
                    outcome.problem = "stream ended without [DONE] and without an error event"
        else:
            response = await client.post("/v1/chat/completions", json=body)
            _headers(outcome, response)
            if response.status_code != 200:
                outcome.problem = _error_of(response.content, response.status_code)
                return
            choices = orjson.loads(response.content).get("choices") or []
            outcome.done = bool(choices and choices[0].get("message"))
            if not outcome.done:
                outcome.problem = "a 200 answer without a message"
    except httpx.HTTPError as exc:
        outcome.problem = f"{type(exc).__name__}: {exc}"[:200]
    except orjson.JSONDecodeError as exc:
        outcome.problem = f"an answer that is not JSON: {exc}"


def _headers(outcome: Outcome, response: httpx.Response) -> None:
    outcome.status = response.status_code
    outcome.backend = response.headers.get("x-gateway-backend")
    outcome.route = response.headers.get("x-gateway-route")


def _event(outcome: Outcome, line: str) -> None:
    if not line.startswith("data:"):
        return
    data = line[5:].strip()
    if data == "[DONE]":
        outcome.done = True
        return
    event = orjson.loads(data)
    if "error" in event:
        outcome.error_event = event["error"] if isinstance(event["error"], dict) else {}
    elif any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
        outcome.tokens += 1


def _error_of(body: bytes, status: int) -> str:
    try:
        error = orjson.loads(body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        error = {}
    return f"status {status} {error.get('code')}: {str(error.get('message'))[:120]}"


async def drive(
    soak: Soak, running: Deployment
) -> tuple[list[Outcome], list[FaultWindow], list[list[tuple[float, float]]]]:
    """Send the load open-loop, inject the faults and sample RSS; return what happened."""
    rng = Random(soak.seed)
    clients = [
        httpx.AsyncClient(
            base_url=gw.url,
            timeout=httpx.Timeout(120.0, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            headers={"authorization": "Bearer sk-soak"},
        )
        for gw in running.gateways
    ]
    loop = asyncio.get_running_loop()
    start = loop.time() + soak.warmup_s  # the measured span starts after the warm-up

    def now() -> float:
        return loop.time() - start

    async def until(t: float) -> None:
        await asyncio.sleep(max(0.0, t - now()))

    outcomes: list[Outcome] = []
    windows: list[FaultWindow] = []
    rss: list[list[tuple[float, float]]] = [[] for _ in running.gateways]

    async def one(outcome: Outcome, body: dict[str, Any]) -> None:
        await send(clients[outcome.replica], outcome, body)
        outcome.ended_s = now()

    async def load() -> None:
        tasks = []
        n = int((soak.warmup_s + soak.seconds) * soak.rate)
        for i in range(n):
            await until(-soak.warmup_s + i / soak.rate)
            stream = rng.random() < soak.stream_share
            body = request_body(rng, stream)
            outcome = Outcome(i, i % len(clients), body["model"], stream, now())
            outcomes.append(outcome)
            tasks.append(asyncio.create_task(one(outcome, body)))
        await asyncio.gather(*tasks)

    def hits(sim: SimulatorProcess) -> float:
        return metric_value(sim.metrics(), "sim_faults_injected_total")

    async def inject() -> None:
        for on, off, kind in fault_plan(soak):
            sim = running.sims[kind.backend]
            await until(on)
            before = await asyncio.to_thread(hits, sim)
            window = FaultWindow(kind.name, kind.backend, round(now(), 2))
            await asyncio.to_thread(sim.set_faults, **kind.fields)
            windows.append(window)
            await until(off)
            await asyncio.to_thread(sim.reset_faults)
            window.off_s = round(now(), 2)
            window.hits = await asyncio.to_thread(hits, sim) - before

    async def sample() -> None:
        await until(0.0)
        while now() <= soak.seconds:
            for i, gw in enumerate(running.gateways):
                rss[i].append((round(now(), 2), rss_mib(gw.process.pid)))
            await asyncio.sleep(soak.rss_every_s)

    try:
        await asyncio.gather(load(), inject(), sample())
    finally:
        for client in clients:
            await client.aclose()
    return outcomes, windows, rss


def held_slots(running: Deployment) -> dict[str, Any]:
    """Return what each gateway and simulator holds now, and the live leases in Redis."""
    in_flight, queued = [], []
    for gw in running.gateways:
        samples = parse_metrics(httpx.get(gw.url + "/metrics", timeout=10).text)
        in_flight.append(
            {
                labels["backend"]: value
                for name, labels, value in samples
                if name == "gateway_backend_in_flight_requests"
            }
        )
        queued.append(
            sum(value for name, _, value in samples if name == "gateway_pool_queued_requests")
        )
    sims = {name: sim.metric("sim_inflight_requests") for name, sim in running.sims.items()}
    leases = None
    if running.redis_url and running.redis_prefix:
        leases = live_leases(running.redis_url, running.redis_prefix)
    return {
        "gateway_in_flight": in_flight,
        "gateway_queued": queued,
        "simulator_in_flight": sims,
        "redis_leases": leases,
    }


def live_leases(url: str, prefix: str) -> int:
    """Count the unexpired places (slots, shadow budgets) held in Redis under the prefix."""
    client = redis.Redis.from_url(url)
    try:
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        keys = list(client.scan_iter(match=f"{prefix}:lease:*", count=1000))
        return sum(int(client.zcount(key, now_ms, "+inf")) for key in keys)
    finally:
        client.close()


def _is_free(state: dict[str, Any]) -> bool:
    return not (
        any(v for backends in state["gateway_in_flight"] for v in backends.values())
        or any(state["gateway_queued"])
        or any(state["simulator_in_flight"].values())
        or state["redis_leases"]
    )


def drain(running: Deployment, timeout_s: float) -> dict[str, Any]:
    """Wait until nothing is held on two looks a second apart (copies may still be queued)."""
    started = time.monotonic()
    free_looks = 0
    while True:
        state = held_slots(running)
        free_looks = free_looks + 1 if _is_free(state) else 0
        if free_looks == 2 or time.monotonic() - started > timeout_s:
            state["drained_after_s"] = round(time.monotonic() - started, 1)
            return state
        time.sleep(1.0)


def shadow_sent(running: Deployment) -> float:
    return sum(
        metric_value(httpx.get(gw.url + "/metrics", timeout=10).text, "gateway_shadow_sent_total")
        for gw in running.gateways
    )


def records(running: Deployment, sent: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until the gateways wrote a record per request and per copy; return the counts."""
    db = sa.create_engine(running.database_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            copies = shadow_sent(running)
            with db.connect() as conn:
                requests = conn.execute(sa.select(sa.func.count()).select_from(request_records))
                n_requests = int(requests.scalar_one())
                shadows = conn.execute(sa.select(sa.func.count()).select_from(shadow_records))
                n_shadows = int(shadows.scalar_one())
            if (n_requests >= sent and n_shadows >= copies) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        with db.connect() as conn:
            c = request_records.c
            groups = conn.execute(
                sa.select(c.status, c.error, sa.func.count()).group_by(c.status, c.error)
            ).all()
            s = shadow_records.c
            candidates = conn.execute(
                sa.select(s.candidate_pool, s.kind, s.candidate_error, sa.func.count()).group_by(
                    s.candidate_pool, s.kind, s.candidate_error
                )
            ).all()
    finally:
        db.dispose()
    return {
        "request_records": n_requests,
        "failed_records": sum(n for status, _, n in groups if status != 200),
        "by_status": {f"{status} {error or ''}".strip(): n for status, error, n in groups},
        "shadow_records": n_shadows,
        "shadow_sent": copies,
        "shadow_by_candidate": {
            f"{pool} {kind} {error or 'ok'}": n for pool, kind, error, n in candidates
        },
    }


def shadow_drops(running: Deployment) -> dict[str, float]:
    found: dict[str, float] = {}
    for gw in running.gateways:
        for name, labels, value in parse_metrics(httpx.get(gw.url + "/metrics", timeout=10).text):
            if name == "gateway_shadow_dropped_total":
                reason = labels.get("reason", "")
                found[reason] = found.get(reason, 0.0) + value
    return found


def logged_exceptions(logs: Sequence[Path]) -> int:
    return sum(log.read_text(errors="replace").count("Traceback") for log in logs if log.exists())


def run(soak: Soak, workdir: Path) -> dict[str, Any]:
    """Run a soak in `workdir` (logs, SQLite, spill files) and return its result and checks."""
    with deployment(soak, workdir) as running:
        outcomes, windows, rss = asyncio.run(drive(soak, running))
        slots = drain(running, soak.drain_timeout_s)
        written = records(running, len(outcomes))
        drops = shadow_drops(running)
        exceptions = logged_exceptions(running.logs)
    for outcome in outcomes:
        judge(outcome, windows)
    caused = Counter(o.fault for o in outcomes if o.fault is not None)
    verdicts = Counter(o.verdict for o in outcomes)
    whole = [o for o in outcomes if o.verdict == OK]
    result: dict[str, Any] = {
        "soak": asdict(soak),
        "load_average_at_end": list(os.getloadavg()),
        "requests": {
            "sent": len(outcomes),
            "ok": verdicts[OK],
            "expected": verdicts[EXPECTED],
            "unexpected": verdicts[UNEXPECTED],
            "streamed": sum(o.stream for o in outcomes),
            "by_route": dict(Counter(o.route or "none" for o in outcomes)),
            "by_backend": dict(Counter(o.backend or "none" for o in outcomes)),
            "e2e_ms": {
                kind: {
                    "p50": _rounded(percentile(values, 50)),
                    "p99": _rounded(percentile(values, 99)),
                }
                for kind, values in (
                    ("plain", [(o.ended_s - o.sent_s) * 1000 for o in whole if not o.stream]),
                    ("stream", [(o.ended_s - o.sent_s) * 1000 for o in whole if o.stream]),
                )
            },
            "unexpected_examples": [asdict(o) for o in outcomes if o.verdict == UNEXPECTED][:20],
        },
        "faults": [asdict(w) | {"expected_errors": caused[i]} for i, w in enumerate(windows)],
        "rss": [rss_summary(samples, soak.seconds, soak.rss_window_s) for samples in rss],
        "rss_samples": rss,
        "slots": slots,
        "records": written,
        "shadow_dropped": drops,
        "logged_exceptions": exceptions,
    }
    result["checks"] = [asdict(c) for c in checks(result, soak)]
    return result


def failed(result: dict[str, Any]) -> list[str]:
    """Return the names of the checks a soak failed."""
    return [c["name"] for c in result["checks"] if not c["ok"]]


def print_report(result: dict[str, Any]) -> None:
    soak, req = result["soak"], result["requests"]
    store = "PostgreSQL" if soak["database_url"] else "SQLite"
    shared = ", Redis" if soak["replicas"] > 1 else ""
    print(
        f"\nsoak: {soak['seconds']:g} s (+{soak['warmup_s']:g} s warm-up) at {soak['rate']:g}/s, "
        f"{soak['replicas']} replica(s), {store}{shared}, shadow {soak['shadow_rate']:.0%}"
    )
    print("\nfault                 on        off    hits  expected errors")
    for f in result["faults"]:
        print(
            f"  {f['kind']:6} {f['backend']:7} {f['on_s']:>7.1f} s {f['off_s']:>7.1f} s "
            f"{f['hits']:>6g}  {f['expected_errors']:>6}"
        )
    e2e = req["e2e_ms"]
    print(
        f"\nrequests: {req['sent']} ({req['streamed']} streamed); whole answers {req['ok']}, "
        f"expected errors {req['expected']}, unexpected {req['unexpected']}; e2e p50/p99 "
        f"plain {e2e['plain']['p50']}/{e2e['plain']['p99']} ms, "
        f"stream {e2e['stream']['p50']}/{e2e['stream']['p99']} ms"
    )
    print(f"routes: {req['by_route']}")
    print(f"backends: {req['by_backend']}")
    rec = result["records"]
    print(f"records by status: {rec['by_status']}")
    print(f"shadow records by candidate: {rec['shadow_by_candidate']}")
    print(f"shadow copies dropped: {result['shadow_dropped']}")
    for example in req["unexpected_examples"][:5]:
        print(f"  unexpected: #{example['index']} {example['reason']}")
    print(f"\n{'check':42} {'':4}  detail")
    for check in result["checks"]:
        print(f"{check['name']:42} {'ok' if check['ok'] else 'FAIL':4}  {check['detail']}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = Soak()
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=defaults.seconds)
    parser.add_argument("--rate", type=float, default=defaults.rate, help="requests per second")
    parser.add_argument("--replicas", type=int, choices=(1, 2), default=defaults.replicas)
    parser.add_argument(
        "--database-url", help="e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    parser.add_argument("--redis-url", default=REDIS_URL, help="shared by two replicas")
    parser.add_argument("--fault-every", type=float, default=defaults.fault_every_s)
    parser.add_argument("--fault-seconds", type=float, default=defaults.fault_s)
    parser.add_argument("--first-fault", type=float, default=defaults.first_fault_s)
    parser.add_argument("--warmup", type=float, default=defaults.warmup_s)
    parser.add_argument("--max-rss-growth-pct", type=float, default=defaults.max_rss_growth_pct)
    parser.add_argument("--speed", type=float, default=defaults.speed, help="simulator speed-up")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", default="bench/results/soak.json")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replicas > 1:
        client = redis.Redis.from_url(args.redis_url, socket_connect_timeout=2)
        try:
            client.ping()
        except redis.RedisError as exc:
            print(
                f"two replicas share state through Redis, unreachable at {args.redis_url}: {exc}",
                file=sys.stderr,
            )
            return 2
        finally:
            client.close()
    soak = Soak(
        seconds=args.seconds,
        rate=args.rate,
        replicas=args.replicas,
        database_url=args.database_url,
        redis_url=args.redis_url,
        fault_every_s=args.fault_every,
        fault_s=args.fault_seconds,
        first_fault_s=args.first_fault,
        warmup_s=args.warmup,
        max_rss_growth_pct=args.max_rss_growth_pct,
        speed=args.speed,
        seed=args.seed,
    )
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    result = run(soak, workdir)
    print_report(result)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nJSON: {args.out}")
    bad = failed(result)
    if bad or args.keep:
        print(f"logs: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
