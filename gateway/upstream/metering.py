"""Metering: scrape each backend's energy counter and its engine's load, once an interval.

The edge around gateway/records/energy.py. Every interval it reads each metered backend's Prometheus
endpoint, feeds the readings and the spans of requests (and of shadow copies, which are counted
in pool energy too) to that backend's ledger, and delivers each one's energy and cost once known.
Pools that report no power (or whose scrapes keep failing) get an estimate from the capability
matrix's nominal figures, and their records say so (`energy_estimated`). Every reading also
counts whole for its backend, idle included, beside the time the backend was on and parked
(gateway/records/draw.py): the fleet's energy and device-hours, handed to `record` a minute at a
time.

The same round reads the load series of pools that name their serving `engine`
(gateway/upstream/engines.py): requests the engine runs or queues beyond the gateway's own take
the backend's slots (`BackendState.external`), and an engine that queues or whose KV cache is
full takes nothing more (`engine_full`) until a scrape sees it has room again. The prompt
cache's share and the generation speed an engine reports (llama.cpp) are kept for the fleet's
views and gauges (`engine_cached_share`, `engine_tokens_per_s`): a speed holds until the engine
measures another, as it measures none in a window where no request finished.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.db.schema import BackendEnergy
from gateway.fleet.engine_blocks import BLOCK_TOKENS
from gateway.fleet.parking import PARKED
from gateway.fleet.state import BackendState, Fleet
from gateway.metrics import GatewayMetrics
from gateway.policy.model import Pool
from gateway.policy.tariffs import Rate, Rates, own_rate
from gateway.records.draw import FleetDraw, Seen
from gateway.records.energy import BackendLedger, Span
from gateway.upstream import engines, exposition
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

FAILED_SCRAPES_BEFORE_ESTIMATING = 3
SCRAPE_TIMEOUT_S = 1.0
SLOTS_PATH = "/slots"  # llama.cpp's slots, on the server's own port
BASELINE_S = 0.1


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


# Called with (energy_j, cost_usd, estimated) once a request's energy is known.
Deliver = Callable[[float | None, float | None, bool], None]


@dataclass(slots=True, eq=False)
class _Pending:
    deliver: Deliver
    backend: BackendState
    concurrent: int


class EnergyMeter:
    """Attribute measured energy to requests and shadow copies, per backend."""

    def __init__(
        self,
        fleet: Callable[[], Fleet],
        upstream: Upstream,
        metrics: GatewayMetrics,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
        load_share: Callable[[str], float] = lambda url: 1.0,
        on_room: Callable[[str], None] = lambda pool: None,
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
        self._on_room = on_room
        self._load_share = load_share
        self._upstream = upstream
        self._metrics = metrics
        self._interval_s = interval_s
        self._clock = clock
        self._ledgers: dict[str, BackendLedger] = {}
        self._failures: dict[str, int] = {}
        self._engine_misses: dict[str, int] = {}
        self._pending: dict[str, _Pending] = {}
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
    ) -> None:
        """Close a request's span (instants on the meter's clock); call `deliver` once its
        energy is known (or estimated)."""
        concurrent = backend.load + 1
        ledger = self._ledgers.get(backend.url)
        if ledger is not None and key in ledger and self._metered(backend):
            ledger.close(key, end_at, prompt_tokens, completion_tokens, first_token_at)
            self._pending[key] = _Pending(deliver, backend, concurrent)
            return
        self._estimate(_Pending(deliver, backend, concurrent), end_at - start_at)

    def _estimate(self, pending: _Pending, seconds: float) -> None:
        pool = self._pool(pending.backend)
        if pool is None:
            pending.deliver(None, None, True)
            return
        energy_j, device_s = nominal_energy(pool, seconds, pending.concurrent)
        if not self._metered(pending.backend):
            # Its idle share the draw already estimates by time.
            above_idle = max(0.0, energy_j - pool.power.idle_w * device_s)
            self.draw.estimated(
                pending.backend.pool, pending.backend.name, self._wall(), above_idle
            )
        rate = self._rate(pending.backend.pool, pool)
        pending.deliver(energy_j, cost_usd(pool, energy_j, device_s, rate), True)

    def _release(self, span: Span) -> None:
        pending = self._pending.pop(span.key, None)
        if pending is None:
            return
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
        pending.deliver(span.energy_j, cost, False)

    async def scrape_once(self) -> None:
        """Read every metered backend's energy counter and every engine's load; release the
        records now known, and wake the queues of pools whose engines have room again."""
        fleet = self._fleet()
        offset = self._wall() - self._clock()  # from the meter's clock to the wall's
        power = []
        for state in fleet.pools.values():
            if state.spec.power_metrics is None:
                continue
            for backend in state.backends:
                if released(backend, state.spec):
                    # Given back, nothing answers for it: its meter starts anew once it is back.
                    ledger = self._ledgers.get(backend.url)
                    if ledger is not None:
                        ledger.restart()
                    continue
                power.append((backend, state.spec))
        engine = [
            (backend, pool.spec.engine)
            for pool in fleet.pools.values()
            if pool.spec.engine is not None
            for backend in pool.backends
        ]
        wanted = {b.metrics_url: b.metrics_auth for b, _ in power}
        wanted |= {b.engine_url: b.engine_auth for b, _ in engine}
        # llama.cpp says what its slots keep of past prompts: it bounds the prefix estimate.
        slotted = [b for b, name in engine if name == "llamacpp"]
        wanted |= {b.url + SLOTS_PATH: b.auth for b in slotted}
        ours = {b.url: b.gateway_load for b, _ in engine}
        readings = dict(
            zip(
                wanted,
                await asyncio.gather(*(self._fetch(url, auth) for url, auth in wanted.items())),
                strict=True,
            )
        )
        for backend, pool in power:
            now, text = readings[backend.metrics_url]
            assert pool.power_metrics is not None
            counter = (
                None if text is None else exposition.total(text, pool.power_metrics.energy_counter)
            )
            if counter is None:
                self._scrape_failed(backend.url)
                continue
            self._failures[backend.url] = 0
            ledger = self._ledgers.setdefault(backend.url, BackendLedger(pool.power.idle_w))
            interval = ledger.reading(now, counter / 1000.0, self._load_share(backend.url))  # mJ
            if interval is not None:
                self.draw.measured(
                    backend.pool,
                    backend.name,
                    interval.t0 + offset,
                    interval.t1 + offset,
                    interval.energy_j,
                )
            for span in ledger.settle():
                self._release(span)
        self._count_draw(fleet, offset)
        roomier: set[str] = set()
        for state in fleet.pools.values():
            if state.spec.engine is None:  # a reload took its engine away: its figures go too
                for kept in state.backends:
                    kept.engine_cached_share = kept.engine_tokens_per_s = None
                    if kept.external or kept.engine_full:
                        kept.external = kept.external_seen = 0
                        kept.engine_full = ""
                        roomier.add(state.name)
        for backend, name in engine:
            _, text = readings[backend.engine_url]
            load = None if text is None else engines.read_engine(text, name)
            before = backend.free_slots
            if load is None:
                # A busy engine is the one likeliest to answer its scrape late: its last figures
                # hold for a few misses; then the gateway's own bookkeeping decides.
                misses = self._engine_misses.get(backend.url, 0) + 1
                self._engine_misses[backend.url] = misses
                if misses >= FAILED_SCRAPES_BEFORE_ESTIMATING:
                    backend.external = backend.external_seen = 0
                    backend.engine_full = ""
                    backend.engine_cached_share = backend.engine_tokens_per_s = None
            else:
                self._engine_misses[backend.url] = 0
                # A request of ours on its way to the engine is in our count, not yet in its:
                # the estimate of the others' falls for a moment. It falls only once a second
                # scrape agrees, and ours is the smaller of the counts around the scrape.
                gateway = min(ours[backend.url], backend.gateway_load)
                seen = max(0, load.requests - gateway)
                backend.external = max(seen, backend.external_seen)
                backend.external_seen = seen
                backend.engine_full = engines.full_reason(load)
                backend.engine_cached_share = load.cached_share
                if load.tokens_per_s is not None:
                    backend.engine_tokens_per_s = load.tokens_per_s
            if backend.free_slots > before:
                roomier.add(backend.pool)
        for pool_name in roomier:
            self._on_room(pool_name)
        for backend in slotted:
            _, text = readings[backend.url + SLOTS_PATH]
            tokens = None if text is None else engines.slot_tokens(text)
            fleet.prefixes.bound(backend.name, None if tokens is None else tokens // BLOCK_TOKENS)

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
            pending = self._pending.pop(span.key, None)
            if pending is not None and span.end is not None:
                self._estimate(pending, span.end - span.start)

    async def _fetch(self, url: str, headers: Mapping[str, str]) -> tuple[float, str | None]:
        """Return (when the reading was taken, the metrics text or None)."""
        sent = self._clock()
        answer = await self._upstream.get(url, headers, SCRAPE_TIMEOUT_S)
        if answer is None:
            return sent, None
        status, body = answer
        text = body.decode("utf-8", errors="replace") if status == 200 else None
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
        for key in list(self._pending):
            self._estimate(self._pending.pop(key), 0.0)
        self._hand_over()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.scrape_once()
            except Exception:
                log.exception("energy scrape round failed")


def released(backend: BackendState, pool: Pool) -> bool:
    """Whether `backend` is parked by a pool whose parking gives its devices back."""
    return backend.parking == PARKED and pool.parking is not None and pool.parking.mode == "release"
