"""Replicas sharing slots, ejections and their fallback through a real Redis server."""

from __future__ import annotations

import asyncio

import pytest
import redis
from replicas import SLOTS, lease_count, replica, sent, take_all
from waiting import until

from gateway.fleet.admission import Admission
from gateway.fleet.state import Fleet
from policies import fleet_policy

pytestmark = pytest.mark.redis


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
            # A refresh of b's begun before a's takes may see fewer: wait for one after them.
            await until(
                lambda: b.asic.elsewhere == 3,
                message=lambda: f"b's view never showed a's 3 slots: {b.asic.elsewhere}",
            )
            seen = (b.asic.elsewhere, b.asic.free_slots)
            for slot in held:
                a.admission.release(slot)
            return seen

    assert asyncio.run(scenario()) == (3, 1)


def test_a_slot_freed_on_one_replica_goes_to_a_request_waiting_on_another(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> None:
        # b's view refreshes only every 10 minutes and its waiter gives up after one: only the
        # freed-slot notice can wake it, so that it is served at all is the proof.
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix, refresh_s=600) as b,
        ):
            held = await take_all(a, SLOTS)
            pool = b.fleet.pools["asic"]
            b.asic.elsewhere = SLOTS  # as b's last look saw it
            waiting = asyncio.create_task(b.admission.wait(pool, 60.0))
            # a's give-back says so only once b's waiting flag is in Redis, and b hears it only
            # once it listens.
            probe = redis.Redis.from_url(redis_url)
            try:
                await until(
                    lambda: probe.exists(f"{redis_prefix}:waiting:asic"),
                    message="b never flagged that it waits for the pool",
                )
                await until(
                    lambda: probe.pubsub_numsub(f"{redis_prefix}:events")[0][1] == 2,
                    message="the replicas never both listened for notices",
                )
            finally:
                probe.close()
            assert not waiting.done()
            a.admission.release(held[0])
            slot = await waiting
            b.admission.release(slot)
            for s in held[1:]:
                a.admission.release(s)

    asyncio.run(scenario())


def test_an_outage_leaves_each_replica_its_share_and_rejoining_registers_its_slots(
    private_redis,
) -> None:
    url = private_redis.url  # type: ignore[attr-defined]

    async def scenario() -> dict[str, object]:
        # Heartbeats every 0.5 s; leases of 2 s never lapse between them on a busy machine.
        async with replica(url, "fleet", lease_s=2.0) as a, replica(url, "fleet"):
            await until(  # a heartbeat of a's after b joined counts b
                lambda: a.shared.replicas == 2,
                message=lambda: f"a counts {a.shared.replicas} replicas, not 2",
            )
            seen: dict[str, object] = {"replicas": a.shared.replicas}
            held = await take_all(a, 1)
            private_redis.stop()  # type: ignore[attr-defined]
            # The first call after the outage fails; from then on a serves its share: 4 / 2.
            during = await take_all(a, SLOTS)
            seen["mode_during"] = a.shared.up
            seen["held_during"] = len(held) + len(during)
            seen["outages"] = a.metrics.shared_state_outages._value.get()
            private_redis.start()  # type: ignore[attr-defined]  # empty: it kept nothing
            # A heartbeat of a's rejoins, having registered its slots again.
            seen["mode_after"] = await until(
                lambda: a.shared.up, message="a never rejoined the restarted Redis"
            )
            seen["in_redis_after"] = lease_count(url, "fleet", a.asic.url)
            for slot in held + during:
                a.admission.release(slot)
            assert a.admission.leases is not None
            await sent(a.admission.leases)
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
        async with replica(redis_url, redis_prefix, lease_s=2.0) as a:  # heartbeats every 0.5 s
            held = await take_all(a, 2)
            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(match=f"{redis_prefix}:*"):
                client.delete(key)  # as a restarted Redis that kept nothing
            client.close()
            late = await take_all(a, 1)  # refused by the boot check: taken from local state
            up_after_take = a.shared.up
            # A heartbeat rejoins, having registered every slot again.
            await until(lambda: a.shared.up, message="a never rejoined the emptied Redis")
            registered = lease_count(redis_url, redis_prefix, a.asic.url)
            for slot in held + late:
                a.admission.release(slot)
            return up_after_take, len(held + late), registered

    up_after_take, held, registered = asyncio.run(scenario())
    assert up_after_take is False
    assert registered == held == 3


def test_a_take_cancelled_while_redis_answers_leaves_nothing_held(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[int, int]:
        async with replica(redis_url, redis_prefix) as a:
            task = asyncio.create_task(a.admission.take(a.asic))
            await asyncio.sleep(0)  # the take is on its way to Redis
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert a.admission.leases is not None
            await sent(a.admission.leases)
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


def test_what_redis_says_others_hold_is_bounded_by_what_the_backend_has(
    redis_url: str, redis_prefix: str
) -> None:
    """A damaged or foreign capacity set (100 leases of a terabyte each) cannot say the others
    hold more than all of a backend's slots and memory."""

    async def scenario() -> tuple[int, float, int, float]:
        async with replica(redis_url, redis_prefix, refresh_s=0.05) as r:
            client = redis.Redis.from_url(redis_url)
            key = f"{redis_prefix}:lease:slots:{r.asic.url}"
            far = int(1e15)  # an expiry in Redis time (ms) no test outlives
            client.zadd(key, {f"foreign-{i}:{10**12}": far for i in range(100)})
            client.close()
            await until(lambda: r.asic.elsewhere > 0, message="the foreign leases were never seen")
            return r.asic.elsewhere, r.asic.kv_elsewhere, r.asic.slots, r.asic.kv_capacity

    elsewhere, kv_elsewhere, slots, kv_capacity = asyncio.run(scenario())
    assert elsewhere == slots and kv_elsewhere == kv_capacity
