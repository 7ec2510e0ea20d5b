"""Replicas sharing slots, ejections and their fallback through a real Redis server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import redis

from gateway.fleet.admission import Admission, slot_place
from gateway.fleet.leases import Leases
from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import Fleet, Slot
from gateway.metrics import GatewayMetrics
from gateway.upstream.health import SharedEjections
from gateway.upstream.outliers import OutlierDetector
from policies import fleet_policy

pytestmark = pytest.mark.redis

SLOTS = 4


@dataclass
class Replica:
    shared: SharedState
    fleet: Fleet
    admission: Admission
    outliers: OutlierDetector
    metrics: GatewayMetrics

    @property
    def asic(self):
        return self.fleet.pools["asic"].backends[0]


@contextlib.asynccontextmanager
async def replica(
    url: str,
    prefix: str,
    *,
    lease_s: float = 10.0,
    refresh_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[Replica]:
    metrics = GatewayMetrics()
    shared = SharedState(url, metrics, prefix=prefix, lease_s=lease_s, timeout_s=0.5)
    fleet = Fleet(fleet_policy(asic_extra={"slots_per_backend": SLOTS}))
    admission = Admission(fleet, Leases(shared), refresh_s=refresh_s)
    outliers = OutlierDetector(metrics, threshold=1, clock=clock)
    SharedEjections(shared, lambda: fleet, outliers)
    await shared.start()
    admission.start()
    try:
        yield Replica(shared, fleet, admission, outliers, metrics)
    finally:
        await admission.stop()
        await shared.stop()


def lease_count(url: str, prefix: str, backend_url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        key = f"{prefix}:lease:slots:{backend_url}"
        return int(client.zcard(key))
    finally:
        client.close()


async def take_all(r: Replica, n: int) -> list[Slot]:
    slots = [await r.admission.take(r.asic) for _ in range(n)]
    return [s for s in slots if s is not None]


def test_replicas_together_never_hold_more_than_a_backends_slots(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[int, int]:
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix) as b,
        ):
            # Both see four free slots and race for them, eight times each.
            got = await asyncio.gather(
                *(r.admission.take(r.asic) for r in (a, b) for _ in range(8))
            )
            held = [s for s in got if s is not None]
            in_redis = lease_count(redis_url, redis_prefix, a.asic.url)
            for slot in held:
                (a if slot.backend is a.asic else b).admission.release(slot)
            return len(held), in_redis

    held, in_redis = asyncio.run(scenario())
    assert held == SLOTS
    assert in_redis == SLOTS


def test_without_shared_state_each_replica_fills_the_backend_alone() -> None:
    # The control for the test above: two local admissions over one backend overfill it.
    async def scenario() -> int:
        policy = fleet_policy(asic_extra={"slots_per_backend": SLOTS})
        fleets = [Fleet(policy), Fleet(policy)]
        admissions = [Admission(f) for f in fleets]
        got = [
            await adm.take(f.pools["asic"].backends[0])
            for adm, f in zip(admissions, fleets, strict=True)
            for _ in range(8)
        ]
        return sum(s is not None for s in got)

    assert asyncio.run(scenario()) == 2 * SLOTS


def test_each_replica_sees_what_the_others_hold(redis_url: str, redis_prefix: str) -> None:
    async def scenario() -> tuple[int, int]:
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix, refresh_s=0.05) as b,
        ):
            held = await take_all(a, 3)
            await asyncio.sleep(0.3)  # a few of b's refreshes
            seen = (b.asic.elsewhere, b.asic.free_slots)
            for slot in held:
                a.admission.release(slot)
            return seen

    assert asyncio.run(scenario()) == (3, 1)


def test_a_dead_replicas_slots_come_free_when_its_lease_lapses(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[int, int, int]:
        async with replica(redis_url, redis_prefix, lease_s=0.6) as b:
            a_cm = replica(redis_url, redis_prefix, lease_s=0.6)
            a = await a_cm.__aenter__()
            await take_all(a, SLOTS)
            # a dies: no release, no more heartbeats, its connections just go away.
            await a.shared.periodic.stop()
            await a.admission.periodic.stop()
            await a.shared.redis.aclose()
            refused = len(await take_all(b, 1))
            await asyncio.sleep(1.0)  # past the lease
            after = await take_all(b, SLOTS)
            in_redis = lease_count(redis_url, redis_prefix, b.asic.url)
            for slot in after:
                b.admission.release(slot)
            return refused, len(after), in_redis

    refused, after, in_redis = asyncio.run(scenario())
    assert refused == 0
    assert after == SLOTS
    assert in_redis == SLOTS


def test_a_slot_freed_on_one_replica_goes_to_a_request_waiting_on_another(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> float:
        # b's view refreshes only every 30 s: only the freed-slot notice can wake its waiter.
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix, refresh_s=30) as b,
        ):
            held = await take_all(a, SLOTS)
            pool = b.fleet.pools["asic"]
            b.asic.elsewhere = SLOTS  # as b's last look saw it
            loop = asyncio.get_running_loop()
            waiting = asyncio.create_task(b.admission.wait(pool, 5.0))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            started = loop.time()
            a.admission.release(held[0])
            slot = await waiting
            waited = loop.time() - started
            b.admission.release(slot)
            for s in held[1:]:
                a.admission.release(s)
            return waited

    assert asyncio.run(scenario()) < 1.0


def test_an_outage_leaves_each_replica_its_share_and_rejoining_registers_its_slots(
    private_redis,
) -> None:
    url = private_redis.url  # type: ignore[attr-defined]

    async def scenario() -> dict[str, object]:
        async with replica(url, "fleet", lease_s=0.4) as a, replica(url, "fleet"):
            await asyncio.sleep(0.3)  # a's heartbeats (every 0.1 s) count b
            seen: dict[str, object] = {"replicas": a.shared.replicas}
            held = await take_all(a, 1)
            private_redis.stop()  # type: ignore[attr-defined]
            # The first call after the outage fails; from then on a serves its share: 4 / 2.
            during = await take_all(a, SLOTS)
            seen["mode_during"] = a.shared.up
            seen["held_during"] = len(held) + len(during)
            seen["outages"] = a.metrics.shared_state_outages._value.get()
            private_redis.start()  # type: ignore[attr-defined]  # empty: it kept nothing
            await asyncio.sleep(0.5)  # a heartbeat of a's (every 0.1 s) rejoins
            seen["mode_after"] = a.shared.up
            seen["in_redis_after"] = lease_count(url, "fleet", a.asic.url)
            for slot in held + during:
                a.admission.release(slot)
            await asyncio.sleep(0.1)
            seen["in_redis_released"] = lease_count(url, "fleet", a.asic.url)
            return seen

    seen = asyncio.run(scenario())
    assert seen["replicas"] == 2
    assert seen["mode_during"] is False
    assert seen["held_during"] == SLOTS // 2
    assert seen["outages"] == 1
    assert seen["mode_after"] is True
    assert seen["in_redis_after"] == SLOTS // 2  # what a held, registered again
    assert seen["in_redis_released"] == 0


def test_a_redis_that_lost_its_data_is_noticed_before_a_slot_is_taken(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[bool, int, int]:
        async with replica(redis_url, redis_prefix, lease_s=0.4) as a:
            held = await take_all(a, 2)
            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(match=f"{redis_prefix}:*"):
                client.delete(key)  # as a restarted Redis that kept nothing
            client.close()
            late = await take_all(a, 1)  # refused by the boot check: taken from local state
            up_after_take = a.shared.up
            await asyncio.sleep(0.3)  # a heartbeat rejoins and registers every slot again
            registered = lease_count(redis_url, redis_prefix, a.asic.url)
            for slot in held + late:
                a.admission.release(slot)
            return up_after_take, len(held + late), registered

    up_after_take, held, registered = asyncio.run(scenario())
    assert up_after_take is False
    assert registered == held == 3


def test_an_ejection_on_one_replica_takes_the_backend_out_on_the_others(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[bool, bool]:
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix) as b,
        ):
            a.outliers.failure(a.asic)
            for _ in range(100):
                if b.asic.ejected:
                    break
                await asyncio.sleep(0.01)
            heard = b.asic.ejected
            # A replica that joins now learns the ejection in force from Redis.
            async with replica(redis_url, redis_prefix) as c:
                learned = c.asic.ejected
            return heard, learned

    assert asyncio.run(scenario()) == (True, True)


def test_ejections_other_replicas_announce_are_forgiven_like_its_own(
    redis_url: str, redis_prefix: str
) -> None:
    # A backend with a fault now and then, seen failing by replica a: b hears each ejection.
    # Serving 10 s after each return forgives the doubling, so b's own ejection is the base one.
    now = [1000.0]

    def clock() -> float:
        return now[0]

    async def heard(r: Replica) -> None:
        for _ in range(200):
            if r.asic.ejected:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the ejection notice never arrived")

    async def scenario() -> list[float]:
        async with (
            replica(redis_url, redis_prefix, clock=clock) as a,
            replica(redis_url, redis_prefix, clock=clock) as b,
        ):
            intervals = []
            for _ in range(3):
                a.outliers.failure(a.asic)
                await heard(b)
                intervals.append(b.asic.ejected_until - now[0])
                now[0] = max(a.asic.ejected_until, b.asic.ejected_until)
                assert a.outliers.restore(a.asic) and b.outliers.restore(b.asic)
                now[0] += 10.0  # both serve for 10 s after the backend returns
            b.outliers.failure(b.asic)
            intervals.append(b.asic.ejected_until - now[0])
            return intervals

    assert asyncio.run(scenario()) == [2.0, 2.0, 2.0, 2.0]


def test_slot_place_weighs_kv_memory_only_when_the_backend_has_a_limit() -> None:
    fleet = Fleet(fleet_policy())
    backend = fleet.pools["asic"].backends[0]
    place = slot_place(backend)
    assert place.limit == backend.slots and place.weight_limit == backend.kv_capacity
    backend.kv_capacity = float("inf")
    assert slot_place(backend).weight_limit == -1


def test_a_shadow_budgets_places_are_fleet_wide(redis_url: str, redis_prefix: str) -> None:
    # A shadow target's max_concurrent of 1 holds across replicas: the place goes with the slot.
    from gateway.fleet.leases import Place

    async def scenario() -> tuple[int, int]:
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix) as b,
        ):
            budget = [Place("shadow:chat:asic:candidate", 1)]
            first = await a.admission.take(a.asic, 0.0, budget)
            second = await b.admission.take(b.asic, 0.0, budget)
            assert first is not None
            a.admission.release(first)
            await asyncio.sleep(0.1)  # the give-back is sent in the background
            third = await b.admission.take(b.asic, 0.0, budget)
            assert third is not None
            b.admission.release(third)
            return int(second is None), int(b.asic.in_flight)

    refused, left = asyncio.run(scenario())
    assert refused == 1  # b had free slots, but the target's one place was a's
    assert left == 0


def test_a_take_cancelled_while_redis_answers_leaves_nothing_held(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[int, int]:
        async with replica(redis_url, redis_prefix) as a:
            task = asyncio.create_task(a.admission.take(a.asic))
            await asyncio.sleep(0)  # the take is on its way to Redis
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(0.2)  # the give-back, in the background
            return a.asic.in_flight, lease_count(redis_url, redis_prefix, a.asic.url)

    assert asyncio.run(scenario()) == (0, 0)


def test_takes_in_one_turn_of_the_event_loop_share_a_round_trip(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[int, int]:
        async with replica(redis_url, redis_prefix) as a:
            sent: list[int] = []
            execute = a.shared._execute

            async def counting(calls):  # type: ignore[no-untyped-def]
                sent.append(len(calls))
                return await execute(calls)

            a.shared._execute = counting  # type: ignore[method-assign]
            slots = await asyncio.gather(*(a.admission.take(a.asic) for _ in range(SLOTS)))
            for slot in slots:
                assert slot is not None
                a.admission.release(slot)
            return sent[0], sum(s is not None for s in slots)

    batch, held = asyncio.run(scenario())
    assert batch == SLOTS and held == SLOTS
