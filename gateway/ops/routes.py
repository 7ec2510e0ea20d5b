"""The ops app: health, readiness, metrics, the admin API and the OpenAPI description, on FastAPI.

It also runs the lifespan that starts and stops the gateway's parts.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.ops import admin, console, error_handlers, openapi
from gateway.ops.parts import OpsParts


def ops_app(gateway: OpsParts) -> FastAPI:
    """Build the FastAPI app for health, readiness and metrics, running the gateway's lifespan."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        # What exists once started (modules, policy, fleet, cost model) lives as long as the
        # process: keep it out of the collector's full passes, which otherwise walk it all and
        # pause the event loop for ~90 ms under load (6-11 ms frozen; docs/performance.md).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await gateway.stop()

    # /docs (Swagger UI) loads its scripts from a CDN onto the origin where operators paste the
    # admin token: off unless GATEWAY_DOCS asks for it. /openapi.json is always served.
    docs = "/docs" if gateway.settings.docs else None
    app = FastAPI(title="shadow-gateway", lifespan=lifespan, docs_url=docs, redoc_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        state = gateway.readiness()
        return JSONResponse(state, status_code=200 if state["ready"] else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    admin.install(app, gateway)
    console.install(app, gateway)
    error_handlers.install(app)
    generate = app.openapi  # FastAPI's generator, which keeps what it generated
    app.openapi = lambda: openapi.document(generate(), gateway.serving.policy)  # type: ignore[method-assign]
    return app
