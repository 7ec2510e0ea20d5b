"""Admission: slot and KV-memory accounting per backend, and each pool's own bounded queue.

A request holds one slot of its backend, and the KV cache its prompt and output need, from
admission until its answer ends. When a pool is full, requests wait in that pool's queue in
arrival order and a released slot goes straight to the oldest waiter it fits, so one saturated
pool never stalls another and nothing is preempted.
"""

from __future__ import annotations

import asyncio

from gateway.errors import NoCapacity
from gateway.routing.fleet import BackendState, Fleet, PoolState, Waiter


class Admission:
    """Take and give back slots; hand freed slots to waiting requests."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    def acquire(self, backend: BackendState, kv_bytes: float = 0.0) -> None:
        backend.in_flight += 1
        backend.kv_reserved += kv_bytes

    def release(self, backend: BackendState, kv_bytes: float = 0.0) -> None:
        backend.in_flight -= 1
        backend.kv_reserved -= kv_bytes
        pool = self.fleet.pools.get(backend.pool)
        if pool is not None and pool.waiters:
            self.dispatch(pool)

    def dispatch(self, pool: PoolState) -> None:
        """Give free slots of the pool to its oldest waiters."""
        while pool.waiters:
            waiter = pool.waiters[0]
            if waiter.future.done():
                pool.waiters.popleft()
                continue
            # The oldest waiter goes first, even if a younger one would fit: no starvation.
            backend = pool.most_free(kv_bytes=waiter.kv_bytes)
            if backend is None:
                return
            pool.waiters.popleft()
            self.acquire(backend, waiter.kv_bytes)
            waiter.future.set_result(backend)

    async def wait(self, pool: PoolState, timeout_s: float, kv_bytes: float = 0.0) -> BackendState:
        """Wait in the pool's queue for a slot; raise NoCapacity when the budget runs out."""
        future: asyncio.Future[BackendState] = asyncio.get_running_loop().create_future()
        waiter = Waiter(future, kv_bytes)
        pool.waiters.append(waiter)
        try:
            await asyncio.wait((future,), timeout=timeout_s)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result(), kv_bytes)
            future.cancel()
            raise
        if future.done():
            return future.result()
        future.cancel()
        pool.waiters.remove(waiter)
        raise NoCapacity(
            f"pool {pool.name!r} had no free slot within {timeout_s * 1000:.0f} ms; retry later"
        )
