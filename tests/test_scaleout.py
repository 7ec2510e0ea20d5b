"""Two `gateway serve` processes sharing Redis behave as one gateway in front of one backend."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
import yaml
from waiting import wait_for

from gateway.db.connection import upgrade
from harness.gateways import ROOT, GatewayProcess, gateway_process
from harness.metrics import metric_value
from harness.simulators import SimulatorProcess, start_simulator
from policies import MODEL, pool

pytestmark = pytest.mark.redis

SLOTS = 4  # the policy's slots on the one ASIC backend (the simulated card itself has 16)
ADMIN = "scaleout-admin-token"


def write_policy(path: Path, asic_url: str, **top: object) -> Path:
    doc = {
        "default_slo_class": "batch",
        "slo_classes": {"batch": {"e2e_ms": 120000, "max_queue_ms": 60000, "timeout_s": 60}},
        "pools": {"asic": pool("asic", [asic_url], [MODEL], slots_per_backend=SLOTS)},
        "routes": [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["asic"]}],
        **top,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@contextlib.contextmanager
def replicas(
    tmp_path: Path, sim: SimulatorProcess, redis_url: str | None, prefix: str, **env: str
) -> Iterator[list[GatewayProcess]]:
    """Start two gateway processes on one policy and one database, sharing Redis if given."""
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(database)
    common = {
        "GATEWAY_POLICY": str(write_policy(tmp_path / "policy.yaml", sim.url)),
        "DATABASE_URL": database,
        "GATEWAY_ADMIN_TOKEN": ADMIN,
        "GATEWAY_REDIS_PREFIX": prefix,
        "GATEWAY_SLOT_LEASE_S": "2",
        "GATEWAY_HEALTH_CHECK_INTERVAL_S": "0.5",
        # A Redis call a busy machine makes slow is no outage; a stopped Redis still fails fast.
        "GATEWAY_REDIS_TIMEOUT_S": "10",
        **({"REDIS_URL": redis_url} if redis_url else {}),
        **env,
    }
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                gateway_process(
                    {**common, "GATEWAY_SPILL_DIR": str(tmp_path / f"spill-{i}")},
                    tmp_path / f"gateway-{i}.log",
                )
            )
            for i in range(2)
        ]
        yield procs


def chat(gw: GatewayProcess, max_tokens: int = 60) -> str:
    reply = gw.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Summarise the history of computing."}],
        max_tokens=max_tokens,
        temperature=0,
    )
    return reply.choices[0].finish_reason or ""


def load(gateways: list[GatewayProcess], per_gateway: int, **kw: int) -> list[BaseException]:
    """Send per_gateway concurrent requests to each gateway; return the failures."""
    failures: list[BaseException] = []

    def one(gw: GatewayProcess) -> None:
        try:
            chat(gw, **kw)
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=one, args=(gw,)) for gw in gateways for _ in range(per_gateway)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return failures


def held_load(
    sim: SimulatorProcess, gateways: list[GatewayProcess], per_gateway: int, until: int
) -> list[BaseException]:
    """Run `load` with the backend slowed until `until` requests are in flight on it together.

    Both replicas' requests then overlap however late a busy machine starts either one.
    """
    failures: list[BaseException] = []
    sim.set_faults(slow_factor=50)
    worker = threading.Thread(target=lambda: failures.extend(load(gateways, per_gateway)))
    worker.start()
    try:
        sim.wait_for_metric("sim_inflight_requests", until)
    finally:
        sim.reset_faults()
        worker.join(timeout=120)
    return failures


@pytest.fixture
def asic(tmp_path: Path) -> Iterator[SimulatorProcess]:
    # Each request takes ~0.1-0.2 s; `held_load` slows them while a test needs them to overlap.
    with start_simulator("asic", speed=4, seed=7) as sim:
        yield sim


def test_two_replicas_sharing_redis_never_exceed_the_pools_slots_together(
    tmp_path: Path, asic: SimulatorProcess, redis_url: str, redis_prefix: str
) -> None:
    with replicas(tmp_path, asic, redis_url, redis_prefix) as gateways:
        failures = held_load(asic, gateways, per_gateway=12, until=SLOTS)
    assert failures == []
    assert asic.metric("sim_peak_inflight_requests") == SLOTS  # full, and never over


def test_without_redis_two_replicas_overfill_the_pool(
    tmp_path: Path, asic: SimulatorProcess
) -> None:
    # The control for the test above: the same load with no shared state overfills the card.
    with replicas(tmp_path, asic, None, "none") as gateways:
        failures = held_load(asic, gateways, per_gateway=12, until=2 * SLOTS)
    assert failures == []
    assert asic.metric("sim_peak_inflight_requests") == 2 * SLOTS  # each replica fills its own


def leases_in_redis(url: str, prefix: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return sum(int(client.zcard(k)) for k in client.scan_iter(match=f"{prefix}:lease:slots:*"))
    finally:
        client.close()


def longest_lease_left_ms(url: str, prefix: str) -> int:
    """Return how long the slot lease furthest from lapsing has left, by Redis's clock."""
    client = redis.Redis.from_url(url)
    try:
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        expiries = [
            score
            for k in client.scan_iter(match=f"{prefix}:lease:slots:*")
            for _, score in client.zrange(k, 0, -1, withscores=True)
        ]
        return int(max(expiries) - now_ms)
    finally:
        client.close()


def version_of(gw: GatewayProcess) -> int:
    """Return the policy version a replica serves."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    version: int = httpx.get(gw.url + "/admin/policy", headers=admin).json()["version"]
    return version


def test_a_replica_killed_mid_request_leaks_no_slot(
    tmp_path: Path, asic: SimulatorProcess, redis_url: str, redis_prefix: str
) -> None:
    with replicas(tmp_path, asic, redis_url, redis_prefix) as (a, b):
        asic.set_faults(slow_factor=50)  # a's requests hold every slot for a long while
        doomed = [threading.Thread(target=lambda: load([a], SLOTS)) for _ in range(1)]
        for t in doomed:
            t.start()
        asic.wait_for_metric("sim_inflight_requests", SLOTS)
        assert leases_in_redis(redis_url, redis_prefix) == SLOTS
        # a's slots lapse 2 s after its last renewal (the lease), not after the default 10 s.
        assert longest_lease_left_ms(redis_url, redis_prefix) <= 2000
        a.kill()
        asic.reset_faults()
        failures = load([b], SLOTS)  # they wait for the dead replica's leases to lapse
        assert failures == []
        wait_for(
            lambda: leases_in_redis(redis_url, redis_prefix) == 0,
            message="slots stayed leased in Redis",
        )
        wait_for(  # a's registration lapses too
            lambda: b.readiness()["shared_state"]["replicas"] == 1,
            message="b still counts the dead replica",
        )
    assert asic.metric("sim_peak_inflight_requests") == SLOTS


PHASE = 30  # answers served before, during and after an outage: a second's load or so


def test_redis_stopped_and_restarted_mid_load_fails_no_request(
    tmp_path: Path, asic: SimulatorProcess, private_redis
) -> None:
    url = private_redis.url  # type: ignore[attr-defined]
    failures: list[BaseException] = []
    served = [0]
    stop = threading.Event()

    def steady(gw: GatewayProcess) -> None:
        while not stop.is_set():
            try:
                chat(gw, max_tokens=20)
                served[0] += 1
            except BaseException as exc:
                failures.append(exc)

    def serve_some_more(when: str) -> None:
        """Wait until the load has had PHASE more answers: the gateways serve meanwhile."""
        goal = served[0] + PHASE
        wait_for(
            lambda: served[0] >= goal or failures,
            message=lambda: f"{served[0]} of {goal} answers {when}",
        )

    def modes() -> list[str]:
        return [gw.readiness()["shared_state"]["mode"] for gw in gateways]

    with replicas(tmp_path, asic, url, "fleet") as gateways:
        threads = [threading.Thread(target=steady, args=(gw,)) for gw in gateways for _ in range(4)]
        for t in threads:
            t.start()
        try:
            serve_some_more("before the outage")
            private_redis.stop()  # type: ignore[attr-defined]
            wait_for(  # the next Redis call of each replica fails
                lambda: all(mode.startswith("local") for mode in modes()),
                message=lambda: f"the replicas did not notice the outage: {modes()}",
            )
            during = [gw.readiness() for gw in gateways]
            serve_some_more("during the outage")
            private_redis.start()  # type: ignore[attr-defined]
            wait_for(
                lambda: all(mode == "shared" for mode in modes()),
                message=lambda: f"the replicas did not rejoin Redis: {modes()}",
            )
            serve_some_more("after the outage")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        after = [gw.readiness() for gw in gateways]
        metrics = httpx.get(gateways[0].url + "/metrics").text
    assert failures == []
    assert served[0] >= 3 * PHASE
    assert all(r["ready"] and r["shared_state"]["mode"].startswith("local") for r in during)
    assert all(r["shared_state"]["mode"] == "shared" for r in after)
    assert metric_value(metrics, "gateway_shared_state_outages_total") == 1
    assert metric_value(metrics, "gateway_shared_state_up") == 1
    # Cut off from Redis, each replica uses at most its half of what the other did not hold
    # when last seen; what the other took in the last moment before (up to its half) is the
    # most the backend can briefly hold beyond its slots.
    assert asic.metric("sim_peak_inflight_requests") <= SLOTS + SLOTS // 2


def test_a_policy_change_reaches_the_other_replica_within_a_second(
    tmp_path: Path, asic: SimulatorProcess, redis_url: str, redis_prefix: str
) -> None:
    # Polling alone would take a minute: a version seen before the first poll came by notice.
    with replicas(tmp_path, asic, redis_url, redis_prefix, GATEWAY_POLICY_POLL_INTERVAL_S="60") as (
        a,
        b,
    ):
        first_poll = time.monotonic() + 50  # 60 s after each started, less time to start

        def by_notice(gw: GatewayProcess, version: int) -> None:
            wait_for(
                lambda: version_of(gw) == version,
                timeout=first_poll - time.monotonic(),
                message=f"{gw.url} still serves the old version",
            )

        admin = {"authorization": f"Bearer {ADMIN}"}
        doc = yaml.safe_load(httpx.get(a.url + "/admin/policy", headers=admin).json()["yaml"])
        doc["routes"][0]["name"] = "chat-renamed"
        put = httpx.put(
            a.url + "/admin/policy",
            headers=admin,
            json={"yaml": yaml.safe_dump(doc), "message": "rename the route"},
        )
        assert put.status_code == 200, put.text
        version = put.json()["version"]
        by_notice(b, version)
        reply = b.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.headers["x-gateway-route"] == "chat-renamed"

        # `gateway policy apply` from a shell tells the replicas the same way.
        doc["routes"][0]["name"] = "chat-from-cli"
        path = tmp_path / "cli.yaml"
        path.write_text(yaml.safe_dump(doc))
        env = {
            "DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
            "REDIS_URL": redis_url,
            "GATEWAY_REDIS_PREFIX": redis_prefix,
        }
        command = [sys.executable, "-m", "gateway", "policy", "apply", str(path), "-m", "cli"]
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        for gw in (a, b):
            by_notice(gw, version + 1)


def test_a_tenants_rate_limit_holds_across_replicas(
    tmp_path: Path, asic: SimulatorProcess, redis_url: str, redis_prefix: str
) -> None:
    import hashlib

    key = "tenant-key-acme"
    tenants = [
        {
            "name": "acme",
            "api_key_sha256": [hashlib.sha256(key.encode()).hexdigest()],
            "rate_limit": {"requests_per_minute": 6},
        }
    ]
    with replicas(tmp_path, asic, redis_url, redis_prefix) as gateways:
        doc = yaml.safe_load(
            write_policy(tmp_path / "acme.yaml", asic.url, tenants=tenants).read_text()
        )
        admin = {"authorization": f"Bearer {ADMIN}"}
        put = httpx.put(
            gateways[0].url + "/admin/policy",
            headers=admin,
            json={"yaml": yaml.safe_dump(doc), "message": "acme gets a limit"},
        )
        assert put.status_code == 200, put.text
        version = put.json()["version"]
        for gw in gateways:  # how fast a change spreads is another test's: wait until it has
            wait_for(
                lambda gw=gw: version_of(gw) == version,
                message="a replica never took the tenant's limit",
            )
        outcomes = []
        for i in range(10):
            gw = gateways[i % 2]
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
            try:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                outcomes.append("ok")
            except openai.RateLimitError as exc:
                assert exc.response.headers["retry-after"].isdigit()
                assert exc.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
                outcomes.append("limited")
    assert outcomes.count("ok") == 6  # a minute's worth, spent across both replicas


def test_applies_and_rollbacks_under_load_on_two_replicas_fail_no_request(
    tmp_path: Path, asic: SimulatorProcess, redis_url: str, redis_prefix: str
) -> None:
    failures: list[BaseException] = []
    routes: set[str] = set()
    stop = threading.Event()

    def steady(gw: GatewayProcess) -> None:
        while not stop.is_set():
            try:
                raw = gw.client().chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
                )
                routes.add(raw.headers["x-gateway-route"])
            except BaseException as exc:
                failures.append(exc)

    with replicas(
        tmp_path, asic, redis_url, redis_prefix, GATEWAY_POLICY_POLL_INTERVAL_S="60"
    ) as gateways:
        admin = {"authorization": f"Bearer {ADMIN}"}
        base = yaml.safe_load(
            httpx.get(gateways[0].url + "/admin/policy", headers=admin).json()["yaml"]
        )
        threads = [threading.Thread(target=steady, args=(gw,)) for gw in gateways for _ in range(3)]
        for t in threads:
            t.start()

        def everywhere(version: int) -> None:
            wait_for(
                lambda: all(version_of(gw) == version for gw in gateways),
                message=lambda: f"not every replica serves version {version}",
            )

        try:
            for i in range(4):
                doc = {**base, "routes": [{**base["routes"][0], "name": f"chat-v{i}"}]}
                via = gateways[i % 2]
                put = httpx.put(
                    via.url + "/admin/policy",
                    headers=admin,
                    json={"yaml": yaml.safe_dump(doc), "message": f"step {i}"},
                )
                assert put.status_code == 200, put.text
                everywhere(put.json()["version"])
                wait_for(  # traffic runs under each version in turn
                    lambda i=i: f"chat-v{i}" in routes or failures,
                    message=f"no request was served under chat-v{i}",
                )
                rolled = httpx.post(
                    gateways[(i + 1) % 2].url + "/admin/policy/rollback",
                    headers=admin,
                    json={"message": f"undo step {i}"},
                )
                assert rolled.status_code == 200, rolled.text
                everywhere(rolled.json()["version"])
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        versions = [version_of(gw) for gw in gateways]
    assert failures == []
    assert {"chat", *(f"chat-v{i}" for i in range(4))} <= routes  # every version served traffic
    assert versions[0] == versions[1] == 9  # the first version, then 4 applies and 4 rollbacks


def test_a_prefix_served_by_one_replica_is_known_to_the_other(
    tmp_path: Path, asic: SimulatorProcess, redis_url: str, redis_prefix: str
) -> None:
    system = "You answer questions about the routing gateway's fleet, briefly and exactly. " * 30
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Slots?"}]
    with replicas(tmp_path, asic, redis_url, redis_prefix) as (a, b):
        admin = {"authorization": f"Bearer {ADMIN}"}

        def explained() -> str:
            body = {"model": MODEL, "messages": messages}
            reply = httpx.post(b.url + "/admin/explain", json={"body": body}, headers=admin)
            return " ".join(reply.json()["trace"])

        assert "holds 0 of the prompt's 9" in explained()  # b knows nothing of it yet
        a.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        # The system prompt's 9 whole blocks of 256 characters, sent by a, held as b sees it.
        wait_for(
            lambda: "chosen: asic-0 has 4 free slots, holds 9 of the prompt's 9" in explained(),
            message="b never heard which blocks a sent",
        )
