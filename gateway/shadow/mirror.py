"""Mirror: copy sampled requests to candidate pools off the request path, and compare the answers.

On the request path nothing waits:

- `sample` (gateway/shadow/sample.py, pure) decides, once the route is known, which shadow
  targets get a copy. Only sampled requests have their primary answer kept as it is relayed.
- `submit`, once the client has its answer, checks each copy's rate budget and puts it on a
  bounded queue; when the rate, the queue or its byte budget is full, the copy is dropped and
  counted.

A fixed number of worker tasks then send the copies. Each copy takes a slot of the candidate
backend from the same admission that primaries use, so slot accounting stays true, but it never
waits for one: past the target's concurrency or slot share, or with no free slot, it is dropped.
With shared state (REDIS_URL) a target's budget is the fleet's, not each replica's: the rate
is a token bucket in Redis, and `max_concurrent` and `max_slot_share` are places taken in Redis
with the copy's slot (`gateway/fleet/leases.py`); while Redis is out, each replica keeps its share.
Copies carry `x-gateway-shadow: 1`, run under their SLO class's timeout, are never retried and
never fall back; they are compared with the primary's answer here, in the worker, and become
shadow records. A hanging candidate can hold at most its `max_concurrent` workers and slots,
each until the timeout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from gateway.compare.answers import Answer, read_body, read_stream
from gateway.compare.failures import failure
from gateway.compare.measures import Diff, compare
from gateway.db.schema import ShadowRecord
from gateway.energy.meter import EnergyMeter
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.exchange import Exchange
from gateway.fleet.admission import Admission
from gateway.fleet.leases import Place
from gateway.fleet.ratelimit import Bucket, Draw, TokenBuckets
from gateway.fleet.state import BackendState, Fleet
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import Policy, Route
from gateway.records.requests import ms
from gateway.records.slo import tpot_s
from gateway.routing.classify import RequestProfile, text_tokens
from gateway.routing.router import tokens_needed
from gateway.shadow.records import CopyEnergy, ShadowWriter
from gateway.shadow.sample import CANDIDATE, NOISE, Sampler, ShadowPlan, sample, stable_fraction
from gateway.shadow.semantic import Embedder
from gateway.upstream import usage
from gateway.upstream.client import PATHS, Upstream
from gateway.upstream.sse import StreamTally

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 32_768


@dataclass(slots=True, eq=False)
class ShadowJob:
    """A served request and its primary's answer, ready to be copied."""

    decision_id: str
    ts: float
    route: str
    model: str
    tenant: str | None
    endpoint: str
    stream: bool
    timeout_s: float
    deadline_s: float
    body: bytes
    primary_pool: str
    primary_backend: str
    primary_status: int
    primary_ttft_ms: float | None
    primary_tpot_ms: float | None
    primary_e2e_ms: float | None
    primary_prompt_tokens: int | None
    primary_completion_tokens: int | None
    captured: bytes
    kv_bytes: float = 0.0
    max_tokens: int | None = None
    token_ratio: float = 1.0  # the model's token estimate ratio (usage.whole)
    slo_class: str | None = None  # the request's, whose targets its copies are judged against

    @property
    def size(self) -> int:
        return len(self.body) + len(self.captured)


@dataclass(slots=True)
class CandidateOutcome:
    """What the candidate did with its copy."""

    status: int | None
    error: str | None
    data: bytes
    ttft_s: float | None
    last_token_s: float | None
    tokens: int
    e2e_s: float
    engine: str | None = None  # the candidate pool's serving engine, as the policy names it


def _job(ex: Exchange, body: bytes, policy: Policy) -> ShadowJob:
    profile, backend = ex.profile, ex.backend
    assert profile is not None and backend is not None and ex.captured is not None
    # Upstream latencies: from sending to the backend, the queue wait left out, as for copies.
    ttft_s = None if ex.ttft_s is None else ex.ttft_s - ex.queue_s
    last_s = None if ex.last_token_at is None else ex.last_token_at - ex.started_at - ex.queue_s
    return ShadowJob(
        decision_id=ex.decision_id,
        ts=ex.ts,
        route=ex.route_name,
        model=ex.model[:128],
        tenant=profile.tenant,
        endpoint=profile.endpoint,
        stream=profile.stream,
        timeout_s=policy.slo_classes[profile.slo_class].timeout_s,
        deadline_s=policy.slo_classes[profile.slo_class].deadline_s,
        body=body,
        primary_pool=backend.pool,
        primary_backend=backend.name,
        primary_status=ex.status,
        primary_ttft_ms=ms(ttft_s),
        primary_tpot_ms=ms(tpot_s(ttft_s, last_s, ex.completion_tokens)),
        primary_e2e_ms=ms(ex.upstream_s),
        primary_prompt_tokens=ex.prompt_tokens,
        primary_completion_tokens=ex.completion_tokens,
        captured=b"".join(ex.captured),
        kv_bytes=ex.decision.kv_bytes if ex.decision is not None else 0.0,
        max_tokens=profile.max_tokens,
        token_ratio=profile.token_ratio,
        slo_class=profile.slo_class,
    )


def _sampling(endpoint: str, body: bytes) -> tuple[float | None, float | None, bool, bool]:
    """Return (temperature, top_p, seeded, sampled) of a request body."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    temperature, top_p = payload.get("temperature"), payload.get("top_p")
    temperature = float(temperature) if isinstance(temperature, int | float) else None
    top_p = float(top_p) if isinstance(top_p, int | float) else None
    # OpenAI's default temperature is 1: a request that names none is sampled.
    sampled = endpoint != "embeddings" and (temperature is None or temperature > 0)
    return temperature, top_p, payload.get("seed") is not None, sampled


def copy_body(endpoint: str, body: bytes, top: int) -> bytes:
    """Return the body a copy sends: the client's, asking for `top` logprobs if it asked none.

    The copy's answer is only compared, so asking more of it changes nothing the client sees.
    """
    if top <= 0 or endpoint not in ("chat", "completions"):
        return body
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(payload, dict) or payload.get("logprobs"):
        return body
    if endpoint == "chat":
        payload["logprobs"], payload["top_logprobs"] = True, top
    else:
        payload["logprobs"] = min(top, 5)  # the legacy endpoint's bound
    return orjson.dumps(payload)


class Mirror:
    """Send sampled copies to candidate pools within their budgets, and record the diffs."""

    def __init__(
        self,
        upstream: Upstream,
        admission: Admission,
        metrics: GatewayMetrics,
        writer: ShadowWriter,
        fleet: Callable[[], Fleet],
        meter: EnergyMeter,
        buckets: TokenBuckets | None = None,
        *,
        workers: int = 16,
        max_pending: int = 256,
        max_pending_bytes: int = 64 * 1024 * 1024,
        draw: Sampler = stable_fraction,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ):
        self.upstream = upstream
        self.admission = admission
        self.metrics = metrics
        self.writer = writer
        self._fleet = fleet
        self.meter = meter
        # Bound once: a bound method made per copy would be one more object held for each.
        self._on_energy = self._settled
        self.buckets = buckets if buckets is not None else TokenBuckets()
        self._workers = workers
        self._max_pending_bytes = max_pending_bytes
        self._draw = draw
        self._clock = clock
        self._wall = wall
        self._queue: asyncio.Queue[tuple[ShadowJob, ShadowPlan]] = asyncio.Queue(max_pending)
        self._pending_bytes = 0
        self._rates: dict[tuple[str, str, str], Bucket] = {}
        self._in_flight: Counter[tuple[str, str, str]] = Counter()
        self._pool_in_flight: Counter[str] = Counter()
        self._tasks: list[asyncio.Task[None]] = []
        self.embedder = Embedder(upstream, admission, metrics, fleet)

    @property
    def in_flight(self) -> int:
        """Copies being sent now."""
        return sum(self._pool_in_flight.values())

    @property
    def pending(self) -> int:
        """Copies waiting for a worker."""
        return self._queue.qsize()

    def sample(
        self, profile: RequestProfile, route: Route, policy: Policy, key: str
    ) -> tuple[ShadowPlan, ...]:
        """Decide which copies a routed request gets (nothing for a route without shadows)."""
        return sample(profile, route, policy, key, self._draw) if route.shadow else ()

    def submit(
        self, ex: Exchange, body: bytes, policy: Policy, plans: tuple[ShadowPlan, ...]
    ) -> None:
        """Queue the copies planned for a served exchange; never wait, never raise."""
        try:
            self._submit(ex, body, policy, plans)
        except Exception:
            log.exception("could not mirror request %s", ex.decision_id)

    def _submit(
        self, ex: Exchange, body: bytes, policy: Policy, plans: tuple[ShadowPlan, ...]
    ) -> None:
        route = ex.route_name
        primary = ex.pool_name
        if ex.status != 200 or ex.error is not None or ex.backend is None or ex.captured is None:
            # Nothing to compare against: a failed primary is not evidence about a candidate.
            for plan in plans:
                self._drop(route, plan.pool or primary or "", plan.kind, "primary_failed")
            return
        job = _job(ex, body, policy)
        now = self._clock()
        # Sampling checked the candidates' context against the prompt's estimate; the primary's
        # backend has since counted it, and a copy that would overflow is refused, not evidence.
        counted = ex.prompt_tokens if isinstance(ex.prompt_tokens, int) else None
        for plan in plans:
            candidate = plan.pool or primary
            if plan.kind == CANDIDATE and candidate == primary:
                self._drop(route, candidate, plan.kind, "served_by_candidate")
                continue
            pool = policy.pools.get(candidate)
            if (
                plan.kind == CANDIDATE
                and counted is not None
                and pool is not None
                and ex.profile is not None
                and tokens_needed(ex.profile, policy, counted) > pool.max_context
            ):
                self._drop(route, candidate, plan.kind, "context")
                continue
            key = (route, candidate, plan.kind)
            per_second = plan.budget.max_per_second
            rate = self._rates.get(key)
            if rate is None or rate.rate != per_second:
                rate = self._rates[key] = Bucket(per_second, max(1.0, per_second), now)
            # This replica alone never exceeds the budget; with shared state the worker then
            # spends from the fleet-wide bucket too.
            if not rate.take(1.0, now):
                self._drop(route, candidate, plan.kind, "rate")
                continue
            if self._pending_bytes + job.size > self._max_pending_bytes or self._queue.full():
                self._drop(route, candidate, plan.kind, "queue_full")
                continue
            self._queue.put_nowait((job, plan))
            self._pending_bytes += job.size

    def _drop(self, route: str, candidate: str, kind: str, reason: str) -> None:
        self.metrics.child(self.metrics.shadow_dropped, route, candidate, kind, reason).inc()
        self.writer.count_drop(route, candidate, kind, reason)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"shadow-worker-{i}")
            for i in range(self._workers)
        ]

    async def stop(self) -> None:
        """Stop the workers; copies in flight are abandoned and their slots given back."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        while not self._queue.empty():
            self._queue.get_nowait()
        self._pending_bytes = 0

    async def _work(self) -> None:
        while True:
            job, plan = await self._queue.get()
            self._pending_bytes -= job.size
            try:
                await self._mirror(job, plan)
            except Exception:
                log.exception("shadow copy of request %s failed", job.decision_id)

    def _share(self, limit: int) -> int:
        shared = self.buckets.shared
        return limit if shared is None else int(shared.share(limit))

    def _pick(self, job: ShadowJob, plan: ShadowPlan) -> tuple[BackendState, int] | str:
        """Return the backend for the copy and the pool's allowance for copies, or why not."""
        candidate = plan.pool or job.primary_pool
        limit = self._share(plan.budget.max_concurrent)
        if self._in_flight[(job.route, candidate, plan.kind)] >= limit:
            return "concurrency"
        pool = self._fleet().pools.get(candidate)
        if pool is None:
            return "no_slot"
        allowed = int(plan.budget.max_slot_share * sum(b.slots for b in pool.backends))
        if self._pool_in_flight[candidate] >= self._share(allowed):
            return "no_slot"
        exclude = frozenset({job.primary_backend}) if plan.kind == NOISE else frozenset()
        backend = pool.most_free(exclude, job.kv_bytes)
        if backend is None and exclude:
            # No other backend can take the noise copy (the pool has one, or the others are
            # ejected or full): the one that answered is asked again, measuring its own
            # nondeterminism.
            backend = pool.most_free(frozenset(), job.kv_bytes)
        return "no_slot" if backend is None else (backend, allowed)

    async def _mirror(self, job: ShadowJob, plan: ShadowPlan) -> None:
        candidate = plan.pool or job.primary_pool
        picked = self._pick(job, plan)
        if isinstance(picked, str):
            self._drop(job.route, candidate, plan.kind, picked)
            return
        backend, allowed = picked
        key = (job.route, candidate, plan.kind)
        name = ":".join(key)
        if self.buckets.shared is not None:
            per_second = plan.budget.max_per_second
            draw = Draw(f"shadow:{name}", per_second, max(1.0, per_second))
            if await self.buckets.take([draw]) > 0:
                self._drop(job.route, candidate, plan.kind, "rate")
                return
        # With shared state the budget's places are fleet-wide, taken with the slot.
        places = (
            Place(f"shadow:{name}", plan.budget.max_concurrent),
            Place(f"shadow-share:{candidate}", allowed),
        )
        slot = await self.admission.take(backend, job.kv_bytes, places)
        if slot is None:
            self._drop(job.route, candidate, plan.kind, "no_slot")
            return
        self._in_flight[key] += 1
        self._pool_in_flight[candidate] += 1
        self.metrics.child(self.metrics.shadow_sent, *key).inc()
        # Copies draw power too: they get their own span, so primaries are not charged for them.
        span = f"{job.decision_id}:{plan.kind}:{backend.name}"
        started_at = self._clock()
        self.meter.open(backend, span, started_at)
        try:
            outcome = await self._send(job, plan, backend)
        except BaseException:
            self.meter.abandon(backend, span)
            raise
        finally:
            self._in_flight[key] -= 1
            self._pool_in_flight[candidate] -= 1
            self.admission.release(slot)
        # Reading and comparing two answers is CPU the event loop need not spend: a long pair
        # takes milliseconds, and requests arriving meanwhile would wait for them.
        record, texts = await asyncio.to_thread(self._account, job, plan, backend, outcome)
        semantic = plan.compare.semantic_similarity
        if semantic is not None and record.diff.exact_match is False and texts is not None:
            record.diff.semantic_similarity = await self.embedder.similarity(semantic, *texts)

        self.writer.add(record, job.slo_class)
        self.meter.settle(
            backend,
            span,
            start_at=started_at,
            end_at=started_at + outcome.e2e_s,
            first_token_at=None if outcome.ttft_s is None else started_at + outcome.ttft_s,
            prompt_tokens=record.candidate_prompt_tokens or 0,
            completion_tokens=record.candidate_completion_tokens or 0,
            deliver=self._on_energy,
            subject=(record.decision_id, record.ts, record.kind, backend.name),
        )

    def _settled(
        self,
        copy: tuple[str, float, str, str],
        energy_j: float | None,
        cost: float | None,
        _: bool,
    ) -> None:
        """Write a copy's energy on its candidate, once settled, onto its record."""
        self.writer.add_energy(CopyEnergy(*copy, energy_j, cost))

    async def _send(
        self, job: ShadowJob, plan: ShadowPlan, backend: BackendState
    ) -> CandidateOutcome:
        """Send the copy once and read the whole answer, timing it as the forwarder does."""
        clock = self._clock
        started = clock()
        status: int | None = None
        error: str | None = None
        parts: list[bytes] = []
        tally = StreamTally()
        try:
            response = await self.upstream.send(
                backend,
                PATHS[job.endpoint],
                copy_body(job.endpoint, job.body, plan.compare.logprobs),
                backend.shadow_headers,
                job.timeout_s,
                job.deadline_s,
            )
            try:
                status = response.status
                if job.stream and status == 200:
                    chunks = self.upstream.chunks(backend, response)
                    try:
                        async for chunk in chunks:
                            tally.feed(chunk, clock())
                            parts.append(chunk)
                    finally:
                        await chunks.aclose()  # type: ignore[attr-defined]
                    if not tally.done:
                        error = "stream_broken"
                else:
                    parts.append(await self.upstream.read(backend, response))
                    if status >= 500:
                        error = "upstream_error"
                    elif status >= 400:
                        error = "upstream_client_error"
            finally:
                response.release()
        except UpstreamTimeout:
            error = "upstream_timeout"
        except UpstreamError:
            error = "stream_broken" if job.stream and status == 200 else "upstream_error"
        first = None if tally.first_token_at is None else tally.first_token_at - started
        last = None if tally.last_token_at is None else tally.last_token_at - started
        pool = self._fleet().pools.get(backend.pool)
        return CandidateOutcome(
            status,
            error,
            b"".join(parts),
            first,
            last,
            tally.tokens,
            clock() - started,
            pool.spec.engine if pool is not None else None,
        )

    def _account(
        self, job: ShadowJob, plan: ShadowPlan, backend: BackendState, outcome: CandidateOutcome
    ) -> tuple[ShadowRecord, tuple[str, str] | None]:
        """Compare the two answers, update the metrics and return the shadow record, with the
        two texts when both sides have one.

        Runs in a worker thread: it reads only the job and the outcome, and metrics are
        thread-safe.
        """
        read = read_stream if job.stream else read_body
        labels = (job.route, backend.pool, plan.kind)
        primary = read(job.captured)
        candidate = Answer() if outcome.error is not None else read(outcome.data)
        diff = (
            compare(primary, candidate, plan.compare.comparators)
            if outcome.error is None
            else Diff()
        )
        temperature, top_p, seeded, sampled = _sampling(job.endpoint, job.body)
        completion = candidate.completion_tokens
        if outcome.error is None and usage.counts_one_choice(outcome.engine):
            # The answer's usage counts its first choice: count every one.
            completion = (
                usage.streamed(outcome.data, outcome.engine)
                if job.stream
                else usage.whole(outcome.data, outcome.engine, job.max_tokens, job.token_ratio)
            ).completion
        if completion is None and job.stream and outcome.error is None:
            completion = outcome.tokens
        if completion is None and outcome.error is None:
            completion = _counted(candidate, job.token_ratio)
        primary_completion = job.primary_completion_tokens
        if primary_completion is None:
            primary_completion = _counted(primary, job.token_ratio)
        record = ShadowRecord(
            decision_id=job.decision_id,
            ts=job.ts,
            route=job.route,
            model=job.model,
            tenant=job.tenant,
            kind=plan.kind,
            endpoint=job.endpoint,
            stream=job.stream,
            temperature=temperature,
            top_p=top_p,
            seeded=seeded,
            sampled=sampled,
            primary_pool=job.primary_pool,
            primary_backend=job.primary_backend,
            candidate_pool=backend.pool,
            candidate_backend=backend.name,
            primary_status=job.primary_status,
            candidate_status=outcome.status,
            candidate_error=outcome.error,
            primary_ttft_ms=job.primary_ttft_ms,
            primary_tpot_ms=job.primary_tpot_ms,
            primary_e2e_ms=job.primary_e2e_ms,
            candidate_ttft_ms=ms(outcome.ttft_s),
            candidate_tpot_ms=ms(tpot_s(outcome.ttft_s, outcome.last_token_s, completion)),
            candidate_e2e_ms=ms(outcome.e2e_s),
            primary_prompt_tokens=job.primary_prompt_tokens,
            primary_completion_tokens=primary_completion,
            candidate_prompt_tokens=candidate.prompt_tokens,
            candidate_completion_tokens=completion,
            diff=diff,
            failure=failure(outcome.error, candidate, primary),
            primary_failure=None if outcome.error else failure(None, primary, candidate),
        )
        if plan.compare.store_text and (primary.text is not None or candidate.text is not None):
            record.primary_text = _clip(primary.text)
            record.candidate_text = _clip(candidate.text)
            record.text_expires_at = self._wall() + plan.compare.text_retention_h * 3600
        self._observe(labels, outcome, diff, record.failure)
        if primary.text is None or candidate.text is None:
            return record, None
        return record, (primary.text, candidate.text)

    def _observe(
        self,
        labels: tuple[str, str, str],
        outcome: CandidateOutcome,
        diff: Diff,
        failure: str | None,
    ) -> None:
        m = self.metrics
        if outcome.error is not None:
            m.child(m.shadow_failed, *labels, outcome.error).inc()
            return
        if failure is not None:  # answered, but not an answer a client could use
            m.child(m.shadow_failed, *labels, failure).inc()
        m.child(m.shadow_duration, *labels).observe(outcome.e2e_s)
        if diff.exact_match is None:
            return
        m.child(m.shadow_compared, *labels).inc()
        # Added even when zero: a match rate with no numerator series shows no data, not 0 %.
        m.child(m.shadow_exact_matches, *labels).inc(1 if diff.exact_match else 0)
        m.child(m.shadow_normalized_matches, *labels).inc(1 if diff.normalized_match else 0)
        if diff.similarity is not None:
            m.child(m.shadow_similarity, *labels).observe(diff.similarity)


def _counted(answer: Answer, ratio: float) -> int | None:
    """Count an answer's completion tokens where its engine sent no usage, so that its time is
    still held to the SLO its length allows: its logprob entries (which a copy asks for), else
    the gateway's estimate of its text (gateway/routing/classify.py)."""
    if answer.tokens:
        return len(answer.tokens)
    if answer.text is None:
        return None
    return math.ceil(text_tokens(answer.text) * ratio)


def _clip(text: str | None) -> str | None:
    return None if text is None else text[:MAX_TEXT_CHARS]
