"""Backend health: passive outlier detection on the request path, active probes beside it.

A backend that fails `threshold` times in a row, or half the requests of a 10 s window (at
least 10 of them), is ejected for an interval that doubles with each ejection (up to a cap).
The share catches what a run cannot: a backend failing every other request, as one behind a
round-robin balancer with one broken replica does, never fails three times in a row. As in
Envoy, the doubling is forgiven: every `forgive_after_s` (10 s) a backend serves after
returning takes one doubling off, so a backend with a fault now and then is ejected again for
the base interval, not for ever longer ones. This holds for ejections other replicas announce
too. The health checker probes every backend; an ejected one comes back once its interval has
passed and a probe succeeds, and a healthy one whose probes keep failing is ejected without
waiting for traffic to find out.

With shared state, an ejection is also a notice to the other replicas and a key in Redis that
expires with the interval, so every replica stops sending to a failing backend as soon as one
has seen it fail, and a replica that joins later learns the ejections in force.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import BackendState, Fleet
from gateway.metrics import GatewayMetrics
from gateway.periodic import Periodic
from gateway.upstream.client import Upstream

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)


class OutlierDetector:
    """Eject backends after consecutive failures or a failing share of a window's requests, for
    an interval that grows and is forgiven."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        threshold: int = 3,
        failure_share: float = 0.5,
        min_requests: int = 10,
        window_s: float = 10.0,
        base_ejection_s: float = 2.0,
        max_ejection_s: float = 30.0,
        forgive_after_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        on_eject: Callable[[BackendState, float], None] | None = None,
    ):
        self.metrics = metrics
        self.on_eject = on_eject
        self.threshold = threshold
        self.failure_share = failure_share
        self.min_requests = min_requests
        self.window_s = window_s
        self.base_ejection_s = base_ejection_s
        self.max_ejection_s = max_ejection_s
        self.forgive_after_s = forgive_after_s
        self.clock = clock

    def success(self, backend: BackendState) -> None:
        backend.consecutive_failures = 0
        self._count(backend, failed=False)

    def failure(self, backend: BackendState) -> None:
        """Count a failure; eject the backend when it reaches either rule."""
        backend.consecutive_failures += 1
        requests, failures = self._count(backend, failed=True)
        if backend.ejected:
            return
        if backend.consecutive_failures >= self.threshold:
            why = f"{backend.consecutive_failures} consecutive failures"
        elif requests >= self.min_requests and failures >= self.failure_share * requests:
            why = f"{failures} failures in its last {requests} requests"
        else:
            return
        self._forgive(backend)
        interval = min(self.base_ejection_s * 2**backend.ejections, self.max_ejection_s)
        self.eject(backend, interval)
        self.metrics.ejections.labels(backend.pool).inc()
        log.warning(
            "ejected backend %s of pool %s for %.1f s after %s",
            backend.name,
            backend.pool,
            interval,
            why,
        )
        if self.on_eject is not None:
            self.on_eject(backend, interval)

    def _count(self, backend: BackendState, *, failed: bool) -> tuple[int, int]:
        """Count an outcome in the backend's window; return the window's requests and failures."""
        now = self.clock()
        if now - backend.window_started >= self.window_s:
            backend.window_started = now
            backend.window_requests = backend.window_failures = 0
        backend.window_requests += 1
        backend.window_failures += failed
        return backend.window_requests, backend.window_failures

    def eject(self, backend: BackendState, interval_s: float) -> None:
        """Take a backend out of rotation for interval_s (here, or because a replica said so)."""
        if not backend.ejected:
            self._forgive(backend)
            backend.ejections += 1
        backend.ejected = True
        backend.ejected_until = max(backend.ejected_until, self.clock() + interval_s)
        backend.consecutive_failures = 0
        backend.window_requests = backend.window_failures = 0  # it returns with a clean slate

    def _forgive(self, backend: BackendState) -> None:
        """Take one doubling off per forgive_after_s the backend has served since it returned."""
        if backend.ejected or not backend.ejections:
            return
        forgiven = int((self.clock() - backend.returned_at) // self.forgive_after_s)
        if forgiven > 0:
            backend.ejections = max(0, backend.ejections - forgiven)
            backend.returned_at += forgiven * self.forgive_after_s

    def restore(self, backend: BackendState) -> bool:
        """Bring an ejected backend back if its interval has passed; return whether it did."""
        now = self.clock()
        if backend.ejected and now >= backend.ejected_until:
            backend.ejected = False
            backend.returned_at = now
            backend.consecutive_failures = 0
            log.info(
                "backend %s of pool %s is back after passing its health check",
                backend.name,
                backend.pool,
            )
            return True
        return False


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
        backends = self._fleet().backends()
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
