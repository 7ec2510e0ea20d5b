"""Parking in the serving gateway: simulators and gateways on loopback, real Redis and SQLite.

The plan's windows are cut to seconds (a test cannot wait the two minutes a real forecast
looks back), and its rounds to a fifth of a second; everything else is the serving gateway's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from switching import HOOK, switched, up
from waiting import wait_for

from gateway.db.schema import parking_events
from gateway.fleet.state import Fleet
from gateway.parking.driver import Parker, last_gpu
from gateway.parking.plan import Move
from gateway.policy.definition import Policy
from harness.gateways import GatewayServer, run_gateway
from harness.simulators import SimulatorProcess, start_simulator
from policies import MODEL, fleet_policy

SLOTS = 2  # so that two requests at once need both backends (at 60% of their slots)
# Slots enough that requests one at a time never need a second backend, however the forecast
# reads their timing on a busy machine (it counts the arrivals a follower tells in a batch).
ROOMY = 8
CHAT_ONLY = [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}]
VLLM = {"hook": "vllm", "wake_s": 0.4}
TOKEN = "admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def parked_policy(urls: list[str], parking: dict, slots: int = SLOTS) -> Policy:
    return fleet_policy(
        gpu=urls,
        routes=CHAT_ONLY,
        gpu_extra={"slots_per_backend": slots, "parking": parking},
    )


def quick(server: GatewayServer) -> GatewayServer:
    """Cut the plan's windows and rounds to what a test can wait for."""
    parker = server.gateway.parker
    parker.planner.window_s, parker.planner.short_s, parker.planner.hold_s = 3.0, 1.0, 1.0
    parker.drain_grace_s = 0.3
    parker.periodic.interval_s = 0.2
    return server


@pytest.fixture
def gpus() -> Iterator[list[SimulatorProcess]]:
    """Two GPU simulators of this test's own, which it may put to sleep."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(start_simulator("gpu", seed=s)) for s in (1, 2)]


def sleeping(sim: SimulatorProcess) -> bool:
    return bool(httpx.get(sim.url + "/is_sleeping").json()["is_sleeping"])


def states(server: GatewayServer) -> dict[str, str]:
    return {b.url: b.parking for b in server.gateway.fleet.pools["gpu"].backends}


def chat(server: GatewayServer, tokens: int = 8) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": tokens,
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def events(server: GatewayServer) -> list[tuple[str, str]]:
    with server.gateway.db.connect() as conn:
        rows = conn.execute(
            sa.select(parking_events.c.backend, parking_events.c.event).order_by(
                parking_events.c.id
            )
        )
        return [(r.backend, r.event) for r in rows]


def parked_seconds(server: GatewayServer, backend: str) -> float:
    """The time the meter's draw has counted `backend` parked, in minutes not yet written."""
    draw = server.gateway.meter.draw
    return sum(f[1] for (_, _, name), f in draw._minutes.items() if name == backend)


def metric(server: GatewayServer, name: str, **labels: str) -> float:
    value = server.gateway.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_an_idle_backend_is_parked_and_woken_before_traffic_reaches_it(
    gpus: list[SimulatorProcess], tmp_path: Path
) -> None:
    urls = [s.url for s in gpus]
    with run_gateway(parked_policy(urls, VLLM), tmp_path, admin_token=TOKEN) as server:
        quick(server)
        assert chat(server).status_code == 200
        # Traffic stops: one backend is drained and parked, its engine asleep; the other serves.
        parked = wait_for(
            lambda: next((u for u, s in states(server).items() if s == "parked"), None),
            message=lambda: f"no backend parked: {states(server)}",
        )
        sim = next(s for s in gpus if s.url == parked)
        assert sleeping(sim)
        assert list(states(server).values()).count("") == 1  # the pool's last stays on
        # explain, the fleet view and the console's parking history say which and why.
        name = next(b.name for b in server.gateway.fleet.backends() if b.url == parked)
        with server.http() as http:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
            explained = http.post("/admin/explain", json={"body": body}, headers=ADMIN).json()
            fleet = http.get("/admin/fleet", headers=ADMIN).json()
            history = http.get("/admin/parking", headers=ADMIN).json()
        why = next(b for b in explained["pools"]["gpu"]["backends"] if b["backend"] == name)
        assert why["parking"]["state"] == "parked"
        assert why["parking"]["reason"].startswith("forecast ")
        (gpu,) = [p for p in fleet if p["pool"] == "gpu"]
        assert gpu["parked"] == 1
        assert metric(server, "gateway_pool_parking_backends", pool="gpu", state="parked") == 1
        assert next(b for b in gpu["backends"] if b["name"] == name)["parking"] == why["parking"]
        (pool,) = history["pools"]
        assert pool["pool"] == "gpu" and pool["parks"] == 1 and pool["daily"][-1]["parked"] > 0

        # Traffic returns, more than one backend's share: the parked one is woken, and
        # serves only once its engine is awake (no request meets a sleeping engine).
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: chat(server, 200), range(24)))
        assert [a.status_code for a in answers] == [200] * 24
        wait_for(
            lambda: states(server)[parked] == "" and not sleeping(sim),
            message=lambda: f"the parked backend was not woken: {states(server)}",
        )
        served = {a.headers["x-gateway-backend"] for a in answers}
        later = [chat(server, 200) for _ in range(2)] if len(served) == 1 else []
        assert all(a.status_code == 200 for a in later)
        assert sim.metric("sim_requests_total", status="503") == 0  # none met it asleep
        wait_for(
            lambda: (
                [e for b, e in events(server) if b == name][:4]
                == ["drain", "parked", "wake", "ready"]
            ),
            message=lambda: f"events: {events(server)}",
        )
        assert metric(server, "gateway_backend_parks_total", pool="gpu") >= 1
        assert metric(server, "gateway_backend_wakeups_total", pool="gpu") >= 1


def simulator(seed: int) -> Callable[[int], list[str]]:
    """A GPU simulator's command line, given its port."""
    argv = [sys.executable, "-m", "simulator", "--profile", "gpu", "--host", "127.0.0.1"]
    return lambda port: [*argv, "--port", str(port), "--speed", "100", "--seed", str(seed)]


@pytest.fixture
def releasable(tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """Two GPU simulators whose processes the release hook stops and starts again."""
    state = tmp_path / "servers"
    with switched([simulator(s) for s in (1, 2)], state, timeout_s=60) as urls:
        yield urls, state


def test_a_released_backend_is_given_back_and_started_again_for_returning_traffic(
    releasable: tuple[list[str], Path], tmp_path: Path
) -> None:
    urls, state = releasable
    release = {
        "hook": "command",
        "mode": "release",
        "wake_s": 2,
        "park_command": [*HOOK, "park", "{url}", str(state)],
        "wake_command": [*HOOK, "wake", "{url}", str(state)],
    }
    policy = parked_policy(urls, release)
    with run_gateway(policy, tmp_path, parking_commands=[sys.executable]) as server:
        quick(server)
        assert chat(server).status_code == 200
        # Traffic stops: one backend is drained and given back; nothing listens on its port.
        parked = wait_for(
            lambda: next((u for u, s in states(server).items() if s == "parked"), None),
            message=lambda: f"no backend released: {states(server)}",
        )
        assert not up(parked)
        assert list(states(server).values()).count("") == 1
        # Its meter is not read while it is given back: no scrape fails, nothing is estimated.
        name = next(b.name for b in server.gateway.fleet.backends() if b.url == parked)
        wait_for(
            lambda: parked_seconds(server, name) > 0,
            message="no scrape round counted the released backend's time",
        )
        assert server.gateway.meter._failures.get(parked, 0) == 0
        # Traffic returns: it is started again, and serves only once its /health answers.
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: chat(server, 200), range(24)))
        assert [a.status_code for a in answers] == [200] * 24
        wait_for(
            lambda: states(server)[parked] == "" and up(parked),
            message=lambda: f"the released backend was not started: {states(server)}",
        )
        wait_for(
            lambda: (
                [e for b, e in events(server) if b == name][:4]
                == ["drain", "parked", "wake", "ready"]
            ),
            message=lambda: f"events: {events(server)}",
        )
        # Released, it drew nothing: its pool's whole idle draw was saved, whatever its meter
        # read last before its process went away.
        wake = next(r for r in _event_rows(server) if r.backend == name and r.event == "wake")
        idle_w = policy.pools["gpu"].power.idle_w
        assert wake.seconds > 0 and wake.saved_j == pytest.approx(idle_w * wake.seconds)


def test_a_hook_that_fails_leaves_the_backend_serving(
    gpus: list[SimulatorProcess], tmp_path: Path
) -> None:
    failing = {
        "hook": "command",
        "wake_s": 1,
        "park_command": [sys.executable, "-c", "import sys; sys.exit('no power cap here')"],
        "wake_command": [sys.executable, "-c", "pass"],
    }
    urls = [s.url for s in gpus]
    with run_gateway(
        parked_policy(urls, failing), tmp_path, parking_commands=[sys.executable]
    ) as server:
        quick(server)
        wait_for(
            lambda: metric(
                server, "gateway_parking_hook_failures_total", pool="gpu", action="park"
            ),
            message="the failing hook was never called",
        )
        wait_for(
            lambda: ("gpu-0", "failed") in events(server) or ("gpu-1", "failed") in events(server)
        )
        # Whatever was drained is back in service, and both backends answer.
        wait_for(lambda: set(states(server).values()) <= {"", "draining"})
        assert not any(sleeping(s) for s in gpus)
        assert all(chat(server).status_code == 200 for _ in range(4))
        failure = next(r for r in _event_rows(server) if r.event == "failed")
        assert "no power cap here" in failure.reason and "exited 1" in failure.reason


def _event_rows(server: GatewayServer) -> list:
    with server.gateway.db.connect() as conn:
        return list(conn.execute(sa.select(parking_events)))


def test_a_command_not_allowed_is_never_run(gpus: list[SimulatorProcess], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hook = {
        "hook": "command",
        "wake_s": 1,
        "park_command": [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        "wake_command": [sys.executable, "-c", "pass"],
    }
    with run_gateway(parked_policy([s.url for s in gpus], hook), tmp_path) as server:
        quick(server)
        wait_for(
            lambda: metric(
                server, "gateway_parking_hook_failures_total", pool="gpu", action="park"
            ),
            message="the hook was never tried",
        )
        assert not marker.exists()
        # The event is written by the records writer, after the metric counts the failure.
        wait_for(
            lambda: any(
                "GATEWAY_PARKING_COMMANDS" in r.reason
                for r in _event_rows(server)
                if r.event == "failed"
            ),
            message=lambda: f"no failed event naming the allow-list: {_event_rows(server)}",
        )
        assert not marker.exists()


def test_two_replicas_plan_under_one_lease_and_neither_routes_to_a_parked_backend(
    gpus: list[SimulatorProcess], tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    urls = [s.url for s in gpus]
    shared = {"redis_url": redis_url, "redis_prefix": redis_prefix, "slot_lease_s": 1.0}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    policy = parked_policy(urls, VLLM, slots=ROOMY)
    with contextlib.ExitStack() as stack:
        a = quick(stack.enter_context(run_gateway(policy, tmp_path / "a", **shared)))
        b = quick(stack.enter_context(run_gateway(policy, tmp_path / "b", **shared)))
        wait_for(lambda: a.gateway.parker.leading != b.gateway.parker.leading)
        planner, follower = (a, b) if a.gateway.parker.leading else (b, a)
        parked = wait_for(
            lambda: next((u for u, s in states(planner).items() if s == "parked"), None),
            message=lambda: f"no backend parked: {states(planner)}",
        )
        wait_for(
            lambda: states(follower)[parked] == "parked",
            message=lambda: f"the follower did not follow: {states(follower)}",
        )
        assert not follower.gateway.parker.leading
        sim = next(s for s in gpus if s.url == parked)
        assert sleeping(sim)
        # The follower sends nothing to the sleeping engine (asleep, it answers 503), and never
        # wakes one: whatever is woken, the planner wakes.
        for _ in range(3):
            assert chat(follower).status_code == 200
        assert sim.metric("sim_requests_total", status="503") == 0
        assert metric(follower, "gateway_backend_wakeups_total", pool="gpu") == 0
        # A replica started now (one restarted) finds the parked backend parked.
        (tmp_path / "c").mkdir()
        late = quick(stack.enter_context(run_gateway(policy, tmp_path / "c", **shared)))
        wait_for(
            lambda: states(late)[parked] == "parked",
            message=lambda: f"the late replica did not learn: {states(late)}",
        )


def test_the_lease_passes_to_another_replica_when_its_holder_stops(
    gpus: list[SimulatorProcess], tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    shared = {"redis_url": redis_url, "redis_prefix": redis_prefix, "slot_lease_s": 1.0}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    policy = parked_policy([s.url for s in gpus], VLLM)
    with contextlib.ExitStack() as first_stack:
        first = quick(first_stack.enter_context(run_gateway(policy, tmp_path / "a", **shared)))
        wait_for(lambda: first.gateway.parker.leading, message="the first replica never planned")
        with run_gateway(policy, tmp_path / "b", **shared) as second:
            quick(second)
            wait_for(lambda: second.gateway.parker.periodic._task is not None)
            assert not second.gateway.parker.leading
            first_stack.close()  # the planner stops
            wait_for(lambda: second.gateway.parker.leading, message="the lease never passed")


def test_the_fleets_last_gpu_in_service_is_never_parked() -> None:
    fleet = Fleet(
        fleet_policy(
            gpu=["http://127.0.0.1:11", "http://127.0.0.1:12"],
            gpu_extra={"parking": VLLM},
        )
    )
    one, two = fleet.pools["gpu"].backends
    two.parking = "parked"
    assert last_gpu(one, fleet)
    assert not last_gpu(fleet.pools["asic"].backends[0], fleet)
    two.parking = ""
    assert not last_gpu(one, fleet)
    two.ejected = True
    assert last_gpu(one, fleet)


def test_a_park_move_on_the_last_gpu_is_not_taken() -> None:
    from gateway.fleet.admission import Admission
    from gateway.metrics import GatewayMetrics
    from gateway.upstream.client import Upstream

    policy = fleet_policy(
        gpu=["http://127.0.0.1:11", "http://127.0.0.1:12"], gpu_extra={"parking": VLLM}
    )
    fleet = Fleet(policy)
    parker = Parker(lambda: fleet, lambda: policy, Upstream(), Admission(fleet), GatewayMetrics())
    parker._configure(policy)
    one, two = fleet.pools["gpu"].backends
    two.parking = "parked"
    parker._take(Move(one, "park", "forecast 0"), fleet)
    assert one.parking == ""
    two.parking = ""
    parker._take(Move(one, "park", "forecast 0"), fleet)
    assert one.parking == "draining" and one.parking_reason == "forecast 0"


def test_while_redis_is_unreachable_no_replica_parks() -> None:
    import asyncio

    from gateway.fleet.admission import Admission
    from gateway.fleet.sharedstate import SharedState
    from gateway.metrics import GatewayMetrics
    from gateway.upstream.client import Upstream

    command = {
        "hook": "command",
        "wake_s": 1,
        "park_command": ["park", "{name}"],
        "wake_command": ["wake", "{name}"],
    }
    policy = fleet_policy(
        gpu=["http://127.0.0.1:11", "http://127.0.0.1:12"], gpu_extra={"parking": command}
    )
    fleet = Fleet(policy)
    metrics = GatewayMetrics()
    now = [0.0]

    async def scenario() -> list[str]:
        # Never started: as a replica whose Redis went away (SharedState.up is False).
        shared = SharedState("redis://127.0.0.1:1/0", metrics, timeout_s=0.1)
        parker = Parker(
            lambda: fleet,
            lambda: policy,
            Upstream(),
            Admission(fleet),
            metrics,
            shared=shared,
            clock=lambda: now[0],
        )
        parker.planner.hold_s = 1.0
        idle = parker.planner.plan(fleet, 0.0, ["gpu"]) + parker.planner.plan(fleet, 5.0, ["gpu"])
        assert [m.action for m in idle] == ["park"]  # what a planner in touch would do
        parker.planner = type(parker.planner)(hold_s=1.0)
        for t in range(10):
            now[0] = float(t)
            await parker.round()
        await shared.redis.aclose()
        return [b.parking for b in fleet.backends()]

    assert set(asyncio.run(scenario())) == {""}
