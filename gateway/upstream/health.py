"""Backend health: active probes beside the request path, and ejections shared between replicas.

The health checker probes every backend. An ejected one (gateway/upstream/outliers.py) comes
back once its interval has passed and a probe succeeds, and a healthy one whose probes keep
failing is ejected without waiting for traffic to find out.

With shared state, an ejection is also a notice to the other replicas and a key in Redis that
expires with the interval, so every replica stops sending to a failing backend as soon as one
has seen it fail, and a replica that joins later learns the ejections in force.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import BackendState, Fleet
from gateway.periodic import Periodic
from gateway.upstream.client import Upstream
from gateway.upstream.outliers import OutlierDetector

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)


class HealthChecker:
    """Probe every backend on an interval and apply the results to the outlier state."""

    def __init__(
        self,
        fleet: Callable[[], Fleet],
        upstream: Upstream,
        outliers: OutlierDetector,
        on_restore: Callable[[BackendState], None],
        interval_s: float = 2.0,
    ):
        self._fleet = fleet
        self._upstream = upstream
        self._outliers = outliers
        self._on_restore = on_restore
        self.periodic = Periodic("health-checker", interval_s, self.check_once)

    def start(self) -> None:
        self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()

    async def check_once(self) -> None:
        """Probe every backend once and apply the results."""
        # A parked backend is off on purpose, and a waking one is watched by parking itself.
        backends = [b for b in self._fleet().backends() if b.parking not in ("parked", "waking")]
        results = await asyncio.gather(*(self._upstream.probe(b) for b in backends))
        for backend, ok in zip(backends, results, strict=True):
            if backend.ejected:
                if ok and self._outliers.restore(backend):
                    self._on_restore(backend)
            elif ok:
                self._outliers.success(backend)
            else:
                self._outliers.failure(backend)


class SharedEjections:
    """Tell the other replicas about this replica's ejections, and apply theirs."""

    def __init__(self, shared: SharedState, fleet: Callable[[], Fleet], outliers: OutlierDetector):
        self.shared = shared
        self._fleet = fleet
        self._outliers = outliers
        outliers.on_eject = self.announce
        shared.on("eject", self._heard)
        shared.on_reset(self.load)

    def _key(self, url: str) -> str:
        return self.shared.key("ejected", url)

    def announce(self, backend: BackendState, interval_s: float) -> None:
        """Publish an ejection, and keep it in Redis until its interval ends."""
        shared = self.shared
        if not shared.up:
            return
        ms = max(1, int(interval_s * 1000))
        notice = shared.notice("eject", url=backend.url, ms=ms)
        key = self._key(backend.url)

        async def write(redis: Redis) -> None:
            pipe = redis.pipeline(transaction=False)
            pipe.set(key, b"1", px=ms)
            pipe.publish(shared.channel, notice)
            await pipe.execute()

        shared.spawn(shared.call(write))

    def _heard(self, notice: dict[str, Any]) -> None:
        self._apply(str(notice.get("url")), float(notice.get("ms", 0)) / 1000)

    def _apply(self, url: str, interval_s: float) -> None:
        # What Redis says is bounded like an ejection of this replica's own: a notice or key
        # claiming a year (a bug, a stray writer) takes a backend out for the longest interval.
        interval_s = min(interval_s, self._outliers.max_ejection_s)
        for backend in self._fleet().backends():
            if backend.url == url and interval_s > 0:
                if not backend.ejected:
                    log.warning(
                        "backend %s of pool %s ejected for %.1f s: another replica saw it fail",
                        backend.name,
                        backend.pool,
                        interval_s,
                    )
                self._outliers.eject(backend, interval_s)

    async def load(self) -> None:
        """Apply the ejections in force (on joining shared state)."""
        urls = [b.url for b in self._fleet().backends()]

        async def read(redis: Redis) -> list[int]:
            pipe = redis.pipeline(transaction=False)
            for url in urls:
                pipe.pttl(self._key(url))
            return list(await pipe.execute())

        for url, ms in zip(urls, await self.shared.call(read), strict=True):
            if ms > 0:
                self._apply(url, ms / 1000)
