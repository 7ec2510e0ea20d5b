"""Ingress: the OpenAI-compatible API on /v1, as a plain ASGI app on the hot path.

It reads and checks the body, classifies and routes the request, hands it to the forwarder, and
finishes it (telemetry, shadow copies). Every refusal and failure on /v1 becomes an
OpenAI-shaped error response in one place, `_refuse`; once a response has started, a failure
can only end it (the forwarder ends a broken stream with an error event).
"""

from __future__ import annotations

import itertools
import logging
import random
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import orjson

from gateway.costmodel.predict import OutputLengths
from gateway.costmodel.train import Observation
from gateway.db.schema import RequestRecord
from gateway.energy.meter import EnergyMeter
from gateway.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    RateLimited,
)
from gateway.exchange import Exchange
from gateway.fleet.ratelimit import TokenBuckets, admit_tenant, settle_tenant
from gateway.fleet.sessions import SESSION_HEADERS
from gateway.fleet.state import Serving
from gateway.ingress.body import BodyDeadlines
from gateway.ingress.responses import ResponsesRelay, to_chat
from gateway.ingress.telemetry import Telemetry
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import Policy, Tenant
from gateway.records.requests import RequestEnergy
from gateway.routing.bodies import MAX_MODEL_CHARS
from gateway.routing.classify import (
    ENDPOINTS,
    RESPONSES_PATH,
    RequestProfile,
    TokenEstimator,
    classify,
    tenant_of,
)
from gateway.routing.ranking import CostRanker
from gateway.routing.router import decide, tokens_at_most
from gateway.settings import Settings
from gateway.shadow.mirror import Mirror
from gateway.shadow.sample import ShadowPlan
from gateway.upstream.asgi import Receive, Scope, Send
from gateway.upstream.forward import Forwarder

# The request headers classify reads beside the x-slo- ones: the tenant key and session keys.
_KEPT_HEADERS = frozenset({b"authorization", *(h.encode() for h in SESSION_HEADERS)})
log = logging.getLogger(__name__)
MODELS_PATH = "/v1/models"

JSON = [(b"content-type", b"application/json")]


async def _respond(send: Send, status: int, body: bytes, extra: list[Any] | None = None) -> None:
    headers = [*JSON, (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _refuse(send: Send, exc: GatewayError, ex: Exchange | None = None) -> None:
    """Answer an error in OpenAI's shape, with the decision's id and route when there is one."""
    extra = exc.headers()
    if ex is not None:
        extra.append((b"x-gateway-decision-id", ex.decision_id.encode()))
        if ex.decision is not None:
            extra.append((b"x-gateway-route", ex.decision.route.name.encode()))
    await _respond(send, exc.status, exc.body(), extra)


def _assumed_max_tokens(payload: Any, profile: RequestProfile, policy: Policy) -> int | None:
    """Return the output limit to give a request that named none, or None when it needs none.

    A backend told nothing generates up to its context; the request is reserved and charged
    the policy's `assumed_max_tokens` (or its `min_tokens`, if more), so that is its limit,
    written into the body it is forwarded with.
    """
    if profile.max_tokens is not None or profile.endpoint == "embeddings":
        return None
    return max(policy.assumed_max_tokens, int(payload.get("min_tokens") or 0))


def _used(ex: Exchange, charged: int) -> int:
    """Return the tokens a request used, as its tenant is billed: prompt and output as its
    backend reported them (the prompt estimate when it did not say), nothing when no answer
    came, and what was charged for an answer that does not say how long it was."""
    output, prompt = ex.completion_tokens, ex.prompt_tokens
    if not isinstance(output, int) or output < 0:
        return charged if ex.status == 200 else 0
    if not isinstance(prompt, int) or prompt < 0:
        prompt = ex.profile.prompt_tokens if ex.profile is not None else 0
    return prompt + output


def decision_ids() -> Iterator[str]:
    """Yield 32-hex-digit decision ids: a random per-process prefix and a counter.

    Unique across replicas and restarts like a UUID, without a system call per request.
    """
    prefix = secrets.token_hex(8)
    for n in itertools.count():
        yield f"{prefix}{n:016x}"


class Parts(Protocol):
    """What the ingress uses of the running gateway (runtime.Gateway has them all): the
    snapshot it serves by, its limits, the parts a request passes through and where it ends."""

    serving: Serving
    settings: Settings
    clock: Callable[[], float]
    estimator: TokenEstimator
    buckets: TokenBuckets
    ranker: CostRanker
    forwarder: Forwarder
    mirror: Mirror
    metrics: GatewayMetrics
    meter: EnergyMeter
    outputs: OutputLengths

    def record_finished(self, record: RequestRecord) -> None: ...

    def energy_settled(
        self, energy: RequestEnergy, seen: Observation | None, predicted_energy_j: float | None
    ) -> None: ...


class Ingress:
    """Serve /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses (through chat
    completions, gateway/ingress/responses.py) and /v1/models.

    Another method on one of these paths is a 405 whose `Allow` names the one it takes; any
    other /v1 path is a 404.
    """

    def __init__(self, gateway: Parts):
        self.gateway = gateway
        self._ids = decision_ids()
        self._draw = random.Random(gateway.settings.routing_seed).random
        self._bodies = BodyDeadlines()
        self.telemetry = Telemetry(
            gateway.metrics,
            gateway.record_finished,
            gateway.meter,
            gateway.estimator,
            gateway.outputs,
            gateway.energy_settled,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        endpoint = ENDPOINTS.get(path)
        if path == RESPONSES_PATH and method == "POST":
            await self._serve("chat", scope, receive, send, responses=True)
        elif endpoint is not None and method == "POST":
            await self._serve(endpoint, scope, receive, send)
        elif endpoint is not None or path == RESPONSES_PATH:
            await _refuse(send, MethodNotAllowed(f"{path} takes POST, not {method}", allow="POST"))
        elif path == MODELS_PATH and method == "GET":
            await _respond(send, 200, self._models())
        elif path == MODELS_PATH:
            await _refuse(send, MethodNotAllowed(f"{path} takes GET, not {method}", allow="GET"))
        else:
            await _refuse(send, NotFound(f"unknown path {path}"))

    def _models(self) -> bytes:
        policy = self.gateway.serving.policy
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

    async def _serve(
        self, endpoint: str, scope: Scope, receive: Receive, send: Send, *, responses: bool = False
    ) -> None:
        gw = self.gateway
        clock = gw.clock
        ex = Exchange(next(self._ids), endpoint, time.time(), clock())
        plans: tuple[ShadowPlan, ...] = ()
        tenant: Tenant | None = None
        charged = 0
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
            if responses:
                request, payload = payload, to_chat(payload)
                body = orjson.dumps(payload)
                send = ResponsesRelay(send, ex.decision_id, request, bool(payload.get("stream")))
            headers = {
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in scope["headers"]
                if name.startswith(b"x-slo-") or name in _KEPT_HEADERS
            }
            serving = gw.serving  # one policy version and its fleet for the whole request
            policy, fleet = serving.policy, serving.fleet
            tenant = tenant_of(policy, headers)
            ex.profile = classify(endpoint, payload, headers, tenant, policy, gw.estimator)
            assumed = _assumed_max_tokens(payload, ex.profile, policy)
            if assumed is not None:
                ex.profile.max_tokens = assumed
                body = orjson.dumps(payload | {"max_tokens": assumed})
            if policy.tenants:
                tokens = tokens_at_most(ex.profile, policy)
                await admit_tenant(gw.buckets, tenant, tokens)
                charged = tokens
            ex.decision = decide(ex.profile, policy, fleet, gw.ranker, self._draw())
            plans = gw.mirror.sample(ex.profile, ex.decision.route, policy, ex.decision_id)
            if plans:
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
                await _refuse(send, exc, ex)
        except Exception:
            failure = InternalError()
            ex.status, ex.error = failure.status, failure.code
            log.exception("request %s failed", ex.decision_id)
            if not ex.response_started:
                await _refuse(send, failure, ex)
        finally:
            self.telemetry.finish(ex, clock())
            session = ex.profile.session if ex.profile is not None else None
            if session and ex.slo_met is False and ex.status == 200 and ex.backend is not None:
                # Answered too slowly: if by the session's backend, route the session afresh.
                gw.serving.fleet.sessions.missed(session, ex.backend.name)
            if plans:
                gw.mirror.submit(ex, body, policy, plans)
            if charged:
                await settle_tenant(gw.buckets, tenant, charged, _used(ex, charged))
