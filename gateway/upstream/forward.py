"""Forward: send a routed request upstream and relay the answer downstream.

Failures before the first byte reaches the client are retried once on another backend or the
route's fallback pool. After that the response is committed: a broken stream ends with an
OpenAI-style error event, never as a silently truncated answer.

A prompt a backend refuses as too long for its context (400 or 413 from vLLM and SGLang, 422
from TGI, 400 `exceed_context_size_error` from llama.cpp, streamed or not, with their usual
messages) is the estimate's mistake, not the backend's: it is sent again, before the first
byte, to a pool of the route (or its fallback) with a larger context, waiting for a slot there
as the request would have, and the client sees the refusal only when no larger pool exists.

The tokens an answer used are read from its `usage`, every choice counted where the engine
counts one (gateway/upstream/usage.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from gateway.costmodel.predict import Prediction
from gateway.errors import NoCapacity, UpstreamError
from gateway.exchange import Exchange
from gateway.fleet.admission import Admission
from gateway.fleet.state import BackendState, Fleet, Slot
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import Policy
from gateway.routing.ranking import CostRanker
from gateway.routing.router import pick_backend
from gateway.upstream import usage
from gateway.upstream.asgi import Receive, Send
from gateway.upstream.client import PATHS
from gateway.upstream.http1 import Response
from gateway.upstream.outliers import OutlierDetector
from gateway.upstream.sse import StreamTally

MAX_ATTEMPTS = 2
# What serving engines say when a prompt does not fit (see the docstring).
CONTEXT_REFUSALS = frozenset({400, 413, 422})
# llama.cpp: `{"error": {"code": 400, "message": "request (N tokens) exceeds the available
# context size (M tokens), try increasing it", "type": "exceed_context_size_error",
# "n_prompt_tokens": N, "n_ctx": M}}`, also when the request asked for a stream.
_TOO_LONG = re.compile(
    rb"context.length|maximum context|context window|longer than the model|must be <= "
    rb"|exceed_context_size_error|available context size|max context size",
    re.IGNORECASE,
)


def too_long(status: int, body: bytes) -> bool:
    """Say whether an answer is a backend refusing a prompt too long for its context."""
    return status in CONTEXT_REFUSALS and _TOO_LONG.search(body[:4096]) is not None


def error_detail(body: bytes, backend: BackendState, limit: int = 200) -> str:
    """Return the start of a backend's error body for the client, its key blanked out."""
    text = body.decode(errors="replace")
    _, _, key = backend.headers.get("authorization", "").partition(" ")
    if key:
        text = text.replace(key, "[redacted]")  # before clipping: no prefix of it survives
    return text[:limit]


class Spans(Protocol):
    """Told when an attempt upstream starts and when one fails: the energy meter, which
    attributes a backend's measured energy to the requests it served."""

    def open(self, backend: BackendState, key: str, start_at: float) -> None: ...

    def abandon(self, backend: BackendState, key: str) -> None: ...


class Forwarder:
    """Admit, send, retry before the first byte, and relay; give the slot back as soon as the
    backend has answered, and always."""

    def __init__(
        self,
        upstream: Any,
        admission: Admission,
        outliers: OutlierDetector,
        metrics: GatewayMetrics,
        meter: Spans,
        ranker: CostRanker,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.upstream = upstream
        self.admission = admission
        self.outliers = outliers
        self.metrics = metrics
        self.meter = meter
        self.ranker = ranker
        self.clock = clock

    async def forward(
        self,
        ex: Exchange,
        body: bytes,
        receive: Receive,
        send: Send,
        policy: Policy,
        fleet: Fleet,
    ) -> None:
        """Serve the exchange's decision; raise GatewayError if nothing was sent downstream."""
        slot = await self._admit(ex, policy, fleet)
        started = self.clock()
        slot, response, head, chunks = await self._open(ex, slot, body, policy, fleet)
        # The backend is free once its answer has arrived, however slowly the client reads it.
        response.on_end(lambda: self.admission.release(slot))
        backend = slot.backend
        ex.concurrent = backend.load
        ex.context_tokens = backend.kv_tokens(policy.kv_bytes_per_token(ex.model))
        ex.prediction = self._prediction(ex, backend, fleet)
        profile = ex.profile
        assert profile is not None  # _admit holds it to a decision made from one
        # Only an answer leaves the prompt in the engine's cache and the session on its backend.
        served = response.status == 200
        if served and profile.session is not None:
            fleet.sessions.served(profile.session, backend.name)
        blocks = profile.blocks if served else ()
        if blocks:
            fleet.prefixes.sent(backend.name, blocks)
        engine = policy.pools[backend.pool].engine if backend.pool in policy.pools else None
        try:
            if chunks is not None:
                await self._relay_stream(ex, backend, head, chunks, receive, send, engine)
            else:
                await self._relay_whole(ex, response, head, send, engine)
        finally:
            ex.upstream_s = self.clock() - started
            if chunks is not None:
                await chunks.aclose()  # type: ignore[attr-defined]
            response.release()
            self.admission.release(slot)
            if blocks and ex.cached_tokens is not None:
                found = profile.blocks_found(ex.cached_tokens, ex.prompt_tokens)
                fleet.prefixes.reported(backend.name, ex.expected_blocks, found)

    async def _admit(self, ex: Exchange, policy: Policy, fleet: Fleet) -> Slot:
        decision = ex.decision
        assert decision is not None and ex.profile is not None
        kv = decision.kv_bytes
        if decision.backend is not None:
            ex.first_pool = decision.backend.pool
            self.admission.routed(ex.first_pool, ex.profile.prompt_tokens, ex.profile.model)
            slot = await self.admission.take(decision.backend, kv)
            if slot is not None:
                return slot
            # Another replica took the last slot first: wait for the pool as if it were full.
            pool = fleet.pools[decision.backend.pool]
        else:
            assert decision.queue_pool is not None
            pool = decision.queue_pool
            ex.first_pool = pool.name
            self.admission.routed(ex.first_pool, ex.profile.prompt_tokens, ex.profile.model)
        waited = self.clock()
        try:
            return await self.admission.wait(pool, decision.queue_budget_s, kv)
        except NoCapacity:
            slot = await self._take_any(ex, policy, fleet, frozenset())
            if slot is None:
                raise
            ex.fallback_reason = "queue_timeout"
            return slot
        finally:
            ex.queue_s = self.clock() - waited
            self.metrics.child(self.metrics.queue_wait, pool.name).observe(ex.queue_s)

    async def _take_any(
        self, ex: Exchange, policy: Policy, fleet: Fleet, exclude: frozenset[str]
    ) -> Slot | None:
        """Take a free slot on any backend of the route (its fallback included), or None."""
        assert ex.profile is not None and ex.decision is not None
        while True:
            backend = pick_backend(ex.profile, ex.decision.route, policy, fleet, exclude)
            if backend is None:
                return None
            slot = await self.admission.take(backend, ex.decision.kv_bytes)
            if slot is not None:
                return slot
            exclude = exclude | {backend.name}

    async def _open(
        self, ex: Exchange, slot: Slot, body: bytes, policy: Policy, fleet: Fleet
    ) -> tuple[Slot, Response, bytes, AsyncIterator[bytes] | None]:
        """Send until a backend answers; return its slot, response, first bytes and the rest."""
        profile, decision = ex.profile, ex.decision
        assert profile is not None and decision is not None
        slo = policy.slo_classes[profile.slo_class]
        path = PATHS[profile.endpoint]
        failed: set[str] = set()
        while True:
            backend = slot.backend
            ex.attempts += 1
            ex.attempt_started_at = self.clock()
            ex.backend = backend
            # What the engine should find cached, as the index knew it before this request:
            # blocks recorded later (another request's, arriving meanwhile) may still be in
            # prefill when this one's is.
            ex.expected_blocks = fleet.prefixes.cached(backend.name, profile.blocks)
            # What it has to compute before its first token, which later requests wait behind.
            prefill = max(0, profile.prompt_tokens - profile.cached_tokens(ex.expected_blocks))
            backend.prefilling += prefill
            # The span opens before the first reading that may include this request's prefill.
            self.meter.open(backend, ex.decision_id, ex.attempt_started_at)
            response: Response | None = None
            try:
                response = await self.upstream.send(
                    backend, path, body, backend.headers, slo.timeout_s, slo.deadline_s
                )
                if response.status >= 500:
                    detail = error_detail(await self.upstream.read(backend, response), backend)
                    raise UpstreamError(
                        f"backend {backend.name} answered {response.status}: {detail}"
                    )
                chunks: AsyncIterator[bytes] | None = None
                if profile.stream and response.status == 200:
                    chunks = self.upstream.chunks(backend, response)
                    head = await anext(chunks, b"")
                    if not head:
                        raise UpstreamError(f"backend {backend.name} ended the stream at once")
                else:
                    head = await self.upstream.read(backend, response)
                    self.outliers.success(backend)
                    if too_long(response.status, head):
                        larger = await self._larger(ex, policy, fleet, backend)
                        if larger is not None:
                            response.release()
                            self.meter.abandon(backend, ex.decision_id)
                            self.admission.release(slot)
                            self.metrics.child(self.metrics.retries, backend.pool).inc()
                            ex.fallback_reason = "context_overflow"
                            slot = larger
                            continue
                # A stream counts as a success only once it ends with [DONE] (_relay_stream):
                # a backend that cuts its streams mid-answer must reach the ejection threshold.
                return slot, response, head, chunks
            except UpstreamError:
                if response is not None:
                    response.release()
                self.meter.abandon(backend, ex.decision_id)
                self.outliers.failure(backend)
                self.admission.release(slot)
                failed.add(backend.name)
                retry = (
                    await self._take_any(ex, policy, fleet, frozenset(failed))
                    if ex.attempts < MAX_ATTEMPTS
                    else None
                )
                if retry is None:
                    ex.backend = None
                    raise
                self.metrics.child(self.metrics.retries, backend.pool).inc()
                ex.fallback_reason = "upstream_failure"
                slot = retry
            except BaseException:
                # Cancelled (shutdown) or a bug: the slot must still come back.
                if response is not None:
                    response.release()
                self.meter.abandon(backend, ex.decision_id)
                self.admission.release(slot)
                ex.backend = None
                raise
            finally:
                # Its first byte is in (or it failed): its prefill holds up nothing more.
                backend.prefilling -= prefill

    async def _larger(
        self, ex: Exchange, policy: Policy, fleet: Fleet, refused: BackendState
    ) -> Slot | None:
        """Take a slot on a pool of the route with a larger context than the one that refused
        the prompt: a free one now, else the first such pool's queue; None when there is none."""
        assert ex.profile is not None and ex.decision is not None
        route, context = ex.decision.route, policy.pools[refused.pool].max_context
        names = [*route.pools, *([route.fallback] if route.fallback else [])]
        larger = [n for n in names if n in fleet.pools and policy.pools[n].max_context > context]
        if not larger:
            return None
        smaller = frozenset(
            b.name
            for name, pool in fleet.pools.items()
            if name not in larger
            for b in pool.backends
        )
        slot = await self._take_any(ex, policy, fleet, smaller)
        if slot is not None:
            return slot
        try:
            return await self.admission.wait(
                fleet.pools[larger[0]], ex.decision.queue_budget_s, ex.decision.kv_bytes
            )
        except NoCapacity:
            return None

    def _prediction(self, ex: Exchange, backend: BackendState, fleet: Fleet) -> Prediction:
        """Return the cost model's estimate for the pool that finally serves the request."""
        assert ex.decision is not None and ex.profile is not None
        known = ex.decision.predictions.get(backend.pool)
        if known is not None:
            return known
        return self.ranker.predict(ex.profile, ex.route_name, fleet.pools[backend.pool])

    def _headers(self, ex: Exchange, content_type: bytes) -> list[tuple[bytes, bytes]]:
        backend = ex.backend
        assert backend is not None
        headers = [
            (b"content-type", content_type),
            (b"x-gateway-route", ex.route_name.encode()),
            (b"x-gateway-pool", backend.pool.encode()),
            (b"x-gateway-backend", backend.name.encode()),
            (b"x-gateway-decision-id", ex.decision_id.encode()),
        ]
        if ex.prediction is not None:
            headers.append((b"x-gateway-energy-j", f"{ex.prediction.energy_j:.4g}".encode()))
            headers.append((b"x-gateway-cost-usd", f"{ex.prediction.cost_usd:.4g}".encode()))
            headers.append((b"x-gateway-carbon-g", f"{ex.prediction.carbon_g:.4g}".encode()))
        return headers

    async def _relay_whole(
        self, ex: Exchange, response: Response, body: bytes, send: Send, engine: str | None
    ) -> None:
        content_type = response.headers.get("content-type", "application/json").encode()
        headers = self._headers(ex, content_type)
        headers.append((b"content-length", str(len(body)).encode()))
        ex.status = response.status
        if response.status == 200:
            if ex.captured is not None:
                ex.captured.append(body)
            assert ex.profile is not None
            ex.prompt_tokens, ex.completion_tokens, ex.cached_tokens = usage.whole(
                body, engine, ex.profile.max_tokens, ex.profile.token_ratio
            )
        else:
            ex.error = "upstream_client_error"
        ex.response_started = True
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_stream(
        self,
        ex: Exchange,
        backend: BackendState,
        head: bytes,
        chunks: AsyncIterator[bytes],
        receive: Receive,
        send: Send,
        engine: str | None,
    ) -> None:
        tally = StreamTally(per_choice_usage=usage.counts_one_choice(engine))
        captured = ex.captured  # only sampled requests keep their answer for the mirror
        headers = self._headers(ex, b"text/event-stream")
        headers.append((b"cache-control", b"no-cache"))
        ex.status = 200
        ex.response_started = True
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        tally.feed(head, self.clock())
        if captured is not None:
            captured.append(head)
        await send({"type": "http.response.body", "body": head, "more_body": True})
        disconnected = asyncio.ensure_future(receive())
        try:
            async for chunk in chunks:
                if disconnected.done():
                    ex.status, ex.error = 499, "client_closed"
                    return
                tally.feed(chunk, self.clock())
                if captured is not None:
                    captured.append(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not tally.done:
                raise UpstreamError(f"backend {backend.name} ended the stream without [DONE]")
            self.outliers.success(backend)
        except UpstreamError as exc:
            self.outliers.failure(backend)
            ex.status, ex.error = exc.status, "stream_broken"
            event = b"data: " + exc.body() + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": False})
            return
        finally:
            disconnected.cancel()
            self._account_stream(ex, tally)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _account_stream(self, ex: Exchange, tally: StreamTally) -> None:
        if tally.first_token_at is not None:
            ex.ttft_s = tally.first_token_at - ex.started_at
            ex.last_token_at = tally.last_token_at
        ex.tokens_seen = tally.tokens
        if tally.usage is not None:
            ex.prompt_tokens, ex.completion_tokens, ex.cached_tokens = usage.of(tally.usage)
        else:
            ex.completion_tokens = tally.tokens
