"""The live state of the fleet: slots and KV memory in use and health of every backend, waiters.

The ingress, forwarder and health checker mutate it; the router only reads it. Everything here
runs on the event loop, so reads and writes between two awaits are consistent.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.policy import Policy, Pool

if TYPE_CHECKING:
    from gateway.admission import Slot


@dataclass(eq=False, slots=True)
class BackendState:
    """One upstream server: its slots and KV-cache memory in use, and its outlier state.

    `in_flight` and `kv_reserved` are this replica's; `elsewhere` and `kv_elsewhere` what the
    other replicas hold, as last seen through shared state (always 0 for a single process).
    """

    name: str
    url: str
    pool: str
    slots: int
    kv_capacity: float = float("inf")
    in_flight: int = 0
    kv_reserved: float = 0.0
    elsewhere: int = 0
    kv_elsewhere: float = 0.0
    ejected: bool = False
    ejected_until: float = 0.0
    consecutive_failures: int = 0
    ejections: int = 0

    @property
    def free_slots(self) -> int:
        return self.slots - self.in_flight - self.elsewhere

    @property
    def load(self) -> int:
        """Requests the backend serves now, every replica's included."""
        return self.in_flight + self.elsewhere

    def fits(self, kv_bytes: float) -> bool:
        """Return whether a request needing kv_bytes of KV cache fits in the free memory."""
        return self.kv_reserved + self.kv_elsewhere + kv_bytes <= self.kv_capacity

    def overcommitted(self) -> bool:
        """Return whether more slots or KV memory are held than the backend has."""
        return self.free_slots < 0 or not self.fits(0.0)


@dataclass(eq=False, slots=True)
class Waiter:
    """A request waiting in a pool's queue, and the KV memory the slot it gets must have."""

    future: asyncio.Future[Slot]
    kv_bytes: float = 0.0


@dataclass(eq=False, slots=True)
class PoolState:
    """A pool's backends and the requests waiting, in arrival order, for one of its slots."""

    name: str
    spec: Pool
    backends: list[BackendState]
    waiters: deque[Waiter] = field(default_factory=deque)

    def healthy(self) -> list[BackendState]:
        return [b for b in self.backends if not b.ejected]

    def most_free(
        self, exclude: frozenset[str] = frozenset(), kv_bytes: float = 0.0
    ) -> BackendState | None:
        """Return the healthy backend with the most free slots and room for kv_bytes, or None."""
        best = None
        for backend in self.backends:
            if backend.ejected or backend.free_slots <= 0 or backend.name in exclude:
                continue
            if not backend.fits(kv_bytes):
                continue
            if best is None or backend.free_slots > best.free_slots:
                best = backend
        return best


class Fleet:
    """Every pool of the active policy with its live backend state."""

    def __init__(self, policy: Policy):
        self.pools: dict[str, PoolState] = {
            name: PoolState(
                name,
                spec,
                [
                    BackendState(
                        b.name, b.url, name, spec.slots_per_backend, spec.kv_capacity_bytes()
                    )
                    for b in spec.backends
                ],
            )
            for name, spec in policy.pools.items()
        }

    def backends(self) -> list[BackendState]:
        return [b for p in self.pools.values() for b in p.backends]

    def reconfigure(self, policy: Policy) -> Fleet:
        """Return the fleet of a new policy that keeps this one's live state.

        A backend whose URL is unchanged keeps its BackendState object (slots and KV memory
        held, outlier state), updated to its new name, pool and capacity, so the requests in
        flight give their slots back to the state the new fleet uses. A pool that keeps its name
        keeps its queue of waiters.
        """
        known = {b.url: b for b in self.backends()}
        fleet = Fleet(policy)
        for name, pool in fleet.pools.items():
            for i, fresh in enumerate(pool.backends):
                kept = known.pop(fresh.url, None)
                if kept is not None:
                    kept.name, kept.pool = fresh.name, fresh.pool
                    kept.slots, kept.kv_capacity = fresh.slots, fresh.kv_capacity
                    pool.backends[i] = kept
            previous = self.pools.get(name)
            if previous is not None:
                pool.waiters = previous.waiters
        return fleet
