"""The admin API under /admin: what operators read and do, behind the admin bearer token.

Every route here needs `Authorization: Bearer <GATEWAY_ADMIN_TOKEN>`. Without a configured token
the API is off (403 `admin_disabled`) rather than open; a missing or wrong token is 401.
Errors have OpenAI's shape, as on /v1.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from pydantic import BaseModel

from gateway.errors import AdminDisabled, GatewayError, InvalidRequest, Unauthorized
from gateway.explain import explain
from gateway.shadow import summarize

if TYPE_CHECKING:
    from gateway.app import Gateway

DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str | None, now: float) -> float | None:
    """Read `since` as Unix seconds, an ISO 8601 time (UTC unless it says), or an age like 24h."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    age = DURATION.match(value)
    if age is not None:
        return now - float(age.group(1)) * UNIT_S[age.group(2)]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            f"'since' must be Unix seconds, an ISO 8601 time or an age such as 24h or 7d, "
            f"got {value!r}",
            param="since",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def admin_router(gateway: Gateway) -> APIRouter:
    """Build the /admin routes for a gateway, each behind the token guard."""

    async def require_admin(request: Request) -> None:
        token = gateway.settings.admin_token
        if token is None or not token.get_secret_value():
            raise AdminDisabled("the admin API is disabled: set GATEWAY_ADMIN_TOKEN to enable it")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        expected = token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise Unauthorized(
                "the admin API needs Authorization: Bearer <GATEWAY_ADMIN_TOKEN>",
                code="invalid_admin_token",
            )

    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

    @router.get("/shadow/summary")
    async def shadow_summary(
        route: str | None = None, candidate: str | None = None, since: str | None = None
    ) -> list[dict[str, Any]]:
        """Summarise shadow evidence per route and candidate pool."""
        start = parse_since(since, time.time())
        return await asyncio.to_thread(
            summarize, gateway.engine, route or None, candidate or None, start
        )

    @router.post("/explain")
    async def explain_request(request: ExplainRequest) -> dict[str, Any]:
        """Route a request as the gateway would now, without sending it; return the reasons."""
        return explain(
            request.endpoint,
            request.body,
            request.headers,
            gateway.policy,
            gateway.fleet,
            gateway.ranker,
            gateway.estimator,
        )

    return router


class ExplainRequest(BaseModel):
    """A request to explain: its endpoint, JSON body and headers."""

    endpoint: Literal["chat", "completions", "embeddings"] = "chat"
    body: Any
    headers: dict[str, str] = {}


async def _error_response(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
    return Response(exc.body(), exc.status, headers, media_type="application/json")


def install(app: FastAPI, gateway: Gateway) -> None:
    """Mount the admin API on the ops app, with errors turned into OpenAI-shaped responses."""
    app.include_router(admin_router(gateway))
    app.add_exception_handler(GatewayError, _error_response)
