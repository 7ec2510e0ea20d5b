"""The running gateway: settings, the active policy, the fleet's state and every part that serves.

`Gateway` builds the parts and wires them to each other, starts and stops them in order, and
swaps in a new policy version between two requests. The ASGI app that serves it is `gateway.app`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from gateway.costmodel import store
from gateway.costmodel.learner import Learner
from gateway.costmodel.predict import CostModel, OutputLengths
from gateway.costmodel.train import Observation, RetrainSchedule
from gateway.db.connection import connect, reachable_apart
from gateway.db.retention import Pruner, Windows
from gateway.db.schema import BackendEnergy, RequestRecord, backend_energy, request_records
from gateway.energy.meter import EnergyMeter
from gateway.errors import PolicyStoreUnavailable
from gateway.fleet.admission import Admission
from gateway.fleet.collector import FleetCollector
from gateway.fleet.kv_events import KvEventSubscriber, publishers
from gateway.fleet.leases import Leases
from gateway.fleet.ratelimit import TokenBuckets
from gateway.fleet.shared_prefixes import SharedPrefixes
from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import BackendState, Fleet, Serving
from gateway.metrics import GatewayMetrics
from gateway.parking.driver import Parker, command_environment
from gateway.periodic import LoopLag, time_collections
from gateway.policy import versions
from gateway.policy.credentials import Access
from gateway.policy.definition import Policy, SloClass
from gateway.policy.load import content_hash, render_policy
from gateway.policy.sync import FileWatcher, PolicyWatcher
from gateway.policy.tariffs import DAY_S, Rate, fixed_rates, rate_at
from gateway.policy.versions import PolicyVersion
from gateway.promotion.rollout import RolloutDriver
from gateway.promotion.shadow_minutes import ShadowMinutes
from gateway.records.batching import BatchWriter
from gateway.records.requests import RecordWriter, RequestEnergy
from gateway.records.writer import WriterProcess
from gateway.report.schedule import ReportScheduler, parse_schedule
from gateway.routing.classify import TokenEstimator
from gateway.routing.ranking import CostRanker
from gateway.routing.tokenizers import tokenizer_or_none
from gateway.settings import Settings, variables
from gateway.shadow.mirror import Mirror
from gateway.shadow.records import ShadowWriter
from gateway.upstream.client import Upstream
from gateway.upstream.engines import EngineLoads
from gateway.upstream.forward import Forwarder
from gateway.upstream.health import HealthChecker, SharedEjections
from gateway.upstream.outliers import OutlierDetector
from gateway.upstream.scrape import Scrape

log = logging.getLogger(__name__)

# How often a gateway that started without a usable database checks for it again.
DATABASE_RECHECK_S = 2.0


class Gateway:
    """The running gateway: settings, active policy, fleet state and the parts serving requests."""

    def __init__(
        self,
        settings: Settings,
        policy: Policy,
        *,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.perf_counter,
        policy_text: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ):
        self.settings = settings
        # The upstream keys policies name, read from `environ`, and where they may be sent: a
        # policy this gateway cannot serve by them is refused before anything changes.
        self.access = Access(environ, settings.upstream_key_hosts, settings.upstream_hosts)
        self.clock = clock
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        # Version 0 until the version store confirms or replaces it.
        text = policy_text if policy_text is not None else render_policy(policy)
        self.serving = Serving(policy, Fleet(policy, self.access), 0, text)
        # The rates of the pools without a tariff, for the policy they were read from.
        self._fixed_rates = (policy, fixed_rates(policy))
        self.metrics.registry.register(FleetCollector(lambda: self.fleet))
        self.estimator = TokenEstimator(tokenizers=tokenizer_or_none)
        # What the engines that publish KV-cache events hold (each replica subscribes itself).
        self.kv_events = KvEventSubscriber(self.fleet.prefixes)
        self._kv_events_started = False
        self.shared = (
            SharedState(
                settings.redis_url,
                self.metrics,
                prefix=settings.redis_prefix,
                lease_s=settings.slot_lease_s,
                timeout_s=settings.redis_timeout_s,
            )
            if settings.redis_url
            else None
        )
        self.admission = Admission(
            self.fleet, Leases(self.shared) if self.shared is not None else None
        )
        self.buckets = TokenBuckets(self.shared)
        self.upstream = Upstream(settings.max_answer_bytes)
        self.outliers = OutlierDetector(self.metrics)
        if self.shared is not None:
            SharedEjections(self.shared, lambda: self.fleet, self.outliers)
            # Every policy version's fleet keeps this one index (Fleet.reconfigure).
            SharedPrefixes(self.shared, self.fleet.prefixes)
        self.db = connect(settings.database_url)
        # Records are inserted by a process of their own, off the serving process's interpreter
        # and below its priority.
        self.writer = (
            WriterProcess(settings.database_url) if reachable_apart(settings.database_url) else None
        )
        spill: dict[str, Any] = {
            "flush_interval_s": settings.record_flush_interval_s,
            "max_held": settings.record_buffer_rows,
            "spill_dir": settings.spill_dir,
            "max_spill_bytes": settings.spill_max_bytes,
            "inserter": self.writer,
        }
        self.records = RecordWriter(self.db, self.metrics, targets=self._slo_targets, **spill)
        # Each backend's draw and time on and parked, a row a minute (gateway/energy/draw.py).
        self.draw_records: BatchWriter[BackendEnergy] = BatchWriter(
            self.db,
            backend_energy,
            self.metrics,
            self.metrics.draw_records_written,
            self.metrics.draw_records_dropped,
            **spill,
        )
        self.meter = EnergyMeter(
            lambda: self.fleet,
            self.metrics,
            clock=clock,
            load_share=self._load_share,
            rates=self.rate,
            record=self.draw_records.add,
        )
        self.engine_loads = EngineLoads(lambda: self.fleet, on_room=self._room)
        self.scrape = Scrape(
            self.upstream,
            [self.meter, self.engine_loads],
            interval_s=settings.power_scrape_interval_s,
            clock=clock,
        )
        self.costmodel = CostModel(policy)
        self.learner = Learner(
            lambda: self.policy,
            self.db,
            self.metrics,
            self._use_model,
            schedule=RetrainSchedule(
                every=settings.model_retrain_every,
                interval_s=settings.model_retrain_interval_s,
                min_interval_s=settings.model_retrain_min_interval_s,
            ),
        )
        self.loop_lag = LoopLag(self.metrics.loop_lag.observe)
        self._untime_collections: Callable[[], None] = lambda: None
        self.outputs = OutputLengths(default=policy.assumed_max_tokens)
        self.ranker = CostRanker(lambda: self.costmodel, self.outputs, self.rate)
        self.forwarder = Forwarder(
            self.upstream,
            self.admission,
            self.outliers,
            self.metrics,
            self.meter,
            self.ranker,
            clock,
        )
        self.shadow_records = ShadowWriter(
            self.db, self.metrics, summaries=ShadowMinutes(self._slo_targets), **spill
        )
        self.mirror = Mirror(
            self.upstream,
            self.admission,
            self.metrics,
            self.shadow_records,
            lambda: self.fleet,
            self.meter,
            self.buckets,
        )
        self.health = HealthChecker(
            lambda: self.fleet,
            self.upstream,
            self.outliers,
            on_restore=self._restored,
            interval_s=settings.health_check_interval_s,
        )
        self.parker = Parker(
            lambda: self.fleet,
            lambda: self.policy,
            self.upstream,
            self.admission,
            self.metrics,
            shared=self.shared,
            db=self.db,
            power_w=self.meter.power_w,
            commands=settings.parking_commands,
            environ=command_environment(environ, variables()),
        )
        self.policy_watcher = PolicyWatcher(
            self.db,
            self.metrics,
            lambda: self.policy_version,
            self.use_policy,
            interval_s=settings.policy_poll_interval_s,
            announce=self._announce_policy if self.shared is not None else None,
        )
        if self.shared is not None:
            self.shared.on("policy", lambda _: self.policy_watcher.nudge())
        self.policy_file = FileWatcher(
            settings.policy_path, self.db, self.metrics, self.policy_watcher.sync, self.access
        )
        self.reports = (
            ReportScheduler(
                parse_schedule(settings.report_schedule),
                settings.reports_dir,
                self.db,
                lambda: self.policy,
                lambda: self.costmodel,
            )
            if settings.report_schedule
            else None
        )
        self.rollouts = RolloutDriver(
            self.db,
            lambda: self.policy,
            self.policy_watcher.sync,
            interval_s=settings.rollout_check_interval_s,
        )
        self.retention = Pruner(self.db, Windows.of(settings), settings.retention_interval_s)
        self.database_ok = False
        self._database_wait: asyncio.Task[None] | None = None

    @property
    def policy(self) -> Policy:
        return self.serving.policy

    @property
    def fleet(self) -> Fleet:
        return self.serving.fleet

    @property
    def policy_version(self) -> int:
        return self.serving.version

    @property
    def policy_text(self) -> str:
        return self.serving.text

    def use_policy(self, policy: Policy, stored: PolicyVersion) -> None:
        """Serve a new policy version from the next request on.

        Requests already routed finish on the policy and fleet they started with; the backends
        both fleets share keep one state object, so their slots are given back where the new
        fleet sees them.
        """
        fleet = self.fleet.reconfigure(policy)
        costmodel = _rebased(self.costmodel, policy)
        # One step on the event loop, no await: a request sees all of the old or all of the new.
        self.serving = Serving(policy, fleet, stored.version, stored.content)
        self.admission.fleet = fleet
        if self._kv_events_started:
            self.kv_events.configure(publishers(policy))
        self.costmodel = costmodel
        self.outputs.default = policy.assumed_max_tokens
        self.metrics.policy_version.set(stored.version)
        for pool in fleet.pools.values():
            if pool.waiters:  # the new version may have given the pool more slots
                self.admission.dispatch(pool)

    async def _seed_policy(self) -> bool:
        """Serve the store's active version, or store ours as version 1; say if the store works."""
        source = f"initial policy from {self.settings.policy_path}"
        try:
            stored = await asyncio.to_thread(
                versions.record,
                self.db,
                self.policy_text,
                f"gateway@{socket.gethostname()}",
                source,
                only_if_none=True,
            )
            if stored.hash == content_hash(self.policy_text):
                self.serving = dataclasses.replace(self.serving, version=stored.version)
                self.metrics.policy_version.set(stored.version)
            else:
                await self.policy_watcher.sync()
        except PolicyStoreUnavailable as exc:
            log.error("serving the policy file without versions: %s", exc.message)
            return False
        return True

    def rate(self, pool: str) -> Rate:
        """Return what a pool's electricity costs now, by its tariff and the time of day (UTC)."""
        # Asked for every pool ranked and every request metered: a pool without a tariff has
        # one rate, read once per policy version (0.55 µs a call otherwise).
        policy = self.policy
        known, fixed = self._fixed_rates
        if known is not policy:
            fixed = fixed_rates(policy)
            self._fixed_rates = (policy, fixed)
        rate = fixed.get(pool)
        return rate if rate is not None else rate_at(policy, pool, time.time() % DAY_S)

    def _slo_targets(self, name: str | None) -> SloClass | None:
        """Return an SLO class's targets in the policy serving now (None: its default class)."""
        policy = self.policy
        return policy.slo_classes.get(name or policy.default_slo_class)

    def _load_share(self, url: str) -> float:
        """Return the part of a backend's load that is this replica's requests (1 alone)."""
        for backend in self.fleet.backends():
            if backend.url == url and (backend.elsewhere or backend.external):
                return backend.in_flight / backend.load
        return 1.0

    def _announce_policy(self, version: int) -> None:
        assert self.shared is not None
        self.shared.publish("policy", version=version)

    def record_finished(self, record: RequestRecord) -> None:
        """Keep a finished request's record."""
        self.records.add(record)

    def energy_settled(
        self, energy: RequestEnergy, seen: Observation | None, predicted_energy_j: float | None
    ) -> None:
        """Keep a request's energy, now known, and learn from the request."""
        self.records.add_energy(energy)
        self.shadow_records.primary_energy(energy.decision_id, energy.energy_j, energy.cost_usd)
        if seen is not None:
            self.learner.observe(seen, predicted_energy_j)

    def _use_model(self, model: CostModel) -> None:
        # A model trained while the policy changed is rebased on the policy serving now.
        self.costmodel = _rebased(model, self.policy)

    def _room(self, pool: str) -> None:
        state = self.fleet.pools.get(pool)  # a reload may have removed it meanwhile
        if state is not None:
            self.admission.dispatch(state)

    def _restored(self, backend: BackendState) -> None:
        self.admission.dispatch(self.fleet.pools[backend.pool])

    def check_database(self, *, quiet: bool = False) -> bool:
        """Return whether the request-records table is reachable."""
        try:
            with self.db.connect() as conn:
                conn.execute(sa.select(request_records.c.id).limit(1))
        except sa.exc.SQLAlchemyError as exc:
            if not quiet:
                log.error(
                    "the database at DATABASE_URL is not usable (%s); run `gateway db upgrade`"
                    " (checking again every %g s)",
                    type(exc).__name__,
                    DATABASE_RECHECK_S,
                )
            return False
        return True

    async def start(self) -> None:
        if self.shared is not None:
            await self.shared.start()
        self.admission.start()
        self.kv_events.configure(publishers(self.policy))
        self._kv_events_started = True
        await self.upstream.start()
        self.records.start()
        self.shadow_records.start()
        self.draw_records.start()
        self.mirror.start()
        self.meter.start()
        await self.scrape.start()
        self.health.start()
        self.parker.start()
        self.learner.start()
        self.loop_lag.start()
        self._untime_collections = time_collections(
            lambda generation, s: self.metrics.gc_pause.labels(str(generation)).observe(s)
        )
        if not await self._use_database(quiet=False):
            # Serve now from the policy file; once the database is there (migrated, reachable),
            # start what needs it and become ready.
            self._database_wait = asyncio.create_task(self._wait_for_database())

    async def _wait_for_database(self) -> None:
        while True:
            await asyncio.sleep(DATABASE_RECHECK_S)
            if await self._use_database(quiet=True):
                log.info("the database at DATABASE_URL is usable now")
                return

    async def _use_database(self, *, quiet: bool) -> bool:
        """Start the parts that need the database, if it is usable; say whether it is."""
        if not await asyncio.to_thread(self.check_database, quiet=quiet):
            return False
        self.database_ok = True
        versioned = await self._seed_policy()
        stored = await asyncio.to_thread(store.load_latest, self.db, self.policy)
        if stored is not None:
            self._use_model(stored)
            self.metrics.model_version.set(stored.version)
        if self.reports is not None:
            self.reports.start()
        await self.retention.keep_ahead()
        self.retention.start()
        if versioned:
            self.policy_watcher.start()
            self.rollouts.start()
            if self.settings.watch_policy:
                self.policy_file.start()
        return True

    async def stop(self) -> None:
        if self._database_wait is not None:
            self._database_wait.cancel()
            await asyncio.gather(self._database_wait, return_exceptions=True)
        if self.reports is not None:
            await self.reports.stop()
        await self.retention.stop()
        await self.policy_file.stop()
        await self.rollouts.stop()
        await self.policy_watcher.stop()
        await self.learner.stop()
        await self.loop_lag.stop()
        self._untime_collections()
        await self.parker.stop()
        await self.health.stop()
        await self.mirror.stop()
        await self.scrape.stop()  # a last reading of every meter
        await self.meter.stop()  # delivers the energy of what is still held, then it is written
        await self.shadow_records.stop()
        await self.draw_records.stop()
        await self.records.stop()
        if self.writer is not None:
            await asyncio.to_thread(self.writer.close)
        await self.admission.stop()
        await self.kv_events.close()
        if self.shared is not None:
            await self.shared.stop()
        await self.upstream.close()
        self.db.dispose()

    def readiness(self) -> dict[str, Any]:
        """Say whether the gateway can serve, and why not."""
        live = {n: p for n, p in self.fleet.pools.items() if p.spec.live}
        pools = {name: len(pool.healthy()) for name, pool in live.items()}
        ready = self.database_ok and any(pools.values())
        state: dict[str, Any] = {
            "ready": ready,
            "database": self.database_ok,
            "healthy_backends": pools,
        }
        shared = self.shared
        if shared is not None:
            # Not a reason to refuse traffic: without Redis the replica serves its share.
            state["shared_state"] = {
                "redis": shared.address,
                "mode": "shared" if shared.up else "local (Redis unreachable)",
                "replicas": shared.replicas,
            }
        return state


def _rebased(model: CostModel, policy: Policy) -> CostModel:
    """Return the cost model for a policy, keeping the learned residuals of pools still defined."""
    if model.policy is policy:
        return model
    trained = {key: r for key, r in model.trained.items() if key[0] in policy.pools}
    return CostModel(policy, model.version, trained)
