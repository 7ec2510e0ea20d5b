"""Semantic similarity of compared answers, measured on the fleet's own embedding route.

A pair of answers that differ is embedded window by window (gateway/compare/meaning.py) by a
backend of a live pool serving the comparison's embedding model, in one `/v1/embeddings`
request, and the similarity of the least similar windows is kept on the shadow record. Exact
matches need none. Embeddings are shadow work: they take a free slot or none (never queue), and
a per-model budget bounds their rate and concurrency; a pair over budget keeps no semantic
similarity and is judged on its words (gateway/promotion/departures.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import orjson

from gateway.compare.answers import read_body
from gateway.compare.meaning import similarity, windows
from gateway.fleet.admission import Admission
from gateway.fleet.ratelimit import Bucket
from gateway.fleet.state import BackendState, Fleet
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import SemanticSimilarity
from gateway.upstream.client import Upstream, UpstreamError, UpstreamTimeout

log = logging.getLogger(__name__)
TIMEOUT_S = 10.0


class Embedder:
    """Measure the semantic similarity of answer pairs within each model's budget."""

    def __init__(
        self,
        upstream: Upstream,
        admission: Admission,
        metrics: GatewayMetrics,
        fleet: Callable[[], Fleet],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.upstream = upstream
        self.admission = admission
        self.metrics = metrics
        self._fleet = fleet
        self._clock = clock
        self._rates: dict[str, Bucket] = {}
        self._in_flight: Counter[str] = Counter()

    async def similarity(
        self, setting: SemanticSimilarity, primary: str, candidate: str
    ) -> float | None:
        """Return the answers' semantic similarity, or None when it was not measured."""
        model = setting.model
        now = self._clock()
        rate = self._rates.get(model)
        if rate is None or rate.rate != setting.max_per_second:
            per_second = setting.max_per_second
            rate = self._rates[model] = Bucket(per_second, max(1.0, per_second), now)
        if self._in_flight[model] >= setting.max_concurrent or not rate.take(1.0, now):
            self._count(model, "over_budget")
            return None
        backend = self._backend(model)
        if backend is None:
            self._count(model, "no_backend")
            return None
        slot = await self.admission.take(backend)
        if slot is None:
            self._count(model, "no_slot")
            return None
        first, second = windows(primary), windows(candidate)
        body = orjson.dumps({"model": model, "input": first + second})
        self._in_flight[model] += 1
        try:
            response = await self.upstream.send(
                backend, "/v1/embeddings", body, backend.shadow_headers, TIMEOUT_S, TIMEOUT_S
            )
            try:
                data = await self.upstream.read(backend, response)
                status = response.status
            finally:
                response.release()
        except (UpstreamError, UpstreamTimeout) as exc:
            log.debug("embedding for semantic similarity failed: %s", exc)
            self._count(model, "failed")
            return None
        finally:
            self._in_flight[model] -= 1
            self.admission.release(slot)
        vectors = read_body(data).embeddings if status == 200 else ()
        if len(vectors) != len(first) + len(second):
            self._count(model, "failed")
            return None
        self._count(model, "measured")
        return similarity(vectors[: len(first)], vectors[len(first) :])

    def _backend(self, model: str) -> BackendState | None:
        for pool in self._fleet().pools.values():
            if pool.spec.live and model in pool.spec.models:
                backend = pool.most_free()
                if backend is not None:
                    return backend
        return None

    def _count(self, model: str, outcome: str) -> None:
        self.metrics.child(self.metrics.shadow_embeddings, model, outcome).inc()
