"""Ingress: the OpenAI-compatible API on /v1, as a plain ASGI app on the hot path.

It reads and checks the body, classifies and routes the request, hands it to the forwarder,
and turns every GatewayError into an OpenAI-shaped error response: the one place where errors
become HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import secrets
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import (
    BodyTooLarge,
    GatewayError,
    InvalidRequest,
    RateLimited,
    RequestTimeout,
    error_body,
)
from gateway.exchange import Exchange
from gateway.fleet.ratelimit import admit_tenant
from gateway.routing.classify import ENDPOINTS, MAX_MODEL_CHARS, classify
from gateway.routing.router import decide

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]

JSON = [(b"content-type", b"application/json")]


async def _respond(send: Send, status: int, body: bytes, extra: list[Any] | None = None) -> None:
    headers = [*JSON, (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyDeadlines:
    """Cut request bodies that do not arrive in time, with one timer for all of them.

    A client trickling bytes must not hold a connection and its buffer forever. Nearly every
    body arrives with its headers, though, and a timer armed and cancelled per request
    (asyncio.timeout) cost several times the read itself. The reads in progress are kept with
    their deadlines instead, and one check every quarter of the timeout (at most every second)
    cuts those past it: a body is cut between timeout_s and 1.25 × timeout_s after it began.
    """

    def __init__(self) -> None:
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._cut: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._check: asyncio.TimerHandle | None = None

    async def read(self, scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
        """Read the request body within timeout_s, refusing it once it exceeds limit bytes."""
        task = self._current_task()
        self._reading[task] = time.monotonic() + timeout_s
        if self._check is None:
            self._arm(timeout_s)
        try:
            return await _read_body(scope, receive, limit)
        except asyncio.CancelledError:
            if task in self._cut:
                self._cut.discard(task)
                if task.uncancel() == 0:  # cut here, and cancelled by nothing else
                    raise RequestTimeout(
                        f"the request body did not arrive within {timeout_s:g} s"
                    ) from None
            raise
        finally:
            del self._reading[task]

    def _current_task(self) -> asyncio.Task[Any]:
        # Given its loop, current_task skips get_running_loop, which makes a system call.
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:
            self._loop = asyncio.get_running_loop()
            task = asyncio.current_task(self._loop)
            assert task is not None, "the ingress serves requests from tasks"
        return task

    def _arm(self, timeout_s: float) -> None:
        assert self._loop is not None
        self._check = self._loop.call_later(min(timeout_s / 4, 1.0), self._cut_late, timeout_s)

    def _cut_late(self, timeout_s: float) -> None:
        self._check = None
        now = time.monotonic()
        for task, deadline in self._reading.items():
            if deadline <= now and task not in self._cut:
                self._cut.add(task)
                task.cancel()
        if self._reading:
            self._arm(timeout_s)


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise InvalidRequest("the Content-Length header is not a number") from None
            if declared > limit:
                raise BodyTooLarge(f"the request body of {declared} bytes exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("the client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body exceeds {limit} bytes")
        if not message.get("more_body", False):
            return b"".join(chunks)


def decision_ids() -> Iterator[str]:
    """Yield 32-hex-digit decision ids: a random per-process prefix and a counter.

    Unique across replicas and restarts like a UUID, without a system call per request.
    """
    prefix = secrets.token_hex(8)
    for n in itertools.count():
        yield f"{prefix}{n:016x}"


class Ingress:
    """Serve /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self._ids = decision_ids()
        self._draw = random.random
        self._bodies = BodyDeadlines()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        endpoint = ENDPOINTS.get(path)
        if endpoint is None:
            if path == "/v1/models" and scope["method"] == "GET":
                await _respond(send, 200, self._models())
                return
            await _respond(
                send,
                404,
                error_body(f"unknown path {path}", "invalid_request_error", None, "not_found"),
            )
            return
        if scope["method"] != "POST":
            body = error_body(
                f"{path} takes POST, not {scope['method']}",
                "invalid_request_error",
                None,
                "method_not_allowed",
            )
            await _respond(send, 405, body, [(b"allow", b"POST")])
            return
        await self._serve(endpoint, scope, receive, send)

    def _models(self) -> bytes:
        policy = self.gateway.policy
        owners: dict[str, list[str]] = {}
        for name, pool in policy.pools.items():
            if pool.live:
                for model in pool.models:
                    owners.setdefault(model, []).append(name)
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": ",".join(pools)}
            for model, pools in owners.items()
        ]
        return orjson.dumps({"object": "list", "data": data})

    async def _serve(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gateway
        clock = gw.clock
        ex = Exchange(next(self._ids), endpoint, time.time(), clock())
        try:
            settings = gw.settings
            body = await self._bodies.read(
                scope, receive, settings.max_body_bytes, settings.body_read_timeout_s
            )
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
            if isinstance(payload, dict) and isinstance(payload.get("model"), str):
                ex.model = payload["model"][:MAX_MODEL_CHARS]
            headers = {
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in scope["headers"]
                if name.startswith(b"x-slo-") or name == b"authorization"
            }
            policy, fleet = gw.policy, gw.fleet
            ex.profile = classify(endpoint, payload, headers, policy, gw.estimator)
            if policy.tenants:
                await admit_tenant(gw.buckets, ex.profile, policy)
            ex.decision = decide(ex.profile, policy, fleet, gw.ranker, self._draw())
            ex.shadows = gw.mirror.sample(ex.profile, ex.decision.route, policy, ex.decision_id)
            if ex.shadows:
                ex.captured = []
            await gw.forwarder.forward(ex, body, receive, send, policy, fleet)
        except GatewayError as exc:
            ex.status, ex.error = exc.status, exc.code
            if ex.response_started:
                log.warning(
                    "request %s failed after its response started: %s", ex.decision_id, exc.message
                )
            else:
                if isinstance(exc, RateLimited) and ex.profile is not None:
                    gw.metrics.rate_limited.labels(ex.profile.tenant).inc()
                extra = [(b"x-gateway-decision-id", ex.decision_id.encode()), *exc.headers()]
                if ex.decision is not None:
                    extra.append((b"x-gateway-route", ex.decision.route.name.encode()))
                await _respond(send, exc.status, exc.body(), extra)
        except Exception:
            ex.status, ex.error = 500, "internal_error"
            log.exception("request %s failed", ex.decision_id)
            if not ex.response_started:
                await _respond(
                    send,
                    500,
                    error_body(
                        "the gateway failed to serve this request",
                        "api_error",
                        None,
                        "internal_error",
                    ),
                )
        finally:
            gw.telemetry.finish(ex, clock())
            if ex.shadows:
                gw.mirror.submit(ex, body, policy)
