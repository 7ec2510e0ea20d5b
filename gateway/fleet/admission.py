"""Admission: slot and KV-memory accounting per backend, and each pool's own bounded queue.

A request holds one slot of its backend, and the KV cache its prompt and output need, from
admission until its answer ends. When a pool is full, requests wait in that pool's queue in
arrival order and a released slot goes straight to the oldest waiter it fits, so one saturated
pool never stalls another and nothing is preempted.

With shared state (REDIS_URL) a slot is also a lease in the backend's capacity set in Redis
(`gateway/fleet/leases.py`), so all replicas together never hold more than the backend's slots. Each
replica keeps a view of what the others hold (`BackendState.elsewhere`), refreshed by every
take and a few times a second, which the router reads as it does the local counts; a slot
another replica frees wakes this replica's waiters. While Redis is unreachable, the view says
the others hold everything but this replica's share.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway.errors import NoCapacity, SharedStateUnavailable
from gateway.fleet.leases import Leases, Occupancy, Place
from gateway.fleet.state import BackendState, Fleet, PoolState, Slot, Waiter
from gateway.periodic import Periodic, Tasks

if TYPE_CHECKING:
    from redis.asyncio import Redis


class Traffic(Protocol):
    """What parking is told of the requests served: each routed to a pool with its prompt's
    length, each slot's hold."""

    def arrived(self, pool: str, now: float, prompt_tokens: int = 0, model: str = "") -> None: ...

    def finished(self, pool: str, slot_s: float) -> None: ...


def slot_place(backend: BackendState) -> Place:
    """Return the capacity set of a backend's slots, weighted by KV-cache bytes."""
    kv = backend.kv_capacity
    return Place(f"slots:{backend.url}", backend.slots, kv if math.isfinite(kv) else -1.0)


class Admission:
    """Take and give back slots; hand freed slots to waiting requests."""

    def __init__(
        self,
        fleet: Fleet,
        leases: Leases | None = None,
        *,
        refresh_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.fleet = fleet
        self.leases = leases
        self.clock = clock
        # Told of each request routed and each slot given back (parking's forecast), if set.
        self.traffic: Traffic | None = None
        self._dispatching: set[str] = set()
        self._tasks = Tasks()
        self.periodic = Periodic("slot-view", refresh_s, self.refresh)
        if leases is not None:
            leases.shared.on("freed", self._freed)

    def acquire(
        self, backend: BackendState, kv_bytes: float = 0.0, places: Sequence[Place] = ()
    ) -> Slot:
        """Hold a slot of the backend in this replica's books; the caller saw it free."""
        backend.in_flight += 1
        backend.kv_reserved += kv_bytes
        slot = Slot(backend, kv_bytes, taken_at=self.clock())
        if self.leases is not None:
            slot.lease = self.leases.new((slot_place(backend), *places), kv_bytes)
        return slot

    async def take(
        self, backend: BackendState, kv_bytes: float = 0.0, places: Sequence[Place] = ()
    ) -> Slot | None:
        """Take a slot of the backend if it has one free, with places in other capacity sets.

        Returns None when the backend is full (in the shared view, another replica may have
        taken the last slot first) or a place is.
        """
        leases = self.leases
        if leases is not None and not leases.shared.up:
            self._local_view(backend)
        if not backend.takes(kv_bytes):
            return None
        slot = self.acquire(backend, kv_bytes, places)
        if leases is None or not leases.shared.up:
            return slot
        assert slot.lease is not None
        try:
            taken, seen = await leases.take(slot.lease, (slot_place(backend), *places))
        except SharedStateUnavailable:
            self._local_view(backend)  # Redis failed mid-take: this replica's share decides
            taken = not backend.overcommitted()
        except BaseException:
            self.release(slot)  # cancelled while asking Redis: the slot must still come back
            raise
        else:
            self._saw(backend, seen[0], exclude=slot)
        if taken:
            return slot
        leases.forget(slot.lease)
        self._unreserve(slot)
        return None

    def _unreserve(self, slot: Slot) -> None:
        slot.held = False
        slot.backend.in_flight -= 1
        slot.backend.kv_reserved -= slot.kv_bytes

    def routed(self, pool: str, prompt_tokens: int = 0, model: str = "") -> None:
        """Count a request routed to `pool` (its prompt's length, its model), whether it takes a
        slot at once or waits."""
        if self.traffic is not None:
            self.traffic.arrived(pool, self.clock(), prompt_tokens, model)

    def release(self, slot: Slot) -> None:
        """Give a slot back (once, however often asked); the oldest waiter of its pool gets it
        (or whoever fits first)."""
        if not slot.held:
            return
        backend = slot.backend
        self._unreserve(slot)
        if self.traffic is not None:
            self.traffic.finished(backend.pool, self.clock() - slot.taken_at)
        if slot.lease is not None and self.leases is not None:
            self.leases.drop(slot.lease, backend.pool, url=backend.url, kv=slot.kv_bytes)
        pool = self.fleet.pools.get(backend.pool)
        if pool is not None and pool.waiters:
            self.dispatch(pool)

    def dispatch(self, pool: PoolState) -> None:
        """Give free slots of the pool to its oldest waiters."""
        if self.leases is not None:
            if pool.name not in self._dispatching:
                self._dispatching.add(pool.name)
                self._tasks.spawn(self._dispatch_shared(pool))
            return
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
            waiter.future.set_result(self.acquire(backend, waiter.kv_bytes))

    async def _dispatch_shared(self, pool: PoolState) -> None:
        """Dispatch with takes that ask Redis: one round at a time per pool."""
        refused: set[str] = set()
        try:
            while pool.waiters:
                waiter = pool.waiters[0]
                if waiter.future.done():
                    pool.waiters.popleft()
                    continue
                backend = pool.most_free(frozenset(refused), waiter.kv_bytes)
                if backend is None:
                    return
                slot = await self.take(backend, waiter.kv_bytes)
                if slot is None:
                    refused.add(backend.name)  # full after all: try the pool's next backend
                    continue
                if waiter.future.done():  # it timed out or was cancelled meanwhile
                    self.release(slot)
                    continue
                if pool.waiters and pool.waiters[0] is waiter:
                    pool.waiters.popleft()
                waiter.future.set_result(slot)
        finally:
            self._dispatching.discard(pool.name)

    async def wait(self, pool: PoolState, timeout_s: float, kv_bytes: float = 0.0) -> Slot:
        """Wait in the pool's queue for a slot; raise NoCapacity when the budget runs out."""
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        waiter = Waiter(future, kv_bytes)
        pool.waiters.append(waiter)
        if self.leases is not None:
            if len(pool.waiters) == 1:  # the first raises the flag; refreshes keep it up
                self._announce_waiting([pool])
            self.dispatch(pool)  # another backend of the pool may have a slot by now
        try:
            await asyncio.wait((future,), timeout=timeout_s)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            future.cancel()
            raise
        if future.done():
            return future.result()
        future.cancel()
        if waiter in pool.waiters:
            pool.waiters.remove(waiter)
        raise NoCapacity(
            f"pool {pool.name!r} had no free slot within {timeout_s * 1000:.0f} ms; retry later"
        )

    # The shared view: what the other replicas hold.

    def _saw(self, backend: BackendState, seen: Occupancy, exclude: Slot | None = None) -> None:
        """Update the view of a backend from its capacity set as Redis counted it.

        What Redis says is bounded by what the backend has: the others can hold at most all of
        its slots and memory, however large a figure a damaged or foreign key gives.
        """
        mine = backend.in_flight - (1 if exclude is not None else 0)
        backend.elsewhere = min(max(0, seen.places - mine), backend.slots)
        kv_mine = backend.kv_reserved - (exclude.kv_bytes if exclude is not None else 0.0)
        backend.kv_elsewhere = min(max(0.0, seen.weight - kv_mine), backend.kv_capacity)

    def _local_view(self, backend: BackendState) -> None:
        """Assume the others hold all but this replica's share, or what they last held if more.

        The others cannot take more while Redis is out, but those above their share when it
        went away keep what they had until their requests end.
        """
        assert self.leases is not None
        replicas = self.leases.shared.replicas
        backend.elsewhere = max(backend.elsewhere, backend.slots - backend.slots // replicas)
        if math.isfinite(backend.kv_capacity):
            backend.kv_elsewhere = max(
                backend.kv_elsewhere, backend.kv_capacity * (1 - 1 / replicas)
            )

    async def refresh(self) -> None:
        """Refresh the view of every backend; wake waiters of pools that have room now."""
        assert self.leases is not None
        backends = self.fleet.backends()
        if self.leases.shared.up:
            try:
                seen = await self.leases.occupancy([slot_place(b).name for b in backends])
                for backend, occupancy in zip(backends, seen, strict=True):
                    self._saw(backend, occupancy)
            except SharedStateUnavailable:
                pass
        if not self.leases.shared.up:
            for backend in backends:
                self._local_view(backend)
        waiting = [p for p in self.fleet.pools.values() if p.waiters]
        if waiting:
            self._announce_waiting(waiting)
        for pool in waiting:
            self.dispatch(pool)

    def _announce_waiting(self, pools: Sequence[PoolState]) -> None:
        """Flag the pools this replica waits for, so that replicas freeing a slot say so."""
        assert self.leases is not None
        shared = self.leases.shared
        if not shared.up:
            return
        keys = [shared.key("waiting", p.name) for p in pools]
        # The flag outlives a few refreshes, which renew it while requests still wait.
        ttl_ms = max(1000, int(self.periodic.interval_s * 4000))

        async def flag(redis: Redis) -> None:
            pipe = redis.pipeline(transaction=False)
            for key in keys:
                pipe.set(key, b"1", px=ttl_ms)
            await pipe.execute()

        shared.spawn(shared.call(flag))

    def _freed(self, notice: dict[str, Any]) -> None:
        """Another replica gave a slot back: count it free in the view, and dispatch."""
        pool = self.fleet.pools.get(str(notice.get("pool")))
        if pool is None:
            return
        for backend in pool.backends:
            if backend.url == notice.get("url"):
                backend.elsewhere = max(0, backend.elsewhere - 1)
                backend.kv_elsewhere = max(0.0, backend.kv_elsewhere - float(notice.get("kv", 0)))
        if pool.waiters:
            self.dispatch(pool)

    def start(self) -> None:
        if self.leases is not None:
            self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()
        await self._tasks.cancel()
