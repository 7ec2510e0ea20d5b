"""The energy meter: read each backend's energy counter, attribute it to requests, and count
the fleet's draw.

The edge around gateway/energy/ledger.py and gateway/energy/draw.py. Every round of the metrics
scrape (gateway/upstream/scrape.py) hands it each metered backend's Prometheus text; a reading
is O(1) per backend. The spans of requests (and of shadow copies, which are counted in pool
energy too) are opened by the forwarder and the mirror and closed as each ends; their records
are written then, without waiting. A task of the meter's own splits what the readings made due,
a slice of the event loop at a time (`SLICE_S`), and delivers each request's energy and cost
once final: at most a scrape interval and the ledger's `SETTLE_WITHIN_S` after it ended.

Pools that report no power (or whose scrapes keep failing) get an estimate from the capability
matrix's nominal figures, at once, and their records say so (`energy_estimated`). Every reading
also counts whole for its backend, idle included, beside the time the backend was on and parked
(gateway/energy/draw.py): the fleet's energy and device-hours, handed to `record` a minute at a
time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from gateway.db.schema import BackendEnergy
from gateway.energy.draw import FleetDraw, Seen
from gateway.energy.ledger import BackendLedger, Span
from gateway.fleet.state import PARKED, BackendState, Fleet
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import Pool
from gateway.policy.tariffs import Rate, Rates, own_rate
from gateway.upstream import exposition
from gateway.upstream.scrape import Reading

log = logging.getLogger(__name__)

FAILED_SCRAPES_BEFORE_ESTIMATING = 3
# The longest the settling task holds the event loop before it lets requests run.
SLICE_S = 0.001


def cost_usd(pool: Pool, energy_j: float, device_s: float, rate: Rate) -> float:
    """Price energy at the electricity's rate now and device time at the pool's hourly rate."""
    return energy_j * rate.usd_per_j + device_s * pool.price.usd_per_hour / 3600


def nominal_energy(pool: Pool, seconds: float, concurrent: int) -> tuple[float, float]:
    """Estimate (energy_j, device_s) of one of `concurrent` requests that ran `seconds`."""
    k = max(concurrent, 1)
    utilisation = min(k / pool.slots_per_backend, 1.0)
    # Power rises sub-linearly with batch (see docs/simulator.md): a square root is the shape.
    watts = pool.power.idle_w + (pool.power.max_w - pool.power.idle_w) * utilisation**0.5
    return watts * seconds / k, seconds / k


# Called with (subject, energy_j, cost_usd, estimated) once a request's energy is known: one
# function for every request, told which by its subject.
Deliver = Callable[[Any, float | None, float | None, bool], None]


class _Pending(NamedTuple):
    """Whom to tell of a request's energy, and what an estimate of it needs.

    Held for every request until its energy is final: a tuple, and no closure, so that a
    request waiting for its energy is two objects for the collector to walk (this and its
    span), not seven.
    """

    deliver: Deliver
    subject: Any
    backend: BackendState
    concurrent: int
    end_at: float


class EnergyMeter:
    """Attribute measured energy to requests and shadow copies, per backend."""

    def __init__(
        self,
        fleet: Callable[[], Fleet],
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
        load_share: Callable[[str], float] = lambda url: 1.0,
        rates: Rates | None = None,
        wall: Callable[[], float] = time.time,
        record: Callable[[BackendEnergy], None] = lambda row: None,
    ):
        # The fleet's draw per backend and minute, on the wall clock, for `record`.
        self.draw = FleetDraw()
        self._wall = wall
        self._record = record
        # What each pool's electricity costs now (its tariff's window), for the records' cost.
        self._rates = rates
        self._fleet = fleet
        self._load_share = load_share
        self._metrics = metrics
        self._clock = clock
        self._ledgers: dict[str, BackendLedger] = {}
        self._failures: dict[str, int] = {}
        self._due = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _pool(self, backend: BackendState) -> Pool | None:
        pool = self._fleet().pools.get(backend.pool)
        return pool.spec if pool is not None else None

    def _rate(self, name: str, pool: Pool) -> Rate:
        return self._rates(name) if self._rates is not None else own_rate(pool)

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

    def power_w(self, backend: BackendState) -> float | None:
        """Return what the backend's energy counter measured it drawing lately, if metered."""
        ledger = self._ledgers.get(backend.url)
        return ledger.power_w if ledger is not None and self._metered(backend) else None

    def open(self, backend: BackendState, key: str, start_at: float) -> None:
        """Begin attributing energy to a request that started upstream at `start_at`."""
        if self._metered(backend):
            self._ledger(backend).open(key, start_at)

    def abandon(self, backend: BackendState, key: str) -> None:
        """Stop attributing energy to an attempt that failed; its time counts as idle."""
        ledger = self._ledgers.get(backend.url)
        if ledger is not None:
            ledger.forget(key)

    def settle(
        self,
        backend: BackendState,
        key: str,
        *,
        start_at: float,
        end_at: float,
        first_token_at: float | None,
        prompt_tokens: int,
        completion_tokens: int,
        deliver: Deliver,
        subject: Any,
    ) -> None:
        """Close a request's span (instants on the meter's clock); call `deliver` with
        `subject` once its energy is known (or estimated)."""
        pending = _Pending(deliver, subject, backend, backend.load + 1, end_at)
        ledger = self._ledgers.get(backend.url)
        if ledger is not None and key in ledger:
            if self._metered(backend):
                ledger.close(key, end_at, prompt_tokens, completion_tokens, first_token_at, pending)
                return
            ledger.forget(key)  # its meter failed meanwhile: estimated, below
        self._estimate(pending, end_at - start_at)

    def _estimate(self, pending: _Pending, seconds: float) -> None:
        pool = self._pool(pending.backend)
        if pool is None:
            pending.deliver(pending.subject, None, None, True)
            return
        energy_j, device_s = nominal_energy(pool, seconds, pending.concurrent)
        if not self._metered(pending.backend):
            # Its idle share the draw already estimates by time.
            above_idle = max(0.0, energy_j - pool.power.idle_w * device_s)
            self.draw.estimated(
                pending.backend.pool, pending.backend.name, self._wall(), above_idle
            )
        rate = self._rate(pending.backend.pool, pool)
        cost = cost_usd(pool, energy_j, device_s, rate)
        pending.deliver(pending.subject, energy_j, cost, True)

    def _release(self, span: Span) -> None:
        pending: _Pending | None = span.tag
        if pending is None:  # estimated meanwhile: its meter failed
            return
        span.tag = None
        pool = self._pool(pending.backend)
        cost = (
            cost_usd(pool, span.energy_j, span.device_s, self._rate(pending.backend.pool, pool))
            if pool
            else None
        )
        m, pool_name = self._metrics, pending.backend.pool
        m.child(m.energy, pool_name).inc(span.energy_j)
        if cost is not None:
            m.child(m.cost, pool_name).inc(cost)
        m.attribution_delay.observe(max(0.0, self._clock() - pending.end_at))
        pending.deliver(pending.subject, span.energy_j, cost, False)

    def wanted(self) -> Mapping[str, Mapping[str, str]]:
        """Return the energy endpoints to read: every metered backend not given back."""
        wanted: dict[str, Mapping[str, str]] = {}
        for state in self._fleet().pools.values():
            if state.spec.power_metrics is None:
                continue
            for backend in state.backends:
                if released(backend, state.spec):
                    # Given back, nothing answers for it: its meter starts anew once it is back.
                    ledger = self._ledgers.get(backend.url)
                    if ledger is not None:
                        ledger.restart()
                    continue
                wanted[backend.metrics_url] = backend.metrics_auth
        return wanted

    def read(self, readings: Mapping[str, Reading]) -> None:
        """Take a round's readings of the energy counters: O(1) per backend; the splitting
        they make due is the settling task's."""
        fleet = self._fleet()
        offset = self._wall() - self._clock()  # from the meter's clock to the wall's
        for state in fleet.pools.values():
            metrics = state.spec.power_metrics
            if metrics is None:
                continue
            for backend in state.backends:
                reading = readings.get(backend.metrics_url)
                if reading is None:
                    continue  # not asked for this round (released)
                now, text = reading
                counter = None if text is None else exposition.total(text, metrics.energy_counter)
                if counter is None:
                    self._scrape_failed(backend.url)
                    continue
                self._failures[backend.url] = 0
                ledger = self._ledgers.setdefault(
                    backend.url, BackendLedger(state.spec.power.idle_w)
                )
                interval = ledger.reading(now, counter / 1000.0, self._load_share(backend.url))
                if interval is not None:
                    self.draw.measured(
                        backend.pool,
                        backend.name,
                        interval.t0 + offset,
                        interval.t1 + offset,
                        interval.energy_j,
                    )
        self._count_draw(fleet, offset)
        self._due.set()

    async def _settling(self) -> None:
        """Split what the readings made due and deliver what is final, a slice at a time."""
        while True:
            await self._due.wait()
            self._due.clear()
            began = time.perf_counter()
            for ledger in list(self._ledgers.values()):
                for span in ledger.settling():
                    if span is not None:
                        self._release(span)
                    if time.perf_counter() - began > SLICE_S:
                        await asyncio.sleep(0)
                        began = time.perf_counter()

    def settle_now(self) -> None:
        """Split and deliver everything due at once (for a stop, or a test)."""
        for ledger in list(self._ledgers.values()):
            for span in ledger.settle():
                self._release(span)

    def _count_draw(self, fleet: Fleet, offset: float) -> None:
        """Count every backend's time up to now, and hand over the minutes that have ended."""
        now = self._clock() + offset
        seen = []
        for pool in fleet.pools.values():
            for backend in pool.backends:
                ledger = self._ledgers.get(backend.url)
                # A released backend has no meter to wait for while it is: it draws nothing.
                metered = (
                    ledger is not None
                    and self._metered(backend)
                    and not released(backend, pool.spec)
                )
                seen.append(
                    Seen(
                        backend.pool,
                        backend.name,
                        backend.parking == PARKED,
                        pool.spec.power.idle_w,
                        ledger.measured_until + offset if ledger is not None and metered else None,
                    )
                )
        self.draw.round(now, seen)
        self._hand_over(now)

    def _hand_over(self, before: float = math.inf) -> None:
        for m in self.draw.take(before):
            self._record(
                BackendEnergy(
                    m.ts, m.pool, m.backend, m.on_s, m.parked_s, m.energy_j, m.estimated_j
                )
            )

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
            pending, span.tag = span.tag, None
            if pending is not None and span.end is not None:
                self._estimate(pending, span.end - span.start)

    def start(self) -> None:
        self._task = asyncio.create_task(self._settling(), name="energy-settling")

    async def stop(self) -> None:
        """Deliver every request's energy: what the last readings settle, the rest estimated.

        The scrape takes its last reading first (gateway/upstream/scrape.py)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.settle_now()
        for url in list(self._ledgers):
            self._estimate_all(url)
        self._hand_over()


def released(backend: BackendState, pool: Pool) -> bool:
    """Whether `backend` is parked by a pool whose parking gives its devices back."""
    return backend.parking == PARKED and pool.parking is not None and pool.parking.mode == "release"
