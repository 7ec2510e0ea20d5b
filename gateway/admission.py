"""Admission: slot accounting per backend and each pool's own bounded queue.

A request holds one slot of its backend from admission until its answer ends. When a pool is
full, requests wait in that pool's queue in arrival order and a released slot goes straight to
the oldest waiter, so one saturated pool never stalls another and nothing is preempted.
"""

from __future__ import annotations

import asyncio

from gateway.errors import NoCapacity
from gateway.routing.fleet import BackendState, Fleet, PoolState


class Admission:
    """Take and give back slots; hand freed slots to waiting requests."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    def acquire(self, backend: BackendState) -> None:
        backend.in_flight += 1

    def release(self, backend: BackendState) -> None:
        backend.in_flight -= 1
        pool = self.fleet.pools.get(backend.pool)
        if pool is not None and pool.waiters:
            self.dispatch(pool)

    def dispatch(self, pool: PoolState) -> None:
        """Give free slots of the pool to its oldest waiters."""
        while pool.waiters:
            backend = pool.most_free()
            if backend is None:
                return
            waiter = pool.waiters.popleft()
            if waiter.done():
                continue
            backend.in_flight += 1
            waiter.set_result(backend)

    async def wait(self, pool: PoolState, timeout_s: float) -> BackendState:
        """Wait in the pool's queue for a slot; raise NoCapacity when the budget runs out."""
        waiter: asyncio.Future[BackendState] = asyncio.get_running_loop().create_future()
        pool.waiters.append(waiter)
        try:
            await asyncio.wait((waiter,), timeout=timeout_s)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())
            waiter.cancel()
            raise
        if waiter.done():
            return waiter.result()
        waiter.cancel()
        pool.waiters.remove(waiter)
        raise NoCapacity(
            f"pool {pool.name!r} had no free slot within {timeout_s * 1000:.0f} ms; retry later"
        )
