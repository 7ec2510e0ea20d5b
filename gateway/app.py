"""The gateway application: its running parts, and the ASGI app that serves them.

/v1 goes to the plain-ASGI ingress (the hot path); everything else (/healthz, /readyz,
/metrics, /admin) to a FastAPI app, which also runs the lifespan that starts and stops the parts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import admin
from gateway.admission import Admission
from gateway.classify import TokenEstimator
from gateway.costmodel import store
from gateway.costmodel.learner import Learner
from gateway.costmodel.model import CostModel, OutputLengths
from gateway.db import make_engine
from gateway.forward import Forwarder
from gateway.health import HealthChecker, OutlierDetector
from gateway.ingress import Ingress
from gateway.metering import EnergyMeter
from gateway.metrics import GatewayMetrics
from gateway.mirror import Mirror
from gateway.policy import Policy, load_policy
from gateway.records import RecordWriter, RequestRecord, request_records
from gateway.routing.fleet import BackendState, Fleet
from gateway.routing.ranking import CostRanker
from gateway.settings import Settings
from gateway.shadow import ShadowWriter
from gateway.telemetry import Telemetry
from gateway.upstream import Upstream

log = logging.getLogger(__name__)


class Gateway:
    """The running gateway: settings, active policy, fleet state and the parts serving requests."""

    def __init__(
        self,
        settings: Settings,
        policy: Policy,
        *,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.settings = settings
        self.policy = policy
        self.clock = clock
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self.fleet = Fleet(policy)
        self.metrics.watch(lambda: self.fleet)
        self.estimator = TokenEstimator()
        self.admission = Admission(self.fleet)
        self.upstream = Upstream()
        self.outliers = OutlierDetector(self.metrics)
        self.engine = make_engine(settings.database_url)
        self.records = RecordWriter(
            self.engine, self.metrics, flush_interval_s=settings.record_flush_interval_s
        )
        self.meter = EnergyMeter(
            lambda: self.policy,
            self.upstream,
            self.metrics,
            interval_s=settings.power_scrape_interval_s,
            clock=clock,
        )
        self.costmodel = CostModel(policy)
        self.learner = Learner(
            lambda: self.policy,
            self.engine,
            self.metrics,
            self._use_model,
            every=settings.model_retrain_every,
            interval_s=settings.model_retrain_interval_s,
            min_interval_s=settings.model_retrain_min_interval_s,
        )
        self.outputs = OutputLengths(default=policy.assumed_max_tokens)
        self.ranker = CostRanker(lambda: self.costmodel, self.outputs)
        self.forwarder = Forwarder(
            self.upstream,
            self.admission,
            self.outliers,
            self.metrics,
            self.meter,
            self.ranker,
            clock,
        )
        self.telemetry = Telemetry(
            self.metrics, self._record_finished, self.meter, self.estimator, self.outputs
        )
        self.shadow_records = ShadowWriter(
            self.engine, self.metrics, flush_interval_s=settings.record_flush_interval_s
        )
        self.mirror = Mirror(
            self.upstream,
            self.admission,
            self.metrics,
            self.shadow_records,
            lambda: self.fleet,
            self.meter,
        )
        self.health = HealthChecker(
            lambda: self.fleet,
            self.upstream,
            self.outliers,
            on_restore=self._restored,
            interval_s=settings.health_check_interval_s,
        )
        self.database_ok = False

    def _record_finished(self, record: RequestRecord) -> None:
        self.records.add(record)
        self.learner.observe(record)

    def _use_model(self, model: CostModel) -> None:
        self.costmodel = model

    def _restored(self, backend: BackendState) -> None:
        self.admission.dispatch(self.fleet.pools[backend.pool])

    def check_database(self) -> bool:
        """Return whether the request-records table is reachable."""
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.select(request_records.c.id).limit(1))
        except sa.exc.SQLAlchemyError as exc:
            log.error(
                "the database at DATABASE_URL is not usable (%s); run `gateway db upgrade`",
                type(exc).__name__,
            )
            return False
        return True

    async def start(self) -> None:
        self.database_ok = self.check_database()
        if self.database_ok:
            stored = store.load_latest(self.engine, self.policy)
            if stored is not None:
                self._use_model(stored)
                self.metrics.model_version.set(stored.version)
        await self.upstream.start()
        self.records.start()
        self.shadow_records.start()
        self.mirror.start()
        await self.meter.start()
        self.health.start()
        self.learner.start()

    async def stop(self) -> None:
        await self.learner.stop()
        await self.health.stop()
        await self.mirror.stop()
        await self.meter.stop()  # delivers the energy of what is still held, then they are written
        await self.shadow_records.stop()
        await self.records.stop()
        await self.upstream.close()
        self.engine.dispose()

    def readiness(self) -> dict[str, Any]:
        """Say whether the gateway can serve, and why not."""
        live = {n: p for n, p in self.fleet.pools.items() if p.spec.live}
        pools = {name: len(pool.healthy()) for name, pool in live.items()}
        ready = self.database_ok and any(pools.values())
        return {"ready": ready, "database": self.database_ok, "healthy_backends": pools}


def ops_app(gateway: Gateway) -> FastAPI:
    """Build the FastAPI app for health, readiness and metrics, running the gateway's lifespan."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="shadow-gateway", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        state = gateway.readiness()
        return JSONResponse(state, status_code=200 if state["ready"] else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    admin.install(app, gateway)
    return app


class GatewayApp:
    """The ASGI app: /v1 to the ingress, the rest to the FastAPI app."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.ingress = Ingress(gateway)
        self.ops = ops_app(gateway)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            await self.ingress(scope, receive, send)
        else:
            await self.ops(scope, receive, send)


def create_app(settings: Settings | None = None, policy: Policy | None = None) -> GatewayApp:
    """Build the gateway app from settings (default: the environment) and their policy file."""
    settings = settings if settings is not None else Settings()
    policy = policy if policy is not None else load_policy(settings.policy_path)
    return GatewayApp(Gateway(settings, policy))
