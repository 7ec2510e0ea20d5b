"""Outlier detection: eject a backend that keeps failing, passively, from the requests it serves.

A backend that fails `threshold` times in a row, or half the requests of a 10 s window (at
least 10 of them), is ejected for an interval that doubles with each ejection (up to a cap).
The share catches what a run cannot: a backend failing every other request, as one behind a
round-robin balancer with one broken replica does, never fails three times in a row. As in
Envoy, the doubling is forgiven: every `forgive_after_s` (10 s) a backend serves after
returning takes one doubling off, so a backend with a fault now and then is ejected again for
the base interval, not for ever longer ones. This holds for ejections other replicas announce
too. An ejected backend comes back through the health checker (gateway/upstream/health.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.fleet.state import BackendState
from gateway.metrics import GatewayMetrics

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
