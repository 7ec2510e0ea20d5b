"""Leases: places in capacity sets that every replica sees, lapsing when their holder dies."""

from __future__ import annotations

import asyncio

import pytest
from replicas import SLOTS, lease_count, replica, sent, take_all
from waiting import until

from gateway.fleet.admission import slot_place
from gateway.fleet.leases import Leases, Place
from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import Fleet
from gateway.metrics import GatewayMetrics
from policies import fleet_policy


@pytest.mark.redis
def test_a_dead_replicas_slots_come_free_when_its_lease_lapses(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[int, int, int]:
        # The lease is long enough that a's slots are still held when b first asks, however
        # slowly the machine gets from a's death to b's take.
        async with replica(redis_url, redis_prefix, lease_s=3.0) as b:
            a_cm = replica(redis_url, redis_prefix, lease_s=3.0)
            a = await a_cm.__aenter__()
            await take_all(a, SLOTS)
            # a dies: no release, no more heartbeats, its connections just go away.
            await a.shared.periodic.stop()
            await a.admission.periodic.stop()
            await a.shared.redis.aclose()
            refused = len(await take_all(b, 1))
            await until(  # past the lease, b's view (refreshed from Redis) counts them free
                lambda: b.asic.free_slots == SLOTS,
                message=lambda: f"a's leases never lapsed: b sees {b.asic.elsewhere} held",
            )
            after = await take_all(b, SLOTS)
            in_redis = lease_count(redis_url, redis_prefix, b.asic.url)
            for slot in after:
                b.admission.release(slot)
            return refused, len(after), in_redis

    refused, after, in_redis = asyncio.run(scenario())
    assert refused == 0
    assert after == SLOTS
    assert in_redis == SLOTS


def test_slot_place_weighs_kv_memory_only_when_the_backend_has_a_limit() -> None:
    fleet = Fleet(fleet_policy())
    backend = fleet.pools["asic"].backends[0]
    place = slot_place(backend)
    assert place.limit == backend.slots and place.weight_limit == backend.kv_capacity
    backend.kv_capacity = float("inf")
    assert slot_place(backend).weight_limit == -1


@pytest.mark.redis
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
            assert a.admission.leases is not None
            await sent(a.admission.leases)  # the give-back is sent in the background
            third = await b.admission.take(b.asic, 0.0, budget)
            assert third is not None
            b.admission.release(third)
            return int(second is None), int(b.asic.in_flight)

    refused, left = asyncio.run(scenario())
    assert refused == 1  # b had free slots, but the target's one place was a's
    assert left == 0


async def _leases(redis_url: str, redis_prefix: str) -> tuple[SharedState, Leases]:
    shared = SharedState(redis_url, GatewayMetrics(), prefix=redis_prefix, timeout_s=10)
    await shared.start()
    return shared, Leases(shared)


@pytest.mark.redis
def test_a_lease_takes_its_place_in_every_set_or_in_none(redis_url: str, redis_prefix: str) -> None:
    async def scenario() -> tuple[bool, bool, list[int], list[int]]:
        shared, leases = await _leases(redis_url, redis_prefix)
        try:
            roomy, tight = Place("roomy", 5), Place("tight", 1)
            first = leases.new((roomy, tight))
            taken, _ = await leases.take(first, (roomy, tight))
            second = leases.new((roomy, tight))
            refused, seen = await leases.take(second, (roomy, tight))
            held = await leases.occupancy(["roomy", "tight"])
            return taken, refused, [o.places for o in seen], [o.places for o in held]
        finally:
            await shared.stop()

    taken, refused, seen, held = asyncio.run(scenario())
    assert taken and not refused
    assert seen == [1, 1]  # how full each set was when the second lease asked
    assert held == [1, 1]  # the refused lease left no place in the set that had room


@pytest.mark.redis
def test_a_place_is_refused_when_its_weight_would_pass_the_sets_weight_limit(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[list[bool], float, float]:
        shared, leases = await _leases(redis_url, redis_prefix)
        try:
            kv = Place("kv", 10, weight_limit=100.0)
            outcomes = []
            for weight in (60, 50, 40):
                lease = leases.new((kv,), weight)
                taken, _ = await leases.take(lease, (kv,))
                outcomes.append(taken)
                if not taken:
                    leases.forget(lease)
            (full,) = await leases.occupancy(["kv"])
            for lease in list(leases.held):
                leases.drop(lease)
            await sent(leases)  # the give-backs run in the background
            (after,) = await leases.occupancy(["kv"])
            return outcomes, full.weight, after.weight
        finally:
            await shared.stop()

    outcomes, full, after = asyncio.run(scenario())
    assert outcomes == [True, False, True]  # 60 + 50 > 100; 60 + 40 fits exactly
    assert (full, after) == (100.0, 0.0)
