from __future__ import annotations

import asyncio

import pytest
from waiting import until

from gateway.errors import NoCapacity
from gateway.fleet.admission import Admission
from gateway.fleet.state import Fleet, PoolState
from policies import fleet_policy

# Long enough that no busy machine runs out of it: only a freed slot ends these waits.
PATIENT_S = 60.0


async def queued(pool: PoolState, n: int) -> None:
    """Wait until n requests wait in the pool's queue."""
    await until(lambda: len(pool.waiters) == n, message=f"{n} waiters never queued")


def asic_world(slots: int = 2) -> tuple[Fleet, Admission]:
    policy = fleet_policy(asic_extra={"slots_per_backend": slots})
    fleet = Fleet(policy)
    return fleet, Admission(fleet)


def test_released_slot_goes_to_the_oldest_waiter() -> None:
    async def scenario() -> list[int]:
        fleet, admission = asic_world(slots=1)
        pool = fleet.pools["asic"]
        backend = pool.backends[0]
        held = admission.acquire(backend)
        served: list[int] = []

        async def waiter(n: int) -> None:
            got = await admission.wait(pool, PATIENT_S)
            served.append(n)
            await asyncio.sleep(0)
            admission.release(got)

        tasks = [asyncio.create_task(waiter(n)) for n in range(3)]
        await queued(pool, 3)
        admission.release(held)
        await asyncio.gather(*tasks)
        assert backend.in_flight == 0
        return served

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_wait_times_out_with_no_capacity_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        fleet, admission = asic_world(slots=1)
        pool = fleet.pools["asic"]
        held = admission.acquire(pool.backends[0])
        with pytest.raises(NoCapacity, match="asic"):
            await admission.wait(pool, 0.01)
        assert len(pool.waiters) == 0
        admission.release(held)
        assert pool.backends[0].in_flight == 0

    asyncio.run(scenario())


def test_cancelled_waiter_never_holds_a_slot() -> None:
    async def scenario() -> None:
        fleet, admission = asic_world(slots=1)
        pool = fleet.pools["asic"]
        backend = pool.backends[0]
        held = admission.acquire(backend)
        task = asyncio.create_task(admission.wait(pool, PATIENT_S))
        await queued(pool, 1)
        admission.release(held)  # hands the slot to the waiter...
        task.cancel()  # ...which is cancelled before it runs
        await asyncio.gather(task, return_exceptions=True)
        assert backend.in_flight == 0

    asyncio.run(scenario())


def test_dispatch_skips_ejected_backends() -> None:
    async def scenario() -> None:
        fleet, admission = asic_world(slots=1)
        pool = fleet.pools["asic"]
        backend = pool.backends[0]
        held = admission.acquire(backend)
        backend.ejected = True
        task = asyncio.create_task(admission.wait(pool, PATIENT_S))
        await queued(pool, 1)
        admission.release(held)  # a slot handed over here is the waiter's on its next step
        await asyncio.sleep(0)
        assert not task.done()
        backend.ejected = False
        admission.dispatch(pool)
        assert (await task).backend is backend

    asyncio.run(scenario())


def test_kv_memory_is_reserved_and_given_back_with_the_slot() -> None:
    async def scenario() -> None:
        fleet, admission = asic_world(slots=4)
        pool = fleet.pools["asic"]
        backend = pool.backends[0]
        backend.kv_capacity = 10.0
        big = admission.acquire(backend, 8.0)
        assert pool.most_free(kv_bytes=4.0) is None  # a slot is free, the memory is not
        waiter = asyncio.create_task(admission.wait(pool, PATIENT_S, kv_bytes=4.0))
        await queued(pool, 1)
        admission.release(big)
        small = await waiter
        assert small.backend is backend
        assert (backend.in_flight, backend.kv_reserved) == (1, 4.0)
        admission.release(small)
        assert (backend.in_flight, backend.kv_reserved) == (0, 0.0)

    asyncio.run(scenario())


def test_the_oldest_waiter_is_served_first_even_when_a_younger_one_fits() -> None:
    async def scenario() -> list[str]:
        fleet, admission = asic_world(slots=4)
        pool = fleet.pools["asic"]
        backend = pool.backends[0]
        backend.kv_capacity = 10.0
        held = admission.acquire(backend, 9.0)
        order: list[str] = []

        async def wait(name: str, kv: float) -> None:
            got = await admission.wait(pool, PATIENT_S, kv_bytes=kv)
            order.append(name)
            admission.release(got)

        big = asyncio.create_task(wait("big", 8.0))
        await queued(pool, 1)
        small = asyncio.create_task(wait("small", 1.0))
        await queued(pool, 2)
        assert order == []  # "small" would fit now, but "big" came first
        admission.release(held)
        await asyncio.gather(big, small)
        return order

    assert asyncio.run(scenario()) == ["big", "small"]
