"""Gateway replicas in one process, sharing a real Redis: each with its own admission, outliers
and prefix index.

Enough of a replica to test what replicas share (slots as leases, ejections, prefix blocks,
their fallback when Redis is out) without a whole gateway per replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import redis

from gateway.fleet.admission import Admission
from gateway.fleet.leases import Leases
from gateway.fleet.shared_prefixes import SharedPrefixes
from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import Fleet, Slot
from gateway.metrics import GatewayMetrics
from gateway.upstream.health import SharedEjections
from gateway.upstream.outliers import OutlierDetector
from policies import fleet_policy

SLOTS = 4


@dataclass
class Replica:
    """One replica's shared state, fleet, admission and outlier detection."""

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
    # A Redis call a busy machine makes slow is no outage; a stopped Redis still fails at once.
    shared = SharedState(url, metrics, prefix=prefix, lease_s=lease_s, timeout_s=10)
    fleet = Fleet(fleet_policy(asic_extra={"slots_per_backend": SLOTS}))
    admission = Admission(fleet, Leases(shared), refresh_s=refresh_s)
    outliers = OutlierDetector(metrics, threshold=1, clock=clock)
    SharedEjections(shared, lambda: fleet, outliers)
    SharedPrefixes(shared, fleet.prefixes)
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


async def sent(leases: Leases) -> None:
    """Return once the scripts the replica has queued so far (give-backs) have run in Redis.

    Give-backs are sent in the background, one pipeline at a time in the order they were
    called, and a pipeline's callers hear back once all of it has run (scripts a restarted
    Redis had to load again included): a call made after them is answered after them. Waiting
    for the count to drop instead could not tell a give-back from a lease lapsing.
    """
    await asyncio.sleep(0)  # a give-back spawned just now queues its script
    await leases.occupancy([])
