"""Metering: scrape each backend's energy counter and put energy and cost on request records.

The edge around gateway/energy.py. Every interval it reads each metered backend's Prometheus
endpoint, feeds the readings and the request spans to that backend's ledger, and hands each
request record on (to the writer and the learner) once its energy is known, with `energy_j` and
`cost_usd` set.
Pools that report no power (or whose scrapes keep failing) get an estimate from the capability
matrix's nominal figures, and their records say so (`energy_estimated`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from gateway.energy import BackendLedger, Span, read_counter_j
from gateway.metrics import GatewayMetrics
from gateway.policy import Policy, Pool
from gateway.records import RequestRecord
from gateway.routing.fleet import BackendState
from gateway.upstream import Upstream

log = logging.getLogger(__name__)

FAILED_SCRAPES_BEFORE_ESTIMATING = 3
SCRAPE_TIMEOUT_S = 1.0
BASELINE_S = 0.1


def cost_usd(pool: Pool, energy_j: float, device_s: float) -> float:
    """Price energy at the pool's electricity rate and device time at its hourly rate."""
    return energy_j * pool.price.usd_per_kwh / 3.6e6 + device_s * pool.price.usd_per_hour / 3600


def nominal_energy(pool: Pool, seconds: float, concurrent: int) -> tuple[float, float]:
    """Estimate (energy_j, device_s) of one of `concurrent` requests that ran `seconds`."""
    k = max(concurrent, 1)
    utilisation = min(k / pool.slots_per_backend, 1.0)
    # Power rises sub-linearly with batch (see docs/simulator.md): a square root is the shape.
    watts = pool.power.idle_w + (pool.power.max_w - pool.power.idle_w) * utilisation**0.5
    return watts * seconds / k, seconds / k


@dataclass(slots=True, eq=False)
class _Pending:
    record: RequestRecord
    backend: BackendState
    concurrent: int


class EnergyMeter:
    """Attribute measured energy to requests, per backend, and write their records."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        upstream: Upstream,
        sink: Callable[[RequestRecord], None],
        metrics: GatewayMetrics,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self._policy = policy
        self._upstream = upstream
        self._sink = sink
        self._metrics = metrics
        self._interval_s = interval_s
        self._clock = clock
        self._ledgers: dict[str, BackendLedger] = {}
        self._failures: dict[str, int] = {}
        self._pending: dict[str, _Pending] = {}
        self._task: asyncio.Task[None] | None = None

    def _pool(self, backend: BackendState) -> Pool | None:
        return self._policy().pools.get(backend.pool)

    def _metered(self, backend: BackendState) -> bool:
        pool = self._pool(backend)
        return (
            pool is not None
            and pool.power_metrics is not None
            and self._failures.get(backend.url, 0) < FAILED_SCRAPES_BEFORE_ESTIMATING
        )

    def _ledger(self, backend: BackendState) -> BackendLedger:
        ledger = self._ledgers.get(backend.url)
        if ledger is None:
            pool = self._pool(backend)
            ledger = BackendLedger(idle_w=pool.power.idle_w if pool else 0.0)
            self._ledgers[backend.url] = ledger
        return ledger

    def open(self, backend: BackendState, key: str, start: float) -> None:
        """Begin attributing energy to a request that started upstream at `start`."""
        if self._metered(backend):
            self._ledger(backend).open(key, start)

    def abandon(self, backend: BackendState, key: str) -> None:
        """Stop attributing energy to an attempt that failed; its time counts as idle."""
        ledger = self._ledgers.get(backend.url)
        if ledger is not None:
            ledger.forget(key)

    def submit(
        self,
        record: RequestRecord,
        backend: BackendState,
        *,
        start: float,
        end: float,
        first_token: float | None,
    ) -> None:
        """Hand over a finished request's record; it is written once its energy is known."""
        concurrent = backend.in_flight + 1
        ledger = self._ledgers.get(backend.url)
        if (
            ledger is not None
            and self._metered(backend)
            and record.decision_id in {s.key for s in ledger.pending()}
        ):
            ledger.close(
                record.decision_id,
                end,
                record.prompt_tokens or 0,
                record.completion_tokens or 0,
                first_token,
            )
            self._pending[record.decision_id] = _Pending(record, backend, concurrent)
            return
        self._estimate(record, backend, end - start, concurrent)

    def _estimate(
        self, record: RequestRecord, backend: BackendState, seconds: float, concurrent: int
    ) -> None:
        pool = self._pool(backend)
        if pool is not None:
            energy_j, device_s = nominal_energy(pool, seconds, concurrent)
            record.energy_j = round(energy_j, 6)
            record.cost_usd = cost_usd(pool, energy_j, device_s)
            record.energy_estimated = True
        self._sink(record)

    def _release(self, span: Span) -> None:
        pending = self._pending.pop(span.key, None)
        if pending is None:
            return
        pool = self._pool(pending.backend)
        record = pending.record
        record.energy_j = round(span.energy_j, 6)
        record.cost_usd = cost_usd(pool, span.energy_j, span.device_s) if pool else None
        record.energy_estimated = False
        if record.pool:
            self._metrics.energy.labels(record.pool).inc(span.energy_j)
        self._sink(record)

    async def scrape_once(self) -> None:
        """Read every metered backend's energy counter and release the records now known."""
        policy = self._policy()
        targets = [
            (backend, pool)
            for pool in policy.pools.values()
            if pool.power_metrics is not None
            for backend in pool.backends
        ]
        readings = await asyncio.gather(
            *(self._fetch(b.metrics_url or b.url + "/metrics") for b, _ in targets)
        )
        for (backend, pool), (now, text) in zip(targets, readings, strict=True):
            assert pool.power_metrics is not None
            counter = (
                None if text is None else read_counter_j(text, pool.power_metrics.energy_counter)
            )
            if counter is None:
                self._scrape_failed(backend.url)
                continue
            self._failures[backend.url] = 0
            ledger = self._ledgers.setdefault(backend.url, BackendLedger(pool.power.idle_w))
            ledger.reading(now, counter)
            for span in ledger.settle():
                self._release(span)

    def _scrape_failed(self, url: str) -> None:
        failures = self._failures.get(url, 0) + 1
        self._failures[url] = failures
        self._metrics.power_scrape_failures.inc()
        if failures == FAILED_SCRAPES_BEFORE_ESTIMATING:
            log.warning(
                "no power readings from %s; estimating its energy from nominal figures", url
            )
            self._estimate_all(url)

    def _estimate_all(self, url: str) -> None:
        ledger = self._ledgers.pop(url, None)
        if ledger is None:
            return
        for span in ledger.pending():
            pending = self._pending.pop(span.key, None)
            if pending is not None and span.end is not None:
                self._estimate(
                    pending.record, pending.backend, span.end - span.start, pending.concurrent
                )

    async def _fetch(self, url: str) -> tuple[float, str | None]:
        """Return (when the reading was taken, the metrics text or None)."""
        sent = self._clock()
        try:
            async with self._upstream.session.get(
                url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
            ) as response:
                text = await response.text() if response.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return sent, None
        # The exporter read its counter somewhere in the round trip: take the middle.
        return (sent + self._clock()) / 2, text

    async def start(self) -> None:
        """Take a baseline (two readings of the idle fleet, to learn idle draw), then run."""
        await self.scrape_once()
        await asyncio.sleep(min(self._interval_s, BASELINE_S))
        await self.scrape_once()
        self._task = asyncio.create_task(self._run(), name="energy-meter")

    async def stop(self) -> None:
        """Take a last reading, then write every held record, estimated if still unknown."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self.scrape_once()
        except Exception:
            log.exception("final energy reading failed")
        for url in list(self._ledgers):
            self._estimate_all(url)
        for pending in list(self._pending.values()):
            self._pending.pop(pending.record.decision_id)
            self._estimate(pending.record, pending.backend, 0.0, pending.concurrent)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.scrape_once()
            except Exception:
                log.exception("energy scrape round failed")
