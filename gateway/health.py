"""Backend health: passive outlier detection on the request path, active probes beside it.

A backend that fails `threshold` times in a row is ejected for an interval that doubles with
each ejection (up to a cap). The health checker probes every backend; an ejected one comes back
once its interval has passed and a probe succeeds, and a healthy one whose probes keep failing
is ejected without waiting for traffic to find out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.metrics import GatewayMetrics
from gateway.periodic import Periodic
from gateway.routing.fleet import BackendState, Fleet
from gateway.upstream import Upstream

log = logging.getLogger(__name__)


class OutlierDetector:
    """Eject backends after consecutive failures, for a growing interval."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        threshold: int = 3,
        base_ejection_s: float = 2.0,
        max_ejection_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.metrics = metrics
        self.threshold = threshold
        self.base_ejection_s = base_ejection_s
        self.max_ejection_s = max_ejection_s
        self.clock = clock

    def success(self, backend: BackendState) -> None:
        backend.consecutive_failures = 0

    def failure(self, backend: BackendState) -> None:
        """Count a failure; eject the backend when it reaches the threshold."""
        backend.consecutive_failures += 1
        if backend.ejected or backend.consecutive_failures < self.threshold:
            return
        interval = min(self.base_ejection_s * 2**backend.ejections, self.max_ejection_s)
        backend.ejected = True
        backend.ejected_until = self.clock() + interval
        backend.ejections += 1
        backend.consecutive_failures = 0
        self.metrics.ejections.labels(backend.pool).inc()
        log.warning(
            "ejected backend %s of pool %s for %.1f s after %d consecutive failures",
            backend.name,
            backend.pool,
            interval,
            self.threshold,
        )

    def restore(self, backend: BackendState) -> bool:
        """Bring an ejected backend back if its interval has passed; return whether it did."""
        if backend.ejected and self.clock() >= backend.ejected_until:
            backend.ejected = False
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
